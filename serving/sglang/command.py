"""The SGLang server command line and environment for one configuration.

`build_sglang_command(SGLangLaunch(...)) -> (argv, env)`; env holds only what this
configuration sets (the caller merges it over os.environ; a None value removes an
inherited variable).

Stock is stock: an fp8 arm on SGLang's own kernels is exactly the command a user runs
without niah, `python -m sglang.launch_server --model-path M --tp-size N --host H --port P
[--json-model-override-args '{"index_topk": K}'] <args>` with the configuration's `env`,
every NIAH_* variable inherited from niah's environment removed (so the plugin, installed
as an entry point and inert without NIAH_INDEX_DTYPE, cannot run there).

The fp4 arm (fp4/stock) is that same stock command with SGLang's own
`--enable-deepseek-v4-fp4-indexer` added and nothing else (one factor from fp8/stock);
no other arm may carry that flag (extra_args may not set it).

niah's arms (bf16/niah, fp8/niah) get the same SGLang arguments and environment plus only
niah's own switches: the launch entry `python -m niah.serving.sglang`, `--niah-index-dtype`,
`--niah-kernels` (read and stripped by the entry) and NIAH_INDEX_DTYPE / NIAH_KERNELS.
niah forces no SGLang flag or SGLANG_* variable in any arm: fusion, prefill CUDA graphs,
SGLang's top-k and DeepGEMM's selection stay as the user's SGLang has them.
`ARMS` says in words what each built-in arm runs (the manifest records it); `arm_facts` says
it for every arm the forms table makes, a registered form's from its row.
What the plugin cannot serve is decided on SGLang's own parse of the command
(refusals.py): by the launch entry before weights load, and by the matrix wherever
SGLang is importable.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field

from niah.errors import BadInput
from niah.kernels import forms
from niah.serving.sglang.arms import (  # noqa: F401  (arm_name, SGLANG_MODULE: re-exported)
    ENV_INDEX_DTYPE, ENV_KERNELS, FP4_FLAG, KERNELS, KERNELS_FLAG, LAUNCH_MODULE,
    NIAH_ENV_PREFIX, NIAH_FLAG, OVERRIDE_FLAG, SGLANG_MODULE, arm_dtypes, arm_name, check_stock_only, default_kernels)

MAX_INDEX_TOPK = 2048  # SGLang's v2 top-k: 0 < k <= 2048


@dataclass
class SGLangLaunch:
    """How to serve one configuration with SGLang (and niah's plugin)."""

    model_path: str
    tp: int = 1
    port: int = 30000
    host: str = "127.0.0.1"
    index_dtype: str = forms.DEFAULT
    kernels: str | None = None  # None: "niah" for bf16, "stock" for fp8 and fp4
    index_topk: int | None = None  # None: the model's own (V3.2: 2048)
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable

    def validate(self) -> None:
        if not self.model_path:
            raise BadInput("sglang: model_path is required")
        if self.index_dtype not in arm_dtypes():
            raise BadInput(f"sglang: index_dtype {self.index_dtype!r} is not one of {', '.join(arm_dtypes())}")
        if self.kernels not in (None, *KERNELS):
            raise BadInput(f"sglang: kernels {self.kernels!r} is not one of {', '.join(KERNELS)}")
        if self.kernels == forms.STOCK and forms.get(self.index_dtype).sglang_kernels == (forms.NIAH,):
            raise BadInput(f"sglang: {self.index_dtype} index keys run on niah's kernels (kernels = \"niah\"), "
                           "not stock")
        try:
            check_stock_only(self.index_dtype, self.kernels)
        except BadInput as e:
            raise BadInput(f"sglang: {e}") from None
        if not isinstance(self.tp, int) or self.tp < 1:
            raise BadInput(f"sglang: tp must be a positive integer, got {self.tp!r}")
        if not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise BadInput(f"sglang: port must be 1..65535, got {self.port!r}")
        if self.index_topk is not None and (not isinstance(self.index_topk, int)
                                            or not 0 < self.index_topk <= MAX_INDEX_TOPK):
            raise BadInput(f"sglang: index_topk must be 1..{MAX_INDEX_TOPK}, got {self.index_topk!r}")
        for flag in (OVERRIDE_FLAG, NIAH_FLAG, KERNELS_FLAG):
            if any(a == flag or a.startswith(flag + "=") for a in self.extra_args):
                raise BadInput(f"sglang: extra_args may not set {flag}; use index_topk / index_dtype / kernels")
        # the fp4 flag and its abbreviations (argparse takes a unique prefix; SGLang 0.5.23 has no other
        # --enable-deepseek-* flag, so any prefix past "--enable-deep" is it); SGLang's parse decides
        # the rest (refusals.stock_fp4_refusal: a --config file)
        if any(len(a.split("=", 1)[0]) > len("--enable-deep") and FP4_FLAG.startswith(a.split("=", 1)[0])
               for a in self.extra_args):
            raise BadInput(f"sglang: extra_args may not set {FP4_FLAG}; use index_dtype = \"fp4\"")
        for var in (ENV_INDEX_DTYPE, ENV_KERNELS):
            if var in self.env:
                raise BadInput(f"sglang: env may not set {var}; use index_dtype / kernels")

    @property
    def arm_kernels(self) -> str:
        return self.kernels or default_kernels(self.index_dtype)


# What each arm runs, in words (index dtype/kernels -> facts); recorded in the manifest.
ARMS: dict[str, dict[str, str]] = {
    "fp8/stock": {
        "launcher": SGLANG_MODULE, "plugin": "not loaded (NIAH_* variables removed)",
        "index_keys": "fp8 + fp32 scale, 132 B/token, written by SGLang (V3.2 NeoX RoPE, e.g. DeepSeek-V3.2: "
                      "unfused, Hadamard-rotated; interleaved RoPE: fused, no rotation; V4: Hadamard)",
        "query": "fp8, SGLang's", "logits": "SGLang's (DeepGEMM by default)", "top_k": "SGLang's",
        "paths": "SGLang's defaults"},
    "fp4/stock": {
        "launcher": SGLANG_MODULE, "plugin": "not loaded (NIAH_* variables removed)",
        "index_keys": "MXFP4 (e2m1 codes + one ue8m0 exponent per 32 values), 68 B/token, written by SGLang "
                      f"(DeepSeek-V4's {FP4_FLAG}; SGLang accepts it on SM100, SM120 and gfx95 only)",
        "query": "fp4, SGLang's (rotated, then quantised to MXFP4)", "logits": "SGLang's (DeepGEMM's "
        "fp8_fp4_paged_mqa_logits)", "top_k": "SGLang's",
        "paths": f"SGLang's defaults plus {FP4_FLAG}: the fp8/stock command with that one flag added"},
    "fp8/niah": {
        "launcher": LAUNCH_MODULE, "plugin": "loaded",
        "index_keys": "fp8 + fp32 scale, 132 B/token, written by SGLang (as fp8/stock)",
        "query": "fp8, SGLang's", "logits": "niah's fp8 Triton kernels", "top_k": "SGLang's",
        "paths": "SGLang's defaults (the indexer path the model config selects, prefill CUDA graphs, V4 "
                 "non-paged prefill); DeepGEMM's logits replaced by niah's on SGLang's own calls"},
    "bf16/niah": {
        "launcher": LAUNCH_MODULE, "plugin": "loaded",
        "index_keys": "bf16, 256 B/token (V4: 264 B with page padding): SGLang's key before its fp8 cast, the "
                      "same norm, RoPE and rotation as fp8/stock (V3.2 unfused: SGLang's rotated key stored by "
                      "niah; fused: niah's fused store; V4: niah's V4 store)",
        "query": "fp8, SGLang's own, upcast exactly to bf16 for niah's bf16 kernels (a bf16 query is a further "
                 "factor this arm does not take)",
        "logits": "niah's bf16 Triton kernels", "top_k": "SGLang's",
        "paths": "SGLang's defaults (the indexer path the model config selects, prefill CUDA graphs, V4 "
                 "non-paged prefill); DeepGEMM's logits replaced by niah's on SGLang's own calls; prefill key "
                 "gather in torch (SGLang: a Triton kernel)"},
}


INDEX_HEAD_DIM = 128  # DeepSeek's indexer key: what an arm's bytes a token are counted at


def arm_facts(index_dtype: str, kernels: str) -> dict[str, str]:
    """What the arm runs, in words: its `ARMS` row, or for a form registered without one, the
    words its row of the forms table gives (niah.kernels.forms: layout, bytes, SGLang's flag).
    BadInput when the table has no such arm (an unknown form, or kernels it does not run on)."""
    name = arm_name(index_dtype, kernels)
    if name in ARMS:
        return ARMS[name]
    form = forms.get(index_dtype)
    if form is None or kernels not in form.sglang_kernels:
        raise BadInput(f"sglang: no arm {name}: the forms table has no {index_dtype} index keys on {kernels} kernels")
    keys = f"{form.layout}, {form.key_bytes(INDEX_HEAD_DIM)} B/token"
    if kernels == forms.STOCK:
        flag = f" plus {form.sglang_flag}" if form.sglang_flag else ""
        return {"launcher": SGLANG_MODULE, "plugin": "not loaded (NIAH_* variables removed)",
                "index_keys": f"{keys}, written by SGLang", "query": "SGLang's", "logits": "SGLang's",
                "top_k": "SGLang's", "paths": f"SGLang's defaults{flag}"}
    return {"launcher": LAUNCH_MODULE, "plugin": "loaded", "index_keys": f"{keys}, stored by niah",
            "query": "SGLang's", "logits": f"niah's {index_dtype} Triton kernels", "top_k": "SGLang's",
            "paths": "SGLang's defaults; DeepGEMM's logits replaced by niah's on SGLang's own calls"}


def _sglang_args(cfg: SGLangLaunch) -> list[str]:
    """The arguments SGLang's own launch_server gets, the same in every arm."""
    args = ["--model-path", cfg.model_path, "--tp-size", str(cfg.tp), "--host", cfg.host, "--port", str(cfg.port)]
    if cfg.index_topk is not None:
        args += [OVERRIDE_FLAG, json.dumps({"index_topk": cfg.index_topk})]
    flag = forms.get(cfg.index_dtype).sglang_flag  # SGLang's own switch of the form (fp4)
    return args + ([flag] if flag else []) + list(cfg.extra_args)


def build_sglang_command(cfg: SGLangLaunch, environ: dict[str, str] | None = None
                         ) -> tuple[list[str], dict[str, str | None]]:
    """(argv, env) that serve `cfg`. Stock: SGLang's own entry, niah's variables of `environ`
    (default os.environ) removed (None). niah arms: niah's launch entry and switches."""
    cfg.validate()
    kernels = cfg.arm_kernels
    if kernels == "stock":
        environ = os.environ if environ is None else environ
        unset: dict[str, str | None] = {k: None for k in sorted(environ) if k.startswith(NIAH_ENV_PREFIX)}
        return [cfg.python, "-m", SGLANG_MODULE, *_sglang_args(cfg)], {**unset, **cfg.env}
    argv = [cfg.python, "-m", LAUNCH_MODULE, NIAH_FLAG, cfg.index_dtype, KERNELS_FLAG, kernels, *_sglang_args(cfg)]
    return argv, {**cfg.env, ENV_INDEX_DTYPE: cfg.index_dtype, ENV_KERNELS: kernels}


def format_command(argv: list[str], env: dict[str, str | None]) -> str:
    """One shell line: `[env -u VAR ...] VAR=value ... argv` (quoted), for --dry-run output."""
    unset = [f"-u {k}" for k, v in sorted(env.items()) if v is None]
    parts = (["env", *unset] if unset else []) + [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())
                                                  if v is not None]
    return " ".join(parts + [shlex.quote(a) for a in argv])
