"""Triton kernel: exact top-k selection per row by a radix threshold search.

One program holds ROWS independent segments (rows, or chunks of long rows) of BLOCK
positions in registers, as order-preserving int32 keys (float bits, negatives flipped).
A search over the key space finds, per segment, T = the k-th largest key, RADIX_BITS bits of
it a step (32 / RADIX_BITS steps, each counting the keys at or above 2^RADIX_BITS - 1
thresholds; 1 is a binary search); the ROWS x thresholds counts of a step share one
block-wide reduction, so the reduction latency is paid once per step and ROWS segments. The program then
keeps every key > T and the first (k - count(> T)) keys == T in index order, compacting
the indices with one packed prefix sum (keys > T first, then the ties; equal keys stay in
index order, so the lowest-index tie rule holds across rounds). A segment with <= k candidates returns all of them in
index order (0..L-1), then -1 padding.

Long rows run in rounds: each chunk keeps its own top-k (key, index) pairs (OUT_KEYS),
and the next round selects from the survivors (FROM_KEYS).
"""

from __future__ import annotations

import triton
import triton.language as tl

from niah.kernels.topk._search import kth_threshold


@triton.jit
def topk_kernel(
    x_ptr,  # FROM_KEYS: int32 keys [R, W] | else fp32 logits [R, W]
    idx_in_ptr,  # FROM_KEYS: int32 indices [R, W] (-1 = empty)
    len_ptr,  # HAS_LEN: int32 [R] candidates per row are positions < len
    out_idx_ptr,  # int32 [R, n_chunks * K]
    out_key_ptr,  # OUT_KEYS: int32 [R, n_chunks * K]
    thr_ptr,  # PHASE 1 writes, PHASE 2 reads: int32 [segments] thresholds
    n_rows,
    W,
    K,
    n_chunks,
    stride_x,
    stride_in,
    stride_out,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    K_PAD: tl.constexpr,
    FROM_KEYS: tl.constexpr,
    HAS_LEN: tl.constexpr,
    OUT_KEYS: tl.constexpr,
    PHASE: tl.constexpr,  # 0: search + select; 1: search only; 2: select only (fewer live registers each)
    RADIX_BITS: tl.constexpr,  # bits of the threshold a search step finds: 1 (binary), 2 or 4
):
    seg = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [ROWS] segment = (row, chunk)
    seg_ok = seg < n_rows * n_chunks
    row = (seg // n_chunks).to(tl.int64)
    chunk = seg % n_chunks
    offs = tl.arange(0, BLOCK)
    pos = chunk[:, None] * BLOCK + offs[None, :]  # [ROWS, BLOCK]
    in_row = seg_ok[:, None] & (pos < W)
    # invalid positions get the key INT_MIN, which no float maps to (it would be a NaN
    # pattern) and which every search midpoint exceeds: the loop needs the keys alone
    if FROM_KEYS:
        key = tl.load(x_ptr + row[:, None] * stride_x + pos, mask=in_row, other=-2147483648)
    else:
        x = tl.load(x_ptr + row[:, None] * stride_x + pos, mask=in_row, other=float("-inf")).to(tl.float32)
        bits = x.to(tl.int32, bitcast=True)
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed order == float order
        if HAS_LEN:
            length = tl.load(len_ptr + row, mask=seg_ok, other=0)
            valid = in_row & (pos < length[:, None])
        else:
            valid = in_row & (x != float("-inf"))
        key = tl.where(valid, key, -2147483648)

    if PHASE != 2:
        # per segment: the largest t with count(key >= t) >= K, RADIX_BITS of it a step
        thr1 = kth_threshold(key, tl.zeros([ROWS], tl.int32) + K, RADIX_BITS)  # [ROWS]
        if PHASE == 1:
            tl.store(thr_ptr + seg, thr1, mask=seg_ok)
            return
    else:
        thr1 = tl.load(thr_ptr + seg, mask=seg_ok, other=0)
    valid = key != -2147483648
    n_valid = tl.sum(valid.to(tl.int32), axis=1)  # [ROWS]
    # a segment with <= K candidates takes them all, in index order
    thr = tl.where(n_valid <= K, -2147483648, thr1)[:, None]
    gt = key > thr
    eq = valid & (key == thr)
    n_gt = tl.sum(gt.to(tl.int32), axis=1)  # [ROWS]
    need = K - n_gt
    # one packed prefix sum ranks both sets in index order: low 16 bits the keys > T, high
    # 16 bits the ties (BLOCK <= 32768: no carry; the high half is read back unsigned)
    c = tl.cumsum(gt.to(tl.int32) + (eq.to(tl.int32) << 16), axis=1)
    eq_rank = (c >> 16) & 0xFFFF
    sel = gt | (eq & (eq_rank <= need[:, None]))
    # slots: the keys > T first, then the ties kept (equal keys stay in index order)
    slot = tl.where(gt, (c & 0xFFFF) - 1, n_gt[:, None] + eq_rank - 1)
    n_sel = tl.minimum(n_valid, K)  # [ROWS]
    if FROM_KEYS:
        gidx = tl.load(idx_in_ptr + row[:, None] * stride_in + pos, mask=sel, other=-1)
    else:
        gidx = pos

    out_base = row * stride_out + chunk * K  # [ROWS]
    tl.store(out_idx_ptr + out_base[:, None] + slot, gidx, mask=sel)
    if OUT_KEYS:
        tl.store(out_key_ptr + out_base[:, None] + slot, key, mask=sel)
    pad = tl.arange(0, K_PAD)[None, :]
    pad_mask = seg_ok[:, None] & (pad >= n_sel[:, None]) & (pad < K)
    tl.store(out_idx_ptr + out_base[:, None] + pad, tl.full([ROWS, K_PAD], -1, tl.int32), mask=pad_mask)
    if OUT_KEYS:
        tl.store(out_key_ptr + out_base[:, None] + pad, tl.full([ROWS, K_PAD], -2147483648, tl.int32), mask=pad_mask)
