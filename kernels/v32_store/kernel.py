"""Triton kernel: V3.2's production indexer key store (LayerNorm, RoPE, bf16 or fp8 row).

One program per BLOCK_T tokens, [BLOCK_T, 128] in registers. The order of every fp32
operation is reference.py's, i.e. SGLang's indexer_k.cuh (the warp's lane sums and
xor-shuffle butterflies are written as reshape + split, each step one exact add); launched
with FP fusion off so no product is contracted into an FMA. No host sync, grid from
shapes only (CUDA-graph safe).
"""

from __future__ import annotations

import triton
import triton.language as tl

from niah.kernels.store.kernel import _round_to_bf16_grid
from niah.kernels.v4_store.kernel import _e4m3_row, _pair_halves


@triton.jit
def _warp_sum(v, T: tl.constexpr):
    """[T, 128] -> [T]: each lane's 4 values in order, then the butterfly (masks 16..1)."""
    q = tl.reshape(v, [T, 32, 2, 2])  # [t, lane, i1, i0]
    e0, e1 = tl.split(q)  # i0 = 0 | 1
    s0, s2 = tl.split(e0)
    s1, s3 = tl.split(e1)
    s = ((s0 + s1) + s2) + s3  # [T, 32]
    s = _pair_halves(s, T, 16)
    s = _pair_halves(s, T, 8)
    s = _pair_halves(s, T, 4)
    s = _pair_halves(s, T, 2)
    return tl.reshape(_pair_halves(s, T, 1), [T])


@triton.jit
def v32_store_kernel(
    k_ptr,  # [N, 128] bf16, row stride stride_k
    loc_ptr,  # [N] int32 | int64 slots (page * PAGE + off; < 0 = padding)
    w_ptr, b_ptr,  # [128] fp32 LayerNorm weight, bias
    cs_ptr,  # [max_pos, 64] fp32 (cos x 32 | sin x 32)
    pos_ptr,  # [N] int32 | int64
    val_ptr,  # fp8: cache bytes viewed as e4m3 | bf16: cache bytes viewed as bf16 (flat)
    sf_ptr,  # fp8: cache bytes viewed as fp32 (flat)
    N, stride_k, eps,
    BLOCK_T: tl.constexpr, PAGE: tl.constexpr, IS_FP8: tl.constexpr,
    INTERP: tl.constexpr,  # pre-round on the target grid (the interpreter's casts truncate)
):
    D: tl.constexpr = 128
    pid = tl.program_id(0)
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, D)
    t_ok = offs_t < N
    slot = tl.load(loc_ptr + offs_t, mask=t_ok, other=-1).to(tl.int64)
    ok = t_ok & (slot >= 0)
    pos = tl.load(pos_ptr + offs_t, mask=ok, other=0).to(tl.int64)
    x = tl.load(k_ptr + offs_t.to(tl.int64)[:, None] * stride_k + offs_d[None, :],
                mask=ok[:, None], other=0.0).to(tl.float32)

    # 1. LayerNorm, the warp's summation order
    d = tl.full([BLOCK_T], 128.0, tl.float32)
    mean = tl.math.div_rn(_warp_sum(x, BLOCK_T), d)
    c = x - mean[:, None]
    var = tl.math.div_rn(_warp_sum(c * c, BLOCK_T), d)
    inv_std = tl.math.div_rn(tl.full([BLOCK_T], 1.0, tl.float32),
                             tl.math.sqrt_rn(var + tl.full([BLOCK_T], eps, tl.float32)))
    w = tl.load(w_ptr + offs_d)
    b = tl.load(b_ptr + offs_d)
    x = ((c * inv_std[:, None]) * w[None, :]) + b[None, :]

    # 2. RoPE on dims 0..63 (pairs 0..31), interleaved; cos at [pos, p], sin at [pos, 32 + p]
    re, im = tl.split(tl.reshape(x, [BLOCK_T, 64, 2]))
    offs_p = tl.arange(0, 64)
    rope = ok[:, None] & (offs_p[None, :] < 32)
    cs_row = cs_ptr + pos[:, None] * 64 + offs_p[None, :]
    cos = tl.load(cs_row, mask=rope, other=1.0)
    sin = tl.load(cs_row + 32, mask=rope, other=0.0)
    re2 = tl.where(rope, re * cos - im * sin, re)
    im2 = tl.where(rope, re * sin + im * cos, im)
    x = tl.reshape(tl.join(re2, im2), [BLOCK_T, D])

    # 3. the bf16 row (the fp8 path quantises the row rounded through bf16, as the .cuh)
    if INTERP:
        x = _round_to_bf16_grid(x)
    else:
        x = x.to(tl.bfloat16).to(tl.float32)
    page = slot // PAGE
    off = slot % PAGE
    if IS_FP8:
        q, scale = _e4m3_row(x, BLOCK_T, INTERP)
        base = page * (PAGE * (D + 4))
        tl.store(val_ptr + (base + off * D)[:, None] + offs_d[None, :], q.to(tl.float8e4nv), mask=ok[:, None])
        tl.store(sf_ptr + (base + PAGE * D) // 4 + off, scale, mask=ok)
    else:
        tl.store(val_ptr + (page * (PAGE * D) + off * D)[:, None] + offs_d[None, :],
                 x.to(tl.bfloat16), mask=ok[:, None])
