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
    of [M, 2^BITS, N], so 4 bits take 8 reductions, not 32, for 16x the comparisons. The
    answer is unique, so every BITS gives the same t."""
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
def kth_in(key, need, lo, hi):
    """key [N] (INT_MIN = empty), need >= 1 and lo < T <= hi for T, the need-th largest key
    (count(key > lo) >= need, count(key > hi) < need): T by a binary search over (lo, hi]
    only, ceil(log2(hi - lo)) steps instead of 32 (20 for a bracket 2^20 keys wide). The
    same answer as kth_threshold's."""
    pre = lo.to(tl.int64) + 1
    top = hi.to(tl.int64)
    while pre < top:  # while, not range: the bound is the bracket's
        mid = pre + ((top - pre + 1) >> 1)
        ok = tl.sum((key >= mid.to(tl.int32)).to(tl.int32), axis=0) >= need
        pre = tl.where(ok, mid, pre)
        top = tl.where(ok, top, mid - 1)
    return pre.to(tl.int32)
