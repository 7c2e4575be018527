"""Triton kernel: re-score candidate keys from their bf16 rows in the paged cache.

    out[b, n] = sum_h w[b, h] * relu(q[b, h, :] . k[slot(b, cand[b, n]), :])      (-inf where cand < 0)
    slot(b, s) = block_table[b, s // BLOCK_KV] * BLOCK_KV + s % BLOCK_KV

One program = BLOCK_N candidates of one request. It keeps q[b] ([H, D]) and w[b] in
registers, loads its candidates' positions, gathers their bf16 rows through the block table
(only those rows: no page is read whole), computes [BLOCK_N, H] = K @ q^T on the tensor
cores (bf16 x bf16 -> fp32), then ReLU and the weighted head sum.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_rescore_kernel(
    q_ptr,  # [B, H, D] bf16
    kv_ptr,  # [pages, BLOCK_KV, D] bf16 (page stride page_stride elements)
    w_ptr,  # [B, H] fp32
    bt_ptr,  # [B, max_pages] int32
    cand_ptr,  # [B, N] int32 token positions, < 0 = none
    out_ptr,  # [B, N] fp32
    H,
    N,
    max_pages,
    stride_qb,
    stride_qh,
    stride_w,
    stride_bt,
    stride_cand,
    stride_out,
    page_stride,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter: dot/sum in fp32 (bf16 tl.dot is wrong there)
):
    b = tl.program_id(0)
    n0 = tl.program_id(1) * BLOCK_N
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, D)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    h_mask = offs_h < H
    n_mask = offs_n < N
    b64 = b.to(tl.int64)
    q = tl.load(q_ptr + b64 * stride_qb + offs_h[:, None] * stride_qh + offs_d[None, :],
                mask=h_mask[:, None], other=0.0)  # [BLOCK_H, D]
    w = tl.load(w_ptr + b64 * stride_w + offs_h, mask=h_mask, other=0.0)  # [BLOCK_H]
    pos = tl.load(cand_ptr + b64 * stride_cand + offs_n, mask=n_mask, other=-1)  # [BLOCK_N]
    live = (pos >= 0) & (pos < max_pages * BLOCK_KV)
    safe = tl.where(live, pos, 0)
    page = tl.load(bt_ptr + b64 * stride_bt + safe // BLOCK_KV, mask=live, other=0).to(tl.int64)
    rows = page * page_stride + (safe % BLOCK_KV).to(tl.int64) * D  # [BLOCK_N] element offsets
    k = tl.load(kv_ptr + rows[:, None] + offs_d[None, :], mask=live[:, None], other=0.0)  # [BLOCK_N, D]
    if UPCAST:
        q = q.to(tl.float32)
        k = k.to(tl.float32)
    s = tl.dot(k, tl.trans(q))  # [BLOCK_N, BLOCK_H] fp32
    logits = tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1)  # [BLOCK_N]
    logits = tl.where(live, logits, float("-inf"))
    tl.store(out_ptr + b64 * stride_out + offs_n, logits, mask=n_mask)
