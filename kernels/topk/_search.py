"""Triton device function shared by the top-k kernels (imports triton: kernel modules only):
the threshold search on order-preserving int32 keys."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def kth_threshold(key, kk, BITS: tl.constexpr):
    """key [R, N] (INT_MIN = empty; R = M, or 1 for keys every search shares), kk [M]: per m the
    largest t with count(key >= t) >= kk[m] (INT_MIN when fewer than kk[m] keys; INT_MAX when
    kk[m] <= 0), as int32 [M]. The M searches share each reduction.

    A radix search, BITS bits of t a step (32 / BITS steps): the 2^BITS - 1 thresholds above
    the prefix found so far are counted in one reduction, and the prefix moves past every one
    that still has kk keys at or above it (count falls as t rises; every threshold lies in
    (INT_MIN, INT_MAX], so empty keys never count and the int32 casts never wrap). BITS = 1 is
    the binary search (one threshold a step, [M, N]); each step of the others is one reduction
    of [M, 2^BITS, N], so 4 bits take 8 reductions, not 32, for 16x the comparisons. BITS = 8
    (one search over one segment: R = M = 1) counts with histograms instead
    (`_histogram_threshold`). The answer is unique, so every BITS gives the same t."""
    # one return, after a full if/else: compiled Triton still builds the statements after a
    # return inside a constexpr branch, whose [M, 256, N] comparisons can pass Triton's largest tensor
    if BITS == 8:
        t = _histogram_threshold(key, kk)
    else:
        t = _radix_threshold(key, kk, BITS)
    return t


@triton.jit
def _radix_threshold(key, kk, BITS: tl.constexpr):
    """kth_threshold by 2^BITS - 1 counted thresholds a step (BITS = 1: the binary search)."""
    pre = tl.zeros(kk.shape, tl.int64) - 2147483648
    if BITS == 1:
        hi = tl.zeros(kk.shape, tl.int64) + 2147483647
        for _ in range(32):
            mid = pre + ((hi - pre + 1) >> 1)
            ok1 = tl.sum((key >= mid.to(tl.int32)[:, None]).to(tl.int32), axis=1) >= kk
            pre = tl.where(ok1, mid, pre)
            hi = tl.where(ok1, hi, mid - 1)
    else:
        NB: tl.constexpr = 1 << BITS
        j = tl.arange(0, NB).to(tl.int64)
        for step in tl.static_range(32 // BITS):
            t = pre[:, None] + (j << (32 - BITS * (step + 1)))[None, :]        # [M, NB]
            cnt = tl.sum((key[:, None, :] >= t.to(tl.int32)[:, :, None]).to(tl.int32), axis=2)
            ok = (cnt >= kk[:, None]) & (j[None, :] > 0)                      # j = 0: the prefix itself
            pre += tl.sum(ok.to(tl.int64), axis=1) << (32 - BITS * (step + 1))
    return pre.to(tl.int32)


@triton.jit
def _histogram_threshold(key, kk):
    """kth_threshold of one segment (key [1, N], kk [1]) by a radix select, a byte a step: the
    keys' bits as unsigned (sign flipped: the same order), and at each of 4 steps one
    `tl.histogram` of the next byte of the keys that still match the prefix found so far; the
    byte is the largest d whose keys, with those already above the prefix, number >= kk.
    4 histograms where the binary search takes 32 block-wide reductions. Fewer than kk keys
    (empty ones included: BLOCK < kk) leave every byte 0: INT_MIN, as the binary search."""
    N: tl.constexpr = key.shape[1]
    u = (tl.reshape(key, [N]) ^ -2147483648).to(tl.uint32, bitcast=True)       # [N], order kept
    want = tl.sum(kk, axis=0)
    bins = tl.arange(0, 256)
    prefix = tl.sum(tl.zeros([1], tl.uint32), axis=0)
    above = tl.sum(tl.zeros([1], tl.int32), axis=0)
    for step in tl.static_range(4):
        digit = ((u >> (24 - 8 * step)) & 255).to(tl.int32)
        if step == 0:
            hist = tl.histogram(digit, 256)
        else:
            hist = tl.histogram(digit, 256, mask=(u >> (32 - 8 * step)) == prefix)
        suffix = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist           # keys with byte >= j
        d = tl.maximum(tl.sum(((above + suffix) >= want).to(tl.int32), axis=0) - 1, 0)
        above += tl.sum(tl.where(bins > d, hist, 0), axis=0)
        prefix = (prefix << 8) | d.to(tl.uint32)
    return tl.zeros([1], tl.int32) + (prefix ^ 0x80000000).to(tl.int32, bitcast=True)
