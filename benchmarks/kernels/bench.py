"""Benchmark + full-size correctness for the bundled indexer kernels, in ONE process.

    python benchmarks/kernels/bench.py [--out results.json] [--tiny] [--quick] [--only SECTIONS]
    niah kernels bench [--out ...]          (runs this script from the checkout)

For each case it times the project's kernel (a few launch configurations; the best is
the headline), the naive gather-then-bmm and a chunked torch implementation with
triton.testing.do_bench (median, L2 flushed between runs), prints the ratios and the
roofline floor beside them, reports peak extra memory (max_memory_allocated delta over
the call, output included), and checks the kernel against the fp32 torch reference at
full size (calc_diff, identical -inf masks; top-k by value). --tiny runs small shapes on
CPU under TRITON_INTERPRET=1 (wiring check only: no timings worth reading).

The cases live beside it: decode.py (paged logits), topk.py, and prefill and store here;
measure.py holds what they share. The JSON is written after every row.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from datetime import datetime, timezone

import torch
from decode import bench_decode
from measure import GiB, REPORT, ceilings, has_cuda, peak_extra, record, sweep, timeit
from topk import bench_topk


def bench_prefill(results, ceil, dev, kind, seq, skv, heads=64, dim=128, tiny=False):
    from niah.kernels import bf16_mqa_logits, fp8_mqa_logits
    from niah.kernels._common import compare_logits
    from niah.kernels.mqa_logits.reference import chunked_mqa_logits, ref_mqa_logits
    from niah.kernels.quant import quantize_fp8

    case = f"prefill {kind} {seq}x{skv}"
    print(f"\n== {case}", flush=True)
    g = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn(seq, heads, dim, device=dev, generator=g)
    k = torch.randn(skv, dim, device=dev, generator=g)
    w = torch.randn(seq, heads, device=dev, generator=g) * heads**-0.5
    prefix = skv - seq
    ks = torch.zeros(seq, dtype=torch.int32, device=dev)
    ke = (prefix + torch.arange(seq, device=dev) + 1).int()
    if kind == "fp8":
        q, _ = quantize_fp8(q)
        k, sf = quantize_fp8(k)
        call = lambda **cfg: fp8_mqa_logits(q, (k, sf), w, ks, ke, clean_logits=True, **cfg)  # noqa: E731
        peak_rate = ceil["fp8_TFLOPs"] or (2 * ceil["bf16_TFLOPs"] if ceil["bf16_TFLOPs"] else None)
    else:
        q, k, sf = q.bfloat16(), k.bfloat16(), None
        call = lambda **cfg: bf16_mqa_logits(q, k, w, ks, ke, clean_logits=True, **cfg)  # noqa: E731
        peak_rate = ceil["bf16_TFLOPs"]
    flops = 2 * seq * skv * heads * dim  # the full rectangle (the causal part is ~60% of it here)
    logits_bytes = seq * skv * 4
    floor = None
    if peak_rate:
        floor = max(flops / (peak_rate * 1e12), logits_bytes / (ceil["copy_GBps"] * 1e9)) * 1e3
    work = {"flops": flops, "logits_bytes": logits_bytes}
    configs = [{}] if tiny else [
        {}, {"block_n": 256, "block_q": 64}, {"block_n": 256, "block_q": 16},
        {"block_n": 256, "block_q": 32, "num_stages": 2}, {"block_n": 256, "block_q": 32, "num_stages": 4},
        {"block_n": 128, "block_q": 32, "num_warps": 4}, {"block_n": 256, "block_q": 32, "num_warps": 4},
    ]
    best_cfg, ms, table = sweep(call, configs)
    out = call(**best_cfg)
    ref = ref_mqa_logits(q, k, w, ks, ke, sf=sf, chunk=64)
    diff, mask_ok = compare_logits(out, ref)
    del out, ref
    peak = peak_extra(lambda: call(**best_cfg))
    tflops = flops / (ms * 1e-3) / 1e12
    record(results, case, "triton (niah)", ms, floor, work, peak,
           {"TFLOPs": tflops, "config": best_cfg, "sweep": table, "calc_diff": diff, "mask_ok": mask_ok,
            "peak_over_logits": (peak / logits_bytes) if peak else None})
    print(f"  niah     {ms:8.3f} ms  {tflops:6.0f} TFLOP/s  floor {floor if floor is None else round(floor, 3)} ms  "
          f"calc_diff {diff:.2e} masks {'ok' if mask_ok else 'DIFFER'}  peak/logits "
          f"{(peak / logits_bytes) if peak else float('nan'):.3f}  config {best_cfg}", flush=True)
    try:
        t = timeit(lambda: chunked_mqa_logits(q, k, w, ks, ke, sf=sf), rep_ms=100)
        p = peak_extra(lambda: chunked_mqa_logits(q, k, w, ks, ke, sf=sf))
        record(results, case, "chunked torch (256 queries)", t, floor, work, p, {"speedup_of_niah": t / ms})
        print(f"  chunked torch (256 q)      {t:8.3f} ms  niah is {t / ms:6.1f}x faster  "
              f"peak {p / GiB if p else 0:.2f} GiB")
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        record(results, case, "chunked torch (256 queries)", None, floor, work, None, {"error": "OOM"})
    per_query = seq * skv * dim * 2  # the naive per-query gather: [S, Skv, D] bf16
    record(results, case, "naive per-query gather (not run)", None, floor, work, per_query,
           {"note": "would allocate the per-query gather alone (75 GiB peak when it was run at this shape)"})
    print(f"  naive per-query gather: not run (the gather alone is {per_query / GiB:.1f} GiB)")


def bench_store(results, ceil, dev, kind, n_tokens, dim=128):
    from niah.kernels import store_index_keys
    from niah.kernels.store.reference import ref_store_index_keys

    case = f"store {kind} {n_tokens} tokens"
    print(f"\n== {case}", flush=True)
    g = torch.Generator(device=dev).manual_seed(3)
    k = torch.randn(n_tokens, dim, device=dev, generator=g, dtype=torch.bfloat16)
    pages = (n_tokens + 63) // 64 + 8
    slots = torch.randperm(pages * 64, device=dev, generator=g)[:n_tokens]
    if kind == "fp8":
        cache = torch.zeros(pages, 64, 1, dim + 4, dtype=torch.uint8, device=dev)
        per = dim * 2 + dim + 4
    else:
        cache = torch.zeros(pages, 64, 1, dim, dtype=torch.bfloat16, device=dev)
        per = dim * 4
    want = ref_store_index_keys(k, cache.clone(), slots)
    got = store_index_keys(k, cache.clone(), slots)
    ok = bool(torch.equal(got, want))
    extra = {"bitwise_equal": ok}
    if kind == "fp8":
        # how torch's own division forms compare with the kernel's IEEE amax / 448
        amax = k.float().abs().amax(-1).clamp_min(1e-4)
        sf = got.reshape(pages, -1)[:, 64 * dim :].contiguous().view(torch.float32).reshape(-1)[slots]
        extra["scale_mismatch_vs_scalar_div"] = int((sf != amax / 448.0).sum())
        extra["scale_mismatch_vs_tensor_div"] = int((sf != amax / torch.full_like(amax, 448.0)).sum())
        extra["bytes_differing"] = int((got != want).sum())
        print(f"  scales != amax/448.0 (python scalar): {extra['scale_mismatch_vs_scalar_div']}, "
              f"!= amax/tensor(448): {extra['scale_mismatch_vs_tensor_div']}, "
              f"bytes differing {extra['bytes_differing']}")
    ms = timeit(lambda: store_index_keys(k, cache, slots))
    ref_ms = timeit(lambda: ref_store_index_keys(k, cache, slots))
    bytes_moved = n_tokens * per
    floor = bytes_moved / (ceil["copy_GBps"] * 1e9) * 1e3 if ceil["copy_GBps"] else None
    record(results, case, "triton (niah)", ms, floor, {"bytes": bytes_moved}, None, extra)
    record(results, case, "torch (quant.py + index_put)", ref_ms, floor, {"bytes": bytes_moved}, None,
           {"speedup_of_niah": ref_ms / ms})
    print(f"  niah {ms * 1e3:8.1f} us  torch {ref_ms * 1e3:8.1f} us ({ref_ms / ms:.1f}x)  bitwise equal {ok}")


# ----------------------------------------------------------------------------- main
def run(out_path: str | None, tiny: bool = False, quick: bool = False, only: str | None = None) -> dict:
    dev = "cuda" if has_cuda() else "cpu"
    if dev == "cpu" and not tiny:
        raise SystemExit("no CUDA device: use --tiny (interpreter wiring check) or run on a GPU")
    import triton

    info = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "interpreter": os.environ.get("TRITON_INTERPRET", "0"),
    }
    print(info, flush=True)
    ceil = ceilings(dev)
    print({k: (round(v, 1) if v else v) for k, v in ceil.items()}, flush=True)
    results: list[dict] = []
    if out_path:
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        REPORT.update(path=out_path, info=info, ceilings=ceil)

    if tiny:
        bench_decode(results, ceil, dev, "bf16", 2, 200, heads=16, tiny=True)
        bench_decode(results, ceil, dev, "fp8", 3, 200, heads=16, tiny=True, ragged=True)
        bench_prefill(results, ceil, dev, "bf16", 8, 100, heads=16, tiny=True)
        bench_prefill(results, ceil, dev, "fp8", 8, 100, heads=16, tiny=True)
        bench_topk(results, ceil, dev, 2, 3000, 512, tiny=True)
        bench_topk(results, ceil, dev, 2, 3000, 512, tiny=True, ragged=True, ties=True)
        bench_store(results, ceil, dev, "fp8", 100)
    else:
        want = set((only or "decode,ragged,prefill,topk,store").split(","))
        if "ragged" in want:  # lengths uniform in 1..65,536
            bench_decode(results, ceil, dev, "bf16", 64, 65536, ragged=True)
            bench_decode(results, ceil, dev, "fp8", 64, 65536, ragged=True)
        if "decode" in want:
            bench_decode(results, ceil, dev, "bf16", 64, 65536, alternatives=not quick)
            bench_decode(results, ceil, dev, "fp8", 64, 65536, alternatives=not quick)
            bench_decode(results, ceil, dev, "bf16", 1, 131072)
            bench_decode(results, ceil, dev, "fp8", 1, 131072)
            if not quick:
                bench_decode(results, ceil, dev, "bf16", 32, 32768, next_n=2)
        if "topk" in want:
            for k in (512, 1024, 2048):
                bench_topk(results, ceil, dev, 4096, 22016, k)
            bench_topk(results, ceil, dev, 64, 65536, 2048)
            bench_topk(results, ceil, dev, 1, 131072, 2048)
            if not quick:
                bench_topk(results, ceil, dev, 64, 65536, 2048, ragged=True, ties=True)
                bench_topk(results, ceil, dev, 1, 131072, 512)
        if "prefill" in want:
            bench_prefill(results, ceil, dev, "bf16", 4096, 22016)
            bench_prefill(results, ceil, dev, "fp8", 4096, 22016)
        if "store" in want:
            bench_store(results, ceil, dev, "fp8", 22016)
            bench_store(results, ceil, dev, "bf16", 22016)
    report = {"info": info, "ceilings": ceil, "results": results}
    summary(results)
    if out_path:
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1, default=str)
        print(f"\nwrote {out_path}")
    return report


def summary(results):
    print("\n| case | impl | time | graph time | floor | vs niah | peak extra | check |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        ms = r.get("ms")
        t = "-" if ms is None else (f"{ms * 1e3:.1f} us" if ms < 0.1 else f"{ms:.3f} ms")
        fl = r.get("floor_ms")
        fl = "-" if fl is None else (f"{fl * 1e3:.1f} us" if fl < 0.1 else f"{fl:.3f} ms")
        sp = r.get("speedup_of_niah")
        sp = "1.0x" if r["impl"].startswith("triton") else ("-" if sp is None else f"{sp:.1f}x slower")
        pk = r.get("peak_extra_bytes")
        pk = "-" if pk is None else f"{pk / GiB:.2f} GiB"
        chk = ""
        if "calc_diff" in r:
            chk = f"diff {r['calc_diff']:.1e}, masks {'ok' if r['mask_ok'] else 'DIFFER'}"
        elif "correct" in r:
            chk = "ok" if r["correct"] else f"WRONG: {r['problem']}"
        elif "bitwise_equal" in r:
            chk = "bitwise ok" if r["bitwise_equal"] else "DIFFER"
        gm = r.get("graph_ms")
        gm = "-" if gm is None else (f"{gm * 1e3:.1f} us" if gm < 0.1 else f"{gm:.3f} ms")
        print(f"| {r['case']} | {r['impl']} | {t} | {gm} | {fl} | {sp} | {pk} | {chk} |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the JSON report here")
    ap.add_argument("--tiny", action="store_true", help="small shapes on CPU under TRITON_INTERPRET=1")
    ap.add_argument("--quick", action="store_true", help="skip the secondary cases")
    ap.add_argument("--only", default=None, help="comma list of sections: decode,ragged,prefill,topk,store")
    args = ap.parse_args(argv)
    if args.tiny and not has_cuda():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    run(args.out, tiny=args.tiny, quick=args.quick, only=args.only)


if __name__ == "__main__":
    main()
