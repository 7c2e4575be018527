"""Top-k benchmark cases, run by bench.py: a sweep of launch configurations, each
checked by value at full size (check_topk_fast), against torch.topk eager and in a CUDA graph.
The floor is one read of the logits at copy bandwidth."""

from __future__ import annotations

import torch
from measure import host_overhead, peak_extra, record, timeit, timeit_graph


def topk_configs(rows, width, k, tiny):
    """The launch configurations swept (the wrappers' defaults were chosen among them: docs/kernels.md)."""
    if tiny:
        return [{}, {"split": True, "block": 1024}, {"method": "search"}, {"method": "sample"}, {"method": "segmented"}]
    # the search kernel explicitly (its defaults), then the sample-bracketed select's variants
    # (radix_bits: the threshold search's bits a step; 1, the binary search, is the default)
    # ({"method": "sample"}: its launch by rows, topk.wrapper.sample_launch; the others spell theirs out)
    sample = [{"method": "sample"}, {"method": "sample", "tile": 2048, "num_warps": 8},
              {"method": "sample", "tile": 256, "num_warps": 1}, {"method": "sample", "tile": 8192, "num_warps": 8},
              {"method": "sample", "radix_bits": 2}, {"method": "sample", "radix_bits": 4}]
    radix = [{"method": "search", "radix_bits": 2}, {"method": "search", "radix_bits": 4}]
    if rows >= 256:
        cfgs = [{}, {"method": "search"}, {"split": True, "block": 4096}, {"split": False, "block": 8192}] + radix \
            + sample
    else:   # few rows (decode): the segmented select too, its segment (tile) and warps
        segmented = [{"method": "segmented"}, {"method": "segmented", "tile": 2048},
                     {"method": "segmented", "tile": 8192}, {"method": "segmented", "num_warps": 8}]
        cfgs = [{}, {"method": "search"}, {"method": "search", "block": 8192}, {"split": True}] + radix + sample \
            + segmented
    return [c for c in cfgs if c.get("block", 4096) >= 2 * (1 << max(0, (k - 1).bit_length()))]


def bench_topk(results, ceil, dev, rows, width, k, tiny=False, ragged=False, ties=False):
    from niah.kernels import topk_indices
    from niah.kernels.topk.reference import check_topk_fast

    case = f"topk [{rows}, {width}] k={k}" + (" ragged lengths" if ragged else "") + (" ties" if ties else "")
    print(f"\n== {case}", flush=True)
    g = torch.Generator(device=dev).manual_seed(2)
    x = torch.randn(rows, width, device=dev, generator=g)
    if ties:
        x = torch.round(x * 4)  # a few dozen distinct values: thousands of exact ties per row
    if ragged:
        lens = torch.randint(1, width + 1, (rows,), device=dev, generator=g, dtype=torch.int32)
    else:
        lens = torch.full((rows,), width, dtype=torch.int32, device=dev)
    bytes_moved = rows * width * 4
    floor = bytes_moved / (ceil["copy_GBps"] * 1e9) * 1e3 if ceil["copy_GBps"] else None
    few = rows <= 64  # decode-sized: judged in a CUDA graph (as SGLang replays decode)
    table = []
    for cfg in topk_configs(rows, width, k, tiny):
        try:
            idx = topk_indices(x, k, lens, **cfg)
            problem = check_topk_fast(x, idx, k, lens)
            ms = timeit(lambda: topk_indices(x, k, lens, **cfg))
            g_ms = timeit_graph([lambda: topk_indices(x, k, lens, **cfg)]) if few else None
            table.append({"config": cfg, "ms": ms, "graph_ms": g_ms, "correct": problem is None, "problem": problem})
            print(f"  {str(cfg):90s} {ms * 1e3:8.1f} us" + (f"  graph {g_ms * 1e3:7.1f} us" if g_ms else "")
                  + ("" if problem is None else f"  WRONG: {problem}"), flush=True)
        except Exception as e:  # noqa: BLE001 - a config that fails to compile is reported, not fatal
            table.append({"config": cfg, "error": repr(e)[:300]})
            print(f"  {cfg}: {repr(e)[:200]}", flush=True)
    ok = [t for t in table if t.get("correct")]
    if not ok:
        record(results, case, "triton (niah)", None, floor, {"bytes": bytes_moved}, None,
               {"sweep": table, "correct": False, "problem": "no correct config"})
        return
    metric = "graph_ms" if few and all(t["graph_ms"] for t in ok) else "ms"
    best = min(ok, key=lambda t: t[metric])
    default = table[0]
    all_correct = all(t.get("correct") for t in table if "error" not in t)
    t_ms = timeit(lambda: torch.topk(x, k, dim=1))
    t_g = timeit_graph([lambda: torch.topk(x, k, dim=1)]) if few else None
    record(results, case, "triton (niah)", best["ms"], floor, {"bytes": bytes_moved},
           peak_extra(lambda: topk_indices(x, k, lens, **best["config"])),
           {"config": best["config"], "graph_ms": best["graph_ms"], "sweep": table, "correct": all_correct,
            "problem": None if all_correct else "a config was wrong (see sweep)",
            "default_ms": default.get("ms"), "default_graph_ms": default.get("graph_ms"),
            "speedup_vs_torch": t_ms / best["ms"],
            "graph_speedup_vs_torch": (t_g / best["graph_ms"]) if (t_g and best["graph_ms"]) else None,
            "default_speedup_vs_torch": (t_ms / default["ms"]) if default.get("ms") else None})
    record(results, case, "torch.topk", t_ms, floor, {"bytes": bytes_moved}, None,
           {"speedup_of_niah": t_ms / best["ms"], "graph_ms": t_g,
            "graph_speedup_of_niah": (t_g / best["graph_ms"]) if (t_g and best["graph_ms"]) else None})
    print(f"  best {best['config']}: {best['ms'] * 1e3:.1f} us"
          + (f" (graph {best['graph_ms'] * 1e3:.1f} us)" if best["graph_ms"] else "")
          + f"; torch.topk {t_ms * 1e3:.1f} us" + (f" (graph {t_g * 1e3:.1f} us)" if t_g else "")
          + f"; {t_ms / best['ms']:.2f}x eager"
          + (f", {t_g / best['graph_ms']:.2f}x graph" if (t_g and best["graph_ms"]) else "")
          + f"; floor {floor * 1e3 if floor else float('nan'):.1f} us; every config correct: {all_correct}", flush=True)
    if rows == 1 and not tiny:
        results[-2].update(host_overhead(lambda: topk_indices(x, k, lens, **best["config"]), best["ms"],
                                         best["graph_ms"]))
