"""The arms niah serves on SGLang, as constants: the one module the patcher, the refusals,
the launch entry and the command builder all read (it imports nothing of theirs).

- arms: index-key dtype / kernels ("stock", "niah"), both read from the table of index-key
  forms (niah.kernels.forms: a form's `sglang_kernels`): the plugin's dtypes
  (`plugin_dtypes`: fp8, bf16) are the forms with an arm on niah's kernels; bf16 keys run on
  niah's kernels only (`check_arm`, `default_kernels`, `arm_name`); the command builder's
  arms (`arm_dtypes`) add "fp4", which runs stock only (SGLang's own
  `--enable-deepseek-v4-fp4-indexer`, the form's `sglang_flag`: `FP4_FLAG`; the plugin
  serves no fp4 pool);
- entry names: the launch entry `python -m niah.serving.sglang`, SGLang's own
  `sglang.launch_server`, the `sglang.srt.plugins` entry point `niah`;
- niah's switches: `--niah-index-dtype`, `--niah-kernels` (`split_niah_args`) and the
  NIAH_INDEX_DTYPE / NIAH_KERNELS variables that carry them into SGLang's processes;
- SGLang's variable names niah reads (its plugin allow-list, the V4 indexer switches).
"""

from __future__ import annotations

import os

from niah.errors import BadInput
from niah.kernels import forms

KERNELS = (forms.STOCK, forms.NIAH)
# SGLang's own switch of the fp4 arm (stock only: plain launch_server with FP4_FLAG,
# DeepSeek-V4's MXFP4 index keys) and its ServerArgs field.
FP4_FLAG = forms.get("fp4").sglang_flag
FP4_FIELD = forms.get("fp4").sglang_field


def plugin_dtypes() -> tuple[str, ...]:
    """Index-key dtypes the plugin serves (a pool niah's kernels read)."""
    return forms.sglang_plugin_names()


def arm_dtypes() -> tuple[str, ...]:
    """The arms' index dtypes the command builder and the matrix make: the plugin's and SGLang's own."""
    return forms.sglang_arm_names()

# Entries and the plugin's registration (pyproject.toml: [project.entry-points."sglang.srt.plugins"]).
LAUNCH_MODULE = "niah.serving.sglang"
SGLANG_MODULE = "sglang.launch_server"
ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_NAME = "niah"

# niah's own switches: flags read and stripped by the launch entry, variables for SGLang's processes.
NIAH_FLAG = "--niah-index-dtype"
KERNELS_FLAG = "--niah-kernels"
ENV_INDEX_DTYPE = "NIAH_INDEX_DTYPE"
ENV_KERNELS = "NIAH_KERNELS"
NIAH_ENV_PREFIX = "NIAH_"
OVERRIDE_FLAG = "--json-model-override-args"  # niah writes it (index_topk); the user may not

# SGLang's variables: its plugin allow-list (SGLang renames a legacy SGL_* variable to SGLANG_*
# when it is imported, srt/environ.py _handle_deprecated_envs) and the V4 indexer switches.
SGLANG_PLUGINS = "SGLANG_PLUGINS"
SGL_PLUGINS = "SGL_PLUGINS"
TILELANG_INDEXER = "SGLANG_OPT_USE_TILELANG_INDEXER"
AITER_INDEXER = "SGLANG_OPT_USE_AITER_INDEXER"
V4_INDEXER_SWITCHES = (TILELANG_INDEXER, AITER_INDEXER)
PAGED_LOGITS_TORCH = "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"
ENV_TRUE = ("1", "true", "yes", "y", "on")  # SGLang's EnvBool true values ("on" it rejects; niah refuses it too)


def env_on(env, name: str) -> bool:
    """Whether SGLang's EnvBool `name` is on in `env` (niah also counts "on")."""
    return str(env.get(name) or "").strip().lower() in ENV_TRUE


def check_arm(index_dtype: str, kernels: str) -> None:
    if index_dtype not in plugin_dtypes():
        raise BadInput(f"unknown index dtype {index_dtype!r}; expected one of {', '.join(plugin_dtypes())}")
    if kernels not in KERNELS:
        raise BadInput(f"unknown kernels {kernels!r}; expected one of {', '.join(KERNELS)}")
    if kernels not in forms.get(index_dtype).sglang_kernels:
        raise BadInput(f"{index_dtype} index keys run on niah's kernels only (kernels = \"niah\")")


def check_stock_only(index_dtype: str, kernels: str | None) -> None:
    """SGLang's own arms (fp4 index keys): stock kernels only."""
    form = forms.get(index_dtype)
    if form is not None and form.sglang_kernels == (forms.STOCK,) and kernels not in (None, forms.STOCK):
        raise BadInput(f"{index_dtype} index keys run on SGLang's own kernels only (kernels = \"stock\"): niah's "
                       f"plugin serves {' and '.join(plugin_dtypes())} pools")


def default_kernels(index_dtype: str) -> str:
    return forms.default_kernels(index_dtype)


def arm_name(index_dtype: str, kernels: str) -> str:
    return f"{index_dtype}/{kernels}"


def split_niah_args(argv: list[str], env=None) -> tuple[str, str | None, list[str]]:
    """(index dtype, kernels or None, argv without niah's flags). Defaults from `env`
    (os.environ): $NIAH_INDEX_DTYPE or fp8; $NIAH_KERNELS or None (the dtype's default)."""
    env = os.environ if env is None else env
    found = {NIAH_FLAG: env.get(ENV_INDEX_DTYPE) or forms.DEFAULT,
             KERNELS_FLAG: env.get(ENV_KERNELS) or None}
    rest: list[str] = []
    it = iter(range(len(argv)))
    for i in it:
        a = argv[i]
        flag = next((f for f in found if a == f or a.startswith(f + "=")), None)
        if flag is None:
            rest.append(a)
        elif a == flag:
            if i + 1 >= len(argv):
                raise BadInput(f"{flag} needs a value")
            found[flag] = argv[i + 1]
            next(it)
        else:
            found[flag] = a.split("=", 1)[1]
    return found[NIAH_FLAG], found[KERNELS_FLAG], rest
