"""fp4 (MXFP4) index-key kernels side by side with fp8 and bf16, one process:

    python benchmarks/kernels/fp4.py --out fp4.json            # CUDA
    python benchmarks/kernels/fp4.py --tiny --out fp4.json     # CPU, TRITON_INTERPRET=1: the wiring only

Decode logits (clean_logits=False, H=64, D=128, next_n=1) at B=64 with lengths uniform in
1..65,536 (ragged) and at B=1 x 131,072, on the same keys stored three ways: niah's fp4
(`fp4_paged_mqa_logits`; bf16 and fp4 queries), niah's fp8 and bf16 (`fp8_paged_mqa_logits`,
`bf16_paged_mqa_logits`), and DeepGEMM's fp8 (`deep_gemm.fp8_paged_mqa_logits`) when
`import deep_gemm` works. Each case records the median ms (triton.testing.do_bench), the bytes
each one reads (whole pages up to the lengths, a key's bytes as the forms table
niah.kernels.forms sizes it: fp4 68, fp8 132, bf16 256 bytes a token) and the ratios fp4 /
DeepGEMM fp8 (goal <= 1.0, moonshot 0.6) and fp4 / niah fp8 (the yardstick where DeepGEMM is
not built). The fp4 arms: unpack (bf16 and fp4 queries; the default, packed, with the f16 product for
the fp4 query, beside packed's bf16 product, `f16=False`, and the first decoding, `packed=False`,
each checked against the first decoding bit for bit first), the fp8 MMA path where the GPU has fp8
MMA (fp4 query), scaled where it has fp4 MMA; the fp4 query's unpack path again at each launch of a
sweep (pages a program 4/8/16, stages 1/2, registers as compiled or capped at 96 / 80, 4 warps;
`launch_sweep`), the best as its own row; every decode row timed eagerly and replayed in a CUDA
graph (`graph_ms`, `graph_ratio`: GPU time alone; at B=1 the eager time is the host's launch).
Also the fp4 key store (4,096 tokens) and the fp4 prefill logits (4,096 x 22,016).
Every case is checked against the float64 / fp32 reference (calc_diff) at B=1 first.
"""

from __future__ import annotations

import os
import sys

if "--tiny" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from measure import bench_cli, deep_gemm, has_cuda, timeit, timeit_graph, write_results  # noqa: E402


def pages_of(keys: torch.Tensor):
    """keys [P*64, 128] -> the three pools (fp4 2-D, fp8 4-D, bf16 4-D) of the same keys."""
    from measure import fp8_pages

    from niah.kernels import store_fp4_index_keys

    n = keys.shape[0]
    fp4 = torch.empty(n // 64, 64 * 68, dtype=torch.uint8, device=keys.device)
    store_fp4_index_keys(keys, fp4, torch.arange(n, device=keys.device))
    return fp4, fp8_pages(keys.reshape(n // 64, 64, 128)), keys.bfloat16().reshape(n // 64, 64, 1, 128)


def decode_case(results, dev, batch, ctx_len, ragged, dg, tiny):
    from niah.kernels import bf16_paged_mqa_logits, forms, fp4_paged_mqa_logits, fp8_paged_mqa_logits
    from niah.kernels._common import compare_logits
    from niah.kernels.fp4_paged_logits.reference import ref_fp4_paged_mqa_logits
    from niah.kernels.fp4_paged_logits.wrapper import has_fp4_mma, has_fp8_mma
    from niah.kernels.quant import quantize_fp4, quantize_fp8

    g = torch.Generator(device=dev).manual_seed(0)
    heads = 64
    per = (ctx_len + 63) // 64
    table = torch.randperm(batch * per, device=dev, generator=g).reshape(batch, per).int()
    keys = torch.randn(batch * per * 64, 128, device=dev, generator=g)
    fp4, fp8, bf16 = pages_of(keys)
    del keys
    b4, b8, b16 = (forms.get(n).key_bytes(128) for n in ("fp4", "fp8", "bf16"))  # a key's bytes, scales included
    q = torch.randn(batch, 1, heads, 128, device=dev, generator=g)
    w = torch.rand(batch, heads, device=dev, generator=g) * heads**-0.5
    ctx = (torch.randint(1, ctx_len + 1, (batch,), device=dev, generator=g, dtype=torch.int32) if ragged
           else torch.full((batch,), ctx_len, dtype=torch.int32, device=dev))
    q4, q8, q16 = quantize_fp4(q), quantize_fp8(q)[0], q.bfloat16()
    pages_read = int(((ctx.long() + 63) // 64).sum()) * 64
    case = f"decode B={batch} {'ragged<=' if ragged else 'x'}{ctx_len}"
    calls = {
        "niah fp4 (unpack, bf16 query)": (lambda: fp4_paged_mqa_logits(q16, fp4, w, ctx, table, None, ctx_len,
                                                                        mma="unpack"), b4),
        "niah fp4 (unpack, fp4 query)": (lambda: fp4_paged_mqa_logits(q4, fp4, w, ctx, table, None, ctx_len,
                                                                       mma="unpack"), b4),
        "niah fp4 (unpack first decoding, bf16 query)": (lambda: fp4_paged_mqa_logits(
            q16, fp4, w, ctx, table, None, ctx_len, mma="unpack", packed=False), b4),
        "niah fp4 (unpack first decoding, fp4 query)": (lambda: fp4_paged_mqa_logits(
            q4, fp4, w, ctx, table, None, ctx_len, mma="unpack", packed=False), b4),
        "niah fp4 (unpack packed bf16 product, fp4 query)": (lambda: fp4_paged_mqa_logits(
            q4, fp4, w, ctx, table, None, ctx_len, mma="unpack", f16=False), b4),
        "niah fp8": (lambda: fp8_paged_mqa_logits(q8, fp8, w, ctx, table, None, ctx_len), b8),
        "niah bf16": (lambda: bf16_paged_mqa_logits(q16, bf16, w, ctx, table, None, ctx_len), b16),
    }
    if has_fp8_mma(fp4):
        calls["niah fp4 (fp8 MMA, fp4 query)"] = (lambda: fp4_paged_mqa_logits(q4, fp4, w, ctx, table, None, ctx_len,
                                                                               mma="fp8"), b4)
    if has_fp4_mma(fp4):
        calls["niah fp4 (scaled, fp4 query)"] = (lambda: fp4_paged_mqa_logits(q4, fp4, w, ctx, table, None, ctx_len,
                                                                              mma="scaled"), b4)
    if dg is not None:
        ctx2 = ctx.view(-1, 1)
        meta = dg.get_paged_mqa_logits_metadata(ctx2, 64, dg.get_num_sms())
        calls["DeepGEMM fp8"] = (lambda: dg.fp8_paged_mqa_logits(q8, fp8, w, ctx2, table, meta, ctx_len,
                                                                  clean_logits=False), b8)
    if batch == 1 or tiny:  # the fp4 kernel against its reference on these inputs
        ref = ref_fp4_paged_mqa_logits(q4, fp4, w, ctx, table, ctx_len)
        for mma in ("unpack", "fp8") if has_fp8_mma(fp4) else ("unpack",):
            out = fp4_paged_mqa_logits(q4, fp4, w, ctx, table, None, ctx_len, clean_logits=True, mma=mma)
            diff = compare_logits(out, ref)[0]
            results.append({"case": case, "impl": f"check: niah fp4 ({mma}) vs reference", "calc_diff": diff})
            print(f"{case}: niah fp4 ({mma}) calc_diff vs reference {diff:.2e}")
    # the default (packed; the f16 product for the fp4 query) against the first decoding, and the f16
    # product against packed's bf16 one: equal bit for bit under the interpreter (tested); here, on this GPU
    for name, qq, kw in (("bf16 query, packed", q16, {}), ("fp4 query, f16 product", q4, {}),
                         ("fp4 query, packed bf16 product", q4, {"f16": False})):
        default = fp4_paged_mqa_logits(qq, fp4, w, ctx, table, None, ctx_len, clean_logits=True, mma="unpack", **kw)
        first = fp4_paged_mqa_logits(qq, fp4, w, ctx, table, None, ctx_len, clean_logits=True, mma="unpack",
                                     packed=False)
        same = torch.equal(default, first)
        diff = compare_logits(default, first)[0]
        results.append({"case": case, "impl": f"check: niah fp4 unpack {name} = first decoding",
                        "bitwise_equal": same, "calc_diff": diff})
        print(f"{case}: {name} equals the first decoding bit for bit: {same} (calc_diff {diff:.1e})")
    timed, graphed = {}, {}
    for impl, (fn, row_bytes) in calls.items():
        ms = timeit(fn)
        timed[impl] = ms
        graphed[impl] = gms = timeit_graph([fn])   # GPU time alone (B=1's eager time is the host's launch)
        results.append({"case": case, "impl": impl, "ms": ms, "graph_ms": gms, "bytes_read": pages_read * row_bytes,
                        "GBps": pages_read * row_bytes / (ms * 1e-3) / 1e9 if has_cuda() else None})
        print(f"{case}: {impl}: {ms:.4f} ms" + (f" (CUDA graph {gms:.4f} ms)" if gms else "")
              + f", {pages_read * row_bytes / 2**20:.1f} MiB of keys")
    def sweep_call(mma, **kw):
        return fp4_paged_mqa_logits(q4, fp4, w, ctx, table, None, ctx_len, mma=mma, **kw)

    # the fp8 MMA path, swept too once, took 1.3x (B=1) and 1.6x (B=64) unpack's best (one H100): unpack only
    launch_sweep(results, case, timed, graphed, sweep_call, ("unpack",), tiny)
    for base in ("DeepGEMM fp8", "niah fp8"):   # niah fp8: the yardstick where DeepGEMM is not built
        if base not in timed:
            continue
        for impl in [k for k in timed if k.startswith("niah fp4")]:
            ratio = timed[impl] / timed[base]
            g = graphed[impl] / graphed[base] if graphed.get(impl) and graphed.get(base) else None
            goal = {"goal": 1.0, "moonshot": 0.6} if base == "DeepGEMM fp8" else {}   # the goals are DeepGEMM's
            results.append({"case": case, "impl": f"{impl} / {base}", "ratio": ratio, "graph_ratio": g, **goal})
            print(f"{case}: {impl} / {base} = {ratio:.3f}" + (f"; in a CUDA graph {g:.3f}" if g else "")
                  + (" (goal <= 1.0, moonshot 0.6)" if goal else ""))


def store_and_prefill(results, dev, tiny):
    from niah.kernels import fp4_mqa_logits, store_fp4_index_keys
    from niah.kernels.quant import fp4_sglang_layout, quantize_fp4

    n, seq, skv = (64, 8, 128) if tiny else (4096, 4096, 22016)
    g = torch.Generator(device=dev).manual_seed(1)
    keys = torch.randn(n, 128, device=dev, generator=g).bfloat16()
    cache = torch.empty(n // 64, 64 * 68, dtype=torch.uint8, device=dev)
    slots = torch.randperm(n, device=dev, generator=g)
    ms = timeit(lambda: store_fp4_index_keys(keys, cache, slots))
    results.append({"case": f"store N={n}", "impl": "niah fp4 store", "ms": ms})
    print(f"store N={n}: niah fp4 store {ms:.4f} ms")
    kv = fp4_sglang_layout(*quantize_fp4(torch.randn(skv, 128, device=dev, generator=g)))
    q = torch.randn(seq, 64, 128, device=dev, generator=g).bfloat16()
    w = torch.rand(seq, 64, device=dev, generator=g)
    ks = torch.zeros(seq, dtype=torch.int32, device=dev)
    ke = torch.arange(skv - seq + 1, skv + 1, dtype=torch.int32, device=dev)
    ms = timeit(lambda: fp4_mqa_logits(q, kv, w, ks, ke, clean_logits=False))
    results.append({"case": f"prefill {seq} x {skv}", "impl": "niah fp4 prefill (bf16 query)", "ms": ms})
    print(f"prefill {seq} x {skv}: niah fp4 (bf16 query) {ms:.4f} ms")


# 4 warps only (8 took 1.8-2.1x longer at B=64 and 1.1-1.7x at B=1 on one H100) and 1-2 stages (3 was slower):
# the registers capped (ptxas's maxnreg) beside the compiler's choice, at which the f16 path holds
# 121-128 registers a thread and 24-28 KB of shared memory, four programs an SM (ncu: 25 % occupancy)
SWEEP = [dict(pages_per_split=p, num_warps=4, num_stages=st, max_registers=r)
         for p in (4, 8, 16) for st in (1, 2) for r in (None, 96, 80)]


def launch_sweep(results, case, timed, graphed, call, mmas, tiny):
    """The fp4 query's paths (`mmas`) at each launch of SWEEP (pages a program, stages,
    registers), each checked against the default launch's clean logits (calc_diff, the -inf masks)
    and timed as the other rows (clean_logits=False; eager and in a CUDA graph); the best (by
    CUDA-graph time where there is one: B=1's eager time is the host's launch, which the sweep's
    options do not change) becomes a "... best launch" row beside the default's, so the ratios
    below include it."""
    from niah.kernels._common import compare_logits

    for mma in mmas:
        want = call(mma, clean_logits=True)
        timings = []
        for cfg in SWEEP[:2] if tiny else SWEEP:
            diff, masks = compare_logits(call(mma, clean_logits=True, **cfg), want)
            ms = timeit(lambda cfg=cfg: call(mma, **cfg))
            gms = timeit_graph([lambda cfg=cfg: call(mma, **cfg)])
            results.append({"case": case, "impl": f"sweep: niah fp4 ({mma}, fp4 query)", "launch": cfg, "ms": ms,
                            "graph_ms": gms, "calc_diff_vs_default": float(diff), "masks_equal": bool(masks)})
            print(f"{case}: sweep {mma} {cfg}: {ms:.4f} ms" + (f" (CUDA graph {gms:.4f} ms)" if gms else "")
                  + f" (calc_diff vs the default launch {diff:.1e}, masks equal: {masks})")
            if diff < 1e-9 and masks:
                timings.append((ms, gms, cfg))
        if not timings:
            continue
        # by GPU time where every launch has one (a failed capture leaves None), else by eager time
        by_graph = all(gms for _, gms, _ in timings)
        ms, gms, cfg = min(timings, key=lambda t: t[1] if by_graph else t[0])
        impl = f"niah fp4 ({'fp8 MMA' if mma == 'fp8' else 'unpack'}, fp4 query) best launch"
        timed[impl], graphed[impl] = ms, gms
        results.append({"case": case, "impl": impl, "ms": ms, "graph_ms": gms, "launch": cfg})
        print(f"{case}: {impl}: {ms:.4f} ms" + (f" (CUDA graph {gms:.4f} ms)" if gms else "") + f" {cfg}")


def main() -> None:
    a, dev, env = bench_cli(__doc__, "fp4.py")
    results: list = []
    dg = None if a.tiny else deep_gemm()
    cases = [(1, 200, False)] if a.tiny else [(1, 131072, False), (64, 65536, True)]
    for batch, ctx_len, ragged in cases:
        decode_case(results, dev, batch, ctx_len, ragged, dg, a.tiny)
        write_results(a.out, env, results)
    store_and_prefill(results, dev, a.tiny)
    write_results(a.out, env, results)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
