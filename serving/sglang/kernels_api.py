"""Find niah.kernels' public functions lazily (nothing is imported until first use).

The kernels keep DeepGEMM's argument order. They may live in niah.kernels itself or in
one of its sub-packages; `kernel(name)` looks in both and caches the answer.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

_PLACES = (
    "niah.kernels",
    "niah.kernels.paged_logits",
    "niah.kernels.mqa_logits",
    "niah.kernels.store",
    "niah.kernels.topk",
)

# Store kernel: any of these names, first found wins (see store_bf16 below for the call).
STORE_NAMES = ("store_index_k", "store_index_keys", "index_k_store", "store_keys")


class KernelMissing(RuntimeError):
    """niah.kernels does not (yet) provide a function the plugin needs."""


def _lookup(name: str):
    for place in _PLACES:
        try:
            mod = importlib.import_module(place)
        except ImportError:
            continue
        fn = getattr(mod, name, None)
        if callable(fn):
            return fn
    return None


@lru_cache(maxsize=None)
def kernel(name: str):
    """The niah.kernels function `name` (e.g. "bf16_paged_mqa_logits"), or KernelMissing."""
    fn = _lookup(name)
    if fn is None:
        raise KernelMissing(f"niah.kernels has no {name}() (looked in {', '.join(_PLACES)})")
    return fn


@lru_cache(maxsize=None)
def store_kernel():
    """The bundled key-store kernel, or None if niah.kernels has none."""
    for name in STORE_NAMES:
        fn = _lookup(name)
        if fn is not None:
            return fn
    return None


def available() -> dict[str, bool]:
    """Which of the kernels the plugin uses are present (for `niah doctor`)."""
    names = ("fp8_paged_mqa_logits", "bf16_paged_mqa_logits", "fp8_mqa_logits", "bf16_mqa_logits",
             "store_v32_index_keys", "store_v4_index_keys")
    out = {n: _lookup(n) is not None for n in names}
    out["store"] = store_kernel() is not None
    return out
