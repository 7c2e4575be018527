"""The GPU server's sparse attention kernel (serving/embedded/cuda/sparse_kernel.py) beside
its first version, on the shapes of the seed's longest prompt: SmolLM2's 9 query heads over
3 kv heads of 64 dims, a 22,600-token fp32 KV cache, each query attending to its own top-k.

    python benchmarks/kernels/sparse_attention.py [--tokens 22600] [--queries 4096] [--topk 512,1024]
        [--selection random|window] [--tune]
    python benchmarks/kernels/sparse_attention.py --union 12189,22600 [--topk 512,1024]

Arms: the kernel's three `precision`s: "broadcast" (its first version, the baseline: the two
products as a broadcast multiply-and-sum on CUDA cores, 32 keys a step), "tf32x3" and
"ieee" (`tl.dot` at each precision, 64 keys a step). Cases: a prefill chunk (`--queries`
queries) and one decode query. Kept positions: each query's own random top-k of its causal
prefix (so the loads are scattered as in a real selection). One JSON line per (case, k,
arm): the median time over triton.testing.do_bench and the largest difference from the
masked-SDPA reference. `--selection window` keeps each query's last k positions instead (the
other bound: neighbouring queries share all but one key, the loads hit the cache); `--tune`
also times the "tf32x3" kernel at other key tiles, warps and pipeline stages (one line each);
`--selection clustered`: each query's top-k of one random field shared by the chunk plus its
own noise of a third of its scale (neighbouring queries keep many of the same keys, as a real
indexer's rows do). `--union`: union_attention (tiles of queries over the union of their kept
keys; the prefill's path where attend.PREFILL_SHARE > 0) against the gather kernel, every selection, one line a (end, k,
selection, tile, warps), with the tiles' mean union over k and the union's build
time alone (`tile_union`, included in union_ms; its torch reference's beside it).
(The H200 figures in docs/embedded-server.md were taken when the
first version was a kernel of its own in this file: the same code as "broadcast".)
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

from niah.serving.embedded.cuda.attend import sparse_attention, sparse_attention_reference

H, HKV, D = 9, 3, 64


def case(tokens: int, queries: int, topk: int, seed: int = 0, selection: str = "random"):
    g = torch.Generator(device="cuda").manual_seed(seed)
    k = torch.randn(1, HKV, tokens, D, device="cuda", generator=g)
    v = torch.randn(1, HKV, tokens, D, device="cuda", generator=g)
    q = torch.randn(1, H, queries, D, device="cuda", generator=g)
    pos = torch.arange(tokens - queries, tokens, device="cuda")                  # the last `queries` positions
    if selection == "window":   # the latest positions score highest
        scores = torch.arange(tokens, device="cuda", dtype=torch.float32)[None, :].repeat(queries, 1)
    elif selection == "clustered":   # one field for the chunk, each query's own noise on it
        scores = torch.rand(1, tokens, device="cuda", generator=g) \
            + torch.rand(queries, tokens, device="cuda", generator=g) / 3
    else:
        scores = torch.rand(queries, tokens, device="cuda", generator=g)
    scores.masked_fill_(torch.arange(tokens, device="cuda")[None, :] > pos[:, None], -1.0)
    idx = scores.topk(topk, dim=1).indices.int()
    return q, k, v, idx


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=22600)
    ap.add_argument("--queries", type=int, default=4096)
    ap.add_argument("--topk", default="512,1024")
    ap.add_argument("--selection", choices=("random", "window", "clustered"), default="random")
    ap.add_argument("--tune", action="store_true", help="also the tf32x3 kernel at other tiles, warps and stages")
    ap.add_argument("--union", default="", help="only union_attention against the gather kernel: a chunk of "
                    "--queries queries ending at each of these positions, every selection")
    a = ap.parse_args(argv)
    if a.union:
        return union(a)
    arms = {p: (lambda q, k, v, i, p=p: sparse_attention(q, k, v, i, precision=p, share=0))
            for p in ("broadcast", "tf32x3", "ieee")}
    for name, queries in (("prefill-chunk", a.queries), ("decode", 1)):
        for topk in (int(x) for x in a.topk.split(",")):
            q, k, v, idx = case(a.tokens, queries, topk, selection=a.selection)
            ref = sparse_attention_reference(q[:, :, :256], k, v, idx[:256])
            base = None
            for arm, fn in arms.items():
                err = float((fn(q[:, :, :256], k, v, idx[:256].contiguous()) - ref).abs().max())
                ms = triton.testing.do_bench(lambda fn=fn: fn(q, k, v, idx), warmup=25, rep=200)
                base = base or ms
                print(json.dumps({"case": name, "queries": queries, "tokens": a.tokens, "topk": topk, "arm": arm,
                                  "ms": round(ms, 4), "speedup_vs_broadcast": round(base / ms, 2),
                                  "max_abs_err_vs_sdpa": err, "selection": a.selection}), flush=True)
            if name == "prefill-chunk":   # the tuned launch beside the one it replaced, bit for bit
                before = sparse_attention(q, k, v, idx, num_warps=4, num_stages=3, share=0)
                now = sparse_attention(q, k, v, idx, share=0)
                print(json.dumps({"case": name, "topk": topk, "selection": a.selection,
                                  "tuned_equals_previous_launch": bool(torch.equal(before, now)),
                                  "max_abs_diff": float((before - now).abs().max())}), flush=True)
            if a.tune and name == "prefill-chunk":
                tune(name, q, k, v, idx, ref, topk, a.selection, base)


def union(a) -> None:
    """union_attention against the gather kernel (tf32x3, the prefill's launch) on a prefill
    chunk ending at each position, for each selection: tiles of 4 or 8 queries, 2 or 4 warps,
    64 keys a step. One line a combination, with the dense arm's attention of the same chunk
    beside them (dense_ms), and the bitmap build's (tile_union_bitmap_ms; union_bitmap_ms the
    union with it; bitmap_same: its entries equal the sort's)."""
    from niah.serving.embedded.cuda.attend import (tile_union, tile_union_bitmap, tile_union_reference,
                                                   union_attention)

    for end in (int(x) for x in a.union.split(",")):
        d_ms = None
        for topk in (int(x) for x in a.topk.split(",")):
            for selection in ("random", "clustered", "window"):
                q, k, v, idx = case(end, min(a.queries, end), topk, selection=selection)
                gather = sparse_attention(q, k, v, idx, share=0)
                g_ms = triton.testing.do_bench(lambda: sparse_attention(q, k, v, idx, share=0), warmup=10, rep=100)
                d_ms = d_ms or triton.testing.do_bench(lambda: dense_chunk(q, k, v, end), warmup=10, rep=100)
                for bq in (4, 8):
                    count = tile_union(idx, bq, end)[2]
                    prep_ms = triton.testing.do_bench(lambda bq=bq: tile_union(idx, bq, end), warmup=10, rep=100)
                    prep8_ms = triton.testing.do_bench(lambda bq=bq: tile_union(idx, bq, end, num_warps=8),
                                                       warmup=10, rep=100)
                    torch_ms = triton.testing.do_bench(lambda bq=bq: tile_union_reference(idx, bq, end),
                                                       warmup=10, rep=100)
                    bitmap_ms = triton.testing.do_bench(lambda bq=bq: tile_union_bitmap(idx, bq, end),
                                                        warmup=10, rep=100)
                    same = same_entries(tile_union(idx, bq, end), tile_union_bitmap(idx, bq, end))
                    for nw in (2, 4):
                        for bn in (64,):
                            def fn(bq=bq, nw=nw, bn=bn):
                                return union_attention(q, k, v, idx, block_q=bq, block_n=bn, num_warps=nw)
                            def fn_bitmap(bq=bq, nw=nw, bn=bn):
                                return union_attention(q, k, v, idx, block_q=bq, block_n=bn, num_warps=nw,
                                                       build="bitmap")
                            try:
                                diff = float((fn() - gather).abs().max())
                                ms = triton.testing.do_bench(fn, warmup=10, rep=100)
                                bitmap_union_ms = triton.testing.do_bench(fn_bitmap, warmup=10, rep=100)
                            except Exception as e:  # noqa: BLE001 (a tile that does not compile is noted)
                                diff, ms, bitmap_union_ms = type(e).__name__, None, None
                            print(json.dumps({"case": "union-vs-gather", "end": end, "queries": q.shape[2],
                                              "topk": topk, "selection": selection, "block_q": bq, "num_warps": nw,
                                              "block_n": bn,
                                              "union_over_k": round(float(count.float().mean()) / topk, 2),
                                              "gather_ms": round(g_ms, 4), "union_ms": ms and round(ms, 4),
                                              "tile_union_ms": round(prep_ms, 4),
                                              "tile_union_8_warps_ms": round(prep8_ms, 4),
                                              "tile_union_torch_ms": round(torch_ms, 4),
                                              "tile_union_bitmap_ms": round(bitmap_ms, 4), "bitmap_same": same,
                                              "union_bitmap_ms": bitmap_union_ms and round(bitmap_union_ms, 4),
                                              "gather_over_union": ms and round(g_ms / ms, 2),
                                              "dense_ms": round(d_ms, 4),
                                              "max_abs_diff": diff}), flush=True)


def same_entries(a, b) -> bool:
    """Two tile_union results hold the same entries (pos and who up to each tile's count)."""
    (pa, wa, ca), (pb, wb, cb) = a, b
    if not torch.equal(ca, cb):
        return False
    live = torch.arange(pa.shape[1], device=pa.device)[None, :] < ca[:, None]
    return bool(torch.equal(pa[live], pb[live]) and torch.equal(wa[live], wb[live]))


def dense_chunk(q, k, v, end: int):
    """The dense arm's attention for the same chunk (model.dense_attention's CUDA form: kv heads
    repeated, the causal mask of the chunk's rows over the first `end` keys)."""
    T = q.shape[2]
    rep = q.shape[1] // k.shape[1]
    kr, vr = k[:, :, :end].repeat_interleave(rep, 1), v[:, :, :end].repeat_interleave(rep, 1)
    pos = torch.arange(end - T, end, device=q.device)
    mask = torch.arange(end, device=q.device)[None, :] <= pos[:, None]
    return torch.nn.functional.scaled_dot_product_attention(q, kr, vr, attn_mask=mask)


def tune(name, q, k, v, idx, ref, topk, selection, base):
    for bn in (16, 32, 64, 128):
        for nw in (1, 2, 4, 8):
            for ns in (1, 2, 3, 4):
                def fn(q, k, v, i, bn=bn, nw=nw, ns=ns):
                    return sparse_attention(q, k, v, i, block_n=bn, num_warps=nw, num_stages=ns, share=0)
                try:
                    err = float((fn(q[:, :, :256], k, v, idx[:256].contiguous()) - ref).abs().max())
                    ms = triton.testing.do_bench(lambda fn=fn: fn(q, k, v, idx), warmup=10, rep=60)
                except Exception as e:  # noqa: BLE001 (a shape that does not compile is noted)
                    err, ms = type(e).__name__, None
                print(json.dumps({"case": name, "topk": topk, "selection": selection, "arm": "tf32x3",
                                  "block_n": bn, "num_warps": nw, "num_stages": ns,
                                  "ms": ms and round(ms, 4), "speedup_vs_broadcast": ms and round(base / ms, 2),
                                  "max_abs_err_vs_sdpa": err}), flush=True)


if __name__ == "__main__":
    main()
