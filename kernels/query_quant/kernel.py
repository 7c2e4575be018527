"""Triton kernel: quantise an index query and fold its scales into the head weights, one launch.

One program a (row, kv head): the G heads' D values are read (any strides), each head row
quantised on its own and written to a contiguous [N, Hkv, GP, D] query with its weight to
[N, Hkv, GP]; heads G..GP-1 are padding, written as zero queries with zero weights.

fp8 (IS_FP8): niah.kernels.quant.quantize_fp8's arithmetic, as the key store computes it:
amax = max(max|q|, 1e-4); scale = amax / 448 (IEEE-rounded division); q8 = e4m3(clamp(q /
scale, -448, 448)), round to nearest even; weight out = weight * scale (fp32). bf16: q rounded
to bf16 (nearest even), the weight unchanged.
"""

from __future__ import annotations

import triton
import triton.language as tl

from niah.kernels.store.kernel import _round_to_bf16_grid, _round_to_e4m3_grid


@triton.jit
def quantize_query_kernel(
    q_ptr,  # [N, Hkv, G, D] float, any strides (D contiguous)
    out_ptr,  # [N, Hkv, GP, D] e4m3 | bf16, contiguous
    w_out_ptr,  # [N, Hkv, GP] fp32, contiguous
    weight,  # fp32: the head weight every head shares
    Hkv,
    stride_n,
    stride_h,
    stride_g,
    G: tl.constexpr,
    GP: tl.constexpr,
    GB: tl.constexpr,  # next_pow2(GP): the program's head rows
    D: tl.constexpr,
    IS_FP8: tl.constexpr,
    INTERP: tl.constexpr,  # pre-round on the target grid (the interpreter's casts truncate)
):
    pid = tl.program_id(0).to(tl.int64)
    n = pid // Hkv
    h = pid % Hkv
    offs_g = tl.arange(0, GB)
    offs_d = tl.arange(0, D)
    g_ok = offs_g < G
    out_ok = offs_g < GP
    src = q_ptr + n * stride_n + h * stride_h + offs_g[:, None] * stride_g + offs_d[None, :]
    q = tl.load(src, mask=g_ok[:, None], other=0.0).to(tl.float32)  # [GB, D]
    w = tl.where(g_ok, tl.full([GB], 1.0, tl.float32) * weight, 0.0)
    dst = pid * GP * D + offs_g[:, None] * D + offs_d[None, :]
    if IS_FP8:
        amax = tl.maximum(tl.max(tl.abs(q), axis=1), 1e-4)  # [GB]
        scale = tl.math.div_rn(amax, tl.full([GB], 448.0, tl.float32))
        x = tl.math.div_rn(q, tl.broadcast_to(scale[:, None], [GB, D]))
        x = tl.minimum(tl.maximum(x, -448.0), 448.0)
        if INTERP:
            x = _round_to_e4m3_grid(x)
        tl.store(out_ptr + dst, x.to(tl.float8e4nv), mask=out_ok[:, None])
        w = w * scale
    else:
        if INTERP:
            q = _round_to_bf16_grid(q)
        tl.store(out_ptr + dst, q.to(tl.bfloat16), mask=out_ok[:, None])
    tl.store(w_out_ptr + pid * GP + offs_g, w, mask=out_ok)
