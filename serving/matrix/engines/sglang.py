"""engine = "sglang": an SGLang server, stock or with niah's plugin (serving/sglang builds it).

Its keys (model_path required; tp, index dtype, kernels, top-k, ...), its command (stock:
SGLang's own `launch_server`; niah arms: niah's launch entry; what an arm cannot serve is
refused here where SGLang's parser is importable: serving/sglang/refusals.py), the arms that
cannot exist (bf16 keys on stock kernels, fp4 keys on niah's), what each arm runs in words,
the dry run's line on whether SGLang's parser checked the arguments here, the fp4 platform
check before any server starts (serving/sglang/fp4.py), and its GPUs per job (tp).
"""

from __future__ import annotations

import os

from niah.errors import BadInput
from niah.kernels import forms
from niah.serving.launch import HOST
from niah.serving.matrix.engines.base import Engine
from niah.serving.matrix.keys import COMMON, PORT_PLACEHOLDER, choice, choice_of, int_range, string
from niah.serving.sglang import refusals
from niah.serving.sglang.arms import default_kernels
from niah.serving.sglang.command import SGLangLaunch, arm_facts, arm_name, build_sglang_command
from niah.serving.sglang.fp4 import fp4_platform_refusal

KEYS = {
    **COMMON,
    "model_path": string,
    "tp": int_range(1),
    "index_dtype": choice_of(forms.sglang_arm_names),  # the forms SGLang serves (fp4: its own arm, stock only)
    "kernels": choice("stock", "niah"),
    "index_topk": int_range(1, 2048),
    "python": string,
    "model": string,
    "index_query_dtype": choice("fp8"),  # a label: every SGLang arm keeps SGLang's fp8 query
}
_PORT_SENTINEL = 65535


def sglang_command(cfg, port: int | str) -> tuple[list[str], dict[str, str]]:
    """argv and environment for one SGLang arm (serving/sglang builds them: stock is SGLang's
    own launch_server, niah arms go through niah's launch entry). What the arm cannot serve
    is refused here when SGLang's parser is importable, else by the launch entry
    (serving/sglang/refusals.py)."""
    s = cfg.settings
    launch = SGLangLaunch(
        model_path=s["model_path"], tp=s.get("tp", 1), port=_PORT_SENTINEL if port == PORT_PLACEHOLDER else port,
        host=HOST, index_dtype=s.get("index_dtype", forms.DEFAULT), kernels=s.get("kernels"),
        index_topk=s.get("index_topk"),
        extra_args=list(s.get("args", [])), env=cfg.env,
    )
    if "python" in s:
        launch.python = s["python"]
    try:
        argv, env = build_sglang_command(launch)
        merged = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
        override = {} if launch.index_topk is None else {"index_topk": launch.index_topk}
        refusals.check_command(argv, merged, override, launch.index_dtype)  # where SGLang's parser is importable
    except BadInput as e:
        raise BadInput(f"{cfg.name} (line {cfg.line}): {e}") from None
    return _with_placeholder(argv, port), env


def _with_placeholder(argv: list[str], port: int | str) -> list[str]:
    if port != PORT_PLACEHOLDER:
        return argv
    out = list(argv)
    for i, a in enumerate(out[:-1]):
        if a == "--port" and out[i + 1] == str(_PORT_SENTINEL):
            out[i + 1] = PORT_PLACEHOLDER
    return out


def impossible(settings: dict) -> str | None:
    """Why an SGLang arm cannot exist (bf16 keys on stock kernels, fp4 keys on niah's), or None."""
    dtype, kernels = settings.get("index_dtype"), settings.get("kernels")
    form = forms.get(dtype) if isinstance(dtype, str) else None
    if form is None or kernels is None or kernels in form.sglang_kernels:
        return None
    if kernels == forms.STOCK:
        return f"sglang: {dtype} index keys run on kernels = \"niah\", not stock"
    return f"sglang: {dtype} index keys run on SGLang's own kernels (kernels = \"stock\"), not niah's"


def arm_of(cfg) -> dict[str, str]:
    """What the configuration's arm runs, in words (command.arm_facts: a registered form's too)."""
    dtype = cfg.settings.get("index_dtype", forms.DEFAULT)
    kernels = cfg.settings.get("kernels") or default_kernels(dtype)
    return {"arm": arm_name(dtype, kernels), **arm_facts(dtype, kernels)}


def parser_note() -> str:
    why = refusals.parser_status()
    return "# SGLang arguments: " + ("checked with SGLang's own parser here (refusals: serving/sglang/refusals.py)"
                                     if why is None else f"not checked here ({why}); the launch entry checks them "
                                                         "with SGLang's parser before weights load")


def fp4_preflight(cfg) -> str | None:
    """SGLang's refusal of an fp4 arm on this machine (asked of its server's Python), or None."""
    form = forms.get(cfg.settings.get("index_dtype") or forms.DEFAULT)
    if form is None or not form.sglang_flag:  # only a form SGLang turns on by its own flag (fp4)
        return None
    argv, env = sglang_command(cfg, 30000)  # a port SGLang's parser takes; nothing listens
    merged = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    return fp4_platform_refusal(argv[0], argv[3:], merged)


ENGINE = Engine("sglang", KEYS, required=("model_path",), command=sglang_command,
                health_paths=("/health_generate", "/health", "/v1/models"), ready_timeout_s=1800.0,
                impossible=impossible, arm=arm_of, dry_run_note=parser_note, preflight=fp4_preflight,
                job_gpus=lambda settings: int(settings.get("tp", 1)))
