"""What niah's plugin refuses to serve, decided SGLang's way, before anything loads.

The launch entry (`python -m niah.serving.sglang`) hands the exact argv SGLang will get
to SGLang's own parser (`sglang.srt.server_args.prepare_server_args`: argparse with its
abbreviations, e.g. `--enable-hier`, and `--config` YAML files) and decides on the parsed
`ServerArgs` fields, never on flag strings. With niah's kernels (bf16 keys included) it
refuses every path niah does not patch (`RULES`, index_kpool > 1 from
`--json-model-override-args`), DeepSeek-V4 where niah's V4 path is not proven
(`v4_release_refusal`: 0.5.16) and the fp8-layout DeepSeek-V4 indexer kernels
(`indexer_env_refusal`: SGLANG_OPT_USE_TILELANG_INDEXER / SGLANG_OPT_USE_AITER_INDEXER
on; `sm120_refusal`, launch entry only: SGLang's own SM120 default turns TileLang on for
V4), and for any arm through the entry it refuses an `SGLANG_PLUGINS` that would keep the
plugin out of SGLang's processes. The matrix runs the same check where SGLang is
importable (`check_command`, which also checks that the arguments leave niah's
`--json-model-override-args` as niah wrote it); elsewhere the launch entry does. Each
refusal is one line (BadInput, exit 2).

SGLang's own fp4 arm (fp4/stock) is checked in fp4.py: its platform refusal (SGLang's reason,
before any server starts) and, here on SGLang's parse, that a stock arm's fp4 field matches
its label (`stock_fp4_refusal`).

What cannot be decided here: the model's architecture when its config.json is neither a
local folder nor in the Hugging Face cache (the V4 rules then wait for the V4 pool,
v4.env_refusal, after the weights have loaded; an explicit switch is refused anyway).

The plugin allow-list is read SGLang's way: SGLang renames a legacy `SGL_PLUGINS` to
`SGLANG_PLUGINS` when it is imported (srt/environ.py, `_handle_deprecated_envs`, over any
`SGLANG_PLUGINS`), so an `SGL_PLUGINS` that leaves niah out is refused like an
`SGLANG_PLUGINS` that does. The launch entry also re-checks, on SGLang's parse, that
niah's `--json-model-override-args` (the first one in the argv) is what SGLang will use
(`entry_override_refusal`: a later one, an abbreviation or a --config file replaces it).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from niah.errors import BadInput
from niah.kernels.forms import DEFAULT as DEFAULT_INDEX_DTYPE
from niah.serving.sglang.arms import (
    ENTRY_POINT_NAME as PLUGIN_NAME, LAUNCH_MODULE, OVERRIDE_FLAG, SGL_PLUGINS, SGLANG_MODULE, SGLANG_PLUGINS,
    FP4_FIELD, TILELANG_INDEXER as TILELANG, V4_INDEXER_SWITCHES, default_kernels, env_on, plugin_dtypes,
    split_niah_args)
from niah.serving.sglang.fp4 import stock_fp4_refusal
from niah.serving.sglang.releases import SUPPORTED_VERSIONS, release_of


@dataclass(frozen=True)
class Rule:
    """Refuse when `ServerArgs.<field>` makes `refused(value)` true, for niah's kernels
    with these index dtypes (None: every dtype the plugin serves, arms.plugin_dtypes)."""

    field: str
    refused: Callable[[Any], bool]
    what: str
    dtypes: tuple[str, ...] | None = None
    releases: tuple[str, ...] | None = None  # the SGLang releases that have the field (None: all)


def _on(v) -> bool:
    return bool(v)


def _wider_than_one(v) -> bool:
    return v is not None and int(v) > 1


RULES: tuple[Rule, ...] = (
    Rule("enable_hierarchical_cache", _on, "HiCache: its host pool and transfers are sized for 132-byte fp8 keys"),
    Rule("enable_hisparse", _on, "HiSparse: its own index-key paths"),
    Rule("dcp_size", _wider_than_one, "decode-context parallel: a sharded key cache"),
    Rule("enable_prefill_cp", _on, "prefill context parallel: keys split and gathered across CP ranks by paths "
                                   "niah does not patch"),
    Rule("attn_cp_size", _wider_than_one, "attention context parallel: keys split across CP ranks"),
    Rule("disaggregation_mode", lambda v: v not in (None, "null"),
         "PD disaggregation: key pages move between servers as 132-byte fp8 rows"),
    Rule("enable_dsa_cache_layer_split", _on, "layer-split DSA key cache pools"),
    Rule("enable_kv_cache_sharding", _on, "page-interleave (sharded) key cache pools", releases=("0.5.23",)),
    Rule(FP4_FIELD, _on, "DeepSeek-V4 fp4 index keys (niah reads 132-byte fp8 or bf16 rows)"),
    Rule("dsa_paged_mqa_logits_backend", lambda v: v not in ("auto", "deepgemm"),
         "only auto/deepgemm decode through resolve_fp8_paged_mqa_logits_fn, which niah patches; "
         "cutedsl and aiter call their own kernels"),
    Rule("speculative_algorithm", lambda v: v is not None and str(v).upper() not in ("", "NONE"),
         "speculative decoding / MTP: target-verify and draft-extend read the fp8 key layout", dtypes=("bf16",)),
)


# ---------------------------------------------------------------------------------------
# SGLang's parser


class ParserMissing(BadInput):
    """SGLang's server_args cannot be imported in this Python environment."""


def load_parser() -> Callable[[list[str]], Any]:
    """SGLang's `prepare_server_args`; ParserMissing (one line) if it cannot be imported."""
    if importlib.util.find_spec("sglang") is None:
        raise ParserMissing("SGLang is not installed in this environment (pip install sglang==0.5.23)")
    try:
        from sglang.srt.server_args import prepare_server_args  # noqa: PLC0415 (optional: SGLang, checked above)
    except Exception as e:  # a broken SGLang install: its parser is what decides, so say so
        raise ParserMissing(f"SGLang's argument parser cannot be imported here: {type(e).__name__}: {e}") from None
    return prepare_server_args


def parser_status() -> str | None:
    """None when SGLang's parser is importable here, else why not (one line)."""
    try:
        load_parser()
    except ParserMissing as e:
        return str(e)
    return None


@contextlib.contextmanager
def _quiet_root_logging():
    """prepare_server_args reconfigures the root logger (basicConfig(force=True)); put it back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def parse(argv: list[str]):
    """SGLang's own `ServerArgs` for the exact argv (`--config` merged, abbreviations
    expanded); what SGLang's parser rejects becomes one line (BadInput)."""
    prepare = load_parser()
    err, out = io.StringIO(), io.StringIO()
    try:
        with _quiet_root_logging(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            return prepare(list(argv))
    except SystemExit as e:  # argparse: usage + "sglang serve: error: ..." on stderr
        lines = [ln for ln in (err.getvalue() + out.getvalue()).splitlines() if ln.strip()]
        if e.code in (0, None):  # --help / --version: SGLang will print it at launch
            return None
        raise BadInput(f"SGLang's argument parser refused the arguments: {lines[-1] if lines else e}") from None
    except Exception as e:  # e.g. a --config file that is missing or not YAML
        raise BadInput(f"SGLang's argument parser refused the arguments: {type(e).__name__}: {e}") from None


# ---------------------------------------------------------------------------------------
# Decisions


def installed_release() -> str | None:
    """The supported release the installed SGLang is a build of (None: not installed or another)."""
    try:
        return release_of(importlib.metadata.version("sglang"))
    except importlib.metadata.PackageNotFoundError:
        return None


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def refusal(index_dtype: str, kernels: str, args) -> str | None:
    """One line saying why niah's kernels cannot serve these parsed ServerArgs, or None.
    The stock arm is SGLang's own: nothing is refused there."""
    if kernels == "stock" or args is None:
        return None
    release = installed_release()
    for rule in RULES:
        if rule.releases is not None and release not in rule.releases:
            continue  # that release has no such path (e.g. 0.5.16 has no sharded key cache)
        if not hasattr(args, rule.field):  # fail closed: not the SGLang these rules were written for
            return (f"SGLang's ServerArgs has no field {rule.field!r}; niah's refusals are written for SGLang "
                    f"{', '.join(SUPPORTED_VERSIONS)}")
        value = getattr(args, rule.field)
        if index_dtype in (rule.dtypes or plugin_dtypes()) and rule.refused(value):
            shown = "" if isinstance(value, bool) else f" {value}"
            return f"{_flag(rule.field)}{shown} is not supported with {index_dtype}/{kernels} index keys ({rule.what})"
    override = getattr(args, "json_model_override_args", None) or "{}"
    try:
        kpool = json.loads(override).get("index_kpool", 1)
    except (ValueError, AttributeError):
        return f"--json-model-override-args is not a JSON object: {override!r}"
    if kpool not in (None, 1):
        return (f"index_kpool {kpool} (--json-model-override-args) is not supported with {index_dtype}/{kernels} "
                "index keys (IndexerKPool's pooled key cache)")
    return None


V4_ARCH = "DeepseekV4ForCausalLM"


def architecture(args) -> str | None:
    """The model's architecture as SGLang will read it (`architectures[0]`): from
    --json-model-override-args, else the model's config.json in a local folder or the
    Hugging Face cache (no download). None when it cannot be told here."""
    try:
        override = json.loads(getattr(args, "json_model_override_args", None) or "{}")
    except ValueError:
        override = {}
    archs = override.get("architectures") if isinstance(override, dict) else None
    path = str(getattr(args, "model_path", "") or "")
    config = os.path.join(path, "config.json")
    if not archs and not os.path.isfile(config) and path and not os.path.isdir(path):
        try:
            from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415 (optional: ImportError is caught)

            cached = try_to_load_from_cache(path, "config.json", revision=getattr(args, "revision", None))
            config = cached if isinstance(cached, str) else config
        except Exception:  # not a repo id, no huggingface_hub: not known here
            pass
    if not archs and os.path.isfile(config):
        try:
            with open(config, encoding="utf-8") as f:
                archs = json.load(f).get("architectures")
        except (OSError, ValueError, AttributeError):
            archs = None
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


def indexer_env_refusal(args, env: Mapping[str, str]) -> str | None:
    """DeepSeek-V4's C4 indexer tries the TileLang and AITER kernels before the paged
    function niah routes; both read the fp8 page layout. Refused when on, unless the model
    is known not to be V4 (the switches do nothing elsewhere)."""
    arch = architecture(args) if args is not None else None
    if arch is not None and arch != V4_ARCH:
        return None
    for name in V4_INDEXER_SWITCHES:
        if env_on(env, name):
            return (f"{name} is on: that DeepSeek-V4 indexer kernel reads the fp8 page layout and bypasses niah's "
                    "kernels; set it to 0 in the configuration's env (every arm) to compare on the DeepGEMM path")
    return None


V4_RELEASES = ("0.5.23",)  # where niah's DeepSeek-V4 path is proven (patches/deepseek_v4.py)


def v4_release_refusal(args) -> str | None:
    """niah's kernels on DeepSeek-V4 on an SGLang whose V4 path niah is not proven on
    (0.5.16): refused here where the architecture can be told, before SGLang starts (else
    where the V4 pool is built, v4.refuse_release, with the same reason)."""
    if args is None or installed_release() in V4_RELEASES or architecture(args) != V4_ARCH:
        return None
    try:
        installed = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        installed = "unknown"
    return (f"niah's DeepSeek-V4 path is proven on SGLang {', '.join(V4_RELEASES)} only, not on the installed "
            f"{installed}; serve DeepSeek-V4 with fp8/stock, or use SGLang {V4_RELEASES[-1]}")


def sm120_refusal(args, env: Mapping[str, str]) -> str | None:
    """SGLang's own default (arg_groups/model_hook.py): DeepSeek-V4 on SM120 turns the
    TileLang indexer on unless SGLANG_OPT_USE_TILELANG_INDEXER is set. Decided with SGLang's
    platform probe (NVML, no CUDA context) where the architecture can be told."""
    if args is None or TILELANG in env or architecture(args) != V4_ARCH:
        return None
    from sglang.srt.runtime_context import get_platform  # noqa: PLC0415 (optional: SGLang is there when args are)

    if not get_platform().is_sm120:
        return None
    return (f"DeepSeek-V4 on SM120: SGLang turns the TileLang indexer on ({TILELANG} unset), which reads the fp8 "
            f"page layout and bypasses niah's kernels; set {TILELANG}=0 in the configuration's env (every arm)")


def override_refusal(args, expected: dict) -> str | None:
    """niah writes `--json-model-override-args` itself (index_topk); SGLang's parse of the
    whole argv (abbreviations, --config) must leave it as niah wrote it."""
    if args is None:
        return None
    raw = getattr(args, "json_model_override_args", None) or "{}"
    try:
        got = json.loads(raw)
    except ValueError:
        got = raw
    if got == expected:
        return None
    shown = json.dumps(expected) if not isinstance(expected, str) else expected
    return (f"the SGLang arguments set --json-model-override-args to {raw!r} (a later --json-model-override-args, "
            f"an abbreviation or a --config file), over niah's {shown!r}: set index_topk in the configuration "
            "instead")


def niah_override(argv: list[str]):
    """What the first `--json-model-override-args` of `argv` says (niah writes it there,
    before the user's arguments): its JSON, the raw text if it is not JSON, None if absent."""
    for i, a in enumerate(argv):
        if a == OVERRIDE_FLAG and i + 1 < len(argv):
            raw = argv[i + 1]
        elif a.startswith(OVERRIDE_FLAG + "="):
            raw = a.split("=", 1)[1]
        else:
            continue
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return None


def entry_override_refusal(argv: list[str], args) -> str | None:
    """The launch entry's check on SGLang's parse: the first --json-model-override-args in
    the argv (niah's) is the one SGLang uses."""
    expected = niah_override(argv)
    return None if expected is None else override_refusal(args, expected)


def plugins_allow_list(env: Mapping[str, str]) -> tuple[str, str]:
    """(variable, value) of the allow-list SGLang's loader will read: SGLang copies a set
    SGL_PLUGINS over SGLANG_PLUGINS when it is imported (srt/environ.py)."""
    if SGL_PLUGINS in env:
        return SGL_PLUGINS, env.get(SGL_PLUGINS) or ""
    return SGLANG_PLUGINS, env.get(SGLANG_PLUGINS) or ""


def plugins_refusal(env: Mapping[str, str]) -> str | None:
    """SGLang's rule (srt/plugins/__init__.py load_plugins_by_group): a non-empty
    SGLANG_PLUGINS is a comma-separated allow-list, and plugins not on it are skipped."""
    var, allowed = plugins_allow_list(env)
    if not allowed:
        return None
    names = {x.strip() for x in allowed.split(",") if x.strip()}
    if PLUGIN_NAME in names:
        return None
    renamed = f" (SGLang renames it to {SGLANG_PLUGINS})" if var == SGL_PLUGINS else ""
    return (f"{var}={allowed!r}{renamed} does not name {PLUGIN_NAME!r}, so SGLang would load its processes "
            f"without niah's plugin; add {PLUGIN_NAME} to it or unset it")


def platform_refusal(kernels: str) -> str | None:
    """niah's kernels run on CUDA: ROCm (whose aiter/HIP indexer paths niah does not patch,
    and whose V4 indexer writes fp4/fp8 keys) is refused for them."""
    if kernels == "stock":
        return None
    import torch

    return f"ROCm is not supported with niah's kernels (kernels = {kernels!r})" if torch.version.hip else None


def check(index_dtype: str, kernels: str, argv: list[str], env: Mapping[str, str], parsed: bool = False):
    """Refuse (BadInput, one line) what this arm cannot serve with SGLang arguments `argv`
    in environment `env`. Parses with SGLang's parser where something can be refused (or
    `parsed` asks for it); returns the parsed ServerArgs, or None where it did not parse."""
    problem = plugins_refusal(env)
    args = None
    if problem is None and (kernels != "stock" or parsed):
        args = parse(argv)
    if problem is None and kernels != "stock":
        problem = refusal(index_dtype, kernels, args) or v4_release_refusal(args) or indexer_env_refusal(args, env)
    if problem:
        raise BadInput(problem)
    return args


def check_command(argv: list[str], env: Mapping[str, str], override: dict | None = None,
                  index_dtype: str | None = None) -> bool:
    """The launch entry's check for a built command (`python -m niah.serving.sglang ...`),
    run here if SGLang's parser is importable; with `override` (what niah wrote in
    --json-model-override-args), the parsed arguments of any arm, stock included, must
    keep it. `index_dtype`: a stock command's arm (fp8 when None, or fp4), whose parsed
    fp4 field must match it. True: checked; False: SGLang is not importable here, the
    launch entry will check (niah arms; a stock command is SGLang's own and is not checked
    further; an fp4 arm's platform is asked of the server's Python at launch)."""
    if argv[1:3] == ["-m", LAUNCH_MODULE]:
        dtype, kernels, rest = split_niah_args(argv[3:], env)
        kernels = kernels or default_kernels(dtype)
    elif argv[1:3] == ["-m", SGLANG_MODULE]:
        dtype, kernels, rest = index_dtype or DEFAULT_INDEX_DTYPE, "stock", argv[3:]
        env = {k: v for k, v in env.items() if k not in (SGLANG_PLUGINS, SGL_PLUGINS)}  # no plugin to keep out
    else:
        return True
    if parser_status() is not None:
        if kernels != "stock" and (problem := plugins_refusal(env)):
            raise BadInput(problem)
        return False  # SGLang's parser is not importable here: the launch entry decides
    args = check(dtype, kernels, rest, env, parsed=override is not None or kernels == "stock")
    if override is not None and (problem := override_refusal(args, override)):
        raise BadInput(problem)
    if kernels == "stock" and (problem := stock_fp4_refusal(dtype, args)):
        raise BadInput(problem)
    return True
