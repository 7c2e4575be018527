"""Decode benchmark cases (uniform and ragged batches, host overhead at B=1), run by bench.py;
make_decode_inputs is also the input of host.py and ncu_call.py.

Floors count the bytes actually moved: the pages each row reads (whole 64-token pages up
to its length, a key's bytes as the forms table niah.kernels.forms sizes its form) plus the
logits written (every position with clean_logits=True).
"""

from __future__ import annotations

import torch
from measure import GiB, chunked_paged, fp8_pages, host_overhead, peak_extra, record, sweep, timeit, timeit_graph

SMS = 132  # the schedule's SM count (an H100's / H200's), as SGLang passes DeepGEMM's metadata


def make_decode_inputs(dev, kind, batch, ctx_len, heads, dim, next_n, ragged, seed=0):
    from niah.kernels.quant import quantize_fp8

    g = torch.Generator(device=dev).manual_seed(seed)
    pages_per = (ctx_len + 63) // 64
    n_pages = batch * pages_per
    block_table = torch.randperm(n_pages, device=dev, generator=g).reshape(batch, pages_per).int()
    k = torch.randn(n_pages, 64, dim, device=dev, generator=g, dtype=torch.bfloat16)
    q = torch.randn(batch, next_n, heads, dim, device=dev, generator=g)
    w = torch.randn(batch * next_n, heads, device=dev, generator=g) * heads**-0.5
    if kind == "fp8":
        kv = fp8_pages(k)
        del k
        q = quantize_fp8(q)[0]
    else:
        kv = k.reshape(n_pages, 64, 1, dim)
        q = q.bfloat16()
    if ragged:  # lengths uniform in 1..ctx_len
        ctx = torch.randint(1, ctx_len + 1, (batch,), device=dev, generator=g, dtype=torch.int32)
    else:
        ctx = torch.full((batch,), ctx_len, dtype=torch.int32, device=dev)
    return q, kv, w, ctx, block_table


def decode_bytes(ctx, ctx_len, next_n, key_bytes, clean):
    """Bytes actually moved: whole pages up to each length, plus the logits written."""
    pages = (ctx.long().clamp(0, ctx_len) + 63) // 64
    keys = int(pages.sum()) * 64 * key_bytes
    written = ctx.numel() * next_n * ctx_len if clean else int(pages.sum()) * 64 * next_n
    return keys + written * 4


def decode_configs(ragged, tiny):
    if tiny:
        return [{}]
    base = [{}, {"live_loop": False}, {"pages_per_split": 4}, {"pages_per_split": 16}, {"pages_per_split": 32},
            {"pages_per_split": 8, "num_stages": 4}, {"pages_per_split": 8, "num_stages": 2}]
    if ragged:
        base += [{"pages_per_split": 2}, {"pages_per_split": 4, "live_loop": False}]
    return base


def bench_decode(results, ceil, dev, kind, batch, ctx_len, heads=64, dim=128, next_n=1, tiny=False,
                 ragged=False, alternatives=True):
    from niah.kernels import bf16_paged_mqa_logits, forms, fp8_paged_mqa_logits, get_paged_mqa_logits_metadata
    from niah.kernels._common import compare_logits
    from niah.kernels.paged_logits.reference import naive_paged_mqa_logits, ref_paged_mqa_logits

    case = f"decode {kind} B={batch}x{'1..' if ragged else ''}{ctx_len} next_n={next_n}"
    print(f"\n== {case}", flush=True)
    q, kv, w, ctx, block_table = make_decode_inputs(dev, kind, batch, ctx_len, heads, dim, next_n, ragged)
    fn = fp8_paged_mqa_logits if kind == "fp8" else bf16_paged_mqa_logits
    key_bytes = forms.get(kind).key_bytes(dim)  # a key's bytes in its form, scale included (the forms table)
    meta = get_paged_mqa_logits_metadata(ctx, 64, SMS)
    bytes_moved = decode_bytes(ctx, ctx_len, next_n, key_bytes, clean=True)
    gbps_floor = ceil["copy_GBps"]
    floor = bytes_moved / (gbps_floor * 1e9) * 1e3 if gbps_floor else None
    work = {"bytes": bytes_moved, "mean_len": float(ctx.float().mean())}

    call = lambda **cfg: fn(q, kv, w, ctx, block_table, meta, ctx_len, clean_logits=True, **cfg)  # noqa: E731
    best_cfg, ms, table = sweep(call, decode_configs(ragged, tiny))
    out = call(**best_cfg)
    ref = ref_paged_mqa_logits(q, kv, w, ctx, block_table, ctx_len)
    diff, mask_ok = compare_logits(out, ref)
    rerun_ok = bool(torch.equal(out, call(**best_cfg)))
    del out, ref
    gbps = bytes_moved / (ms * 1e-3) / 1e9
    # GPU time alone (CUDA graph), over enough copies of the pages that L2 cannot hold them
    copies = max(1, min(4, (256 << 20) // max(1, kv.numel() * kv.element_size()) + 1))
    kvs = [kv] + [kv.clone() for _ in range(copies - 1)]
    g_ms = timeit_graph([lambda kv_=kv_: fn(q, kv_, w, ctx, block_table, meta, ctx_len, clean_logits=True, **best_cfg)
                         for kv_ in kvs])
    del kvs
    extra = {"GBps": gbps, "config": best_cfg, "sweep": table, "calc_diff": diff, "mask_ok": mask_ok,
             "rerun_bitwise": rerun_ok, "graph_ms": g_ms, "graph_copies": copies,
             "over_floor": (ms / floor) if floor else None,
             "graph_over_floor": (g_ms / floor) if (floor and g_ms) else None}
    if ragged and not tiny:  # clean_logits=False (SGLang's call): only the visited pages are written
        nb = decode_bytes(ctx, ctx_len, next_n, key_bytes, clean=False)
        t = timeit(lambda: fn(q, kv, w, ctx, block_table, meta, ctx_len, clean_logits=False, **best_cfg))
        extra.update({"noclean_ms": t, "noclean_bytes": nb,
                      "noclean_over_floor": t / (nb / (gbps_floor * 1e9) * 1e3) if gbps_floor else None})
        print(f"  clean_logits=False: {t:.4f} ms = {extra['noclean_over_floor'] or float('nan'):.2f}x its floor")
    kern = record(results, case, "triton (niah)", ms, floor, work, peak_extra(lambda: call(**best_cfg)), extra)
    if g_ms:
        print(f"  niah (CUDA graph, {copies} page pools) {g_ms * 1e3:.1f} us GPU time")
    print(f"  niah     {ms:8.4f} ms  {gbps:7.0f} GB/s  floor {floor if floor is None else round(floor, 4)} ms "
          f"({extra['over_floor'] or float('nan'):.2f}x)  calc_diff {diff:.2e} masks {'ok' if mask_ok else 'DIFFER'}  "
          f"config {best_cfg}", flush=True)
    if next_n == 1 and alternatives:
        alts = [("naive gather+bmm", naive_paged_mqa_logits)] + (
            [] if ragged else [("chunked torch (8 requests)", chunked_paged)])
        for impl, f in alts:
            try:
                t = timeit(lambda: f(q, kv, w, ctx, block_table, ctx_len), rep_ms=100)
                p = peak_extra(lambda: f(q, kv, w, ctx, block_table, ctx_len))
                gt = timeit_graph([lambda: f(q, kv, w, ctx, block_table, ctx_len)]) if batch <= 8 else None
                record(results, case, impl, t, floor, work, p,
                       {"speedup_of_niah": t / ms, "graph_ms": gt,
                        "graph_speedup_of_niah": (gt / g_ms) if (gt and g_ms) else None})
                print(f"  {impl:26s} {t:8.4f} ms  niah is {t / ms:6.1f}x faster  peak {p / GiB if p else 0:.2f} GiB")
            except torch.OutOfMemoryError:
                record(results, case, impl, None, floor, work, None, {"error": "OOM"})
                print(f"  {impl}: OOM")
                torch.cuda.empty_cache()
    if batch == 1 and not tiny:
        kern.update(host_overhead(lambda: call(**best_cfg), ms, g_ms))
        # the same checks and allocation without the launch (max_context_len=0 returns early)
        kern["host_us_checks_only"] = host_overhead(
            lambda: fn(q, kv, w, ctx, block_table, meta, 0, clean_logits=True), ms, None)["host_us_per_call"]
    return kern
