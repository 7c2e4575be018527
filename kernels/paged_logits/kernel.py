"""Triton kernel: paged index logits for decode (bf16 or fp8 pages), read in place.

    logits[b*next_n + j, s] = sum_h w[b*next_n + j, h] * relu(q[b, j, h, :] . k[s, :])  (* sf[s] for fp8)

One program = one (next_n row j, split of pages, request b). It keeps q[b, j] ([H, D]) and
w in registers, walks its pages through the block table, and for each page computes
[64 tokens, H] = K_page @ q^T on the tensor cores (bf16 x bf16 or e4m3 x e4m3 -> fp32),
then ReLU, the weighted head sum, and the fp8 key scale. No gather is materialised.
The two next_n rows of a request run as neighbouring programs, so the second read of a
page hits L2. A program computes only the pages below its row's length (LIVE_LOOP: the
loop runs to the last live page, so ragged batches spend no tensor-core time on dead
pages); clean_logits then writes -inf to the rest of its split with plain stores.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _page_logits(q, w, kv_ptr, sf_ptr, bt_row, out_row, page0, i, start, seq_len, max_context_len,
                 page_stride, sf_page_stride, offs_t, offs_d,
                 D: tl.constexpr, BLOCK_KV: tl.constexpr, IS_FP8: tl.constexpr, UPCAST: tl.constexpr):
    """One page: [BLOCK_KV, H] = K @ q^T, ReLU, weighted head sum (x key scale), stored."""
    p_start = start + i * BLOCK_KV
    live = p_start < seq_len
    page = tl.load(bt_row + page0 + i, mask=live, other=0).to(tl.int64)
    k = tl.load(
        kv_ptr + page * page_stride + offs_t[:, None] * D + offs_d[None, :],
        mask=live & (offs_t[:, None] < BLOCK_KV),
        other=0.0,
    )  # [BLOCK_KV, D]
    if UPCAST:
        k = k.to(tl.float32)
    s = tl.dot(k, tl.trans(q))  # [BLOCK_KV, BLOCK_H] fp32
    logits = tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1)  # [BLOCK_KV]
    if IS_FP8:
        sf = tl.load(sf_ptr + page * sf_page_stride + (BLOCK_KV * D) // 4 + offs_t, mask=live, other=0.0)
        logits = logits * sf
    pos = p_start + offs_t
    logits = tl.where(pos < seq_len, logits, float("-inf"))
    tl.store(out_row + pos, logits, mask=(pos < max_context_len) & live)


@triton.jit
def paged_mqa_logits_kernel(
    q_ptr,  # [B, NEXT_N, H, D]           bf16 | e4m3
    kv_ptr,  # bf16: [pages, BLOCK_KV, D]  | fp8: page bytes viewed as e4m3 [pages, BLOCK_KV*(D+4)]
    sf_ptr,  # fp8: the same bytes viewed as fp32 [pages, BLOCK_KV*(D+4)/4]; unused for bf16
    w_ptr,  # [B*NEXT_N, H] fp32
    ctx_ptr,  # [B] or [B, NEXT_N] int32
    bt_ptr,  # [B, max_pages] int32
    out_ptr,  # [B*NEXT_N, max_context_len] fp32 (row stride stride_out)
    H,
    max_context_len,
    max_pages,
    stride_qb,
    stride_qn,
    stride_qh,
    stride_w,
    stride_ctx,
    stride_bt,
    stride_out,
    page_stride,  # elements of kv_ptr per page
    sf_page_stride,  # fp32 elements per page (fp8 only)
    PAGES_PER_SPLIT: tl.constexpr,
    NEXT_N: tl.constexpr,
    CTX_2D: tl.constexpr,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    IS_FP8: tl.constexpr,
    CLEAN: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter: dot/sum in fp32 (triton#11584, #11604)
    LIVE_LOOP: tl.constexpr,  # loop to the last live page (a runtime bound: not under the interpreter)
):
    j = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2)
    row = b * NEXT_N + j

    # tokens visible to this row: token j of next_n sees context_len - next_n + j + 1
    if CTX_2D:
        seq_len = tl.load(ctx_ptr + b * stride_ctx + j)
    else:
        seq_len = tl.load(ctx_ptr + b * stride_ctx) - NEXT_N + j + 1
    seq_len = tl.minimum(tl.maximum(seq_len, 0), max_context_len)
    seq_len = tl.minimum(seq_len, max_pages * BLOCK_KV)  # never read past the block table

    page0 = split * PAGES_PER_SPLIT
    start = page0 * BLOCK_KV

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, D)
    offs_t = tl.arange(0, BLOCK_KV)
    h_mask = offs_h < H
    out_row = out_ptr + row.to(tl.int64) * stride_out
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt

    if start < seq_len:
        q = tl.load(
            q_ptr + b.to(tl.int64) * stride_qb + j * stride_qn + offs_h[:, None] * stride_qh + offs_d[None, :],
            mask=h_mask[:, None],
            other=0.0,
        )  # [BLOCK_H, D]
        if UPCAST:
            q = q.to(tl.float32)
        w = tl.load(w_ptr + row.to(tl.int64) * stride_w + offs_h, mask=h_mask, other=0.0)  # [BLOCK_H]
        if LIVE_LOOP:
            n_live = tl.minimum((seq_len - start + BLOCK_KV - 1) // BLOCK_KV, PAGES_PER_SPLIT)
            for i in range(0, n_live):
                _page_logits(q, w, kv_ptr, sf_ptr, bt_row, out_row, page0, i, start, seq_len, max_context_len,
                             page_stride, sf_page_stride, offs_t, offs_d, D, BLOCK_KV, IS_FP8, UPCAST)
        else:
            # the interpreter cannot loop to a loaded value: every page of the split, dead ones masked
            for i in range(0, PAGES_PER_SPLIT):
                _page_logits(q, w, kv_ptr, sf_ptr, bt_row, out_row, page0, i, start, seq_len, max_context_len,
                             page_stride, sf_page_stride, offs_t, offs_d, D, BLOCK_KV, IS_FP8, UPCAST)
    if CLEAN:
        # -inf at and past the row's length inside this split (plain stores, no compute)
        for i in range(0, PAGES_PER_SPLIT):
            pos = start + i * BLOCK_KV + offs_t
            tl.store(out_row + pos, tl.full([BLOCK_KV], float("-inf"), tl.float32),
                     mask=(pos >= seq_len) & (pos < max_context_len))
