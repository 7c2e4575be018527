"""Install niah's patches into a live SGLang process.

SGLang 0.5.23 runs entry-point plugins (group `sglang.srt.plugins`) in every process
it starts, the spawned scheduler/model processes included; niah registers
`sglang_plugin` there (pyproject.toml). It does nothing unless NIAH_INDEX_DTYPE is
set, which the launch entry (`python -m niah.serving.sglang`) does, with NIAH_KERNELS.
Before patching anything it checks the contract against the installed modules and
refuses, naming the version and the symbol, if SGLang does not match. Any failure while
patching stops the process with one line naming the symbol (fail closed).

Arms (index dtype / kernels): fp8/niah (SGLang's fp8 keys read by niah's fp8 logits
kernels), bf16/niah (niah's bf16 index keys and kernels). fp8/stock is SGLang alone: niah's
launcher starts plain `sglang.launch_server` without NIAH_* variables, so the plugin does
not run there (installing it for fp8/stock by hand only counts calls). In every arm SGLang
keeps its fused indexer, prefill CUDA graphs, its fp8 query and its own top-k. Patches are listed per model family (`FAMILIES`), each a
`Patch(target, when, factory)`; `when` is "always", an index dtype or a kernels value.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import types
from dataclasses import dataclass
from typing import Callable

from niah.errors import BadInput

log = logging.getLogger("niah.sglang")

ENV_INDEX_DTYPE = "NIAH_INDEX_DTYPE"
ENV_KERNELS = "NIAH_KERNELS"
# Index-key dtypes the plugin serves (niah.kernels.quant.INDEX_DTYPES: what the key store holds).
SGLANG_INDEX_DTYPES = ("fp8", "bf16")
KERNELS = ("stock", "niah")
ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_NAME = "niah"

_installed: tuple[str, str] | None = None


class PluginRefused(BadInput):
    """The installed SGLang does not match what the plugin patches, or patching failed."""


@dataclass(frozen=True)
class Patch:
    """Replace/wrap `target` with `factory(original)` when `when` is "always", the index
    dtype or the kernels value. Every target is a contract PatchPoint."""

    target: str
    when: str
    factory: Callable


def _const(fn):
    return lambda original: fn


def _server_patches(r) -> list[Patch]:
    """Model-independent: attestation in /server_info; SGLang's own top-k, counted."""
    sched = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
    return [
        Patch(f"{sched}.get_internal_state", "always", r.wrap_internal_state),
        Patch("sglang.srt.layers.attention.dsa.dsa_topk_backend.DSATopKBackend.topk_transform", "always",
              r.wrap_topk_transform),
    ]


def _v32_patches(r) -> list[Patch]:
    """DeepSeek-V3.2 (DSA indexer), in SGLang's default (fused) paths."""
    from niah.serving.sglang import v32

    dsa = "sglang.srt.layers.attention.dsa"
    idx = f"{dsa}.dsa_indexer.Indexer"
    ikc = "sglang.srt.mem_cache.index_key_cache.IndexKeyCache"
    return [
        Patch(f"{dsa}.utils.resolve_fp8_paged_mqa_logits_fn", "niah", _const(r.resolve_fp8_paged_mqa_logits_fn)),
        Patch(f"{dsa}.utils.resolve_fp8_mqa_logits_fn", "niah", _const(r.resolve_fp8_mqa_logits_fn)),
        Patch(f"{idx}._fused_k_prepare_and_store", "bf16", v32.fused_k_store_bf16),
        Patch(f"{idx}._fused_k_prepare_and_store", "fp8", v32.counting_fp8_store("sglang.fused_k_indexer_norm_rope_store")),
        Patch(f"{idx}._store_index_k_cache", "bf16", v32.store_index_k_cache_bf16),
        Patch(f"{idx}._store_index_k_cache", "fp8", v32.counting_fp8_store("sglang.Indexer._store_index_k_cache")),
        Patch(f"{idx}._get_topk_paged", "bf16", v32.topk_paged_bf16),
        Patch(f"{ikc}._buffer_shape", "bf16", _const(r.index_key_cache_buffer_shape)),
        Patch(f"{ikc}._buffer_shape", "fp8", r.wrap_buffer_shape),
        Patch(f"{ikc}.get_k_and_scale", "bf16", _const(r.index_key_cache_get_k_and_scale)),
        Patch(f"{ikc}.store_quantized", "bf16", _const(r.index_key_cache_store_quantized)),
        Patch(f"{ikc}.move", "bf16", _const(r.index_key_cache_move)),
        Patch("sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator._compute_dsa_indexer_cell_size",
              "bf16", r.wrap_indexer_cell_size),
    ]


def _v4_patches(r) -> list[Patch]:
    """DeepSeek-V4 (C4 indexer): niah arms read pages through niah's kernels on the path SGLang
    picks (DeepGEMM's functions are routed to niah's where the V4 pool is built, see
    v4.route_deep_gemm); bf16 keys are stored by niah's V4 store kernel into bf16-sized pools
    and gathered as bf16 for the non-paged prefill; every other fp8 path is refused."""
    from niah.serving.sglang import v4

    dsv4 = "sglang.srt.layers.attention.dsv4"
    pool = "sglang.srt.mem_cache.deepseek_v4_memory_pool"
    ipool = f"{pool}.DeepSeekV4IndexerPool"
    return [
        Patch(f"{dsv4}.indexer.fp8_paged_mqa_logits_torch", "niah", _const(v4.paged_logits)),
        Patch(f"{dsv4}.indexer.fp8_paged_mqa_logits_torch_sm120", "niah", _const(v4.paged_logits)),
        Patch(f"{pool}.DeepSeekV4TokenToKVPool.__init__", "niah", v4.wrap_pool_init),
        Patch(f"{pool}.get_dsv4_indexer_bytes_per_token", "bf16", v4.wrap_bytes_per_token),
        Patch(f"{ipool}._create_buffer", "bf16", v4.wrap_create_buffer),
        Patch(f"{ipool}.set_index_k_scale_buffer", "bf16", _const(v4.refuse_set_index_k_scale_buffer)),
        Patch(f"{ipool}.set_index_fused", "bf16", _const(v4.refuse_set_index_fused)),
        Patch(f"{ipool}.set_index_fp4", "bf16", _const(v4.refuse_set_index_fp4)),
        Patch(f"{ipool}.get_index_k_scale_buffer", "bf16", _const(v4.gather_bf16_index_k)),
        Patch(f"{dsv4}.compressor_v2.compress_norm_rope_store", "bf16", v4.wrap_compress_norm_rope_store),
    ]


FAMILIES: tuple[Callable, ...] = (_server_patches, _v32_patches, _v4_patches)


def all_patches() -> list[Patch]:
    from niah.serving.sglang import replacements as r

    return [p for family in FAMILIES for p in family(r)]


def installed_arm() -> tuple[str, str] | None:
    """(index dtype, kernels) the plugin was installed with in this process (None: not installed)."""
    return _installed


def check_arm(index_dtype: str, kernels: str) -> None:
    if index_dtype not in SGLANG_INDEX_DTYPES:
        raise BadInput(f"unknown index dtype {index_dtype!r}; expected one of {', '.join(SGLANG_INDEX_DTYPES)}")
    if kernels not in KERNELS:
        raise BadInput(f"unknown kernels {kernels!r}; expected one of {', '.join(KERNELS)}")
    if index_dtype == "bf16" and kernels != "niah":
        raise BadInput("bf16 index keys run on niah's kernels only (kernels = \"niah\")")


def default_kernels(index_dtype: str) -> str:
    return "niah" if index_dtype == "bf16" else "stock"


def patches_for(index_dtype: str, kernels: str) -> list[Patch]:
    """The patches installed for one arm."""
    return [p for p in all_patches() if p.when in ("always", index_dtype, kernels)]


def patch_targets(index_dtype: str, kernels: str | None = None) -> list[str]:
    """The targets patched for one arm (for docs, doctor and tests)."""
    return [p.target for p in patches_for(index_dtype, kernels or default_kernels(index_dtype))]


def _split_target(target: str) -> tuple[str, list[str]]:
    """'pkg.mod.Class.meth' -> ('pkg.mod', ['Class', 'meth']) using the contract's modules."""
    from niah.serving.sglang.contract import PATCH_POINTS

    for p in PATCH_POINTS:
        if p.target == target:
            return p.module, p.qualname.split(".")
    raise KeyError(f"{target} is not in the plugin contract")


def _propagate(original, new, skip, target: str) -> None:
    """Rebind `from X import name` copies of `original` in every loaded module. A copy
    that cannot be rebound would keep calling SGLang's original: PluginRefused."""
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
                except Exception as e:
                    raise PluginRefused(
                        f"cannot patch {target}: its copy {getattr(mod, '__name__', mod)}.{name} cannot be "
                        f"rebound ({type(e).__name__}: {e}), so that module would still call SGLang's original"
                    ) from None


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
        _propagate(original, new, owner, target)
    log.info("niah: patched %s", target)


def apply_all(patches: list[Patch]) -> None:
    """Apply every patch; the first failure of any kind becomes PluginRefused naming it."""
    for p in patches:
        try:
            module, parts = _split_target(p.target)
            apply_at(module, ".".join(parts), p.factory)
        except PluginRefused:
            raise
        except Exception as e:  # fail closed: a half-patched server must not serve
            raise PluginRefused(f"patching {p.target} failed: {type(e).__name__}: {e}") from e


def install(index_dtype: str, kernels: str | None = None) -> None:
    """Check the contract against the installed SGLang, then patch. Idempotent."""
    global _installed
    from niah.serving.sglang import attest
    from niah.serving.sglang.contract import LiveSource, check_contract, points_for

    kernels = kernels or default_kernels(index_dtype)
    check_arm(index_dtype, kernels)
    if _installed == (index_dtype, kernels):
        return
    if _installed is not None:
        raise BadInput(f"niah plugin already installed as {'/'.join(_installed)}")
    source = LiveSource()
    if source.version is None:
        raise PluginRefused("SGLang is not installed in this environment (pip install sglang==0.5.23)")
    try:
        report = check_contract(source, points_for(index_dtype, kernels))
    except Exception as e:
        raise PluginRefused(f"contract check failed: {type(e).__name__}: {e}") from e
    if not report.ok:
        raise PluginRefused(report.summary())
    if report.build_note:
        log.info("niah: %s", report.build_note)
    attest.configure(index_dtype, kernels)
    attest.set_facts(query="fp8")  # SGLang's own fp8 indexer query in every arm (bf16 kernels: upcast, exact)
    apply_all(patches_for(index_dtype, kernels))
    _installed = (index_dtype, kernels)
    log.info("niah: SGLang plugin installed (sglang %s, %s/%s)", source.version, index_dtype, kernels)


def sglang_plugin() -> None:
    """Entry point for SGLang's plugin loader: install iff NIAH_INDEX_DTYPE is set.

    SGLang logs and swallows plugin exceptions, so any failure here is printed as one
    line and the process exits (code 2) before the model loads: serving with half a
    plugin would give wrong recall numbers.
    """
    dtype = os.environ.get(ENV_INDEX_DTYPE)
    if not dtype:
        return
    try:
        install(dtype, os.environ.get(ENV_KERNELS) or None)
    except Exception as e:
        msg = str(e) if isinstance(e, BadInput) else f"{type(e).__name__}: {e}"
        print(f"niah: error: {msg}".splitlines()[0], file=sys.stderr, flush=True)
        os._exit(2)


def entry_point_registered() -> bool:
    """Whether SGLang's loader will find this plugin (niah pip-installed in this env)."""
    from importlib.metadata import entry_points

    return any(ep.name == ENTRY_POINT_NAME and ep.value.startswith("niah.serving.sglang")
               for ep in entry_points(group=ENTRY_POINT_GROUP))
