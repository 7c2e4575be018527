"""Triton kernel: attention of each query over its own kept keys only (GQA, fp32 data).

    out[t, h] = softmax_j( q[t, h] . k[g, idx[t, j]] * scale ) @ v[g, idx[t, j]]    g = h // G

idx [T, K] int32 holds the kept key positions of query t (-1 = none: rows shorter than K).
One program = one (query t, kv head g): the G query heads of the group as the rows of a
[BLOCK_G, D] tile (rows past G are zero and never stored; BLOCK_G >= 16 for `tl.dot`, the
smallest tile it takes), K keys walked BLOCK_N at a time, rows of k and v loaded by index straight
from the KV cache (no gather is materialised), online softmax in fp32. With ONE_HEAD (few
queries: a decode step's one query has Hkv programs otherwise, each walking all K keys alone)
one program = one (query t, query head h), its head the tile's only row: G times the programs,
each row computed as in the group's tile (a tile row's products and softmax read no other
row), so the same output.

With SPLIT_KEYS (> 0: a decode step's few queries, whose programs would each walk all K keys
in K / BLOCK_N dependent steps) the keys are split too: program_id(2) = s walks keys
[s * SPLIT_KEYS, (s + 1) * SPLIT_KEYS) only and leaves its running max, its softmax sum and its
unnormalised output in a partial row; `sparse_attention_combine_kernel` (one program a query
head) rescales the partials to their common max and sums them (flash-decoding's split-K): the
same softmax, its sums in another order (fp32 rounding apart, the same output).

Both products are `tl.dot` at `PRECISION`: "tf32x3" (the default: three tf32 tensor-core
products per fp32 product, the small parts' cross terms included, fp32-level accuracy, the
CPU server's SDPA to ~1e-6) or "ieee" (fp32 FMA); or "broadcast", this kernel's first
version (a broadcast multiply-and-sum on CUDA cores, BLOCK_G = next_pow2(G)), kept as the
baseline benchmarks/kernels/sparse_attention.py times the other two against
(docs/embedded-server.md has the H200 figures).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def sparse_attention_kernel(
    q_ptr,      # [T, H, D] fp32
    k_ptr,      # [Hkv, S_cap, D] fp32 (the KV cache)
    v_ptr,      # [Hkv, S_cap, D] fp32
    idx_ptr,    # [T, K] int32
    out_ptr,    # [T, H, D] fp32
    part_ptr,   # SPLIT_KEYS > 0: fp32 partials, [T, H, NS, D] outputs then [T, H, NS, 2] (max, sum); else unused
    scale,
    stride_qt, stride_qh,
    stride_kh, stride_ks,
    stride_vh, stride_vs,
    stride_it,
    stride_ot, stride_oh,
    n_heads,    # H, all query heads (SPLIT_KEYS > 0: the partials' layout)
    K: tl.constexpr,          # kept keys per query (the top-k: one compile per value)
    G: tl.constexpr,
    BLOCK_G: tl.constexpr,    # >= G (and >= 16 for tl.dot)
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,  # "tf32x3", "ieee" or "broadcast"
    ONE_HEAD: tl.constexpr,   # one query head a program (program_id(1) = the head): few queries
    SPLIT_KEYS: tl.constexpr = 0,  # > 0: keys a program (program_id(2) = the split), partials out
):
    t = tl.program_id(0)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    if ONE_HEAD:
        h = tl.program_id(1)
        g = h // G
        g_mask = offs_g < 1
        heads = h + offs_g
    else:
        g = tl.program_id(1)
        g_mask = offs_g < G
        heads = g * G + offs_g
    q = tl.load(q_ptr + t.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None], other=0.0)                                  # [BLOCK_G, D]
    q = q * scale
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    k_base = k_ptr + g.to(tl.int64) * stride_kh
    v_base = v_ptr + g.to(tl.int64) * stride_vh
    idx_row = idx_ptr + t.to(tl.int64) * stride_it
    SPAN: tl.constexpr = SPLIT_KEYS if SPLIT_KEYS > 0 else K               # keys this program walks
    n_lo = tl.program_id(2) * SPLIT_KEYS                                    # 0 unsplit
    for n0 in range(0, SPAN, BLOCK_N):
        n = n_lo + n0 + offs_n
        idx = tl.load(idx_row + n, mask=n < K, other=-1)
        valid = idx >= 0
        rows = tl.where(valid, idx, 0).to(tl.int64)
        k = tl.load(k_base + rows[:, None] * stride_ks + offs_d[None, :], mask=valid[:, None], other=0.0)
        if PRECISION == "broadcast":
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)                       # [BLOCK_G, BLOCK_N]
        else:
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])                                             # 0 where masked
        alpha = tl.exp(m - m_safe)
        v = tl.load(v_base + rows[:, None] * stride_vs + offs_d[None, :], mask=valid[:, None], other=0.0)
        if PRECISION == "broadcast":
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)   # [BLOCK_G, D]
        else:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        denom = denom * alpha + tl.sum(p, axis=1)
        m = m_new
    if SPLIT_KEYS > 0:
        # partial row (t, head, split) of T * H * NS: its output at row * D (rows 16-byte
        # aligned), its max and sum after all the outputs, at T * H * NS * D + 2 * row
        NS = tl.num_programs(2)
        row = (t.to(tl.int64) * n_heads + heads) * NS + tl.program_id(2)                     # [BLOCK_G]
        tl.store(part_ptr + row[:, None] * D + offs_d[None, :], acc, mask=g_mask[:, None])
        ml = part_ptr + tl.num_programs(0).to(tl.int64) * n_heads * NS * D + 2 * row
        tl.store(ml, m, mask=g_mask)
        tl.store(ml + 1, denom, mask=g_mask)
    else:
        out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
        tl.store(out_ptr + t.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + offs_d[None, :], out,
                 mask=g_mask[:, None])


@triton.jit
def sparse_attention_combine_kernel(
    part_ptr,   # fp32: [T, H, NS, D] each split's unnormalised output, then [T, H, NS, 2] its max and sum
    out_ptr,    # [T, H, D] fp32
    stride_ot, stride_oh,
    H: tl.constexpr,
    NS: tl.constexpr,
    BLOCK_S: tl.constexpr,    # next_pow2(NS)
    D: tl.constexpr,
):
    """One program a (query t, head h): out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s,
    M the largest m_s (a split with no kept key: m_s = -inf, weight 0; none at all: 0 out)."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, D)
    s_ok = offs_s < NS
    row = (t.to(tl.int64) * H + h) * NS + offs_s                                        # [BLOCK_S]
    ml = part_ptr + tl.num_programs(0).to(tl.int64) * H * NS * D + 2 * row
    m = tl.load(ml, mask=s_ok, other=float("-inf"))
    den = tl.load(ml + 1, mask=s_ok, other=0.0)
    acc = tl.load(part_ptr + row[:, None] * D + offs_d[None, :], mask=s_ok[:, None], other=0.0)
    m_all = tl.max(m, axis=0)
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    w = tl.exp(m - m_safe)                                                                # 0 where m = -inf
    total = tl.sum(w * den, axis=0)
    out = tl.sum(w[:, None] * acc, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + h * stride_oh + offs_d, out)
