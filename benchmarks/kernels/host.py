"""Host cost of an eager logits call at B=1: niah's direct launch against Triton's launcher.

    python benchmarks/kernels/host.py --out host.json [--calls 200] [--repeats 7] [--deepgemm auto|off]
    python benchmarks/kernels/host.py --smoke --out host.json     (CPU, TRITON_INTERPRET=1: wiring only)

Cases: decode (paged logits, B=1, next_n=1, 64 heads x 128) over one row of 131,072 and of
4,096 tokens, bf16 and fp8; prefill (mqa logits) of 128 queries over 4,096 keys, bf16 and
fp8; timed as SGLang calls them (clean_logits=False). For each, `--calls` back-to-back eager
calls, timed `--repeats` times (median):
  wall_us  = (calls + one final synchronize) / calls: what a stream of eager calls costs
  host_us  = the loop alone / calls: the CPU time a call takes to enqueue
(decode also: the wrapper's checks and output allocation alone, max_context_len=0)
for niah's wrapper as shipped (direct launch of the cached compiled kernel) and for the same
wrapper through kernel[grid] (`_launch.via_triton()`), their ratio, and CUDA-graph replay of
the same calls (16 a graph) as the device-time floor. With `import deep_gemm` working (and
--deepgemm auto), DeepGEMM's fp8_paged_mqa_logits / fp8_mqa_logits on the fp8 inputs the
same way; otherwise it prints "DeepGEMM: not available". Direct and kernel[grid] outputs are
compared bitwise in the same process. Writes the JSON after every case.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone


def _sync(dev: str) -> None:
    import torch

    if dev == "cuda":
        torch.cuda.synchronize()


def eager_us(fn, dev: str, calls: int, repeats: int) -> dict:
    """Median over repeats of (wall, host) microseconds per call of `calls` back-to-back calls."""
    fn()
    _sync(dev)
    walls, hosts = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        _sync(dev)
        t2 = time.perf_counter()
        hosts.append((t1 - t0) / calls * 1e6)
        walls.append((t2 - t0) / calls * 1e6)
    return {"wall_us": statistics.median(walls), "host_us": statistics.median(hosts)}


def graph_us(fn, dev: str, per_graph: int = 16, replays: int = 50) -> float | None:
    """Microseconds per call of a CUDA graph holding `per_graph` calls, replayed back to back."""
    import torch

    if dev != "cuda":
        return None
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(per_graph):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / (replays * per_graph) * 1e6
    except Exception as e:  # noqa: BLE001  (a failed capture is reported, the run goes on)
        print(f"  graph capture failed: {e!r}"[:300])
        return None


def smoke_stand_in():
    """--smoke only: niah.kernels under DeepGEMM's names, so that the DeepGEMM branch's wiring
    runs on CPU (its timings are niah's, and the report says so)."""
    import types

    import niah.kernels as nk

    return types.SimpleNamespace(get_num_sms=lambda: 4, get_paged_mqa_logits_metadata=nk.get_paged_mqa_logits_metadata,
                                 fp8_paged_mqa_logits=nk.fp8_paged_mqa_logits, fp8_mqa_logits=nk.fp8_mqa_logits,
                                 __file__="niah.kernels (smoke stand-in, not DeepGEMM)")


def deep_gemm_module(mode: str):
    if mode == "off":
        print("DeepGEMM: off (--deepgemm off)")
        return None
    try:
        import deep_gemm
    except Exception as e:  # noqa: BLE001  (ImportError, or a build that does not load)
        print(f"DeepGEMM: not available ({type(e).__name__}: {str(e)[:200]})")
        return None
    print(f"DeepGEMM: {getattr(deep_gemm, '__file__', '?')}")
    return deep_gemm


def decode_case(dev, kind, ctx_len, heads):
    """(niah call(clean=False), DeepGEMM call factory or None) for one row of ctx_len tokens."""
    from niah.kernels import bf16_paged_mqa_logits, fp8_paged_mqa_logits
    from decode import make_decode_inputs

    q, kv, w, ctx, bt = make_decode_inputs(dev, kind, 1, ctx_len, heads, 128, 1, ragged=False)
    fn = fp8_paged_mqa_logits if kind == "fp8" else bf16_paged_mqa_logits
    niah = lambda clean=False, n=ctx_len: fn(q, kv, w, ctx, bt, None, n, clean_logits=clean)  # noqa: E731

    def deepgemm(dg):  # the fp8 inputs only: DeepGEMM has no bf16-key kernel
        ctx2 = ctx.view(-1, 1)  # DeepGEMM takes context_lens [B, next_n] (SGLang passes the 2-D form)
        meta = dg.get_paged_mqa_logits_metadata(ctx2, 64, dg.get_num_sms())
        return lambda: dg.fp8_paged_mqa_logits(q, kv, w, ctx2, bt, meta, ctx_len, clean_logits=False)
    return niah, deepgemm if kind == "fp8" else None


def prefill_case(dev, kind, seq, skv, heads):
    import torch

    from niah.kernels import bf16_mqa_logits, fp8_mqa_logits
    from niah.kernels.quant import quantize_fp8

    g = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn(seq, heads, 128, device=dev, generator=g)
    k = torch.randn(skv, 128, device=dev, generator=g)
    w = torch.randn(seq, heads, device=dev, generator=g) * heads**-0.5
    ks = torch.zeros(seq, dtype=torch.int32, device=dev)
    ke = (skv - seq + torch.arange(seq, device=dev) + 1).int()
    if kind == "fp8":
        q, (k, sf) = quantize_fp8(q)[0], quantize_fp8(k)
        niah = lambda clean=False: fp8_mqa_logits(q, (k, sf), w, ks, ke, clean_logits=clean)  # noqa: E731
        return niah, lambda dg: (lambda: dg.fp8_mqa_logits(q, (k, sf), w, ks, ke, clean_logits=False))
    q, k = q.bfloat16(), k.bfloat16()
    return (lambda clean=False: bf16_mqa_logits(q, k, w, ks, ke, clean_logits=clean)), None


def run_case(name, niah, deepgemm, dg, dev, calls, repeats) -> dict:
    from niah.kernels._launch import via_triton

    print(f"\n== {name}", flush=True)
    import torch

    with via_triton():
        ref = niah(clean=True)
    direct = niah(clean=True)
    row = {"case": name, "direct_equals_kernel_grid": bool(torch.equal(direct, ref))}
    del ref, direct
    row["niah_direct"] = eager_us(niah, dev, calls, repeats)
    with via_triton():
        row["niah_kernel_grid"] = eager_us(niah, dev, calls, repeats)
    row["ratio_kernel_grid_over_direct"] = row["niah_kernel_grid"]["wall_us"] / row["niah_direct"]["wall_us"]
    row["niah_graph_us"] = graph_us(niah, dev)
    # the wrapper's checks and allocation alone (max_context_len=0 returns before the launch)
    if name.startswith("decode"):
        row["niah_checks_only"] = eager_us(lambda: niah(n=0), dev, calls, repeats)
    if dg is not None and deepgemm is not None:
        try:
            call = deepgemm(dg)
            row["deepgemm"] = eager_us(call, dev, calls, repeats)
            row["deepgemm_graph_us"] = graph_us(call, dev)
            row["direct_over_deepgemm"] = row["niah_direct"]["wall_us"] / row["deepgemm"]["wall_us"]
        except Exception as e:  # noqa: BLE001  (an API mismatch is recorded, not fatal)
            row["deepgemm_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    _print_row(row)
    return row


def _print_row(row: dict) -> None:
    d, t = row["niah_direct"], row["niah_kernel_grid"]
    g = row["niah_graph_us"]
    print(f"  niah direct      {d['wall_us']:8.1f} us/call (host {d['host_us']:.1f})  "
          f"equal to kernel[grid]: {row['direct_equals_kernel_grid']}")
    print(f"  niah kernel[grid]{t['wall_us']:8.1f} us/call (host {t['host_us']:.1f})  "
          f"ratio {row['ratio_kernel_grid_over_direct']:.2f}x")
    print(f"  niah CUDA graph  {'-' if g is None else f'{g:8.1f}'} us/call (device-time floor)")
    if "niah_checks_only" in row:
        print(f"  niah checks+alloc only {row['niah_checks_only']['host_us']:.1f} us/call (no launch)")
    if "deepgemm" in row:
        dg, dgg = row["deepgemm"], row["deepgemm_graph_us"]
        print(f"  DeepGEMM         {dg['wall_us']:8.1f} us/call (host {dg['host_us']:.1f}); graph "
              f"{'-' if dgg is None else f'{dgg:.1f}'} us; niah direct / DeepGEMM {row['direct_over_deepgemm']:.2f}x")
    elif "deepgemm_error" in row:
        print(f"  DeepGEMM error: {row['deepgemm_error']}")


def _info(dev: str, smoke: bool) -> dict:
    import torch
    import triton

    info = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "cpu": platform.processor(),
            "python": sys.version.split()[0], "torch": torch.__version__, "triton": triton.__version__,
            "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (TRITON_INTERPRET=1)",
            "smoke": smoke}
    return info


def run(out_path: str, smoke: bool, calls: int, repeats: int, deepgemm_mode: str) -> dict:
    import torch

    dev = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    if dev == "cpu" and not smoke:
        raise SystemExit("host.py: no CUDA device (use --smoke for the CPU wiring check)")
    dg = deep_gemm_module(deepgemm_mode)
    if smoke:  # the import is tried and reported; the branch runs on a stand-in
        dg = smoke_stand_in()
        print("smoke: the DeepGEMM branch runs niah.kernels under DeepGEMM's names (wiring only)")
    heads = 16 if smoke else 64
    decode_lens = (256, 128) if smoke else (131072, 4096)
    seq, skv = (8, 128) if smoke else (128, 4096)
    report = {"info": _info(dev, smoke), "calls": calls, "repeats": repeats,
              "deepgemm": None if dg is None else str(dg.__file__), "results": []}
    cases = []
    for ctx_len in decode_lens:
        for kind in ("bf16", "fp8"):
            cases.append((f"decode {kind} B=1 x {ctx_len}", lambda k=kind, n=ctx_len: decode_case(dev, k, n, heads)))
    for kind in ("bf16", "fp8"):
        cases.append((f"prefill {kind} {seq} x {skv}", lambda k=kind: prefill_case(dev, k, seq, skv, heads)))
    for name, make in cases:
        niah, deepgemm = make()
        report["results"].append(run_case(name, niah, deepgemm, dg, dev, calls, repeats))
        _write(out_path, report)
    from niah.kernels.mqa_logits.wrapper import _launcher as prefill_launcher
    from niah.kernels.paged_logits.wrapper import _launcher as decode_launcher

    report["cached_specialisations"] = {"paged": len(decode_launcher().cache), "mqa": len(prefill_launcher().cache),
                                        "direct": decode_launcher().compiled_mode}
    _write(out_path, report)
    print(f"\nwrote {out_path}")
    return report


def _write(path: str, report: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON results path")
    p.add_argument("--smoke", action="store_true", help="CPU wiring check under TRITON_INTERPRET=1 (no timings)")
    p.add_argument("--calls", type=int, default=None, help="back-to-back calls a timing (default 200; smoke 1)")
    p.add_argument("--repeats", type=int, default=None, help="timings a case, median reported (default 7; smoke 1)")
    p.add_argument("--deepgemm", choices=("auto", "off"), default="auto",
                   help="auto: time DeepGEMM when `import deep_gemm` works")
    a = p.parse_args(argv)
    if a.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the wrappers import it lazily)
    run(a.out, a.smoke, a.calls or (1 if a.smoke else 200), a.repeats or (1 if a.smoke else 7), a.deepgemm)


if __name__ == "__main__":
    main()
