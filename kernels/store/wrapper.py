"""store_index_keys(k, kv_cache, slot_mapping, ue8m0=False): quantise + write, one launch.

k [N, D] (bf16/fp16/fp32); slot_mapping int32/int64 [N] (slot = page*block_kv + offset,
negative = skip); kv_cache is written in place:
  fp8:  uint8 [pages, block_kv, 1, D+4] (DeepGEMM's view) or [pages, block_kv*(D+4)]
        (SGLang's buffer; pass block_kv, default 64)
  bf16: bfloat16 [pages, block_kv, 1, D] or [pages, block_kv*D]
"""

from __future__ import annotations

import torch

from niah.kernels._common import check_device, interpreting
from niah.kernels._launch import launcher_of

_KERNEL = ("niah.kernels.store.kernel", "store_index_keys_kernel")


def _layout(kv_cache: torch.Tensor, dim: int, block_kv: int | None) -> tuple[bool, int]:
    fp8 = kv_cache.dtype == torch.uint8
    if not fp8 and kv_cache.dtype != torch.bfloat16:
        raise ValueError(f"store_index_keys: kv_cache must be uint8 (fp8 pages) or bfloat16, got {kv_cache.dtype}")
    per_token = dim + 4 if fp8 else dim
    if kv_cache.dim() == 4:
        if kv_cache.shape[2] != 1 or kv_cache.shape[3] != per_token:
            raise ValueError(
                f"store_index_keys: kv_cache must be [pages, block_kv, 1, {per_token}], got {tuple(kv_cache.shape)}"
            )
        if block_kv is not None and block_kv != kv_cache.shape[1]:
            raise ValueError(f"store_index_keys: block_kv={block_kv} but kv_cache.shape[1]={kv_cache.shape[1]}")
        block_kv = kv_cache.shape[1]
    elif kv_cache.dim() == 2:
        block_kv = block_kv or 64
        if kv_cache.shape[1] != block_kv * per_token:
            raise ValueError(
                f"store_index_keys: kv_cache must be [pages, {block_kv * per_token}] "
                f"(block_kv={block_kv}), got {tuple(kv_cache.shape)}"
            )
    else:
        raise ValueError(f"store_index_keys: kv_cache must be 4-D or 2-D, got {tuple(kv_cache.shape)}")
    if not kv_cache.is_contiguous():
        raise ValueError("store_index_keys: kv_cache must be contiguous")
    if fp8 and block_kv % 4:
        raise ValueError(f"store_index_keys: block_kv must be a multiple of 4, got {block_kv}")
    return fp8, block_kv


def store_index_keys(k: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                     ue8m0: bool = False, block_kv: int | None = None) -> torch.Tensor:
    """Write k's rows into kv_cache at their slots (fp8: quantised with per-token scales). Returns kv_cache."""
    if k.dim() != 2:
        raise ValueError(f"store_index_keys: k must be [N, D], got {tuple(k.shape)}")
    n, dim = k.shape
    if dim < 16 or dim & (dim - 1):
        raise ValueError(f"store_index_keys: head dim must be a power of two >= 16, got {dim}")
    if not k.dtype.is_floating_point or k.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError(f"store_index_keys: k must be bf16/fp16/fp32, got {k.dtype}")
    if slot_mapping.shape != (n,) or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"store_index_keys: slot_mapping must be int32/int64 [{n}], "
            f"got {slot_mapping.dtype} {tuple(slot_mapping.shape)}"
        )
    fp8, block_kv = _layout(kv_cache, dim, block_kv)
    check_device(k, kv_cache, slot_mapping)
    if n == 0:
        return kv_cache
    k = k if k.stride(1) == 1 else k.contiguous()
    flat = kv_cache.view(-1)
    if fp8:
        val, sf = flat.view(torch.float8_e4m3fn), flat.view(torch.float32)
    else:
        val, sf = flat, flat
    block_t = 16
    launcher_of(*_KERNEL)(((n + block_t - 1) // block_t,),
        k, slot_mapping.contiguous(), val, sf, n, k.stride(0),
        D=dim, BLOCK_T=block_t, BLOCK_KV=block_kv, IS_FP8=fp8, UE8M0=bool(ue8m0),
        INTERP=interpreting(), num_warps=4,
    )
    return kv_cache
