"""SGLang 0.5.23's DeepSeek-V4 fp4 index-key Triton code, imported from the wheel's own source
files so that tests run it under TRITON_INTERPRET=1 on CPU tensors.

`fp4_quant()` is `sglang.kernels.ops.quantization.fp4_indexer_quant` (its quantiser kernels and
`quantize_fp4_indexer_tensor`); `fp4_store()` is `sglang.kernels.ops.kvcache.dsv4_fp4_index_k_cache`
(the paged store and gather). Each module's text is written unchanged to a temporary file (Triton
reads a kernel's source from its file) and imported under a private name. Its imports of other
SGLang modules resolve, for the duration of the import only, to: the lifted quantiser module
itself; `get_platform()` from `sglang.srt.runtime_context` (a stand-in reporting the platform the
test names: `is_blackwell` decides which of SGLang's two quantiser kernels runs); and
`INDEX_K_SLOT_BYTES` from `attention/dsv4/fp4_indexer.py`, read out of that file's text
(68 = 64 + 4; the rest of that module needs SGLang's JIT build). Nothing else is replaced.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tempfile
import types
from pathlib import Path

from sglang_source import module_source, sglang_wheel

QUANT = "sglang.kernels.ops.quantization.fp4_indexer_quant"
STORE = "sglang.kernels.ops.kvcache.dsv4_fp4_index_k_cache"
READ = "sglang.kernels.ops.attention.dsv4.fp4_indexer"

_DIR = Path(tempfile.mkdtemp(prefix="niah-sglang-fp4-"))
_CACHE: dict = {}


class Platform:
    """The one attribute SGLang's fp4 quantiser asks of its platform."""

    def __init__(self, is_blackwell: bool):
        self.is_blackwell = is_blackwell


def _import(module: str, stubs: dict[str, types.ModuleType]) -> types.ModuleType:
    path = _DIR / (module.replace(".", "_") + ".py")
    path.write_text(module_source(sglang_wheel(), module))
    spec = importlib.util.spec_from_file_location(f"_sglang_wheel_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    # only the stand-ins come and go: modules the import loads for real (triton) stay loaded
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        spec.loader.exec_module(mod)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return mod


def fp4_quant(platform: Platform | None = None) -> types.ModuleType:
    """SGLang's fp4_indexer_quant module; `platform` is what its get_platform() returns
    (default: not Blackwell, SGLang's one-token-a-program kernel)."""
    holder = _CACHE.setdefault("platform", [Platform(False)])
    if platform is not None:
        holder[0] = platform
    if "quant" not in _CACHE:
        runtime = types.ModuleType("sglang.srt.runtime_context")
        runtime.get_platform = lambda: holder[0]
        _CACHE["quant"] = _import(QUANT, {"sglang.srt.runtime_context": runtime})
    return _CACHE["quant"]


def slot_bytes() -> int:
    """INDEX_K_SLOT_BYTES as fp4_indexer.py defines it (payload + scale bytes)."""
    text = module_source(sglang_wheel(), READ)
    payload = int(re.search(r"INDEX_K_PAYLOAD_BYTES = tl\.constexpr\((\d+)\)", text).group(1))
    scale = int(re.search(r"INDEX_K_SCALE_BYTES = tl\.constexpr\((\d+)\)", text).group(1))
    assert "INDEX_K_SLOT_BYTES = INDEX_K_PAYLOAD_BYTES.value + INDEX_K_SCALE_BYTES.value" in text
    return payload + scale


def fp4_store() -> types.ModuleType:
    """SGLang's dsv4_fp4_index_k_cache module (store_fp4_index_k_cache, gather_fp4_index_k)."""
    if "store" not in _CACHE:
        read = types.ModuleType(READ)
        read.INDEX_K_SLOT_BYTES = slot_bytes()
        _CACHE["store"] = _import(STORE, {READ: read, QUANT: fp4_quant()})
    return _CACHE["store"]
