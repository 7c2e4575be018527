"""Triton kernel: the same attention as sparse_kernel.py (each query over its own kept keys),
computed block-dense over key positions under a bitmask instead of gathered key by key.

    out[t, h] = softmax_{s kept by t}( q[t, h] . k[g, s] * scale ) @ v[g, s]      g = h // G

bits [T, NW] int32: bit s % 32 of word s // 32 set where query t keeps key position s
(`attend.kept_bits`); lo, hi [n_tiles] int32: each tile of BLOCK_Q queries' smallest kept
position (rounded down to BLOCK_N) and one past its largest. One program = one (tile of
BLOCK_Q consecutive queries, kv head g): its BLOCK_Q x GP rows (GP = next_pow2(G); row r is
query r // GP, head r % GP, rows past G zero and never stored) walk the key positions
[lo, hi) BLOCK_N at a time, each block's k and v rows
loaded once, contiguous, for all the tile's queries (the gather kernel loads each query's
kept rows for that query alone); a block where no row keeps a key is skipped; scores of keys
a row does not keep are -inf before the online softmax (fp32). So the tile's queries share
every load, at the price of products over every position of the tile's span: cheaper than the
gather where the span is a few times K (a prompt's first tokens' worth of context, or K a
large share of it), dearer where it is many times K.

Both products are `tl.dot` at `PRECISION` ("tf32x3" by default, as sparse_kernel.py's; "ieee").
The kept keys' sums run in position order (the gather kernel's: the top-k's order), so the
output equals it to fp32 rounding.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _block(q, k_base, v_base, bits_q, q_ok, n0, hi, m, denom, acc, stride_ks, stride_vs,
           D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, BLOCK_Q: tl.constexpr,
           GP: tl.constexpr):
    """One step of BLOCK_N key positions from n0 (a multiple of 32): the online softmax's
    (m, denom, acc) after it (unchanged where no row keeps a key of the block). The bitmask's
    words are loaded once a query ([BLOCK_Q, BLOCK_N / 32]) and spread over its GP rows and
    32 positions a word in registers."""
    NWB: tl.constexpr = BLOCK_N // 32
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    offs_w = tl.arange(0, NWB)
    pos = n0 + offs_n                                                               # [BLOCK_N]
    in_span = pos < hi
    words = tl.load(bits_q[:, None] + (n0 // 32 + offs_w)[None, :],
                    mask=q_ok[:, None] & ((n0 + offs_w * 32) < hi)[None, :], other=0)   # [BLOCK_Q, NWB]
    word = tl.reshape(tl.broadcast_to(tl.reshape(words, [BLOCK_Q, 1, NWB, 1]), [BLOCK_Q, GP, NWB, 32]),
                      [BLOCK_Q * GP, BLOCK_N])                                      # [ROWS, BLOCK_N]
    keep = ((word >> (pos % 32)[None, :]) & 1) != 0
    if tl.max(tl.max(keep.to(tl.int32), axis=1), axis=0) > 0:                       # else: no row keeps a key
        rows = pos.to(tl.int64)
        k = tl.load(k_base + rows[:, None] * stride_ks + offs_d[None, :], mask=in_span[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)                      # [ROWS, BLOCK_N]
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])                                             # 0 where not kept
        alpha = tl.exp(m - m_safe)
        v = tl.load(v_base + rows[:, None] * stride_vs + offs_d[None, :], mask=in_span[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        denom = denom * alpha + tl.sum(p, axis=1)
        m = m_new
    return m, denom, acc


@triton.jit
def masked_attention_kernel(
    q_ptr,      # [T, H, D] fp32
    k_ptr,      # [Hkv, S_cap, D] fp32 (the KV cache)
    v_ptr,      # [Hkv, S_cap, D] fp32
    bits_ptr,   # [T, NW] int32 kept-position bitmask
    lo_ptr,     # [n_tiles] int32: each tile's smallest kept position, rounded down to BLOCK_N
    hi_ptr,     # [n_tiles] int32: one past each tile's largest kept position
    out_ptr,    # [T, H, D] fp32
    scale,
    T,
    stride_qt, stride_qh,
    stride_kh, stride_ks,
    stride_vh, stride_vs,
    stride_bt,
    stride_ot, stride_oh,
    G: tl.constexpr,
    GP: tl.constexpr,         # next_pow2(G)
    BLOCK_Q: tl.constexpr,    # queries a program (BLOCK_Q * GP >= 16 rows for tl.dot)
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,    # key positions a step (a multiple of 32)
    PRECISION: tl.constexpr,  # "tf32x3" or "ieee"
    N_CONST: tl.constexpr = 0,  # > 0 under the interpreter (constant loop bounds only): every program walks N_CONST
):
    tile = tl.program_id(0)
    g = tl.program_id(1)
    ROWS: tl.constexpr = BLOCK_Q * GP
    r = tl.arange(0, ROWS)
    t = tile * BLOCK_Q + r // GP                                                     # [ROWS] query
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
    tq = tile * BLOCK_Q + tl.arange(0, BLOCK_Q)                                      # [BLOCK_Q] the tile's queries
    bits_q = bits_ptr + tq.to(tl.int64) * stride_bt
    q_ok = tq < T
    lo = tl.load(lo_ptr + tile)
    hi = tl.load(hi_ptr + tile)
    if N_CONST > 0:                                   # the interpreter takes only constant range bounds
        for n0 in range(0, N_CONST, BLOCK_N):
            if (n0 >= lo) & (n0 < hi):                # the blocks the compiled loop walks
                m, denom, acc = _block(q, k_base, v_base, bits_q, q_ok, n0, hi, m, denom, acc,
                                       stride_ks, stride_vs, D, BLOCK_N, PRECISION, BLOCK_Q, GP)
    else:
        for n0 in range(lo, hi, BLOCK_N):
            m, denom, acc = _block(q, k_base, v_base, bits_q, q_ok, n0, hi, m, denom, acc,
                                   stride_ks, stride_vs, D, BLOCK_N, PRECISION, BLOCK_Q, GP)
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    tl.store(out_ptr + t64[:, None] * stride_ot + h[:, None] * stride_oh + offs_d[None, :], out,
             mask=row_ok[:, None])
