"""niah.kernels' functions the plugin calls, by explicit name, found lazily (nothing is
imported until first use).

`KERNELS` names each function and the module that defines it (DeepGEMM's argument order
where DeepGEMM has one). `kernel(name)` imports exactly that module and returns exactly
that function; a name not in `KERNELS`, or a module or function that is missing, is
KernelMissing (one line naming it): the plugin never guesses another name or place.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

KERNELS: dict[str, str] = {
    "fp8_paged_mqa_logits": "niah.kernels.paged_logits.wrapper",
    "bf16_paged_mqa_logits": "niah.kernels.paged_logits.wrapper",
    "fp8_mqa_logits": "niah.kernels.mqa_logits.wrapper",
    "bf16_mqa_logits": "niah.kernels.mqa_logits.wrapper",
    "store_index_keys": "niah.kernels.store.wrapper",
    "store_v32_index_keys": "niah.kernels.v32_store.wrapper",
    "store_v4_index_keys": "niah.kernels.v4_store.wrapper",
    "topk_indices": "niah.kernels.topk.wrapper",
}
STORE_KERNEL = "store_index_keys"  # the bf16 key store (replacements.store_bf16_keys)


class KernelMissing(RuntimeError):
    """A niah.kernels function the plugin calls is missing (one line naming it)."""


@lru_cache(maxsize=None)
def kernel(name: str):
    """The niah.kernels function `name` from its module in KERNELS, or KernelMissing."""
    module = KERNELS.get(name)
    if module is None:
        raise KernelMissing(f"{name} is not one of the niah.kernels functions the plugin calls "
                            f"({', '.join(KERNELS)})")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise KernelMissing(f"niah.kernels function {name}: cannot import {module} ({type(e).__name__}: {e})"
                            .splitlines()[0]) from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise KernelMissing(f"niah.kernels function {name} is missing: {module} has no {name}()")
    return fn


def store_kernel():
    """The bf16 key-store kernel (KernelMissing if it is missing)."""
    return kernel(STORE_KERNEL)


def available() -> dict[str, str]:
    """Each kernel the plugin calls -> "yes", or why it is missing (for `niah doctor`)."""
    out = {}
    for name in KERNELS:
        try:
            kernel(name)
            out[name] = "yes"
        except KernelMissing as e:
            out[name] = f"MISSING ({e})"
    return out
