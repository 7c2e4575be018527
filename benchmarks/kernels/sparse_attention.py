"""The GPU server's sparse attention kernel (serving/embedded/cuda/sparse_kernel.py) beside
its first version, on the shapes of the seed's longest prompt: SmolLM2's 9 query heads over
3 kv heads of 64 dims, a 22,600-token fp32 KV cache, each query attending to its own top-k.

    python benchmarks/kernels/sparse_attention.py [--tokens 22600] [--queries 4096] [--topk 512,1024]

Arms: the kernel's three `precision`s: "broadcast" (its first version, the baseline: the two
products as a broadcast multiply-and-sum on CUDA cores, 32 keys a step), "tf32x3" and
"ieee" (`tl.dot` at each precision, 64 keys a step). Cases: a prefill chunk (`--queries`
queries) and one decode query. Kept positions: each query's own random top-k of its causal
prefix (so the loads are scattered as in a real selection). One JSON line per (case, k,
arm): the median time over triton.testing.do_bench and the largest difference from the
masked-SDPA reference. (The H200 figures in docs/embedded-server.md were taken when the
first version was a kernel of its own in this file: the same code as "broadcast".)
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

from niah.serving.embedded.cuda.attend import sparse_attention, sparse_attention_reference

H, HKV, D = 9, 3, 64


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
    arms = {p: (lambda q, k, v, i, p=p: sparse_attention(q, k, v, i, precision=p))
            for p in ("broadcast", "tf32x3", "ieee")}
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
