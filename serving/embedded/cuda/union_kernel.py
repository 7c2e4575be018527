"""Triton kernel: the same attention as sparse_kernel.py (each query over its own kept keys),
a tile of queries at a time over the union of their kept keys, each union key loaded once.

    out[t, h] = softmax_{s kept by t}( q[t, h] . k[g, s] * scale ) @ v[g, s]      g = h // G

The gather kernel's program is one (query, kv head): its G query heads are the rows of a
tile `tl.dot` pads to 16 (G = 3: 13 of 16 rows are zero), so the products it pays for are
16 x K a query, and each query loads its K kept rows alone. Neighbouring queries of a
prompt keep largely the same keys (a real indexer's rows are alike), so here one program is
(a tile of BLOCK_Q consecutive queries, kv head g): its BLOCK_Q x GP rows (GP =
next_pow2(G); row r is query r // GP, head r % GP; rows past G zero and never stored) fill
the rows the gather kernel pads, and walk the tile's union of kept positions (`attend.
tile_union`: pos [n_tiles, L] ascending, L >= the longest union, count [n_tiles] its length,
who [n_tiles, L] bit i set where the tile's query i keeps pos) BLOCK_N at a time, each key's
k and v rows loaded once for the whole tile; a row's scores of keys its query does not keep
are -inf before the online softmax (fp32). Where the tile's queries keep the same keys this
is 1 / BLOCK_Q of the gather kernel's loads and as many products; where they keep disjoint
keys it is as many loads and BLOCK_Q times the products.

Both products are `tl.dot` at `PRECISION` ("tf32x3" by default, as sparse_kernel.py's; "ieee").
The kept keys' sums run in position order (the gather kernel's: the top-k's order), so the
output equals it to fp32 rounding.

The tiles' unions (pos, who, count) come from one of two builds below, the same entries:
`tile_union_kernel` (a register sort of a tile's codes; attend.tile_union) or
`tile_union_bitmap_kernel` (a bitmap a row, no sort; attend.tile_union_bitmap).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _step(q, k_base, v_base, pos_t, who_t, j0, count, r_q, m, denom, acc, stride_ks, stride_vs,
          D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """BLOCK_N union keys from j0: the online softmax's (m, denom, acc) after them."""
    offs_n = j0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    ok = offs_n < count
    pos = tl.load(pos_t + offs_n, mask=ok, other=0).to(tl.int64)                   # [BLOCK_N]
    who = tl.load(who_t + offs_n, mask=ok, other=0)                                # [BLOCK_N]
    keep = ((who[None, :] >> r_q[:, None]) & 1) != 0                               # [ROWS, BLOCK_N]
    k = tl.load(k_base + pos[:, None] * stride_ks + offs_d[None, :], mask=ok[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)                          # [ROWS, BLOCK_N]
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_safe[:, None])                                                # 0 where not kept
    alpha = tl.exp(m - m_safe)
    v = tl.load(v_base + pos[:, None] * stride_vs + offs_d[None, :], mask=ok[:, None], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
    denom = denom * alpha + tl.sum(p, axis=1)
    return m_new, denom, acc


@triton.jit
def union_attention_kernel(
    q_ptr,      # [T, H, D] fp32
    k_ptr,      # [Hkv, S_cap, D] fp32 (the KV cache)
    v_ptr,      # [Hkv, S_cap, D] fp32
    pos_ptr,    # [n_tiles, L] int32: each tile's union of kept positions, ascending, then padding
    who_ptr,    # [n_tiles, L] int32: bit i set where the tile's query i keeps that position
    count_ptr,  # [n_tiles] int32: the union's length
    out_ptr,    # [T, H, D] fp32
    scale,
    T,
    stride_qt, stride_qh,
    stride_kh, stride_ks,
    stride_vh, stride_vs,
    stride_pt,  # pos and who: a tile's row stride (L)
    stride_ot, stride_oh,
    G: tl.constexpr,
    GP: tl.constexpr,         # next_pow2(G)
    BLOCK_Q: tl.constexpr,    # queries a program (BLOCK_Q * GP >= 16 rows for tl.dot)
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,    # union keys a step
    PRECISION: tl.constexpr,  # "tf32x3" or "ieee"
    N_CONST: tl.constexpr = 0,  # > 0 under the interpreter (constant loop bounds only): every program walks N_CONST
):
    tile = tl.program_id(0)
    g = tl.program_id(1)
    ROWS: tl.constexpr = BLOCK_Q * GP
    r = tl.arange(0, ROWS)
    r_q = r // GP                                                                   # the row's query in the tile
    t = tile * BLOCK_Q + r_q                                                        # [ROWS] query
    head = r % GP
    row_ok = (head < G) & (t < T)
    h = g * G + head
    offs_d = tl.arange(0, D)
    t64 = t.to(tl.int64)
    q = tl.load(q_ptr + t64[:, None] * stride_qt + h[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0) * scale                          # [ROWS, D]
    m = tl.full([ROWS], float("-inf"), tl.float32)
    denom = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    k_base = k_ptr + g.to(tl.int64) * stride_kh
    v_base = v_ptr + g.to(tl.int64) * stride_vh
    pos_t = pos_ptr + tile.to(tl.int64) * stride_pt
    who_t = who_ptr + tile.to(tl.int64) * stride_pt
    count = tl.load(count_ptr + tile)
    if N_CONST > 0:                                   # the interpreter takes only constant range bounds
        for j0 in range(0, N_CONST, BLOCK_N):
            if j0 < count:                            # the steps the compiled loop walks
                m, denom, acc = _step(q, k_base, v_base, pos_t, who_t, j0, count, r_q, m, denom, acc,
                                      stride_ks, stride_vs, D, BLOCK_N, PRECISION)
    else:
        for j0 in range(0, count, BLOCK_N):
            m, denom, acc = _step(q, k_base, v_base, pos_t, who_t, j0, count, r_q, m, denom, acc,
                                  stride_ks, stride_vs, D, BLOCK_N, PRECISION)
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    tl.store(out_ptr + t64[:, None] * stride_ot + h[:, None] * stride_oh + offs_d[None, :], out,
             mask=row_ok[:, None])


@triton.jit
def tile_union_kernel(
    idx_ptr,      # [T, K] int32 kept positions (-1 pads; distinct within a row)
    pos_ptr,      # [n_tiles, L] int32 out: the tile's union, ascending, in its first count entries
    who_ptr,      # [n_tiles, L] int32 out: bit i set where the tile's query i keeps that position
    count_ptr,    # [n_tiles] int32 out
    scratch_ptr,  # [n_tiles, LP] int32: the tile's sorted codes
    T,
    stride_it,
    stride_pt,    # pos and who: a tile's row stride
    K: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    LP: tl.constexpr,         # next_pow2(BLOCK_Q * K)
):
    """One program a tile (`attend.tile_union` is its torch reference): the tile's codes
    position x BLOCK_Q + row sorted in registers (`tl.sort`, pads last), then each run of one
    position numbered by a running sum (`tl.cumsum`) and its rows' bits gathered from the at
    most BLOCK_Q - 1 codes after its first (read back from scratch, sorted)."""
    tile = tl.program_id(0)
    BIG: tl.constexpr = 2147483647
    j = tl.arange(0, LP)
    r = j // K
    t = tile * BLOCK_Q + r
    ok = (j < BLOCK_Q * K) & (t < T)
    x = tl.load(idx_ptr + t.to(tl.int64) * stride_it + j % K, mask=ok, other=-1)
    code = tl.sort(tl.where(x >= 0, x * BLOCK_Q + r, BIG))
    base = scratch_ptr + tile.to(tl.int64) * LP
    tl.store(base + j, code)
    tl.debug_barrier()
    valid = code != BIG
    p = code // BLOCK_Q
    prev = tl.load(base + j - 1, mask=j > 0, other=-1)
    first = valid & ((j == 0) | (prev // BLOCK_Q != p))
    who = tl.where(valid, 1 << (code % BLOCK_Q), 0)
    for i in tl.static_range(1, BLOCK_Q):
        nxt = tl.load(base + j + i, mask=j + i < LP, other=BIG)
        who = who | tl.where((nxt != BIG) & (nxt // BLOCK_Q == p), 1 << (nxt % BLOCK_Q), 0)
    slot = tl.cumsum(first.to(tl.int32), 0) - 1
    out = tile.to(tl.int64) * stride_pt + slot
    tl.store(pos_ptr + out, p, mask=first)
    tl.store(who_ptr + out, who, mask=first)
    tl.store(count_ptr + tile, tl.sum(first.to(tl.int32), 0))


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _popcount(v):
    """Set bits of each uint32 (SWAR: pairs, nibbles, bytes, then one multiply sums the bytes)."""
    v = v - ((v >> 1) & 0x55555555)
    v = (v & 0x33333333) + ((v >> 2) & 0x33333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F
    return ((v * 0x01010101) >> 24) & 0xFF     # the mask: the same where the product is not wrapped at 32 bits


@triton.jit
def _zero_words(bits, w0, W, n_words, BLOCK_Q: tl.constexpr, WB: tl.constexpr):
    rq = tl.arange(0, BLOCK_Q)
    w = w0 + tl.arange(0, WB)
    tl.store(bits + rq[:, None] * W + w[None, :], tl.zeros([BLOCK_Q, WB], tl.int32), mask=(w < n_words)[None, :])


@triton.jit
def _scan_words(bits, pos_t, who_t, w0, W, n_words, base, BLOCK_Q: tl.constexpr, WB: tl.constexpr):
    """WB bitmap words from w0: their set positions and rows' bits from slot base on; the next base."""
    rq = tl.arange(0, BLOCK_Q)
    w = w0 + tl.arange(0, WB)
    rows = tl.load(bits + rq[:, None] * W + w[None, :], mask=(w < n_words)[None, :], other=0,
                   cache_modifier=".cg").to(tl.uint32, bitcast=True)                         # [BLOCK_Q, WB]
    u = tl.reduce(rows, 0, _or)                                                            # [WB]
    cnt = _popcount(u).to(tl.int32)
    slot = base + tl.cumsum(cnt, 0) - cnt
    for b in tl.static_range(32):
        on = ((u >> b) & 1) != 0
        who = tl.sum((((rows >> b) & 1) << rq[:, None].to(tl.uint32)).to(tl.int32), 0)
        tl.store(pos_t + slot, w * 32 + b, mask=on)
        tl.store(who_t + slot, who, mask=on)
        slot += on.to(tl.int32)
    return base + tl.sum(cnt, 0)


@triton.jit
def tile_union_bitmap_kernel(
    idx_ptr,      # [T, K] int32 kept positions (-1 pads; distinct within a row)
    pos_ptr,      # [n_tiles, L] int32 out: as tile_union_kernel's
    who_ptr,      # [n_tiles, L] int32 out
    count_ptr,    # [n_tiles] int32 out
    bits_ptr,     # [n_tiles, BLOCK_Q, W] int32 scratch: a bitmap of each row's positions (W words a row)
    T,
    W,            # words a row of the scratch (>= the highest position // 32 + 1: positions past it are dropped)
    stride_it,
    stride_pt,    # pos and who: a tile's row stride
    K: tl.constexpr,
    KP: tl.constexpr,         # next_pow2(K)
    BLOCK_Q: tl.constexpr,
    WB: tl.constexpr,         # bitmap words a step of the scan
    W_CONST: tl.constexpr = 0,  # > 0 under the interpreter (constant loop bounds only): every program walks W_CONST
):
    """tile_union_kernel's entries without a sort: each row's positions set bits of its own
    bitmap (one atomic OR a position, the words up to the tile's highest position zeroed first),
    then the words are walked in position order WB at a time: a word's union is the OR of its
    rows' words, its first slot the running count of the words before it (a popcount and a
    prefix sum), and each of its 32 bits, where set, writes its position and its rows' bits."""
    tile = tl.program_id(0)
    rq = tl.arange(0, BLOCK_Q)
    c = tl.arange(0, KP)
    t = tile * BLOCK_Q + rq
    ok = (c[None, :] < K) & (t[:, None] < T)
    x = tl.load(idx_ptr + t.to(tl.int64)[:, None] * stride_it + c[None, :], mask=ok, other=-1)   # [BLOCK_Q, KP]
    x = tl.where(x < W * 32, x, -1)   # a position past the scratch is not set (memory safety; the caller's bound)
    n_words = (tl.max(tl.max(x, 1), 0) >> 5) + 1                     # 0 where the tile keeps nothing
    bits = bits_ptr + tile.to(tl.int64) * BLOCK_Q * W
    if W_CONST > 0:                                   # the interpreter takes only constant range bounds
        for w0 in range(0, W_CONST, WB):              # (masked past n_words)
            _zero_words(bits, w0, W, n_words, BLOCK_Q, WB)
    else:
        for w0 in range(0, n_words, WB):
            _zero_words(bits, w0, W, n_words, BLOCK_Q, WB)
    tl.debug_barrier()
    tl.atomic_or(bits + rq[:, None] * W + (x >> 5), 1 << (x & 31), mask=x >= 0)
    tl.debug_barrier()
    out = tile.to(tl.int64) * stride_pt
    base = tl.zeros([], tl.int32)
    if W_CONST > 0:
        for w0 in range(0, W_CONST, WB):
            base = _scan_words(bits, pos_ptr + out, who_ptr + out, w0, W, n_words, base, BLOCK_Q, WB)
    else:
        for w0 in range(0, n_words, WB):
            base = _scan_words(bits, pos_ptr + out, who_ptr + out, w0, W, n_words, base, BLOCK_Q, WB)
    tl.store(count_ptr + tile, base)
