"""store_v32_index_keys: V3.2's production indexer key store in one launch.

    store_v32_index_keys(key_raw, kv_cache, loc, weight, bias, eps, cos_sin_cache, positions,
                         page_size=64, index_dtype="bf16")

SGLang 0.5.23's fused_k_indexer_norm_rope_store argument order, plus the key dtype:
key_raw bf16 [N, 128] (any row stride: SGLang passes the wk slice of a merged GEMM output);
kv_cache uint8 [pages, row_bytes * page_size] contiguous, row_bytes 132 for "fp8"
(SGLang's index_k_with_scale_buffer) and 256 for "bf16"; loc int32/int64 [N] slots
(page * page_size + offset, negative = padding, skipped); weight, bias fp32 [128] (the
LayerNorm k_norm); eps float; cos_sin_cache fp32 [max_pos, 64] (SGLang's rotary
cos_sin_cache, positions must be < max_pos: not checked on the device, as SGLang);
positions int32/int64 [N]; page_size a power of two. Writes in place, returns kv_cache.
See reference.py for the arithmetic and the layouts.
"""

from __future__ import annotations

import torch

from niah.kernels._common import check_device
from niah.kernels._launch import PlanCache, direct_ok, launcher_of
from niah.kernels.v32_store.reference import HEAD_DIM, ROPE_DIM, ROW_BYTES

_NAME = "store_v32_index_keys"
_BLOCK_T = 8
_KERNEL = ("niah.kernels.v32_store.kernel", "v32_store_kernel")
_PLANS = PlanCache()


def _plan_key(key_raw, kv_cache, loc, weight, bias, eps, cos_sin_cache, positions, page_size, index_dtype):
    """Everything the checks, the grid and the scalar arguments depend on (not the pointers)."""
    return (index_dtype, page_size, float(eps),
            *((t.shape, t.stride(), t.dtype, t.get_device())
              for t in (key_raw, kv_cache, loc, weight, bias, cos_sin_cache, positions)))


def _check(key_raw, kv_cache, loc, weight, bias, cos_sin_cache, positions, page_size, index_dtype):
    if index_dtype not in ROW_BYTES:
        raise ValueError(f"{_NAME}: index_dtype must be 'bf16' or 'fp8', got {index_dtype!r}")
    if key_raw.dtype != torch.bfloat16 or key_raw.dim() != 2 or key_raw.shape[1] != HEAD_DIM \
            or key_raw.stride(1) != 1:
        raise ValueError(f"{_NAME}: key_raw must be bf16 [N, {HEAD_DIM}] with unit column stride, "
                         f"got {key_raw.dtype} {tuple(key_raw.shape)} strides {tuple(key_raw.stride())}")
    n = key_raw.shape[0]
    for label, t in (("loc", loc), ("positions", positions)):
        if t.shape != (n,) or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{_NAME}: {label} must be int32/int64 [{n}], got {t.dtype} {tuple(t.shape)}")
    for label, t in (("weight", weight), ("bias", bias)):
        if t.shape != (HEAD_DIM,) or t.dtype != torch.float32:
            raise ValueError(f"{_NAME}: {label} must be float32 [{HEAD_DIM}], got {t.dtype} {tuple(t.shape)}")
    if cos_sin_cache.dtype != torch.float32 or cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != ROPE_DIM \
            or not cos_sin_cache.is_contiguous():
        raise ValueError(f"{_NAME}: cos_sin_cache must be contiguous float32 [max_pos, {ROPE_DIM}], "
                         f"got {cos_sin_cache.dtype} {tuple(cos_sin_cache.shape)}")
    if page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"{_NAME}: page_size must be a power of two, got {page_size}")
    row = ROW_BYTES[index_dtype] * page_size
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 2 or kv_cache.shape[1] != row \
            or not kv_cache.is_contiguous():
        raise ValueError(f"{_NAME}: a {index_dtype} kv_cache must be contiguous uint8 [pages, {row}] "
                         f"({ROW_BYTES[index_dtype]} bytes x {page_size} tokens), got {kv_cache.dtype} "
                         f"{tuple(kv_cache.shape)}")
    check_device(key_raw, kv_cache, loc, weight, bias, cos_sin_cache, positions)


def store_v32_index_keys(key_raw: torch.Tensor, kv_cache: torch.Tensor, loc: torch.Tensor,
                         weight: torch.Tensor, bias: torch.Tensor, eps: float, cos_sin_cache: torch.Tensor,
                         positions: torch.Tensor, page_size: int = 64, index_dtype: str = "bf16") -> torch.Tensor:
    """LayerNorm + RoPE (no rotation) the raw index keys and write their bf16 or fp8 rows into kv_cache.

    A call whose shapes, strides, dtypes, devices, eps, page size and key dtype were served
    before, with every pointer 16-byte aligned, goes straight to its bound compiled launch
    (kernels/_launch.py); any other call is checked and launched through DirectLauncher."""
    key = _plan_key(key_raw, kv_cache, loc, weight, bias, eps, cos_sin_cache, positions, page_size, index_dtype)
    plan = _PLANS.get(key)
    if plan is not None and direct_ok():
        ptrs = (key_raw.data_ptr(), loc.data_ptr(), weight.data_ptr(), bias.data_ptr(), cos_sin_cache.data_ptr(),
                positions.data_ptr(), kv_cache.data_ptr())
        if not (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | ptrs[5] | ptrs[6]) & 15:
            plan(key[4][3], *ptrs, ptrs[6])  # values and scales: two views of the same pool
            return kv_cache
    _check(key_raw, kv_cache, loc, weight, bias, cos_sin_cache, positions, page_size, index_dtype)
    n = key_raw.shape[0]
    if n == 0:
        return kv_cache
    flat = kv_cache.view(-1)
    fp8 = index_dtype == "fp8"
    val = flat.view(torch.float8_e4m3fn) if fp8 else flat.view(torch.bfloat16)
    sf = flat.view(torch.float32) if fp8 else flat
    launch = launcher_of(*_KERNEL)
    interp = not launch.compiled_mode
    extra = {} if interp else {"enable_fp_fusion": False}
    contiguous = all(t.is_contiguous() for t in (loc, weight, bias, positions))
    grid = ((n + _BLOCK_T - 1) // _BLOCK_T,)
    args = (key_raw, loc.contiguous(), weight.contiguous(), bias.contiguous(), cos_sin_cache,
            positions.contiguous(), val, sf, n, key_raw.stride(0), float(eps))
    meta = dict(BLOCK_T=_BLOCK_T, PAGE=page_size, IS_FP8=fp8, INTERP=interp, num_warps=4, **extra)
    launch(grid, *args, **meta)
    if contiguous:  # the fast path's pointer order: key_raw, loc, weight, bias, cos_sin, positions, val, sf
        _PLANS.put(key, launch.bind(grid, args, meta))
    return kv_cache
