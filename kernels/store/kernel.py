"""Triton kernel: quantise index keys and write them into their pages, one launch.

fp8 page (SGLang / DeepGEMM): [BLOCK_KV x D e4m3, token-major][BLOCK_KV fp32 scales];
token `off` of page `p` has its values at byte p*BLOCK_KV*(D+4) + off*D and its scale
at byte p*BLOCK_KV*(D+4) + BLOCK_KV*D + 4*off. bf16 page: [BLOCK_KV, D] bf16.
slot = page * BLOCK_KV + off; a negative slot is padding and is skipped.

The arithmetic is niah.kernels.quant's: amax = max(max|k|, 1e-4); scale = amax / 448
(IEEE-rounded division); ue8m0 rounds the scale up to a power of two (exponent bits,
exact); k8 = e4m3(clamp(k / scale, -448, 448)), round to nearest even.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _round_to_e4m3_grid(x):
    """Round fp32 x (|x| <= 448) to the nearest e4m3 value, ties to even, in fp32 arithmetic.
    The interpreter's fp32 -> fp8 cast does not round correctly; an exact value casts fine."""
    bits = x.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)  # subnormals share the quantum of the smallest normal
    quantum = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    y = x / quantum  # exact: power-of-two division
    r = (y + 12582912.0) - 12582912.0  # 1.5 * 2**23: round half to even for |y| < 2**22
    out = r * quantum
    return tl.where(out == 0.0, x * 0.0, out)  # a value rounded to zero keeps its sign (-0), as the cast does


@triton.jit
def _round_to_bf16_grid(x):
    """Round fp32 x to the nearest bf16 value, ties to even (interpreter only, as above)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def store_index_keys_kernel(
    k_ptr,  # [N, D] float
    slot_ptr,  # [N] int32 | int64
    val_ptr,  # fp8: cache bytes viewed as e4m3, flat | bf16: cache, flat
    sf_ptr,  # fp8: cache bytes viewed as fp32, flat
    N,
    stride_k,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    IS_FP8: tl.constexpr,
    UE8M0: tl.constexpr,
    INTERP: tl.constexpr,  # pre-round on the target grid (the interpreter's casts truncate)
):
    pid = tl.program_id(0)
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, D)
    t_ok = offs_t < N
    slot = tl.load(slot_ptr + offs_t, mask=t_ok, other=-1).to(tl.int64)
    ok = t_ok & (slot >= 0)
    page = slot // BLOCK_KV
    off = slot % BLOCK_KV
    k = tl.load(k_ptr + offs_t.to(tl.int64)[:, None] * stride_k + offs_d[None, :], mask=ok[:, None], other=0.0)
    k = k.to(tl.float32)  # [BLOCK_T, D]
    if IS_FP8:
        amax = tl.maximum(tl.max(tl.abs(k), axis=1), 1e-4)  # [BLOCK_T]
        scale = tl.math.div_rn(amax, tl.full([BLOCK_T], 448.0, tl.float32))
        if UE8M0:
            bits = scale.to(tl.int32, bitcast=True)
            expo = (bits >> 23) & 0xFF
            expo = tl.where((bits & 0x7FFFFF) != 0, expo + 1, expo)
            scale = (expo << 23).to(tl.float32, bitcast=True)
        x = tl.math.div_rn(k, tl.broadcast_to(scale[:, None], [BLOCK_T, D]))
        x = tl.minimum(tl.maximum(x, -448.0), 448.0)
        if INTERP:
            x = _round_to_e4m3_grid(x)
        page_bytes = BLOCK_KV * (D + 4)
        tl.store(val_ptr + page[:, None] * page_bytes + off[:, None] * D + offs_d[None, :],
                 x.to(tl.float8e4nv), mask=ok[:, None])
        tl.store(sf_ptr + (page * page_bytes + BLOCK_KV * D) // 4 + off, scale, mask=ok)
    else:
        if INTERP:
            k = _round_to_bf16_grid(k)
        tl.store(val_ptr + (page * BLOCK_KV + off)[:, None] * D + offs_d[None, :],
                 k.to(tl.bfloat16), mask=ok[:, None])
