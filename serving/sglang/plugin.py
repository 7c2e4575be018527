"""Install niah's patches into a live SGLang process.

SGLang 0.5.23 runs entry-point plugins (group `sglang.srt.plugins`) in every process
it starts, the spawned scheduler/model processes included; niah registers
`sglang_plugin` there (pyproject.toml). It does nothing unless NIAH_INDEX_DTYPE is
set, which the launch entry (`python -m niah.serving.sglang`) does. Before patching
anything it checks the contract against the installed modules and refuses, naming the
version and the symbol, if SGLang does not match.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import types
from typing import Callable

from niah.errors import BadInput

log = logging.getLogger("niah.sglang")

ENV_INDEX_DTYPE = "NIAH_INDEX_DTYPE"
# Index-key dtypes the plugin serves (niah.kernels.quant.INDEX_DTYPES: what the key store holds).
SGLANG_INDEX_DTYPES = ("fp8", "bf16")
ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_NAME = "niah"

_installed: str | None = None


class PluginRefused(BadInput):
    """The installed SGLang does not match what the plugin patches."""


def _replacements() -> dict[str, tuple[str, Callable]]:
    """target -> (when, factory(original) -> replacement). Every target is a PatchPoint."""
    from niah.serving.sglang import replacements as r

    const = lambda fn: (lambda original: fn)  # noqa: E731
    dsa = "sglang.srt.layers.attention.dsa"
    ikc = "sglang.srt.mem_cache.index_key_cache.IndexKeyCache"
    return {
        f"{dsa}.utils.resolve_fp8_paged_mqa_logits_fn": ("always", const(r.resolve_fp8_paged_mqa_logits_fn)),
        f"{dsa}.utils.resolve_fp8_mqa_logits_fn": ("always", const(r.resolve_fp8_mqa_logits_fn)),
        "sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch":
            ("always", const(r.v4_paged_mqa_logits)),
        "sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch_sm120":
            ("always", const(r.v4_paged_mqa_logits)),
        f"{dsa}.dsa_indexer.Indexer._get_topk_paged": ("bf16", const(r.indexer_get_topk_paged)),
        f"{dsa}.dsa_indexer.Indexer._store_index_k_cache": ("bf16", const(r.indexer_store_index_k_cache)),
        f"{ikc}._buffer_shape": ("bf16", const(r.index_key_cache_buffer_shape)),
        f"{ikc}.get_k_and_scale": ("bf16", const(r.index_key_cache_get_k_and_scale)),
        f"{ikc}.store_quantized": ("bf16", const(r.index_key_cache_store_quantized)),
        f"{ikc}.move": ("bf16", const(r.index_key_cache_move)),
        "sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator._compute_dsa_indexer_cell_size":
            ("bf16", r.wrap_indexer_cell_size),
        "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4TokenToKVPool.__init__":
            ("bf16", r.wrap_refuse_v4),
    }


def patch_targets(index_dtype: str) -> list[str]:
    """The targets patched for one index dtype (for docs, doctor and tests)."""
    return [t for t, (when, _) in _replacements().items() if when in ("always", index_dtype)]


def _split_target(target: str) -> tuple[str, list[str]]:
    """'pkg.mod.Class.meth' -> ('pkg.mod', ['Class', 'meth']) using the contract's modules."""
    from niah.serving.sglang.contract import PATCH_POINTS

    for p in PATCH_POINTS:
        if p.target == target:
            return p.module, p.qualname.split(".")
    raise KeyError(f"{target} is not in the plugin contract")


def _propagate(original, new, skip) -> None:
    """Rebind `from X import name` copies of `original` in every loaded module."""
    for mod in list(sys.modules.values()):
        if mod is None or mod is skip or not isinstance(mod, types.ModuleType):
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        for name, value in items:
            if value is original:
                try:
                    setattr(mod, name, new)
                except (AttributeError, TypeError):
                    pass


def _apply(target: str, factory: Callable) -> None:
    module, parts = _split_target(target)
    apply_at(module, ".".join(parts), factory)


def apply_at(module: str, qualname: str, factory: Callable) -> None:
    """Replace `module.qualname` by `factory(original)`: keeps staticmethod/classmethod,
    rebinds `from module import name` copies elsewhere, and never patches twice."""
    target = f"{module}.{qualname}"
    parts = qualname.split(".")
    owner = importlib.import_module(module)
    for part in parts[:-1]:
        owner = getattr(owner, part)
    name = parts[-1]
    raw = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if raw is None:
        raise PluginRefused(f"{target} vanished between the contract check and patching")
    original = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    if getattr(original, "__niah__", False):
        return
    new = factory(original)
    new.__niah__ = True
    if isinstance(raw, staticmethod):
        new = staticmethod(new)
    elif isinstance(raw, classmethod):
        new = classmethod(new)
    setattr(owner, name, new)
    if not isinstance(owner, type):
        _propagate(original, new, owner)
    log.info("niah: patched %s", target)


def install(index_dtype: str) -> None:
    """Check the contract against the installed SGLang, then patch. Idempotent."""
    global _installed
    from niah.serving.sglang.contract import LiveSource, check_contract, points_for

    if index_dtype not in SGLANG_INDEX_DTYPES:
        raise BadInput(f"unknown index dtype {index_dtype!r}; expected one of {', '.join(SGLANG_INDEX_DTYPES)}")
    if _installed == index_dtype:
        return
    if _installed is not None:
        raise BadInput(f"niah plugin already installed with index dtype {_installed}")
    source = LiveSource()
    if source.version is None:
        raise PluginRefused("SGLang is not installed in this environment (pip install sglang==0.5.23)")
    report = check_contract(source, points_for(index_dtype))
    if not report.ok:
        raise PluginRefused(report.summary())
    for target, (when, factory) in _replacements().items():
        if when in ("always", index_dtype):
            _apply(target, factory)
    _installed = index_dtype
    log.info("niah: SGLang plugin installed (sglang %s, index dtype %s)", source.version, index_dtype)


def sglang_plugin() -> None:
    """Entry point for SGLang's plugin loader: install iff NIAH_INDEX_DTYPE is set.

    SGLang logs and swallows plugin exceptions, so a refusal here is also printed and
    the process exits: serving with half a plugin would give wrong recall numbers.
    """
    dtype = os.environ.get(ENV_INDEX_DTYPE)
    if not dtype:
        return
    try:
        install(dtype)
    except BadInput as e:
        print(f"niah: error: {e}", file=sys.stderr, flush=True)
        os._exit(e.exit_code)


def entry_point_registered() -> bool:
    """Whether SGLang's loader will find this plugin (niah pip-installed in this env)."""
    from importlib.metadata import entry_points

    return any(ep.name == ENTRY_POINT_NAME and ep.value.startswith("niah.serving.sglang")
               for ep in entry_points(group=ENTRY_POINT_GROUP))
