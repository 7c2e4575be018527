"""The fused indexer + top-k (niah.kernels.indexer_topk) beside the unfused path it replaces.

    python benchmarks/kernels/indexer_topk.py [--lengths 12000,22600] [--rows 4096] [--topk 512,2048] [--out F]

Shape: SmolLM2-135M's indexer (3 kv heads x 3 heads x 64 dims) on the GPU server's paged pool,
the last prefill chunk of a prompt (rows queries at positions S - rows .. S - 1). Unfused, as
the server runs it: per kv head `fp8_mqa_logits` / `bf16_mqa_logits` over the gathered pages
(`score_rows` rows a call, 64 MiB of scores), the kv heads summed, `topk_indices` per call.
Fused: `indexer_topk` (sampled brackets, one candidate pass over the pages in place, a top-k
over the candidates). Prints one JSON line per case: median ms of each, their ratio, whether
the selections agree as sets (rows where they differ, and how many of those are ties at the
cut), and the fallback rows. CUDA only (CPU: the kernel tests).
"""

from __future__ import annotations

import argparse
import json

import torch


def pool(kind, hkv, dim, S, gen):
    pages_seq = -(-S // 64)
    n_pages = hkv * pages_seq + 3
    table = torch.randperm(n_pages, generator=gen)[: hkv * pages_seq].reshape(hkv, pages_seq).int()
    vals = torch.randn(n_pages, 64, dim, generator=gen)
    if kind == "fp8":
        from niah.kernels.quant import quantize_fp8

        v8, sf = quantize_fp8(vals)
        pages = torch.cat([v8.view(torch.uint8).reshape(n_pages, -1), sf.contiguous().view(torch.uint8)
                           .reshape(n_pages, -1)], 1)
    else:
        pages = vals.to(torch.bfloat16).reshape(n_pages, 64 * dim)
    return pages.cuda(), table.cuda()


def main() -> None:
    import triton.testing

    from niah.kernels import bf16_mqa_logits, fp8_mqa_logits, indexer_topk, topk_indices
    from niah.kernels.quant import quantize_fp8

    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="12000,22600")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--topk", default="512,2048")
    ap.add_argument("--dtypes", default="fp8,bf16")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tune", action="store_true", help="also time the fused kernel at other tile shapes "
                                                        "(block_m x block_n x warps) and the bracket step alone")
    a = ap.parse_args()
    hkv, G, D = 3, 3, 64
    out = open(a.out, "a") if a.out else None
    for kind in a.dtypes.split(","):
        for S in (int(x) for x in a.lengths.split(",")):
            for k in (int(x) for x in a.topk.split(",")):
                gen = torch.Generator().manual_seed(S + k)
                C = min(a.rows, S)
                p0 = S - C
                pages, table = pool(kind, hkv, D, S, gen)
                q32 = torch.randn(C, hkv, G, D, generator=gen).cuda()
                w = torch.full((C, hkv, G), (hkv * G * D) ** -0.5, device="cuda")
                if kind == "fp8":
                    q, qs = quantize_fp8(q32)
                    w = w * qs
                else:
                    q = q32.to(torch.bfloat16)
                rows = max(1, min(C, (64 << 20) // (4 * S)))
                n_pages = -(-S // 64)

                def contiguous(g):
                    pg = pages.index_select(0, table[g, :n_pages].long())
                    if kind == "bf16":
                        return pg.view(-1, D)[:S]
                    return (pg[:, :64 * D].contiguous().view(torch.float8_e4m3fn).view(-1, D)[:S],
                            pg[:, 64 * D:].contiguous().view(torch.float32).view(-1)[:S])

                def unfused():
                    idx = torch.full((C, k), -1, dtype=torch.int32, device="cuda")
                    for r0 in range(0, C, rows):
                        r1 = min(C, r0 + rows)
                        ks = torch.zeros(r1 - r0, dtype=torch.int32, device="cuda")
                        ke = torch.arange(p0 + r0 + 1, p0 + r1 + 1, dtype=torch.int32, device="cuda")
                        total = None
                        for g in range(hkv):
                            f = fp8_mqa_logits if kind == "fp8" else bf16_mqa_logits
                            lg = f(q[r0:r1, g].contiguous(), contiguous(g), w[r0:r1, g].contiguous(), ks, ke)
                            total = lg[:, :p0 + r1] if total is None else total.add_(lg[:, :p0 + r1])
                        part = topk_indices(total.contiguous(), min(k, p0 + r1))
                        idx[r0:r1, :part.shape[1]] = part
                    return idx

                def fused():
                    return indexer_topk(q, w, pages, table, p0, k, kind)

                a_idx = unfused()
                b_idx, ok = fused()
                diff = sum(set(x) != set(y) for x, y in zip(a_idx.tolist(), b_idx.tolist()))
                t_un = triton.testing.do_bench(unfused, warmup=5, rep=300, return_mode="median")
                t_fu = triton.testing.do_bench(fused, warmup=5, rep=300, return_mode="median")
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                unfused()
                peak_un = torch.cuda.max_memory_allocated() - base
                torch.cuda.reset_peak_memory_stats()
                fused()
                peak_fu = torch.cuda.max_memory_allocated() - base
                tuned = {}
                if a.tune:
                    from niah.kernels.indexer_topk.wrapper import brackets

                    lo = brackets(q, w, pages, table, p0, k, kind)
                    tuned["brackets_ms"] = round(triton.testing.do_bench(
                        lambda: brackets(q, w, pages, table, p0, k, kind), warmup=5, rep=100,
                        return_mode="median"), 3)
                    for bm in (16, 32, 64):
                        for bn in (64, 128, 256):
                            for nw in (4, 8):
                                try:
                                    t = triton.testing.do_bench(lambda: indexer_topk(
                                        q, w, pages, table, p0, k, kind, block_m=bm, block_n=bn, num_warps=nw, lo=lo),
                                        warmup=3, rep=60, return_mode="median")
                                except Exception as e:  # noqa: BLE001 (a shape that does not compile is noted)
                                    t = type(e).__name__
                                tuned[f"m{bm}-n{bn}-w{nw}"] = t if isinstance(t, str) else round(t, 3)
                row = {"dtype": kind, "tokens": S, "rows": C, "topk": k, "unfused_ms": round(t_un, 3),
                       "fused_ms": round(t_fu, 3), "fused_over_unfused": round(t_fu / t_un, 3),
                       "rows_differ": diff, "fallback_rows": int((~ok).sum()),
                       "unfused_work_mib": round(peak_un / 2**20, 1), "fused_work_mib": round(peak_fu / 2**20, 1),
                       "device": torch.cuda.get_device_name(), **({"tuned_ms": tuned} if tuned else {})}
                print(json.dumps(row), flush=True)
                if out:
                    out.write(json.dumps(row) + "\n")
                    out.flush()


if __name__ == "__main__":
    main()
