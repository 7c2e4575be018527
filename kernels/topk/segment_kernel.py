"""Triton kernels: sample_kernel.py's select with its pass over the row split over programs,
for few long rows (a decode step's rows: one to a few dozen rows of up to 131,072 keys, where
one program a row leaves most of the GPU idle and the row's pass is its longest part).

Four launches, each a step of sample_kernel.py's program, the same keys in the same order:
(a) `segment_bracket_kernel`, one program a row: the sample's joint search for the bracket
    (hi, lo), stored in br [R, 2].
(b1) `segment_count_kernel`, one program a (segment, row): the segment's keys > hi, in (lo, hi],
    == lo and valid, counted into cnt [R, S, 4].
(b2) `segment_scatter_kernel`, the same grid: its offsets are the counts of the segments before
    it, so keys > hi go to the output and candidates to the scratch in index order, exactly
    where the one-program pass puts them (sample_kernel._bracket_tile, one tile a segment).
(c) `segment_finish_kernel`, one program a row: the row's totals, then sample_kernel's (c): the
    candidates' search, the ties at lo, or the fallback, by the same device functions.
The segments read the row twice (b1 and b2; the second read mostly from L2). Scratch: br,
cnt and the candidates' keys and positions, sized from the shapes alone (graph-safe).
"""

from __future__ import annotations

import triton
import triton.language as tl

from niah.kernels.topk._search import kth_threshold
from niah.kernels.topk.sample_kernel import _bracket_tile, _finish, _keys


@triton.jit
def _limit(len_ptr, row, W, HAS_LEN: tl.constexpr):
    if HAS_LEN:
        return tl.minimum(tl.maximum(tl.load(len_ptr + row), 0), W)
    return W


@triton.jit
def segment_bracket_kernel(x_ptr, len_ptr, br_ptr, W, stride_x, R_HI, R_LO, NS: tl.constexpr, STRIDE: tl.constexpr,
                         HAS_LEN: tl.constexpr, RADIX_BITS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    limit = _limit(len_ptr, row, W, HAS_LEN)
    skey = _keys(x_ptr, row * stride_x, tl.arange(0, NS) * STRIDE, limit, HAS_LEN)
    two = tl.arange(0, 2)
    br = kth_threshold(skey[None, :], tl.where(two == 0, R_HI, R_LO), RADIX_BITS)
    hi = tl.sum(tl.where(two == 0, br, 0), axis=0)
    lo = tl.maximum(tl.sum(tl.where(two == 1, br, 0), axis=0), -2147483647)
    tl.store(br_ptr + row * 2 + two, tl.where(two == 0, hi, lo))


@triton.jit
def segment_count_kernel(x_ptr, len_ptr, br_ptr, cnt_ptr, W, stride_x, S, SEG: tl.constexpr, HAS_LEN: tl.constexpr):
    seg = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    limit = _limit(len_ptr, row, W, HAS_LEN)
    hi = tl.load(br_ptr + row * 2)
    lo = tl.load(br_ptr + row * 2 + 1)
    key = _keys(x_ptr, row * stride_x, seg * SEG + tl.arange(0, SEG), limit, HAS_LEN)
    eq = key == lo
    a = tl.sum((key > hi).to(tl.int32) + (((key > lo) & (key <= hi)).to(tl.int32) << 16), axis=0)
    b = tl.sum((key != -2147483648).to(tl.int32) + (eq.to(tl.int32) << 16), axis=0)
    four = tl.arange(0, 4)
    got = tl.where(four == 0, a & 0xFFFF, tl.where(four == 1, (a >> 16) & 0xFFFF,
                                                     tl.where(four == 2, (b >> 16) & 0xFFFF, b & 0xFFFF)))
    tl.store(cnt_ptr + (row * S + seg) * 4 + four, got)


@triton.jit
def _before(cnt_ptr, row, S, upto, which, S_PAD: tl.constexpr):
    """The sum of count `which` over the row's segments < upto."""
    j = tl.arange(0, S_PAD)
    return tl.sum(tl.load(cnt_ptr + (row * S + j) * 4 + which, mask=j < upto, other=0), axis=0)


@triton.jit
def segment_scatter_kernel(x_ptr, len_ptr, br_ptr, cnt_ptr, out_ptr, skey_ptr, sidx_ptr, W, K, stride_x, S,
                         SEG: tl.constexpr, S_PAD: tl.constexpr, CAP: tl.constexpr, HAS_LEN: tl.constexpr):
    seg = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    limit = _limit(len_ptr, row, W, HAS_LEN)
    hi = tl.load(br_ptr + row * 2)
    lo = tl.load(br_ptr + row * 2 + 1)
    n_gt = _before(cnt_ptr, row, S, seg, 0, S_PAD)
    n_cand = _before(cnt_ptr, row, S, seg, 1, S_PAD)
    if (n_gt < K) | (n_cand < CAP):      # else nothing of this segment would be stored
        _bracket_tile(x_ptr, out_ptr, skey_ptr, sidx_ptr, row * stride_x, row * K, row * CAP, seg * SEG, limit,
                      hi, lo, K, n_gt, n_cand, 0, 0, SEG, CAP, HAS_LEN)


@triton.jit
def segment_finish_kernel(x_ptr, len_ptr, br_ptr, cnt_ptr, out_ptr, skey_ptr, sidx_ptr, W, K, stride_x, S,
                          S_PAD: tl.constexpr, TILE: tl.constexpr, CAP: tl.constexpr, HAS_LEN: tl.constexpr,
                          K_PAD: tl.constexpr, RADIX_BITS: tl.constexpr, SCRATCH_TILE: tl.constexpr,
                          NARROW: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    limit = _limit(len_ptr, row, W, HAS_LEN)
    row_off = row * stride_x
    out_off = row * K
    s_off = row * CAP
    hi = tl.load(br_ptr + row * 2)
    lo = tl.load(br_ptr + row * 2 + 1)
    n_gt = _before(cnt_ptr, row, S, S, 0, S_PAD)
    n_cand = _before(cnt_ptr, row, S, S, 1, S_PAD)
    n_eq = _before(cnt_ptr, row, S, S, 2, S_PAD)
    if HAS_LEN:
        n_valid = limit
    else:
        n_valid = _before(cnt_ptr, row, S, S, 3, S_PAD)
    _finish(x_ptr, out_ptr, skey_ptr, sidx_ptr, row_off, out_off, s_off, limit, W, K, hi, lo, n_gt, n_cand, n_eq,
            n_valid, TILE, CAP, HAS_LEN, K_PAD, RADIX_BITS, SCRATCH_TILE, NARROW)
