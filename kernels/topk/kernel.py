"""Triton kernel: exact top-k selection per row by a 32-step threshold search.

One program holds one row (or one chunk of a long row) in registers as order-preserving
int32 keys (float bits, negatives flipped). A binary search over the key space finds
T = the k-th largest key (32 steps, each one compare + one block-wide count); the
program then keeps every key > T and the first (k - count(> T)) keys == T in index
order, compacting the indices with a prefix sum. Rows with <= k candidates return all
their candidates in index order (0..L-1), then -1 padding.

Long rows (more than one block) run in rounds: each chunk keeps its own top-k
(key, index) pairs (OUT_KEYS), and the next round selects from the survivors (FROM_KEYS).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def topk_kernel(
    x_ptr,  # FROM_KEYS: int32 keys [R, W] | else fp32 logits [R, W]
    idx_in_ptr,  # FROM_KEYS: int32 indices [R, W] (-1 = empty)
    len_ptr,  # HAS_LEN: int32 [R] candidates per row are positions < len
    out_idx_ptr,  # int32 [R, n_chunks * K]
    out_key_ptr,  # OUT_KEYS: int32 [R, n_chunks * K]
    W,
    K,
    stride_x,
    stride_in,
    stride_out,
    BLOCK: tl.constexpr,
    K_PAD: tl.constexpr,
    FROM_KEYS: tl.constexpr,
    HAS_LEN: tl.constexpr,
    OUT_KEYS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    pos = chunk * BLOCK + offs
    in_row = pos < W
    # invalid positions get the key INT_MIN, which no float maps to (it would be a NaN
    # pattern) and which every search midpoint exceeds: the loop needs the keys alone
    if FROM_KEYS:
        key = tl.load(x_ptr + row * stride_x + pos, mask=in_row, other=-2147483648)
    else:
        x = tl.load(x_ptr + row * stride_x + pos, mask=in_row, other=float("-inf")).to(tl.float32)
        bits = x.to(tl.int32, bitcast=True)
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed order == float order
        if HAS_LEN:
            valid = pos < tl.load(len_ptr + row)
        else:
            valid = in_row & (x != float("-inf"))
        key = tl.where(valid, key, -2147483648)

    # largest t with count(key >= t) >= K, searched over int32 in int64 scalars
    zero = (tl.program_id(0) * 0).to(tl.int64)  # an int64 scalar on every backend
    lo = zero - 2147483648
    hi = zero + 2147483647
    for _ in range(32):
        mid = lo + ((hi - lo + 1) >> 1)  # > INT_MIN: invalid keys never count
        cnt = tl.sum((key >= mid.to(tl.int32)).to(tl.int32), axis=0)
        ok = cnt >= K
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    thr = lo.to(tl.int32)

    valid = key != -2147483648
    gt = key > thr
    eq = valid & (key == thr)
    need = K - tl.sum(gt.to(tl.int32), axis=0)
    eq_rank = tl.cumsum(eq.to(tl.int32), axis=0)  # inclusive
    sel = gt | (eq & (eq_rank <= need))
    sel_i = sel.to(tl.int32)
    slot = tl.cumsum(sel_i, axis=0) - 1
    n_sel = tl.sum(sel_i, axis=0)
    if FROM_KEYS:
        gidx = tl.load(idx_in_ptr + row * stride_in + pos, mask=sel, other=-1)
    else:
        gidx = pos

    out_base = row * stride_out + chunk * K
    tl.store(out_idx_ptr + out_base + slot, gidx, mask=sel)
    if OUT_KEYS:
        tl.store(out_key_ptr + out_base + slot, key, mask=sel)
    pad = tl.arange(0, K_PAD)
    pad_mask = (pad >= n_sel) & (pad < K)
    tl.store(out_idx_ptr + out_base + pad, tl.full([K_PAD], -1, tl.int32), mask=pad_mask)
    if OUT_KEYS:
        tl.store(out_key_ptr + out_base + pad, tl.full([K_PAD], -2147483648, tl.int32), mask=pad_mask)
