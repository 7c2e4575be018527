"""Triton kernels: the fused indexer's scores read from the paged pool in place: its logits
(`indexer_logits_kernel`) and the candidates of its top-k (`indexer_candidates_kernel`).

For query row i (position p0 + i) and every key position s <= p0 + i:

    I[i, s] = sum_g sf_g[s] * sum_h w[i, g, h] * relu(q[i, g, h, :] . k_g[s, :])    (sf_g = 1 for bf16)

(g: kv head, each with its own block-table row; h: the index heads of kv head g, padded to GP
with zero weights). The kernel never writes I. With lo[i] the row's lower bracket (from a
sample of its keys) it keeps, in position order, in the row's candidate buffer ([C, CAP]
scores and positions):

    every key scoring > lo[i], and the first K (lowest positions) of the keys scoring == lo[i]

and counts ngt[i] (keys > lo) and neq[i] (keys == lo, all of them, also those not kept). A
row's buffer holds n = ngt + min(neq, K) keys; a key whose slot would be >= CAP is dropped
(still counted), so n > CAP means overflow. When min(K, p0 + i + 1) <= ngt + neq and
n <= CAP, the K largest of the n slots, ties to the lowest slot, are the row's top-K with ties
to the lowest positions: a k-th score above lo has every key >= it in the buffer; a k-th score
equal to lo needs at most K of the ties at lo, the first ones. So exact zeros (ReLU), which
put lo at 0 whenever fewer than about K keys of a row score above 0, cost K slots, not one
slot a key. Slots >= n are not written (the caller pre-fills the buffer).

One program = BLOCK_M query rows; it walks the key positions of its last row in position
order in BLOCK_N-wide tiles (BLOCK_N / 64 pages, each looked up in the block table), so "the
first K ties" is a running count; for each kv head it computes [BLOCK_M * GP, BLOCK_N] =
Q_g @ K_g^T on the tensor cores, ReLU, the weighted head sum and the fp8 key scale; the kv
heads are summed in order (g = 0, 1, ...), as the unfused path sums its per-head logits.
Offsets into the pool, the queries and the buffer are int64. A key's slot comes from its rank
in the tile, the product of the tile's 0/1 masks with the upper-triangular ones matrix on the
tensor cores: a `tl.cumsum` here (beside the loop's `tl.sum`, a pattern with known wrong-result
reports in Triton's scan lowering) ranked two keys into one slot in 1-98 of 4,096 rows on the
H200 (random keys; the buffer check caught each), which the product does not do.

`indexer_logits_kernel` writes I itself, for a caller that selects from it (the unfused
prefill): one program = a [BLOCK_M rows, BLOCK_N keys] tile, scored by the same tile function
(so the same fp32 operations in the same order as the candidates kernel's), -inf where
s > p0 + i; a tile wholly past its last row's position is only written -inf. Against one
ragged-logits call per kv head (DeepGEMM's `fp8_mqa_logits` form), summed: the kv heads' keys
are read in place (no gather), the G heads of BLOCK_M rows share one tensor-core product (not
one query's G heads padded to 16 rows) and [rows, keys] is written once, not read and
written again per kv head.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile_scores(q_ptr, w_ptr, kv_ptr, sf_ptr, bt_ptr, rows, row_ok, pos, stride_qc, stride_wc, stride_bt,
                 page_stride, sf_page_stride,
                 HKV: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, PAGE: tl.constexpr, IS_FP8: tl.constexpr, UPCAST: tl.constexpr):
    """[BLOCK_M, BLOCK_N] fp32 scores of the rows against the keys at positions pos."""
    offs_r = tl.arange(0, BLOCK_M * GP)
    h = offs_r % GP
    offs_d = tl.arange(0, D)
    r_ok = tl.reshape(tl.broadcast_to(row_ok[:, None], (BLOCK_M, GP)), (BLOCK_M * GP,))
    r_row = tl.reshape(tl.broadcast_to(rows[:, None], (BLOCK_M, GP)), (BLOCK_M * GP,)).to(tl.int64)
    page_i = pos // PAGE
    slot = pos % PAGE
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for g in tl.static_range(HKV):
        q, w = _head_query(q_ptr, w_ptr, r_row, r_ok, h, g, stride_qc, stride_wc, GP, D, UPCAST)   # [BLOCK_M*GP, D]
        page = tl.load(bt_ptr + g * stride_bt + page_i).to(tl.int64)                  # [BLOCK_N]
        k = tl.load(kv_ptr + page[:, None] * page_stride + slot[:, None] * D + offs_d[None, :])   # [BLOCK_N, D]
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k))                                                    # [BLOCK_M*GP, BLOCK_N]
        s = tl.maximum(s, 0.0) * w[:, None]
        part = tl.sum(tl.reshape(s, (BLOCK_M, GP, BLOCK_N)), axis=1)                  # [BLOCK_M, BLOCK_N]
        if IS_FP8:
            sf = tl.load(sf_ptr + page * sf_page_stride + (PAGE * D) // 4 + slot)     # [BLOCK_N]
            part = part * sf[None, :]
        acc += part
    return acc


@triton.jit
def indexer_candidates_kernel(
    q_ptr,  # [C, HKV * GP, D] bf16 | e4m3 (padded heads: zeros)
    w_ptr,  # [C, HKV * GP] fp32 (padded heads: 0)
    kv_ptr,  # bf16: [pages, PAGE * D] | fp8: the page bytes viewed as e4m3
    sf_ptr,  # fp8: the same bytes viewed as fp32; unused for bf16
    bt_ptr,  # [HKV, max_pages] int32
    lo_ptr,  # [C] fp32: the rows' lower brackets (-inf: every key)
    cval_ptr,  # [C, CAP] fp32 out: candidate scores, position order
    cpos_ptr,  # [C, CAP] int32 out: candidate positions
    ngt_ptr,  # [C] int32 out: keys > lo
    neq_ptr,  # [C] int32 out: keys == lo (the first K of them are kept)
    C,
    p0,
    K,  # ties at lo kept per row
    stride_qc,
    stride_wc,
    stride_bt,
    page_stride,
    sf_page_stride,
    HKV: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    CAP: tl.constexpr,
    IS_FP8: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter: dot/sum in fp32
):
    tl.static_assert(BLOCK_N <= 4096)                               # exact ranks in the product's fp32 sums
    RANK_T: tl.constexpr = tl.float32 if UPCAST else tl.float16
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < C
    row_pos = p0 + rows                                             # the rows' positions
    lo = tl.load(lo_ptr + rows, mask=row_ok, other=float("inf"))
    last = tl.minimum(p0 + pid * BLOCK_M + BLOCK_M, p0 + C)         # keys the program's last row sees
    offs_n = tl.arange(0, BLOCK_N)
    tri = (offs_n[:, None] <= offs_n[None, :]).to(RANK_T)         # [BLOCK_N, BLOCK_N]: m <= n
    ngt = tl.zeros([BLOCK_M], tl.int32)
    neq = tl.zeros([BLOCK_M], tl.int32)
    out_row = rows.to(tl.int64) * CAP
    n0 = 0
    while n0 < last:  # while, not range: the interpreter takes no run-time range bounds
        pos = n0 + offs_n
        live_pos = tl.minimum(pos, last - 1)                         # reads stay inside the block table
        acc = _tile_scores(q_ptr, w_ptr, kv_ptr, sf_ptr, bt_ptr, rows, row_ok, live_pos, stride_qc, stride_wc,
                           stride_bt, page_stride, sf_page_stride, HKV, GP, D, BLOCK_M, BLOCK_N, PAGE, IS_FP8,
                           UPCAST)
        valid = (pos[None, :] <= row_pos[:, None]) & row_ok[:, None] & (pos[None, :] < last)
        gt = valid & (acc > lo[:, None])
        eq = valid & (acc == lo[:, None])
        # ranks in the tile by a product with the upper-triangular ones (exact: 0/1 inputs, fp32
        # sums below 2^24), not tl.cumsum: a scan beside tl.sum in this loop ranked two keys into
        # one slot on the H200 (module doc)
        r_gt = tl.dot(gt.to(RANK_T), tri).to(tl.int32)
        r_eq = tl.dot(eq.to(RANK_T), tri).to(tl.int32)
        k_before = tl.minimum(neq, K)                                # ties kept before this tile
        kept_eq = tl.minimum(neq[:, None] + r_eq, K) - k_before[:, None]   # ties kept up to each key
        keep = gt | (eq & (neq[:, None] + r_eq <= K))
        slot = (ngt + k_before)[:, None] + r_gt + kept_eq - 1
        keep = keep & (slot < CAP)
        tl.store(cval_ptr + out_row[:, None] + slot, acc, mask=keep)
        tl.store(cpos_ptr + out_row[:, None] + slot, tl.broadcast_to(pos[None, :], (BLOCK_M, BLOCK_N)), mask=keep)
        ngt += tl.sum(gt.to(tl.int32), axis=1)
        neq += tl.sum(eq.to(tl.int32), axis=1)
        n0 += BLOCK_N
    tl.store(ngt_ptr + rows, ngt, mask=row_ok)
    tl.store(neq_ptr + rows, neq, mask=row_ok)


@triton.jit
def indexer_logits_kernel(
    q_ptr,  # [C, HKV * GP, D] bf16 | e4m3 (padded heads: zeros)
    w_ptr,  # [C, HKV * GP] fp32 (padded heads: 0)
    kv_ptr,  # bf16: [pages, PAGE * D] | fp8: the page bytes viewed as e4m3
    sf_ptr,  # fp8: the same bytes viewed as fp32; unused for bf16
    bt_ptr,  # [HKV, max_pages] int32
    out_ptr,  # [C, p0 + C] fp32 out, row stride stride_out
    C,
    p0,
    stride_qc,
    stride_wc,
    stride_bt,
    page_stride,
    sf_page_stride,
    stride_out,
    HKV: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    IS_FP8: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter: dot/sum in fp32
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < C
    pos = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    last = tl.minimum(p0 + pid_m * BLOCK_M + BLOCK_M, p0 + C)       # keys the tile's last row sees
    o_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_out + pos[None, :]
    o_mask = row_ok[:, None] & (pos < p0 + C)[None, :]
    if pid_n * BLOCK_N < last:
        live_pos = tl.minimum(pos, last - 1)                         # reads stay inside the block table
        acc = _tile_scores(q_ptr, w_ptr, kv_ptr, sf_ptr, bt_ptr, rows, row_ok, live_pos, stride_qc, stride_wc,
                           stride_bt, page_stride, sf_page_stride, HKV, GP, D, BLOCK_M, BLOCK_N, PAGE, IS_FP8,
                           UPCAST)
        acc = tl.where(pos[None, :] <= (p0 + rows)[:, None], acc, float("-inf"))
        tl.store(o_ptrs, acc, mask=o_mask)
    else:
        tl.store(o_ptrs, tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.float32), mask=o_mask)


@triton.jit
def _head_query(q_ptr, w_ptr, r_row, r_ok, h, g, stride_qc, stride_wc, GP: tl.constexpr, D: tl.constexpr,
                UPCAST: tl.constexpr):
    """kv head g's queries [BLOCK_M * GP, D] and weights [BLOCK_M * GP] (_tile_scores' loads)."""
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + r_row[:, None] * stride_qc + (g * GP + h)[:, None] * D + offs_d[None, :],
                mask=r_ok[:, None], other=0.0)
    w = tl.load(w_ptr + r_row * stride_wc + g * GP + h, mask=r_ok, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    return q, w


@triton.jit
def _head_page(q, w, kv_ptr, sf_ptr, bt_ptr, pg, g, stride_bt, page_stride, sf_page_stride, BLOCK_M: tl.constexpr,
               GP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, IS_FP8: tl.constexpr, UPCAST: tl.constexpr):
    """kv head g's part of the scores [BLOCK_M, PAGE] against its page pg (one block-table
    entry, the page's PAGE x D keys read as one contiguous block): _tile_scores' operations on
    one head, in its order."""
    page = tl.load(bt_ptr + g * stride_bt + pg).to(tl.int64)
    k = tl.load(kv_ptr + page * page_stride + tl.arange(0, PAGE)[:, None] * D + tl.arange(0, D)[None, :])
    if UPCAST:
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k))                                                    # [BLOCK_M*GP, PAGE]
    s = tl.maximum(s, 0.0) * w[:, None]
    part = tl.sum(tl.reshape(s, (BLOCK_M, GP, PAGE)), axis=1)                     # [BLOCK_M, PAGE]
    if IS_FP8:
        part = part * tl.load(sf_ptr + page * sf_page_stride + (PAGE * D) // 4 + tl.arange(0, PAGE))[None, :]
    return part


@triton.jit
def _pages_step(q0, w0, q1, w1, q2, w2, q3, w3, kv_ptr, sf_ptr, bt_ptr, out_rows, rows, row_ok, p0, S, pg,
                stride_bt, page_stride, sf_page_stride, HKV: tl.constexpr, BLOCK_M: tl.constexpr, GP: tl.constexpr,
                D: tl.constexpr, PAGE: tl.constexpr, IS_FP8: tl.constexpr, UPCAST: tl.constexpr):
    """One page position of every kv head: the rows' scores summed over the heads in order
    g = 0, 1, ... (as _tile_scores: from zero), -inf past each row's position, written."""
    acc = tl.zeros([BLOCK_M, PAGE], tl.float32)
    acc += _head_page(q0, w0, kv_ptr, sf_ptr, bt_ptr, pg, 0, stride_bt, page_stride, sf_page_stride, BLOCK_M, GP, D,
                      PAGE, IS_FP8, UPCAST)
    if HKV > 1:
        acc += _head_page(q1, w1, kv_ptr, sf_ptr, bt_ptr, pg, 1, stride_bt, page_stride, sf_page_stride, BLOCK_M, GP,
                          D, PAGE, IS_FP8, UPCAST)
    if HKV > 2:
        acc += _head_page(q2, w2, kv_ptr, sf_ptr, bt_ptr, pg, 2, stride_bt, page_stride, sf_page_stride, BLOCK_M, GP,
                          D, PAGE, IS_FP8, UPCAST)
    if HKV > 3:
        acc += _head_page(q3, w3, kv_ptr, sf_ptr, bt_ptr, pg, 3, stride_bt, page_stride, sf_page_stride, BLOCK_M, GP,
                          D, PAGE, IS_FP8, UPCAST)
    pos = pg * PAGE + tl.arange(0, PAGE)
    acc = tl.where(pos[None, :] <= (p0 + rows)[:, None], acc, float("-inf"))
    tl.store(out_rows + pos[None, :], acc, mask=row_ok[:, None] & (pos < S)[None, :])


@triton.jit
def indexer_logits_pages_kernel(
    q_ptr,  # [C, HKV * GP, D] bf16 | e4m3 (padded heads: zeros)
    w_ptr,  # [C, HKV * GP] fp32 (padded heads: 0)
    kv_ptr,  # bf16: [pages, PAGE * D] | fp8: the page bytes viewed as e4m3
    sf_ptr,  # fp8: the same bytes viewed as fp32; unused for bf16
    bt_ptr,  # [HKV, max_pages] int32
    out_ptr,  # [C, p0 + C] fp32 out, row stride stride_out
    C,
    p0,
    pages_a_program,  # page positions a program walks
    stride_qc,
    stride_wc,
    stride_bt,
    page_stride,
    sf_page_stride,
    stride_out,
    HKV: tl.constexpr,  # 1 to 4
    GP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    PAGE: tl.constexpr,
    IS_FP8: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter: dot/sum in fp32, and while loops (no run-time range bounds)
    STAGES: tl.constexpr,  # the page loop's software pipeline depth (tl.range num_stages)
):
    """indexer_logits_kernel's output, walked by pages: one program = BLOCK_M rows and
    `pages_a_program` consecutive page positions. Each kv head's queries and weights are loaded
    once a program (not once a tile), and each step reads one page a kv head as one contiguous
    [PAGE, D] block (one block-table entry, not one a key), in a loop the compiler can pipeline.
    A page wholly past the program's last row is only written -inf. The same operations in the
    same order as indexer_logits_kernel's tile function, so the same scores."""
    tl.static_assert(HKV <= 4)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < C
    S = p0 + C
    last = tl.minimum(p0 + pid_m * BLOCK_M + BLOCK_M, S)            # keys the program's last row sees
    pg0 = pid_n * pages_a_program
    pg1 = tl.minimum(pg0 + pages_a_program, (S + PAGE - 1) // PAGE)
    live = tl.maximum(tl.minimum(pg1, (last + PAGE - 1) // PAGE), pg0)   # pages some row sees end here
    offs_r = tl.arange(0, BLOCK_M * GP)
    h = offs_r % GP
    r_ok = tl.reshape(tl.broadcast_to(row_ok[:, None], (BLOCK_M, GP)), (BLOCK_M * GP,))
    r_row = tl.reshape(tl.broadcast_to(rows[:, None], (BLOCK_M, GP)), (BLOCK_M * GP,)).to(tl.int64)
    q0, w0 = _head_query(q_ptr, w_ptr, r_row, r_ok, h, 0, stride_qc, stride_wc, GP, D, UPCAST)
    q1, w1 = q0, w0
    q2, w2 = q0, w0
    q3, w3 = q0, w0
    if HKV > 1:
        q1, w1 = _head_query(q_ptr, w_ptr, r_row, r_ok, h, 1, stride_qc, stride_wc, GP, D, UPCAST)
    if HKV > 2:
        q2, w2 = _head_query(q_ptr, w_ptr, r_row, r_ok, h, 2, stride_qc, stride_wc, GP, D, UPCAST)
    if HKV > 3:
        q3, w3 = _head_query(q_ptr, w_ptr, r_row, r_ok, h, 3, stride_qc, stride_wc, GP, D, UPCAST)
    out_rows = out_ptr + rows.to(tl.int64)[:, None] * stride_out
    if UPCAST:
        pg = pg0
        while pg < live:
            _pages_step(q0, w0, q1, w1, q2, w2, q3, w3, kv_ptr, sf_ptr, bt_ptr, out_rows, rows, row_ok, p0, S, pg,
                        stride_bt, page_stride, sf_page_stride, HKV, BLOCK_M, GP, D, PAGE, IS_FP8, UPCAST)
            pg += 1
    else:
        for pg in tl.range(pg0, live, num_stages=STAGES):
            _pages_step(q0, w0, q1, w1, q2, w2, q3, w3, kv_ptr, sf_ptr, bt_ptr, out_rows, rows, row_ok, p0, S, pg,
                        stride_bt, page_stride, sf_page_stride, HKV, BLOCK_M, GP, D, PAGE, IS_FP8, UPCAST)
    ninf = tl.full([BLOCK_M, PAGE], float("-inf"), tl.float32)
    pg = live
    while pg < pg1:
        pos = pg * PAGE + tl.arange(0, PAGE)
        tl.store(out_rows + pos[None, :], ninf, mask=row_ok[:, None] & (pos < S)[None, :])
        pg += 1
