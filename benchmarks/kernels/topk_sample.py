"""A short sweep of the sample-bracketed top-k's launch shape (tile, warps) on one shape,
each configuration checked by value (check_topk_fast) and timed with do_bench; stops
adding configurations after --budget-s seconds. Writes JSON after every configuration.

    python benchmarks/kernels/topk_sample.py --out sweep.json [--rows 4096 --width 22016 --k 1024]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from measure import timeit

CONFIGS = [{"tile": 2048, "num_warps": 16}, {"tile": 1024, "num_warps": 4}, {"tile": 2048, "num_warps": 4},
           {"tile": 2048, "num_warps": 8}, {"tile": 1024, "num_warps": 8}, {"tile": 512, "num_warps": 4}]


def main(argv=None) -> None:
    from niah.kernels import topk_indices
    from niah.kernels.topk.reference import check_topk_fast

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--width", type=int, default=22016)
    ap.add_argument("--ks", default="1024,2048")
    ap.add_argument("--budget-s", type=float, default=20.0)
    args = ap.parse_args(argv)
    t0 = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(args.rows, args.width, device=dev, generator=torch.Generator(device=dev).manual_seed(2))
    lens = torch.full((args.rows,), args.width, dtype=torch.int32, device=dev)
    rows = []
    for k in map(int, args.ks.split(",")):
        ref_ms = timeit(lambda: torch.topk(x, k, dim=1))
        for cfg in CONFIGS:
            if time.time() - t0 > args.budget_s:
                break
            idx = topk_indices(x, k, lens, method="sample", **cfg)
            problem = check_topk_fast(x, idx, k, lens)
            ms = timeit(lambda: topk_indices(x, k, lens, method="sample", **cfg))
            rows.append({"case": f"topk [{args.rows}, {args.width}] k={k}", "config": dict(cfg, method="sample"),
                         "ms": ms, "torch_topk_ms": ref_ms, "speedup_vs_torch": ref_ms / ms, "correct": problem is None,
                         "problem": problem})
            print(rows[-1], flush=True)
            with open(args.out, "w") as f:
                json.dump({"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "results": rows}, f,
                          indent=1)


if __name__ == "__main__":
    main()
