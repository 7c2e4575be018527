"""Triton kernel: exact top-k selection per row segment by a radix select (8-bit digits).

One program holds one segment (a row, or a chunk of a long row) of BLOCK positions in
registers as order-preserving keys (float bits, negatives flipped: signed int order ==
float order). The threshold T = the k-th largest key is found digit by digit, most
significant first, over u = key ^ 0x80000000 (unsigned order): each of the 4 passes
builds a 256-bin histogram (`tl.histogram`, warp ballots + one shared-memory merge) of
the next 8 bits of the keys that still match the threshold's high bits, and picks the
bin holding the k-th key. A pass stops the search early when the whole bin is taken
(EARLY_EXIT; usual for real-valued logits after 2-3 passes). Selection is then one packed
prefix sum: keys > T (or >= the bin's floor after an early exit) get slots in index order,
followed by the first `need` keys == T in index order (ties keep the lowest indices). A
segment with <= k candidates returns all of them in index order (0..L-1), then -1.

Long rows run in rounds: each chunk keeps its own top-k (key, index) pairs (OUT_KEYS),
and the next round selects from the survivors (FROM_KEYS). Equal keys stay in index
order inside a chunk's output and chunks are laid out in index order, so the
lowest-index tie rule holds across rounds.
"""

from __future__ import annotations

import triton
import triton.language as tl

INT_MIN: tl.constexpr = tl.constexpr(-2147483648)


@triton.jit
def _radix_threshold(u, valid, K, EARLY_EXIT: tl.constexpr):
    """(thr_u, need, done): u-space threshold; need = ties at thr_u still to take (done=0),
    or done=1: take every key >= thr_u (a whole bin was taken)."""
    bins = tl.arange(0, 256)
    prefix = tl.zeros([], tl.int32)
    need = tl.zeros([], tl.int32) + K
    done = tl.zeros([], tl.int32)
    for p in tl.static_range(4):
        shift = 24 - 8 * p
        if done == 0:
            digit = (u >> shift) & 0xFF
            if p == 0:
                m = valid
            else:
                m = valid & (((u ^ prefix) >> (shift + 8)) == 0)
            hist = tl.histogram(digit, 256, mask=m)  # [256] int32
            total = tl.sum(hist, axis=0)
            ge = total - tl.cumsum(hist, axis=0) + hist  # matching keys with digit >= bin
            b = tl.sum((ge >= need).to(tl.int32), axis=0) - 1
            above = tl.sum(tl.where(bins > b, hist, 0), axis=0)
            in_b = tl.sum(tl.where(bins == b, hist, 0), axis=0)
            prefix = prefix | (b << shift)
            need = need - above
            if EARLY_EXIT:
                done = (in_b == need).to(tl.int32)
    return prefix, need, done


@triton.jit
def topk_kernel(
    x_ptr,  # FROM_KEYS: int32 keys [R, W] | else fp32 logits [R, W]
    idx_in_ptr,  # FROM_KEYS: int32 indices [R, W] (-1 = empty)
    len_ptr,  # HAS_LEN: int32 [R] candidates per row are positions < len
    out_idx_ptr,  # int32 [R, n_chunks * K]
    out_key_ptr,  # OUT_KEYS: int32 [R, n_chunks * K]
    W,
    K,
    n_chunks,
    stride_x,
    stride_in,
    stride_out,
    BLOCK: tl.constexpr,
    K_PAD: tl.constexpr,
    FROM_KEYS: tl.constexpr,
    HAS_LEN: tl.constexpr,
    OUT_KEYS: tl.constexpr,
    EARLY_EXIT: tl.constexpr,
):
    seg = tl.program_id(0)
    row = (seg // n_chunks).to(tl.int64)
    chunk = seg % n_chunks
    pos = chunk * BLOCK + tl.arange(0, BLOCK)
    in_row = pos < W
    # an invalid position gets the key INT_MIN (a NaN pattern no finite or infinite float maps to)
    if FROM_KEYS:
        key = tl.load(x_ptr + row * stride_x + pos, mask=in_row, other=INT_MIN)
    else:
        x = tl.load(x_ptr + row * stride_x + pos, mask=in_row, other=float("-inf")).to(tl.float32)
        bits = x.to(tl.int32, bitcast=True)
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed order == float order
        if HAS_LEN:
            length = tl.load(len_ptr + row)
            ok = in_row & (pos < length)
        else:
            ok = in_row & (x != float("-inf"))
        key = tl.where(ok, key, INT_MIN)
    valid = key != INT_MIN
    n_valid = tl.sum(valid.to(tl.int32), axis=0)

    thr_u, need, done = _radix_threshold(key ^ INT_MIN, valid, K, EARLY_EXIT)
    thr = thr_u ^ INT_MIN  # back to signed key space
    # rows with <= K candidates: take them all (in index order); after an early exit: keys >= thr
    short = n_valid <= K
    take_ge = (done != 0) | short
    thr = tl.where(short, INT_MIN, thr)
    gt = valid & tl.where(take_ge, key >= thr, key > thr)
    eq = valid & (key == thr) & (take_ge == 0)
    # one packed prefix sum: low 16 bits rank the gt keys, high 16 bits the ties (BLOCK <= 32768)
    c = tl.cumsum(gt.to(tl.int32) + (eq.to(tl.int32) << 16), axis=0)
    gt_rank = c & 0xFFFF
    eq_rank = (c >> 16) & 0xFFFF
    n_gt = tl.sum(gt.to(tl.int32), axis=0)
    take_eq = eq & (eq_rank <= need)
    sel = gt | take_eq
    slot = tl.where(gt, gt_rank - 1, n_gt + eq_rank - 1)
    n_sel = tl.minimum(n_valid, K)
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
        tl.store(out_key_ptr + out_base + pad, tl.full([K_PAD], INT_MIN, tl.int32), mask=pad_mask)
