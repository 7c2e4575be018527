"""The decode step's top-k by each method, one process, no DeepGEMM needed:

    python benchmarks/kernels/topk_decode.py --out topk_decode.json        # CUDA
    python benchmarks/kernels/topk_decode.py --tiny --out topk_decode.json # CPU, TRITON_INTERPRET=1: wiring

`topk_indices` on a decode step's rows (B=64 with lengths uniform in 1..65,536, B=1 x 131,072;
random logits, -inf past each length as clean logits) at k 2,048 (DeepSeek's top-k) and at
4,096 and 8,192 (the two-stage selection's c*k candidates at c = 2, 4), by the search (the
few-rows default, in chunks of 4,096 keys: at k 2,048 each round keeps half its keys, so a
65,536-key row takes four launches; chunks of 8,192 and 16,384 keep a quarter and an eighth),
the sample select (8, 16 and 32 warps: SGLang's topk_v2 gives a row one block of 1,024 threads)
and the segmented select (segments of 2,048, 4,096, 8,192 keys). Each
launch's kept set is checked against the search's (the same set a row) and timed eagerly
(do_bench median) and replayed in a CUDA graph (as SGLang replays decode; one input copy); a
launch that fails to compile is reported and the rest run. The JSON is rewritten after every row.
"""

from __future__ import annotations

import os
import sys

if "--tiny" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from measure import bench_cli, timeit, timeit_graph, write_results  # noqa: E402

METHODS = [("search", {"method": "search"}), ("search, chunks of 8192", {"method": "search", "block": 8192}),
           ("search, chunks of 16384", {"method": "search", "block": 16384}),
           ("sample, 8 warps", {"method": "sample", "num_warps": 8}),
           ("sample, 16 warps", {"method": "sample", "num_warps": 16, "tile": 4096}),
           ("sample, 32 warps", {"method": "sample", "num_warps": 32, "tile": 8192}),
           ("segmented 2048", {"method": "segmented", "tile": 2048}), ("segmented 4096", {"method": "segmented"}),
           ("segmented 8192", {"method": "segmented", "tile": 8192})]


def main() -> None:
    from niah.kernels import topk_indices

    a, dev, env = bench_cli(__doc__, "topk_decode.py")
    cases = [(2, 600, True, (40, 80))] if a.tiny else [(64, 65536, True, (2048, 4096, 8192)),
                                                      (1, 131072, False, (2048, 4096))]
    methods = [(n, dict(c, tile=256) if "tile" in c else c) for n, c in METHODS[::2]] if a.tiny else METHODS
    g = torch.Generator(device=dev).manual_seed(0)
    results: list = []
    for batch, width, ragged, ks in cases:
        lens = (torch.randint(1, width + 1, (batch,), device=dev, generator=g, dtype=torch.int32) if ragged
                else torch.full((batch,), width, dtype=torch.int32, device=dev))
        x = torch.randn(batch, width, device=dev, generator=g)
        x = x.masked_fill(torch.arange(width, device=dev)[None, :] >= lens[:, None].long(), float("-inf"))
        for k in ks:
            case = f"topk B={batch} {'ragged<=' if ragged else 'x'}{width} k={k}"
            want = None
            for name, cfg in methods:
                try:
                    got = topk_indices(x, k, lens, **cfg).sort(1).values
                except Exception as e:  # noqa: BLE001 - a launch that does not compile is reported, not fatal
                    results.append({"case": case, "method": name, "config": cfg, "error": repr(e)[:300]})
                    print(f"{case}: {name}: {repr(e)[:200]}", flush=True)
                    continue
                want = got if want is None else want
                same = bool(torch.equal(got, want))
                ms = timeit(lambda cfg=cfg: topk_indices(x, k, lens, **cfg))
                g_ms = timeit_graph([lambda cfg=cfg: topk_indices(x, k, lens, **cfg)])
                results.append({"case": case, "method": name, "config": cfg, "ms": ms, "graph_ms": g_ms,
                                "same_set_as_search": same})
                print(f"{case}: {name:18s} {ms * 1e3:8.1f} us" + (f"  graph {g_ms * 1e3:7.1f} us" if g_ms else "")
                      + ("" if same else "  NOT THE SEARCH'S SET"), flush=True)
                write_results(a.out, env, results)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
