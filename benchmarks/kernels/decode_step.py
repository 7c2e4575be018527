"""Pieces of the GPU server's decode step at its shapes, each timed in a CUDA graph (the server
replays its decode steps from graphs, so a piece costs its device time, launches included):

- the top-k of one row (the indexer's scores of one decode query over the graph's width W,
  -inf past the position): the default launch against other chunk widths (several programs a
  row, then one over their survivors), warps, and the sample select (method "sample", the
  many-rows default), each checked to keep the same keys in the same order;
- the index query's fp8 quantisation (SmolLM2-135M: 3 kv heads x 3 heads, D 64) by
  `quantize_query`'s one launch and by the torch chain it replaced (quantize_fp8, then the
  weights times the scales), checked bitwise;
- the sparse attention of one query over its k kept keys: one program a kv head walking all k
  keys (the baseline), one a query head, and each with the keys split over programs of 64, 128
  or 256 (`split_keys`: split-K, a second launch combining), the largest difference reported.

    python benchmarks/kernels/decode_step.py [--widths 12288,24576] [--k 512,1024] --out decode_step.jsonl

One JSON line a case: device microseconds a call for each form, and their ratio.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from measure import timeit_graph


TOPK_FORMS = {"block 2048": {"block": 2048}, "block 4096": {"block": 4096}, "block 8192": {"block": 8192},
              "final_warps 8": {"final_warps": 8}, "final_warps 32": {"final_warps": 32},
              "sample": {"method": "sample"}, "segmented": {"method": "segmented"},
              "segmented 1024": {"method": "segmented", "tile": 1024},
              "segmented 2048": {"method": "segmented", "tile": 2048}}


def topk_tune(widths, ks, dev):
    """The decode row's top-k at other chunk widths (several programs a row, then one over the
    survivors) and warps, against the default launch; the same keys in the same order or not."""
    from niah.kernels import topk_indices

    g = torch.Generator(device=dev).manual_seed(6)
    for W in widths:
        for k in ks:
            x = torch.randn(1, W, device=dev, generator=g)
            x[:, int(W * 0.93):] = float("-inf")
            base = topk_indices(x, k)
            t0 = timeit_graph([lambda x=x, k=k: topk_indices(x, k)])
            for name, opts in TOPK_FORMS.items():
                if opts.get("block", 4096) < 2 * k:
                    continue
                same = bool(torch.equal(topk_indices(x, k, **opts), base))
                t = timeit_graph([lambda x=x, k=k, opts=opts: topk_indices(x, k, **opts)])
                yield {"case": f"topk [1, {W}] k={k}", "form": name, "us": round(1e3 * t, 2),
                       "default_us": round(1e3 * t0, 2), "default_over_form": round(t0 / t, 2),
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


def attention_cases(ks, dev, S=12288, splits=(64, 128, 256)):
    """Each form of the decode attention against one program a kv head walking all K keys."""
    from niah.serving.embedded.cuda.attend import sparse_attention

    g = torch.Generator(device=dev).manual_seed(5)
    q = torch.randn(1, 9, 1, 64, device=dev, generator=g)
    k = torch.randn(1, 3, S, 64, device=dev, generator=g)
    v = torch.randn(1, 3, S, 64, device=dev, generator=g)
    for K in ks:
        idx = torch.randperm(S, device=dev, generator=g)[:K].int()[None]
        forms = {"kv_head": {"one_head": False, "split_keys": 0}, "one_head": {"one_head": True, "split_keys": 0}}
        for sk in splits:
            if sk < K:
                forms[f"kv_head_split{sk}"] = {"one_head": False, "split_keys": sk}
                forms[f"one_head_split{sk}"] = {"one_head": True, "split_keys": sk}
        base = sparse_attention(q, k, v, idx, **forms["kv_head"])
        t_base = timeit_graph([lambda idx=idx: sparse_attention(q, k, v, idx, **forms["kv_head"])])
        for name, opts in forms.items():
            out = sparse_attention(q, k, v, idx, **opts)
            t = timeit_graph([lambda idx=idx, opts=opts: sparse_attention(q, k, v, idx, **opts)])
            yield {"case": f"sparse attention, 1 query x 9 heads over {K} of {S} keys", "form": name,
                   "us": round(1e3 * t, 2), "kv_head_us": round(1e3 * t_base, 2),
                   "kv_head_over_form": round(t_base / t, 2),
                   "max_abs_diff": float((out - base).abs().max()), "equal": bool(torch.equal(out, base))}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", default="12288,24576")
    ap.add_argument("--k", default="512,1024")
    ap.add_argument("--out", default="decode_step.jsonl")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("decode_step.py: times CUDA graphs; no CUDA device here")
    rows = list(topk_tune([int(w) for w in a.widths.split(",")], [int(k) for k in a.k.split(",")], "cuda"))
    rows.append(quant_case("cuda"))
    rows += list(attention_cases([int(k) for k in a.k.split(",")], "cuda"))
    with Path(a.out).open("w") as f:
        for r in rows:
            print(json.dumps(r), flush=True)
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
