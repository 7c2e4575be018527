"""Triton kernel: V4's indexer key store (RMSNorm, RoPE, 128-wide Hadamard, fp8 or bf16 row).

One program per BLOCK_T compressed tokens, [BLOCK_T, 128] in registers. The order of every
fp32 operation is reference.py's (the warp's lane-pairwise sums and butterflies are written
as reshape + split + join, each step one exact add or subtract); launched with FP fusion off
so no product is contracted into an FMA. Plans are read on the device: no host sync, grid
from shapes only (CUDA-graph safe).
"""

from __future__ import annotations

import triton
import triton.language as tl

from niah.kernels.store.kernel import _round_to_bf16_grid, _round_to_e4m3_grid


@triton.jit
def _pair_halves(x, T: tl.constexpr, HALF: tl.constexpr):
    """[T, 2*HALF] -> [T, HALF]: x[:, j] + x[:, j + HALF] (one xor-shuffle step of the warp sum)."""
    a, b = tl.split(tl.permute(tl.reshape(x, [T, 2, HALF]), [0, 2, 1]))
    return a + b


@triton.jit
def _butterfly(x, T: tl.constexpr, N: tl.constexpr, M: tl.constexpr):
    """Hadamard stage on index bit log2(M): (a, b) -> (a + b, a - b); x [T, N*2*M]."""
    a, b = tl.split(tl.permute(tl.reshape(x, [T, N, 2, M]), [0, 1, 3, 2]))
    y = tl.permute(tl.join(a + b, a - b), [0, 1, 3, 2])
    return tl.reshape(y, [T, N * 2 * M])


@triton.jit
def _e4m3_row(x, T: tl.constexpr, INTERP: tl.constexpr):
    """[T, D] fp32 -> (values clamped to +-448 on the e4m3 grid's scale, [T] fp32 scale):
    scale = max(amax, 1e-4) / 448, values x / scale, both divisions correctly rounded."""
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4)
    scale = tl.math.div_rn(amax, tl.full([T], 448.0, tl.float32))
    inv = tl.math.div_rn(tl.full([T], 1.0, tl.float32), scale)
    q = tl.minimum(tl.maximum(x * inv[:, None], -448.0), 448.0)
    if INTERP:
        q = _round_to_e4m3_grid(q)
    return q, scale


@triton.jit
def v4_store_kernel(
    kv_ptr, plan_ptr, w_ptr, freq_ptr, loc_ptr, val_ptr, sf_ptr,
    N, n_loc, stride_kv, eps, ratio,
    IS_DECODE: tl.constexpr, BLOCK_T: tl.constexpr, PAGE: tl.constexpr, PAGE_STRIDE: tl.constexpr,
    IS_FP8: tl.constexpr, INTERP: tl.constexpr,
):
    D: tl.constexpr = 128
    pid = tl.program_id(0)
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, D)
    t_ok = offs_t < N
    seq = tl.load(plan_ptr + offs_t.to(tl.int64) * 4, mask=t_ok, other=-1).to(tl.int64) & 0xFFFFFFFF
    if IS_DECODE:
        ok = t_ok & (seq % ratio == 0)
        loc_idx = offs_t.to(tl.int64)
    else:
        ok = t_ok & (seq != 0xFFFFFFFF)
        ragged = tl.load(plan_ptr + offs_t.to(tl.int64) * 4 + 1, mask=t_ok, other=0).to(tl.int64) & 0xFFFF
        loc_idx = tl.minimum(ragged, n_loc - 1)
    slot = tl.load(loc_ptr + loc_idx, mask=ok, other=-1).to(tl.int64)
    ok = ok & (slot >= 0)
    pos = tl.where(ok, seq - ratio, 0)

    # 1. RMSNorm, the warp's summation order
    x = tl.load(kv_ptr + offs_t.to(tl.int64)[:, None] * stride_kv + offs_d[None, :],
                mask=ok[:, None], other=0.0).to(tl.float32)
    sq = tl.reshape(x * x, [BLOCK_T, 32, 2, 2])  # [t, lane, i1, i0]
    e0, e1 = tl.split(sq)  # i0 = 0 | 1
    s0, s2 = tl.split(e0)
    s1, s3 = tl.split(e1)
    s = ((s0 + s1) + s2) + s3  # [t, 32]
    s = _pair_halves(s, BLOCK_T, 16)
    s = _pair_halves(s, BLOCK_T, 8)
    s = _pair_halves(s, BLOCK_T, 4)
    s = _pair_halves(s, BLOCK_T, 2)
    s = tl.reshape(_pair_halves(s, BLOCK_T, 1), [BLOCK_T])
    mean = tl.math.div_rn(s, tl.full([BLOCK_T], 128.0, tl.float32))
    norm = tl.math.div_rn(tl.full([BLOCK_T], 1.0, tl.float32),
                          tl.math.sqrt_rn(mean + tl.full([BLOCK_T], eps, tl.float32)))
    w = tl.load(w_ptr + offs_d).to(tl.float32)
    x = (x * norm[:, None]) * w[None, :]

    # 2. RoPE on dims 64..127 (pairs 32..63), interleaved (cos, sin) per pair
    re, im = tl.split(tl.reshape(x, [BLOCK_T, 64, 2]))
    offs_p = tl.arange(0, 64)
    rope = ok[:, None] & (offs_p[None, :] >= 32)
    f_base = freq_ptr + pos[:, None] * 64 + (offs_p[None, :] - 32) * 2
    fr = tl.load(f_base, mask=rope, other=1.0)
    fi = tl.load(f_base + 1, mask=rope, other=0.0)
    re2 = tl.where(rope, re * fr - im * fi, re)
    im2 = tl.where(rope, re * fi + im * fr, im)
    x = tl.reshape(tl.join(re2, im2), [BLOCK_T, D])

    # 3. Hadamard: index bits 0..6, then the 1/sqrt(128) scale
    x = _butterfly(x, BLOCK_T, 64, 1)
    x = _butterfly(x, BLOCK_T, 32, 2)
    x = _butterfly(x, BLOCK_T, 16, 4)
    x = _butterfly(x, BLOCK_T, 8, 8)
    x = _butterfly(x, BLOCK_T, 4, 16)
    x = _butterfly(x, BLOCK_T, 2, 32)
    x = _butterfly(x, BLOCK_T, 1, 64)
    x = x * 0.08838834764831845

    # 4. store
    page = slot // PAGE
    off = slot % PAGE
    if IS_FP8:
        q, scale = _e4m3_row(x, BLOCK_T, INTERP)
        tl.store(val_ptr + page[:, None] * PAGE_STRIDE + off[:, None] * D + offs_d[None, :],
                 q.to(tl.float8e4nv), mask=ok[:, None])
        tl.store(sf_ptr + (page * PAGE_STRIDE + PAGE * D) // 4 + off, scale, mask=ok)
    else:
        if INTERP:
            x = _round_to_bf16_grid(x)
        tl.store(val_ptr + (page * (PAGE_STRIDE // 2) + off * D)[:, None] + offs_d[None, :],
                 x.to(tl.bfloat16), mask=ok[:, None])
