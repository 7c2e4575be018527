"""Triton kernel: exact top-k per row by a sample-bracketed select (one program per row).

(a) Every STRIDE-th key of the row (NS of them, in registers) gives two bracket keys by a
    joint radix search on the sample (`_search.kth_threshold`, RADIX_BITS a step): hi = the R_HI-th largest
    sample key, lo = the R_LO-th
    (R_HI < k / STRIDE < R_LO, about 4 standard deviations of the sampled rank apart).
(b) One pass over the row in TILE-wide tiles: keys > hi go straight to the output in index
    order, keys in (lo, hi] (the candidates, with their positions) to a per-row scratch of CAP
    slots, both ranked by one packed prefix sum per tile (stores past k / CAP are dropped,
    still counted); the keys == lo (the ties at the lower bracket) are counted.
(c) If count(> hi) < k, the candidates fit the scratch and the row has more than k keys:
    - k <= count(> lo): the k-th key T lies in (lo, hi] and every key == T is in the scratch
      (in index order): a radix search over the CAP scratch keys finds T, and the candidates
      > T plus the lowest-index ties fill the remaining k - count(> hi) slots;
    - count(> lo) < k <= count(>= lo): T = lo: every candidate is kept, then the first
      k - count(> lo) ties (the lowest positions), found by a second pass from the row's start
      that stops once it has them. This is the row whose k-th score is a run
      of exact ties, e.g. an indexer's ReLU zeros (rows with fewer than k keys above 0: about
      a third of SmolLM2's prefill rows at 3.5K tokens, most of some layers'): however many
      keys tie, they need no scratch (the old rule stored them as candidates, overflowed the
      scratch and fell back: 6.6x slower on such rows of 22,600 keys on the H200,
      docs/results/h200-bench-topk-ties.json).
    Otherwise (the bracket missed, too many candidates, or a row with <= k keys) the row
    falls back to a 32-pass search over the whole row and one selection pass: exact, slow,
    rare on real rows (adversarial rows: a tie run above the lower bracket, short rows).
    The output is the same either way up to order: (c) lists keys > hi, then the candidates
    kept, then the ties; the fallback lists every key > T in index order, then the ties.
Keys: order-preserving int32 (float bits, negatives flipped); INT_MIN marks a non-candidate.
"""

from __future__ import annotations

import triton
import triton.language as tl

from niah.kernels.topk._search import kth_in, kth_threshold


@triton.jit
def _keys(x_ptr, row_off, pos, limit, HAS_LEN: tl.constexpr):
    inb = pos < limit
    x = tl.load(x_ptr + row_off + pos, mask=inb, other=float("-inf")).to(tl.float32)
    bits = x.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed order == float order
    if HAS_LEN:
        valid = inb
    else:
        valid = inb & (x != float("-inf"))
    return tl.where(valid, key, -2147483648)


@triton.jit
def _fallback(x_ptr, out_ptr, row_off, out_off, limit, W, K, n_valid, K_PAD: tl.constexpr, TILE: tl.constexpr,
              HAS_LEN: tl.constexpr):
    """Today's exact rule over the whole row from global memory: T by 32 counting passes, then
    keys > T and the lowest-index ties == T; rows with <= K candidates: all of them in index order."""
    offs = tl.arange(0, TILE)
    lo = tl.zeros([1], tl.int64) - 2147483648
    if n_valid > K:
        hi = tl.zeros([1], tl.int64) + 2147483647
        for _ in range(32):
            mid = lo + ((hi - lo + 1) >> 1)
            cnt = tl.zeros([1], tl.int32)
            t0 = 0
            while t0 < W:  # while, not range: the interpreter takes no run-time range bounds
                key = _keys(x_ptr, row_off, t0 + offs, limit, HAS_LEN)
                cnt += tl.sum((key[None, :] >= mid.to(tl.int32)[:, None]).to(tl.int32), axis=1)
                t0 += TILE
            ok = cnt >= K
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid - 1)
    thr = tl.sum(lo, axis=0).to(tl.int32)  # INT_MIN for a short row: every candidate is > thr
    n_above = 0
    t0 = 0
    while t0 < W:
        n_above += tl.sum((_keys(x_ptr, row_off, t0 + offs, limit, HAS_LEN) > thr).to(tl.int32), axis=0)
        t0 += TILE
    need = K - n_above
    b_gt = 0
    b_eq = 0
    t0 = 0
    while t0 < W:
        pos = t0 + offs
        key = _keys(x_ptr, row_off, pos, limit, HAS_LEN)
        gt = key > thr
        eq = (key == thr) & (key != -2147483648)
        c = tl.cumsum(gt.to(tl.int32) + (eq.to(tl.int32) << 16), axis=0)
        r_gt = b_gt + (c & 0xFFFF)
        r_eq = b_eq + ((c >> 16) & 0xFFFF)
        sel = gt | (eq & (r_eq <= need))
        slot = tl.where(gt, r_gt - 1, n_above + r_eq - 1)
        tl.store(out_ptr + out_off + slot, pos, mask=sel)
        b_gt += tl.sum(gt.to(tl.int32), axis=0)
        b_eq += tl.sum(eq.to(tl.int32), axis=0)
        t0 += TILE
    n_sel = tl.minimum(n_valid, K)
    for p0 in range(0, K_PAD, TILE):
        p = p0 + offs
        tl.store(out_ptr + out_off + p, tl.full([TILE], -1, tl.int32), mask=(p >= n_sel) & (p < K))


@triton.jit
def _from_scratch(skey_ptr, sidx_ptr, out_ptr, s_off, out_off, n_cand, n_gt, K, lo, hi, CAP: tl.constexpr,
                  BITS: tl.constexpr, NARROW: tl.constexpr):
    """The candidates hold the k-th key: select the K - n_gt of them that complete the row.
    NARROW: its key found by a binary search over the bracket (lo, hi] only (_search.kth_in)."""
    cp = tl.arange(0, CAP)
    ckey = tl.load(skey_ptr + s_off + cp, mask=cp < n_cand, other=-2147483648)
    need = K - n_gt
    if NARROW:
        thr = kth_in(ckey, need, lo, hi)
    else:
        thr = tl.sum(kth_threshold(ckey[None, :], tl.zeros([1], tl.int32) + need, BITS), axis=0)
    gt = ckey > thr
    eq = ckey == thr
    c = tl.cumsum(gt.to(tl.int32) + (eq.to(tl.int32) << 16), axis=0)
    c_gt = tl.sum(gt.to(tl.int32), axis=0)
    r_eq = (c >> 16) & 0xFFFF
    sel = gt | (eq & (r_eq <= need - c_gt))
    slot = n_gt + tl.where(gt, (c & 0xFFFF) - 1, c_gt + r_eq - 1)
    cidx = tl.load(sidx_ptr + s_off + cp, mask=sel, other=-1)
    tl.store(out_ptr + out_off + slot, cidx, mask=sel)


@triton.jit
def _from_scratch_tiled(skey_ptr, sidx_ptr, out_ptr, s_off, out_off, n_cand, n_gt, K, lo, hi, TILE: tl.constexpr,
                        NARROW: tl.constexpr):
    """_from_scratch's selection read from the scratch in TILE-wide pieces (a program of few warps
    cannot hold CAP keys in registers): T by a binary search, 32 passes over the n_cand
    candidates (cached reads, a few KB a row), then the candidates > T and the lowest-slot ties,
    in slot order as _from_scratch lists them. The threshold is unique, so this is _from_scratch's
    selection whatever bits a step that one takes. NARROW: T searched over the bracket (lo, hi]
    only, ceil(log2(hi - lo)) passes (_search.kth_in's rule)."""
    offs = tl.arange(0, TILE)
    need = K - n_gt
    if NARROW:
        pre = lo.to(tl.int64) + 1
        top = hi.to(tl.int64)
        while pre < top:
            mid = pre + ((top - pre + 1) >> 1)
            cnt = 0
            t0 = 0
            while t0 < n_cand:
                cp = t0 + offs
                key = tl.load(skey_ptr + s_off + cp, mask=cp < n_cand, other=-2147483648)
                cnt += tl.sum((key >= mid.to(tl.int32)).to(tl.int32), axis=0)
                t0 += TILE
            ok = cnt >= need
            pre = tl.where(ok, mid, pre)
            top = tl.where(ok, top, mid - 1)
        thr = pre.to(tl.int32)
    else:
        pre = tl.zeros([1], tl.int64) - 2147483648
        for step in range(32):
            t = pre + (tl.full([1], 1, tl.int64) << (31 - step))
            cnt = tl.zeros([1], tl.int32)
            t0 = 0
            while t0 < n_cand:  # while, not range: the interpreter takes no run-time range bounds
                cp = t0 + offs
                key = tl.load(skey_ptr + s_off + cp, mask=cp < n_cand, other=-2147483648)
                cnt += tl.sum((key[None, :] >= t.to(tl.int32)[:, None]).to(tl.int32), axis=1)
                t0 += TILE
            pre = tl.where(cnt >= need, t, pre)
        thr = tl.sum(pre, axis=0).to(tl.int32)
    c_gt = 0
    t0 = 0
    while t0 < n_cand:
        cp = t0 + offs
        key = tl.load(skey_ptr + s_off + cp, mask=cp < n_cand, other=-2147483648)
        c_gt += tl.sum((key > thr).to(tl.int32), axis=0)
        t0 += TILE
    b_gt = 0
    b_eq = 0
    t0 = 0
    while t0 < n_cand:
        cp = t0 + offs
        key = tl.load(skey_ptr + s_off + cp, mask=cp < n_cand, other=-2147483648)
        gt = key > thr
        eq = key == thr
        c = tl.cumsum(gt.to(tl.int32) + (eq.to(tl.int32) << 16), axis=0)
        r_eq = b_eq + ((c >> 16) & 0xFFFF)
        sel = gt | (eq & (r_eq <= need - c_gt))
        slot = n_gt + tl.where(gt, b_gt + (c & 0xFFFF) - 1, c_gt + r_eq - 1)
        cidx = tl.load(sidx_ptr + s_off + cp, mask=sel, other=-1)
        tl.store(out_ptr + out_off + slot, cidx, mask=sel)
        b_gt += tl.sum(gt.to(tl.int32), axis=0)
        b_eq += tl.sum(eq.to(tl.int32), axis=0)
        t0 += TILE


@triton.jit
def _bracket_tile(x_ptr, out_ptr, skey_ptr, sidx_ptr, row_off, out_off, s_off, t0, limit, hi, lo, K,
                  n_gt, n_cand, n_eq, n_valid, TILE: tl.constexpr, CAP: tl.constexpr, HAS_LEN: tl.constexpr):
    """One tile of pass (b): keys > hi to the output, keys in (lo, hi] to the scratch, in index
    order; the keys == lo counted (with the valid keys' count: no extra reduction without lengths)."""
    pos = t0 + tl.arange(0, TILE)
    key = _keys(x_ptr, row_off, pos, limit, HAS_LEN)
    gt = key > hi
    cand = (key > lo) & (key <= hi)
    eq = key == lo
    packed = gt.to(tl.int32) + (cand.to(tl.int32) << 16)
    c = tl.cumsum(packed, axis=0)
    r_gt = n_gt + (c & 0xFFFF) - 1
    r_c = n_cand + ((c >> 16) & 0xFFFF) - 1
    tl.store(out_ptr + out_off + r_gt, pos, mask=gt & (r_gt < K))
    tl.store(skey_ptr + s_off + r_c, key, mask=cand & (r_c < CAP))
    tl.store(sidx_ptr + s_off + r_c, pos, mask=cand & (r_c < CAP))
    tot = tl.sum(packed, axis=0)
    n_gt += tot & 0xFFFF
    n_cand += (tot >> 16) & 0xFFFF
    if HAS_LEN:
        n_eq += tl.sum(eq.to(tl.int32), axis=0)
    else:
        both = tl.sum((key != -2147483648).to(tl.int32) + (eq.to(tl.int32) << 16), axis=0)
        n_valid += both & 0xFFFF
        n_eq += (both >> 16) & 0xFFFF
    return n_gt, n_cand, n_eq, n_valid


@triton.jit
def _with_ties(x_ptr, sidx_ptr, out_ptr, row_off, s_off, out_off, limit, lo, n_cand, n_gt, K,
               CAP: tl.constexpr, TILE: tl.constexpr, HAS_LEN: tl.constexpr):
    """T = lo: every candidate (after the n_gt keys > hi), then the first ties, found by a pass
    from the row's start that stops once it has them (ties such as ReLU zeros are everywhere)."""
    cp = tl.arange(0, CAP)
    cidx = tl.load(sidx_ptr + s_off + cp, mask=cp < n_cand, other=-1)
    tl.store(out_ptr + out_off + n_gt + cp, cidx, mask=cp < n_cand)
    need = K - n_gt - n_cand
    base = out_off + n_gt + n_cand
    offs = tl.arange(0, TILE)
    got = 0
    t0 = 0
    while (t0 < limit) & (got < need):  # while, not range: the interpreter takes no run-time range bounds
        pos = t0 + offs
        eq = _keys(x_ptr, row_off, pos, limit, HAS_LEN) == lo
        r = got + tl.cumsum(eq.to(tl.int32), axis=0) - 1
        tl.store(out_ptr + base + r, pos, mask=eq & (r < need))
        got += tl.sum(eq.to(tl.int32), axis=0)
        t0 += TILE


@triton.jit
def _finish(x_ptr, out_ptr, skey_ptr, sidx_ptr, row_off, out_off, s_off, limit, W, K, hi, lo, n_gt, n_cand, n_eq,
            n_valid, TILE: tl.constexpr, CAP: tl.constexpr, HAS_LEN: tl.constexpr, K_PAD: tl.constexpr,
            RADIX_BITS: tl.constexpr, SCRATCH_TILE: tl.constexpr, NARROW: tl.constexpr):
    """Step (c) from the row's counts after the pass: the scratch's search, the ties at lo, or
    the fallback (the segmented select's finish calls it too)."""
    fits = (n_gt < K) & (n_cand <= CAP) & (n_valid > K)
    if fits & (n_gt + n_cand >= K):
        if SCRATCH_TILE:
            _from_scratch_tiled(skey_ptr, sidx_ptr, out_ptr, s_off, out_off, n_cand, n_gt, K, lo, hi, SCRATCH_TILE,
                                NARROW)
        else:
            _from_scratch(skey_ptr, sidx_ptr, out_ptr, s_off, out_off, n_cand, n_gt, K, lo, hi, CAP, RADIX_BITS,
                          NARROW)
    elif fits & (n_gt + n_cand + n_eq >= K) & (hi >= lo):   # hi < lo: no bracket to trust (NaN bit patterns)
        _with_ties(x_ptr, sidx_ptr, out_ptr, row_off, s_off, out_off, limit, lo, n_cand, n_gt, K, CAP, TILE,
                   HAS_LEN)
    else:
        _fallback(x_ptr, out_ptr, row_off, out_off, limit, W, K, n_valid, K_PAD, TILE, HAS_LEN)


@triton.jit
def sample_topk_kernel(
    x_ptr,  # fp32 logits [R, W]
    len_ptr,  # HAS_LEN: int32 [R]
    out_ptr,  # int32 [R, K]
    skey_ptr,  # int32 scratch [R, CAP]: candidate keys
    sidx_ptr,  # int32 scratch [R, CAP]: candidate positions
    W,
    K,
    stride_x,
    R_HI,  # sample rank of the upper bracket (<= 0: no upper bracket)
    R_LO,  # sample rank of the lower bracket
    TILE: tl.constexpr,
    NS: tl.constexpr,  # sample slots, a power of two >= ceil(W / STRIDE)
    STRIDE: tl.constexpr,
    CAP: tl.constexpr,
    HAS_LEN: tl.constexpr,
    K_PAD: tl.constexpr,  # next_pow2(K)
    W_CONST: tl.constexpr,  # under the interpreter: W (a constant loop bound); else 0 (W at run time)
    RADIX_BITS: tl.constexpr,  # bits a step of the bracket and scratch searches (_search.kth_threshold): 1, 2 or 4
    SCRATCH_TILE: tl.constexpr,  # 0: the scratch's CAP keys searched in registers; else read in pieces of this many
    NARROW: tl.constexpr,  # the scratch's search over the bracket (lo, hi] only (_search.kth_in), not all 32 bits
):
    row = tl.program_id(0).to(tl.int64)
    row_off = row * stride_x
    out_off = row * K
    s_off = row * CAP
    if HAS_LEN:
        limit = tl.minimum(tl.maximum(tl.load(len_ptr + row), 0), W)
    else:
        limit = W
    # (a) bracket the k-th key from the sample: one joint search for both ranks
    skey = _keys(x_ptr, row_off, tl.arange(0, NS) * STRIDE, limit, HAS_LEN)
    two = tl.arange(0, 2)
    br = kth_threshold(skey[None, :], tl.where(two == 0, R_HI, R_LO), RADIX_BITS)
    hi = tl.sum(tl.where(two == 0, br, 0), axis=0)
    lo = tl.maximum(tl.sum(tl.where(two == 1, br, 0), axis=0), -2147483647)
    # (b) one pass: keys > hi to the output, candidates in (lo, hi] to the scratch, ties at lo counted
    n_gt = 0
    n_cand = 0
    n_eq = 0
    n_valid = 0
    if W_CONST:  # the interpreter takes only constant range bounds
        for t0 in range(0, W_CONST, TILE):
            n_gt, n_cand, n_eq, n_valid = _bracket_tile(x_ptr, out_ptr, skey_ptr, sidx_ptr, row_off, out_off, s_off,
                                                        t0, limit, hi, lo, K, n_gt, n_cand, n_eq, n_valid, TILE, CAP,
                                                        HAS_LEN)
    else:
        for t0 in range(0, W, TILE):
            n_gt, n_cand, n_eq, n_valid = _bracket_tile(x_ptr, out_ptr, skey_ptr, sidx_ptr, row_off, out_off, s_off,
                                                        t0, limit, hi, lo, K, n_gt, n_cand, n_eq, n_valid, TILE, CAP,
                                                        HAS_LEN)
    if HAS_LEN:
        n_valid = limit
    tl.debug_barrier()  # the scratch (and the output) written above are read / rewritten below
    _finish(x_ptr, out_ptr, skey_ptr, sidx_ptr, row_off, out_off, s_off, limit, W, K, hi, lo, n_gt, n_cand, n_eq,
            n_valid, TILE, CAP, HAS_LEN, K_PAD, RADIX_BITS, SCRATCH_TILE, NARROW)
