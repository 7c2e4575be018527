"""Triton kernel: ragged (prefill) index logits over fp4 (MXFP4) keys.

    logits[i, n] = sum_h w[i, h] * relu(q[i, h, :] . k[n, :]),   ks[i] <= n < ke[i]

k[n] is the dequantised MXFP4 key (codes [Skv, D/2], exponents [Skv, D/32]); q is bf16 or
MXFP4. One program = one tile of BLOCK_N keys x BLOCK_Q queries, as the fp8/bf16 kernel
(kernels/mqa_logits): the key tile is decoded once in registers into its even and odd
elements (exact bf16 values), then each query is scored as q_even . k_even + q_odd . k_odd
on the bf16 tensor cores (fp32 in the interpreter). Tiles outside every query's [ks, ke)
window are skipped (only -inf is written, with CLEAN).
"""

from __future__ import annotations

import triton
import triton.language as tl

from niah.kernels._fp4 import fp4_halves


@triton.jit
def fp4_mqa_logits_kernel(
    q_ptr,  # Q_FP4: codes uint8 [S, H, D/2] | bf16 [S, H, D]; contiguous
    qe_ptr,  # Q_FP4: exponents uint8 [S, H, D/32]; else unused
    kc_ptr,  # key codes uint8 [Skv, D/2], contiguous
    ke8_ptr,  # key exponents uint8 [Skv, D/32], contiguous
    w_ptr,  # [S, H] fp32, contiguous
    ks_ptr,  # [S] int32
    ke_ptr,  # [S] int32
    out_ptr,  # [S, Skv] fp32, row stride stride_out
    S,
    Skv,
    H,
    stride_out,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    Q_FP4: tl.constexpr,
    CLEAN: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter: decode to fp32 and dot in fp32
    FP8_CVT: tl.constexpr,  # decode through the fp8 conversion (_fp4.e2m1_value)
):
    OUT: tl.constexpr = tl.float32 if UPCAST else tl.bfloat16
    n0 = tl.program_id(0) * BLOCK_N
    q0 = tl.program_id(1) * BLOCK_Q
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_b = tl.arange(0, D // 2)
    offs_h = tl.arange(0, BLOCK_H)
    offs_qb = q0 + tl.arange(0, BLOCK_Q)
    h_ok = offs_h < H
    col_ok = offs_n < Skv
    ks_b = tl.load(ks_ptr + offs_qb, mask=offs_qb < S, other=2147483647)
    ke_b = tl.load(ke_ptr + offs_qb, mask=offs_qb < S, other=0)
    live = (n0 < tl.max(ke_b, axis=0)) & (n0 + BLOCK_N > tl.min(ks_b, axis=0))
    if live:
        kn = offs_n.to(tl.int64)
        codes = tl.load(kc_ptr + kn[:, None] * (D // 2) + offs_b[None, :], mask=col_ok[:, None], other=0)
        exps = tl.load(ke8_ptr + kn[:, None] * (D // 32) + (offs_b // 16)[None, :], mask=col_ok[:, None], other=127)
        k_even, k_odd = fp4_halves(codes, exps, OUT, FP8_CVT)  # [BLOCK_N, D/2]
        for qq in range(0, BLOCK_Q):
            qi = tl.minimum(q0 + qq, S - 1)
            q_ok = q0 + qq < S
            ks = tl.load(ks_ptr + qi)
            ke = tl.load(ke_ptr + qi)
            qrow = qi.to(tl.int64) * H + offs_h
            if Q_FP4:
                qc = tl.load(q_ptr + qrow[:, None] * (D // 2) + offs_b[None, :], mask=h_ok[:, None], other=0)
                qx = tl.load(qe_ptr + qrow[:, None] * (D // 32) + (offs_b // 16)[None, :], mask=h_ok[:, None],
                             other=127)
                q_even, q_odd = fp4_halves(qc, qx, OUT, FP8_CVT)
            else:
                q_even = tl.load(q_ptr + qrow[:, None] * D + 2 * offs_b[None, :], mask=h_ok[:, None],
                                 other=0.0).to(OUT)
                q_odd = tl.load(q_ptr + qrow[:, None] * D + 2 * offs_b[None, :] + 1, mask=h_ok[:, None],
                                other=0.0).to(OUT)
            w = tl.load(w_ptr + qi.to(tl.int64) * H + offs_h, mask=h_ok, other=0.0)
            s = tl.dot(k_even, tl.trans(q_even)) + tl.dot(k_odd, tl.trans(q_odd))  # [BLOCK_N, BLOCK_H]
            logits = tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1)
            logits = tl.where((offs_n >= ks) & (offs_n < ke), logits, float("-inf"))
            tl.store(out_ptr + qi.to(tl.int64) * stride_out + offs_n, logits, mask=col_ok & q_ok)
    else:
        if CLEAN:
            ninf = tl.full([BLOCK_N], float("-inf"), tl.float32)
            for qq in range(0, BLOCK_Q):
                qi = q0 + qq
                tl.store(out_ptr + qi.to(tl.int64) * stride_out + offs_n, ninf, mask=col_ok & (qi < S))
