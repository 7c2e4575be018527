"""Triton kernel: ragged (prefill) index logits, bf16 or fp8 keys.

    logits[i, n] = sum_h w[i, h] * relu(q[i, h, :] . k[n, :])  (* sf[n] for fp8),  ks[i] <= n < ke[i]

One program = one tile of BLOCK_N keys x BLOCK_Q queries. The key tile ([BLOCK_N, D]) is
loaded once; the program walks its queries, computing [BLOCK_N, H] = K @ q_i^T on the
tensor cores per query, then ReLU, the weighted head sum along the row (inside a warp),
and the key scale. Tiles outside every query's [ks, ke) window are skipped (only -inf is
written, with CLEAN). The output is the only allocation.

COMPRESSED (DeepGEMM's max_seqlen_k > 0): column c of row i is key ks[i] + c, so the key
tile is per query and is loaded inside the query loop.

ACCUM (niah's, with CLEAN): out[i, n] = out[i, n] + logits[i, n]: a second kv head's logits
added to the first's where they are written, the same fp32 sum as adding the two tensors
after the kernel (IEEE addition commutes), without the separate add's passes over [S, n_cols].
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mqa_logits_kernel(
    q_ptr,  # [S, H, D] bf16 | e4m3
    k_ptr,  # [Skv, D] bf16 | e4m3
    sf_ptr,  # [Skv] fp32 (fp8 only)
    w_ptr,  # [S, H] fp32
    ks_ptr,  # [S] int32
    ke_ptr,  # [S] int32
    out_ptr,  # [S, n_cols] fp32, row stride stride_out
    S,
    Skv,
    H,
    n_cols,
    stride_qs,
    stride_qh,
    stride_k,
    stride_w,
    stride_out,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    IS_FP8: tl.constexpr,
    CLEAN: tl.constexpr,
    COMPRESSED: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter: dot/sum in fp32 (triton#11584, #11604)
    ACCUM: tl.constexpr,  # add to out instead of writing it (with CLEAN)
):
    pid_n = tl.program_id(0)
    pid_q = tl.program_id(1)
    n0 = pid_n * BLOCK_N
    q0 = pid_q * BLOCK_Q

    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    offs_h = tl.arange(0, BLOCK_H)
    offs_qb = q0 + tl.arange(0, BLOCK_Q)
    h_mask = offs_h < H
    col_mask = offs_n < n_cols

    ks_b = tl.load(ks_ptr + offs_qb, mask=offs_qb < S, other=2147483647)
    ke_b = tl.load(ke_ptr + offs_qb, mask=offs_qb < S, other=0)
    if COMPRESSED:
        width = tl.max(ke_b - ks_b, axis=0)
        live = n0 < width
    else:
        lo = tl.min(ks_b, axis=0)
        hi = tl.max(ke_b, axis=0)
        live = (n0 < hi) & (n0 + BLOCK_N > lo)

    if live:
        if not COMPRESSED:
            k = tl.load(k_ptr + offs_n[:, None] * stride_k + offs_d[None, :], mask=(offs_n < Skv)[:, None], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
            if IS_FP8:
                sf = tl.load(sf_ptr + offs_n, mask=offs_n < Skv, other=0.0)
        for qq in range(0, BLOCK_Q):
            qi = q0 + qq
            q_ok = qi < S
            qi = tl.minimum(qi, S - 1)
            ks = tl.load(ks_ptr + qi)
            ke = tl.load(ke_ptr + qi)
            q = tl.load(
                q_ptr + qi.to(tl.int64) * stride_qs + offs_h[:, None] * stride_qh + offs_d[None, :],
                mask=h_mask[:, None],
                other=0.0,
            )  # [BLOCK_H, D]
            w = tl.load(w_ptr + qi.to(tl.int64) * stride_w + offs_h, mask=h_mask, other=0.0)
            if UPCAST:
                q = q.to(tl.float32)
            if COMPRESSED:
                kpos = ks + offs_n
                kmask = (kpos < ke) & (kpos < Skv)
                k = tl.load(k_ptr + kpos[:, None] * stride_k + offs_d[None, :], mask=kmask[:, None], other=0.0)
                if UPCAST:
                    k = k.to(tl.float32)
                if IS_FP8:
                    sf = tl.load(sf_ptr + kpos, mask=kmask, other=0.0)
                valid = kmask
            else:
                valid = (offs_n >= ks) & (offs_n < ke)
            s = tl.dot(k, tl.trans(q))  # [BLOCK_N, BLOCK_H] fp32
            logits = tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1)  # [BLOCK_N]
            if IS_FP8:
                logits = logits * sf
            logits = tl.where(valid, logits, float("-inf"))
            o_ptrs = out_ptr + qi.to(tl.int64) * stride_out + offs_n
            if ACCUM:   # (the tl.where above keeps the sum a plain add, not an FMA with the scale)
                logits = tl.load(o_ptrs, mask=col_mask & q_ok, other=0.0) + logits
            tl.store(o_ptrs, logits, mask=col_mask & q_ok)
    else:
        if CLEAN:
            ninf = tl.full([BLOCK_N], float("-inf"), tl.float32)
            for qq in range(0, BLOCK_Q):
                qi = q0 + qq
                o_ptrs = out_ptr + qi.to(tl.int64) * stride_out + offs_n
                v = ninf
                if ACCUM:
                    v = tl.load(o_ptrs, mask=col_mask & (qi < S), other=0.0) + ninf
                tl.store(o_ptrs, v, mask=col_mask & (qi < S))
