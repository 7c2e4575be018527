"""store_v4_index_keys: V4's indexer key store in one launch, SGLang's arguments.

    store_v4_index_keys(kv, plan_bytes, is_decode, compress_ratio, norm_weight, eps,
                        freqs, out_loc, kvcache, key_dtype, page_size=64, page_stride=None)

kv [N, 128] (bf16/fp16/fp32, the compressor's output); plan_bytes uint8 [N, 16] (SGLang's
decode or prefill plan rows: CompressorDecodePlan.plan_d / CompressorPrefillPlan.plan_c);
norm_weight [128] (cast to kv's dtype, as SGLang does); freqs fp32 [max_pos, 64]
(view_as_real of SGLang's complex freqs_cis, flattened); out_loc int64;
kvcache uint8 [pages, page_stride] (contiguous), page_stride >= row_bytes * page_size (the
default), row_bytes 132 for "fp8", 256 for "bf16"; a page's rows start at its first byte.
See reference.py for the arithmetic and the layouts.
"""

from __future__ import annotations

import torch

from niah.kernels._common import check_device, interpreting
from niah.kernels._launch import launcher_of
from niah.kernels.v4_store.reference import HEAD_DIM, ROPE_DIM, ROW_BYTES

_KERNEL = ("niah.kernels.v4_store.kernel", "v4_store_kernel")


def _check(kv, plan_bytes, norm_weight, freqs, out_loc, kvcache, key_dtype, page_size, page_stride):
    if key_dtype not in ROW_BYTES:
        raise ValueError(f"store_v4_index_keys: key_dtype must be 'fp8' or 'bf16', got {key_dtype!r}")
    if kv.dim() != 2 or kv.shape[1] != HEAD_DIM or not kv.dtype.is_floating_point or kv.element_size() < 2:
        raise ValueError(f"store_v4_index_keys: kv must be float [N, {HEAD_DIM}], got {kv.dtype} {tuple(kv.shape)}")
    n = kv.shape[0]
    if plan_bytes.dtype != torch.uint8 or tuple(plan_bytes.shape) != (n, 16) or not plan_bytes.is_contiguous():
        raise ValueError(f"store_v4_index_keys: plan must be contiguous uint8 [{n}, 16], got "
                         f"{plan_bytes.dtype} {tuple(plan_bytes.shape)}")
    if norm_weight.shape != (HEAD_DIM,):
        raise ValueError(f"store_v4_index_keys: norm_weight must be [{HEAD_DIM}], got {tuple(norm_weight.shape)}")
    if freqs.dtype != torch.float32 or freqs.dim() != 2 or freqs.shape[1] != ROPE_DIM:
        raise ValueError(f"store_v4_index_keys: freqs must be fp32 [max_pos, {ROPE_DIM}], got "
                         f"{freqs.dtype} {tuple(freqs.shape)}")
    if out_loc.dim() != 1 or out_loc.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"store_v4_index_keys: out_loc must be int32/int64 [M], got {out_loc.dtype}")
    if page_size < 4 or page_size & (page_size - 1):
        raise ValueError(f"store_v4_index_keys: page_size must be a power of two >= 4, got {page_size}")
    row = ROW_BYTES[key_dtype] * page_size
    if page_stride < row or page_stride % 4:
        raise ValueError(f"store_v4_index_keys: page_stride must be a multiple of 4 >= {row}, got {page_stride}")
    if kvcache.dtype != torch.uint8 or kvcache.dim() != 2 or kvcache.shape[1] != page_stride \
            or not kvcache.is_contiguous():
        raise ValueError(f"store_v4_index_keys: {key_dtype} kvcache must be contiguous uint8 [pages, {page_stride}], "
                         f"got {kvcache.dtype} {tuple(kvcache.shape)}")
    check_device(kv, plan_bytes, norm_weight, freqs, out_loc, kvcache)


def store_v4_index_keys(kv: torch.Tensor, plan_bytes: torch.Tensor, is_decode: bool, compress_ratio: int,
                        norm_weight: torch.Tensor, eps: float, freqs: torch.Tensor, out_loc: torch.Tensor,
                        kvcache: torch.Tensor, key_dtype: str, page_size: int = 64,
                        page_stride: int | None = None) -> torch.Tensor:
    """Write the compressed keys' index rows into kvcache (in place); returns kvcache."""
    if page_stride is None:
        page_stride = ROW_BYTES.get(key_dtype, 0) * page_size
    _check(kv, plan_bytes, norm_weight, freqs, out_loc, kvcache, key_dtype, page_size, page_stride)
    n = kv.shape[0]
    if n == 0 or out_loc.numel() == 0:
        return kvcache
    kv = kv if kv.stride(1) == 1 else kv.contiguous()
    weight = norm_weight.to(kv.dtype).contiguous()
    flat = kvcache.view(-1)
    fp8 = key_dtype == "fp8"
    val = flat.view(torch.float8_e4m3fn) if fp8 else flat.view(torch.bfloat16)
    sf = flat.view(torch.float32) if fp8 else flat
    block_t = 8
    extra = {} if interpreting() else {"enable_fp_fusion": False}
    launcher_of(*_KERNEL)(((n + block_t - 1) // block_t,),
        kv, plan_bytes.view(torch.int32), weight, freqs.contiguous(), out_loc, val, sf,
        n, out_loc.numel(), kv.stride(0), float(eps), int(compress_ratio),
        IS_DECODE=bool(is_decode), BLOCK_T=block_t, PAGE=page_size, PAGE_STRIDE=page_stride, IS_FP8=fp8,
        INTERP=interpreting(), num_warps=4, **extra,
    )
    return kvcache
