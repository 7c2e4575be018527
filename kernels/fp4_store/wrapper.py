"""store_fp4_index_keys(k, kv_cache, slot_mapping, rne=False, block_kv=None): MXFP4 quantise +
write, one launch.

k [N, D] (bf16/fp16/fp32; D a power of two >= 32); slot_mapping int32/int64 [N] (slot =
page*block_kv + offset, negative = skip); kv_cache uint8, written in place:
  [pages, block_kv, 1, D/2 + D/32]  (the DeepGEMM-style view; 68 bytes a token at D = 128), or
  [pages, block_kv * (D/2 + D/32)]  (SGLang's buffer; pass block_kv, default 64).
The page is SGLang 0.5.23's fp4 index-K page (kernel.py); rne=False is SGLang's tie rule for
DeepSeek-V4's C4 pools (the lower code), rne=True its round-half-even variant.
"""

from __future__ import annotations

import torch

from niah.kernels._common import check_device
from niah.kernels._launch import launcher_of
from niah.kernels.fp4_store.reference import fp4_row_bytes

_KERNEL = ("niah.kernels.fp4_store.kernel", "store_fp4_index_keys_kernel")


def fp4_page_layout(kv_cache: torch.Tensor, dim: int, block_kv: int | None, name: str) -> int:
    """Check an fp4 page pool (uint8, the two shapes above, page rows dense); returns block_kv."""
    per_token = fp4_row_bytes(dim)
    if kv_cache.dtype != torch.uint8:
        raise ValueError(f"{name}: kv_cache must be uint8 (fp4 pages), got {kv_cache.dtype}")
    if kv_cache.dim() == 4:
        if kv_cache.shape[2] != 1 or kv_cache.shape[3] != per_token:
            raise ValueError(f"{name}: kv_cache must be [pages, block_kv, 1, {per_token}], got {tuple(kv_cache.shape)}")
        if block_kv is not None and block_kv != kv_cache.shape[1]:
            raise ValueError(f"{name}: block_kv={block_kv} but kv_cache.shape[1]={kv_cache.shape[1]}")
        block_kv = kv_cache.shape[1]
        dense = kv_cache.stride(3) == 1 and kv_cache.stride(1) == per_token
    elif kv_cache.dim() == 2:
        block_kv = block_kv or 64
        if kv_cache.shape[1] != block_kv * per_token:
            raise ValueError(f"{name}: kv_cache must be [pages, {block_kv * per_token}] (block_kv={block_kv}), "
                             f"got {tuple(kv_cache.shape)}")
        dense = kv_cache.stride(1) == 1
    else:
        raise ValueError(f"{name}: kv_cache must be 4-D or 2-D, got {tuple(kv_cache.shape)}")
    if not dense:
        raise ValueError(f"{name}: pages must be dense (a page stride past the page is fine)")
    return block_kv


def store_fp4_index_keys(k: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                         rne: bool = False, block_kv: int | None = None) -> torch.Tensor:
    """Write k's rows into kv_cache at their slots, MXFP4 (codes + ue8m0 exponents). Returns kv_cache."""
    name = "store_fp4_index_keys"
    if k.dim() != 2:
        raise ValueError(f"{name}: k must be [N, D], got {tuple(k.shape)}")
    n, dim = k.shape
    if dim < 32 or dim & (dim - 1):
        raise ValueError(f"{name}: head dim must be a power of two >= 32, got {dim}")
    if not k.dtype.is_floating_point or k.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError(f"{name}: k must be bf16/fp16/fp32, got {k.dtype}")
    if slot_mapping.shape != (n,) or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: slot_mapping must be int32/int64 [{n}], "
                         f"got {slot_mapping.dtype} {tuple(slot_mapping.shape)}")
    block_kv = fp4_page_layout(kv_cache, dim, block_kv, name)
    check_device(k, kv_cache, slot_mapping)
    if n == 0:
        return kv_cache
    k = k if k.stride(1) == 1 else k.contiguous()
    block_t = 16
    launcher_of(*_KERNEL)(((n + block_t - 1) // block_t,),
        k, slot_mapping.contiguous(), kv_cache, n, k.stride(0), kv_cache.stride(0),
        D=dim, BLOCK_T=block_t, BLOCK_KV=block_kv, RNE=bool(rne), num_warps=4,
    )
    return kv_cache
