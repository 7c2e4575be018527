"""What the kernel benchmarks share: timing (do_bench medians, CUDA-graph replays), peak
extra memory, the machine's ceilings (copy bandwidth, bf16/fp8 matmul rate), the decode
inputs' fp8 page layout, the chunked torch decode baseline, the host cost of a call, the
decode benchmarks' command line (`bench_cli`), and the report rows (written to the JSON after
every row, so a run killed at its limit keeps what it measured). Imported by the scripts
beside it; imports only niah.kernels.
"""

from __future__ import annotations

import json
import time

import torch

GiB = 1 << 30
REPORT: dict = {}  # the report being written (path, info, ceilings): rewritten after every record


# ----------------------------------------------------------------------------- timing
def has_cuda() -> bool:
    return torch.cuda.is_available()


def timeit(fn, rep_ms: int = 200) -> float:
    """Median ms per call."""
    if has_cuda():
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def timeit_graph(fns, rep_ms: int = 100) -> float | None:
    """Median ms per call of GPU time alone: the calls (one per input copy, so that repeated
    runs do not read a warm L2) are captured in one CUDA graph and replayed; launch
    overhead on the host is out of the number, as when SGLang replays its decode graphs."""
    if not has_cuda():
        return None
    import triton.testing

    def all_fns():
        for f in fns:
            f()

    try:
        return float(triton.testing.do_bench_cudagraph(all_fns, rep=rep_ms, return_mode="median")) / len(fns)
    except Exception as e:  # noqa: BLE001
        print(f"  cuda-graph timing failed: {e!r}"[:300])
        return None


def peak_extra(fn) -> int | None:
    """Bytes allocated above the starting point while fn runs (its output included)."""
    if not has_cuda():
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


def ceilings(dev) -> dict:
    if not has_cuda():
        return {"copy_GBps": None, "bf16_TFLOPs": None, "fp8_TFLOPs": None}
    n = 2 * GiB // 4
    a = torch.empty(n, dtype=torch.float32, device=dev).uniform_()
    b = torch.empty_like(a)
    t = timeit(lambda src=a, dst=b: dst.copy_(src))  # bound now: the `del` below frees them
    copy = 2 * a.numel() * 4 / (t * 1e-3) / 1e9
    del a, b
    m = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t = timeit(lambda: m @ m)
    bf16 = 2 * 8192**3 / (t * 1e-3) / 1e12
    fp8 = None
    try:
        m8 = m.to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev)
        t = timeit(lambda: torch._scaled_mm(m8, m8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        fp8 = 2 * 8192**3 / (t * 1e-3) / 1e12
    except Exception as e:  # noqa: BLE001
        print(f"fp8 matmul ceiling not measured: {e!r}")
    return {"copy_GBps": copy, "bf16_TFLOPs": bf16, "fp8_TFLOPs": fp8}


def deep_gemm():
    """DeepGEMM's module when `import deep_gemm` works, else None (said on one line)."""
    try:
        import deep_gemm as dg
    except Exception as e:  # noqa: BLE001 (ImportError, or a build that does not load)
        print(f"DeepGEMM: not available ({type(e).__name__}: {str(e)[:160]})")
        return None
    return dg


def write_results(path, env: dict, results: list) -> None:
    """The benchmark's JSON ({"env", "results"}), rewritten after every case."""
    path.write_text(json.dumps({"env": env, "results": results}, indent=1))


def bench_cli(doc: str, script: str):
    """The decode benchmarks' command line: --out (required) and --tiny (CPU under the
    interpreter, tiny shapes: the wiring only); without CUDA and without --tiny, one line and
    exit. -> (args, device, env)."""
    import argparse
    import sys
    from pathlib import Path

    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tiny", action="store_true", help="CPU, interpreter, tiny shapes: the wiring only")
    a = p.parse_args()
    dev = "cuda" if has_cuda() else "cpu"
    if dev == "cpu" and not a.tiny:
        sys.exit(f"{script}: no CUDA device; pass --tiny to check the wiring on CPU")
    env = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)", "torch": torch.__version__}
    return a, dev, env


# ----------------------------------------------------------------------------- inputs
def fp8_pages(k: torch.Tensor) -> torch.Tensor:
    """k [pages, 64, D] -> uint8 [pages, 64, 1, D+4] (SGLang/DeepGEMM page), chunked."""
    from niah.kernels.quant import quantize_fp8

    pages, bkv, d = k.shape
    out = torch.empty(pages, bkv * (d + 4), dtype=torch.uint8, device=k.device)
    step = 4096
    for p0 in range(0, pages, step):
        k8, sf = quantize_fp8(k[p0 : p0 + step])
        out[p0 : p0 + step, : bkv * d] = k8.view(torch.uint8).reshape(-1, bkv * d)
        out[p0 : p0 + step, bkv * d :] = sf.contiguous().view(torch.uint8).reshape(-1, bkv * 4)
    return out.reshape(pages, bkv, 1, d + 4)


def chunked_paged(q, kv_cache, weights, context_lens, block_table, max_len, group=8):
    """Chunked torch decode: gather `group` requests' pages at a time, bf16 bmm."""
    from niah.kernels.paged_logits.reference import naive_paged_mqa_logits

    outs = []
    for b0 in range(0, q.shape[0], group):
        sl = slice(b0, b0 + group)
        outs.append(naive_paged_mqa_logits(q[sl], kv_cache, weights[sl], context_lens[sl], block_table[sl], max_len))
    return torch.cat(outs)


# ----------------------------------------------------------------------------- cases
def record(results, case, impl, ms, floor_ms, work, peak, extra=None):
    row = {"case": case, "impl": impl, "ms": ms, "floor_ms": floor_ms, "peak_extra_bytes": peak}
    row.update(work)
    if extra:
        row.update(extra)
    results.append(row)
    if REPORT.get("path"):  # incremental: a run killed at its time limit keeps what it measured
        with open(REPORT["path"], "w") as f:
            json.dump({"info": REPORT["info"], "ceilings": REPORT["ceilings"], "results": results}, f, indent=1,
                      default=str)
    return row


def sweep(fn, configs):
    """Time fn(**cfg) for each config; returns (best_cfg, best_ms, table)."""
    table = []
    for cfg in configs:
        try:
            fn(**cfg)
            ms = timeit(lambda: fn(**cfg))
            table.append({"config": cfg, "ms": ms})
        except Exception as e:  # noqa: BLE001 - a config that fails to compile is reported, not fatal
            table.append({"config": cfg, "error": repr(e)[:300]})
    ok = [t for t in table if "ms" in t]
    if not ok:
        raise RuntimeError(f"every config failed: {table}")
    best = min(ok, key=lambda t: t["ms"])
    return best["config"], best["ms"], table


def host_overhead(call, eager_ms, graph_ms, n=200) -> dict:
    """The wrapper's host cost: eager (do_bench) minus CUDA-graph time, and the CPU time per call
    of `n` back-to-back launches (the GPU queue does not fill, so this is the host's own time)."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        call()
    host_us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    d = {"host_us_per_call": host_us,
         "eager_minus_graph_us": (eager_ms - graph_ms) * 1e3 if graph_ms else None}
    print(f"  host overhead: {host_us:.1f} us CPU per call; "
          f"eager - graph = {d['eager_minus_graph_us'] or float('nan'):.1f} us")
    return d
