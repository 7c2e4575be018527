"""A short sweep of the sample-bracketed top-k's launch shape (tile, warps) on one shape,
each configuration checked by value (check_topk_fast) and against the default launch's
selection (the same set a row), and timed with do_bench; stops adding configurations after
--budget-s seconds. Writes JSON after every configuration.

    python benchmarks/kernels/topk_sample.py --out sweep.json [--rows 4096 --width 22016 --ks 1024]
    python benchmarks/kernels/topk_sample.py --out sweep.json --rows 4096 --causal 8093 --ks 1024   # a prefill chunk

--causal P0: row r's candidates are its first P0 + r + 1 positions (the GPU server's last prefill
chunk at 12,189 tokens: 4,096 rows after 8,093). Configurations of 1 and 2 warps read the
scratch in pieces (sample_topk's scratch_tile): a warp's reductions need no barrier. "narrow":
the scratch's k-th key searched over the bracket alone (sample_topk's narrow). The first
configuration, {}, is the default launch (by rows: topk.wrapper.sample_launch).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from measure import timeit

CONFIGS = [{}, {"tile": 2048, "num_warps": 8}, {"tile": 2048, "num_warps": 8, "narrow": True},
           {"tile": 256, "num_warps": 1, "narrow": True}, {"tile": 512, "num_warps": 1}, {"tile": 256, "num_warps": 1},
           {"tile": 1024, "num_warps": 1}, {"tile": 512, "num_warps": 2}, {"tile": 1024, "num_warps": 2},
           {"tile": 1024, "num_warps": 4}, {"tile": 2048, "num_warps": 16}]


def main(argv=None) -> None:
    from niah.kernels.topk.wrapper import sample_topk
    from niah.kernels.topk.reference import check_topk_fast

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--width", type=int, default=22016)
    ap.add_argument("--ks", default="1024,2048")
    ap.add_argument("--causal", type=int, default=None, help="P0: row r keeps its first P0 + r + 1 positions")
    ap.add_argument("--budget-s", type=float, default=20.0)
    args = ap.parse_args(argv)
    t0 = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    width = args.width if args.causal is None else args.causal + args.rows
    x = torch.randn(args.rows, width, device=dev, generator=torch.Generator(device=dev).manual_seed(2))
    lens = (torch.full((args.rows,), width, dtype=torch.int32, device=dev) if args.causal is None else
            torch.arange(args.causal + 1, width + 1, dtype=torch.int32, device=dev))
    rows = []
    for k in map(int, args.ks.split(",")):
        ref_ms = timeit(lambda: torch.topk(x, k, dim=1))
        first = None
        case = f"topk [{args.rows}, {width}]{' causal' if args.causal is not None else ''} k={k}"
        for cfg in CONFIGS:
            if time.time() - t0 > args.budget_s:
                break
            idx = sample_topk(x, k, lens, **cfg)
            problem = check_topk_fast(x, idx, k, lens)
            kept = idx.sort(dim=1).values
            first = kept if first is None else first
            if problem is None and not torch.equal(kept, first):
                problem = "a selection unlike the first configuration's"
            ms = timeit(lambda: sample_topk(x, k, lens, **cfg))
            rows.append({"case": case, "config": dict(cfg, method="sample"),
                         "ms": ms, "torch_topk_ms": ref_ms, "speedup_vs_torch": ref_ms / ms, "correct": problem is None,
                         "problem": problem})
            print(rows[-1], flush=True)
            with open(args.out, "w") as f:
                json.dump({"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "results": rows}, f,
                          indent=1)


if __name__ == "__main__":
    main()
