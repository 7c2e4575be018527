"""The GPU server's sparse attention kernel (serving/embedded/cuda/sparse_kernel.py) beside
its first version, on the shapes of the seed's longest prompt: SmolLM2's 9 query heads over
3 kv heads of 64 dims, a 22,600-token fp32 KV cache, each query attending to its own top-k.

    python benchmarks/kernels/sparse_attention.py [--tokens 22600] [--queries 4096] [--topk 512,1024]

Arms: "broadcast" (the first version, kept below as the baseline: the two products as a
broadcast multiply-and-sum on CUDA cores), "tf32x3" and "ieee" (the kernel's `tl.dot` at
each precision). Cases: a prefill chunk (`--queries` queries) and one decode query. Kept
positions: each query's own random top-k of its causal prefix (so the loads are scattered
as in a real selection). One JSON line per (case, k, arm): the median time over
triton.testing.do_bench and the largest difference from the masked-SDPA reference.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from niah.kernels._common import next_pow2
from niah.serving.embedded.cuda.attend import sparse_attention, sparse_attention_reference

H, HKV, D = 9, 3, 64


@triton.jit
def broadcast_kernel(q_ptr, k_ptr, v_ptr, idx_ptr, out_ptr, scale, stride_qt, stride_qh, stride_kh, stride_ks,
                     stride_vh, stride_vs, stride_it, stride_ot, stride_oh, K: tl.constexpr, G: tl.constexpr,
                     BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """The kernel's first version (the baseline): products as broadcast multiply-and-sum."""
    t = tl.program_id(0)
    g = tl.program_id(1)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    g_mask = offs_g < G
    heads = g * G + offs_g
    q = tl.load(q_ptr + t.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None], other=0.0) * scale
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    k_base = k_ptr + g.to(tl.int64) * stride_kh
    v_base = v_ptr + g.to(tl.int64) * stride_vh
    idx_row = idx_ptr + t.to(tl.int64) * stride_it
    for n0 in range(0, K, BLOCK_N):
        n = n0 + offs_n
        idx = tl.load(idx_row + n, mask=n < K, other=-1)
        valid = idx >= 0
        rows = tl.where(valid, idx, 0).to(tl.int64)
        k = tl.load(k_base + rows[:, None] * stride_ks + offs_d[None, :], mask=valid[:, None], other=0.0)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
        v = tl.load(v_base + rows[:, None] * stride_vs + offs_d[None, :], mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        denom = denom * alpha + tl.sum(p, axis=1)
        m = m_new
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + offs_d[None, :], out,
             mask=g_mask[:, None])


def broadcast(q, k, v, idx):
    T = q.shape[2]
    qt = q[0].transpose(0, 1).contiguous()
    kk, vv = k[0], v[0]
    out = torch.empty(T, H, D, dtype=torch.float32, device=q.device)
    broadcast_kernel[(T, HKV)](qt, kk, vv, idx, out, D ** -0.5, qt.stride(0), qt.stride(1), kk.stride(0),
                               kk.stride(1), vv.stride(0), vv.stride(1), idx.stride(0), out.stride(0), out.stride(1),
                               K=idx.shape[1], G=H // HKV, BLOCK_G=next_pow2(H // HKV), D=D, BLOCK_N=32, num_warps=4)
    return out.transpose(0, 1)[None]


def case(tokens: int, queries: int, topk: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    k = torch.randn(1, HKV, tokens, D, device="cuda", generator=g)
    v = torch.randn(1, HKV, tokens, D, device="cuda", generator=g)
    q = torch.randn(1, H, queries, D, device="cuda", generator=g)
    pos = torch.arange(tokens - queries, tokens, device="cuda")                  # the last `queries` positions
    scores = torch.rand(queries, tokens, device="cuda", generator=g)
    scores.masked_fill_(torch.arange(tokens, device="cuda")[None, :] > pos[:, None], -1.0)
    idx = scores.topk(topk, dim=1).indices.int()
    return q, k, v, idx


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=22600)
    ap.add_argument("--queries", type=int, default=4096)
    ap.add_argument("--topk", default="512,1024")
    a = ap.parse_args(argv)
    arms = {"broadcast": broadcast,
            "tf32x3": lambda q, k, v, i: sparse_attention(q, k, v, i, precision="tf32x3"),
            "ieee": lambda q, k, v, i: sparse_attention(q, k, v, i, precision="ieee")}
    for name, queries in (("prefill-chunk", a.queries), ("decode", 1)):
        for topk in (int(x) for x in a.topk.split(",")):
            q, k, v, idx = case(a.tokens, queries, topk)
            ref = sparse_attention_reference(q[:, :, :256], k, v, idx[:256])
            base = None
            for arm, fn in arms.items():
                err = float((fn(q[:, :, :256], k, v, idx[:256].contiguous()) - ref).abs().max())
                ms = triton.testing.do_bench(lambda fn=fn: fn(q, k, v, idx), warmup=25, rep=200)
                base = base or ms
                print(json.dumps({"case": name, "queries": queries, "tokens": a.tokens, "topk": topk, "arm": arm,
                                  "ms": round(ms, 4), "speedup_vs_broadcast": round(base / ms, 2),
                                  "max_abs_err_vs_sdpa": err}), flush=True)


if __name__ == "__main__":
    main()
