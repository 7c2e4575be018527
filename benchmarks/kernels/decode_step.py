"""Pieces of the GPU server's decode step at its shapes, each timed in a CUDA graph (the server
replays its decode steps from graphs, so a piece costs its device time, launches included):

- the top-k of one row (the indexer's scores of one decode query over the graph's width W,
  -inf past the position) by the binary search (radix_bits 1) and by byte histograms
  (radix_bits 8, the default for few rows), checked to keep the same keys in the same order;
- the index query's fp8 quantisation (SmolLM2-135M: 3 kv heads x 3 heads, D 64) by
  `quantize_query`'s one launch and by the torch chain it replaced (quantize_fp8, then the
  weights times the scales), checked bitwise;
- the sparse attention of one query over its k kept keys, one program a query head (the
  default for a decode step) and one a kv head (as before), checked equal.

    python benchmarks/kernels/decode_step.py [--widths 12288,24576] [--k 512,1024] --out decode_step.jsonl

One JSON line a case: device microseconds a call for each form, and their ratio.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from measure import timeit_graph


def topk_cases(widths, ks, dev):
    from niah.kernels import topk_indices

    g = torch.Generator(device=dev).manual_seed(4)
    for W in widths:
        pos = int(W * 0.93)                               # the graph's width past the position
        for k in ks:
            for name, x in (("normal", torch.randn(1, W, device=dev, generator=g)),
                            ("relu", torch.rand(1, W, device=dev, generator=g).sub_(0.97).clamp_min_(0))):
                x[:, pos:] = float("-inf")
                a, b = topk_indices(x, k, radix_bits=1), topk_indices(x, k, radix_bits=8)
                same = bool(torch.equal(a, b))
                t1 = timeit_graph([lambda x=x, k=k: topk_indices(x, k, radix_bits=1)])
                t8 = timeit_graph([lambda x=x, k=k: topk_indices(x, k, radix_bits=8)])
                yield {"case": f"topk [1, {W}] k={k} {name}", "binary_us": round(1e3 * t1, 2),
                       "histogram_us": round(1e3 * t8, 2), "binary_over_histogram": round(t1 / t8, 2),
                       "same_keys_same_order": same}


def quant_case(dev):
    from niah.kernels import quantize_query
    from niah.kernels.quant import quantize_fp8

    q = torch.randn(1, 9, 1, 64, device=dev)[0, :, 0].view(3, 1, 3, 64)
    w = torch.full((3, 3), (9 * 64) ** -0.5, device=dev)

    def torch_chain():
        q8, qs = quantize_fp8(q)
        return q8, w * qs[:, 0]

    a, b = quantize_query(q, (9 * 64) ** -0.5, "fp8"), torch_chain()
    same = bool(torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1][:, 0], b[1]))
    tk = timeit_graph([lambda: quantize_query(q, (9 * 64) ** -0.5, "fp8")])
    tt = timeit_graph([torch_chain])
    return {"case": "fp8 index query [3, 1, 3, 64]", "kernel_us": round(1e3 * tk, 2), "torch_us": round(1e3 * tt, 2),
            "torch_over_kernel": round(tt / tk, 2), "bitwise_equal": same}


def attention_cases(ks, dev, S=12288):
    from niah.serving.embedded.cuda.attend import sparse_attention

    g = torch.Generator(device=dev).manual_seed(5)
    q = torch.randn(1, 9, 1, 64, device=dev, generator=g)
    k = torch.randn(1, 3, S, 64, device=dev, generator=g)
    v = torch.randn(1, 3, S, 64, device=dev, generator=g)
    for K in ks:
        idx = torch.randperm(S, device=dev, generator=g)[:K].int()[None]
        one = sparse_attention(q, k, v, idx, one_head=True)
        same = bool(torch.equal(one, sparse_attention(q, k, v, idx, one_head=False)))
        th = timeit_graph([lambda idx=idx: sparse_attention(q, k, v, idx, one_head=True)])
        tg = timeit_graph([lambda idx=idx: sparse_attention(q, k, v, idx, one_head=False)])
        yield {"case": f"sparse attention, 1 query x 9 heads over {K} of {S} keys", "one_head_us": round(1e3 * th, 2),
               "kv_head_us": round(1e3 * tg, 2), "kv_head_over_one_head": round(tg / th, 2), "equal": same}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", default="12288,24576")
    ap.add_argument("--k", default="512,1024")
    ap.add_argument("--out", default="decode_step.jsonl")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("decode_step.py: times CUDA graphs; no CUDA device here")
    rows = list(topk_cases([int(w) for w in a.widths.split(",")], [int(k) for k in a.k.split(",")], "cuda"))
    rows.append(quant_case("cuda"))
    rows += list(attention_cases([int(k) for k in a.k.split(",")], "cuda"))
    with Path(a.out).open("w") as f:
        for r in rows:
            print(json.dumps(r), flush=True)
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
