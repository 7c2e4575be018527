"""The fused indexer + top-k (niah.kernels.fused_indexer) beside the unfused path it replaces.

    python benchmarks/kernels/indexer_topk.py [--lengths 12000,22600] [--rows 4096] [--topk 512]
        [--dtypes fp8,bf16] [--scores random,relu] [--positive 0.02] [--out F] [--tune]
    TRITON_INTERPRET=1 python benchmarks/kernels/indexer_topk.py --smoke    # CPU: tiny shapes, the counts only

Shape: SmolLM2-135M's indexer (3 kv heads x 3 heads x 64 dims) on the GPU server's paged pool.
Unfused, as the server runs it: `indexer_logits` (the same tile scores, written; `score_rows`
rows a call, 64 MiB of scores), `topk_indices` per call. (The committed H200 results predate
it: their unfused path was one `fp8_mqa_logits` / `bf16_mqa_logits` call per kv head over the
gathered pages, the kv heads summed; benchmarks/kernels/indexer_logits.py times the two.)
Fused: `indexer_topk` (sampled brackets, one candidate pass over the
pages in place, a top-k over the candidates).

Scores: "random" (randn keys and queries) or "relu": queries >= 0 and all but a fraction
`--positive` of the keys <= 0 in every dim, so most keys score exactly 0 (the real model's ReLU
scores); at 2% a row of 22,600 keys has ~450 keys above 0, fewer than k = 512, so its bracket
is 0 and its top-k ends in zeros (the lowest positions); every 16th query is 0 (every key 0).

One JSON line per case (dtype x tokens x k x scores), on the prompt's last `rows` rows:
median ms of each path (triton do_bench), their ratio, `fallback_rows` (ok False; split by
reason: overflow, bracket_missed, check), `rows_differ` (served rows whose kept set differs
from the unfused one), `zero_bracket_rows`, and the buffer's own diagnostics: rows with a slot
below the count never written, with positions out of order, with a kept slot at or past the
count (each 0 when the kernels are sound). `chunks` repeats the counts, untimed, over every
`rows`-row chunk of the prompt from position 0, as the server chunks it.
"""

from __future__ import annotations

import argparse
import json
import torch

HKV, G, D = 3, 3, 64


def pool(kind, S, gen, positive, device):
    """A scattered paged pool of S tokens: (pages, block_table). positive: None (randn keys), or the
    fraction of keys left randn while the rest are -|randn| in every dim."""
    from niah.kernels.quant import quantize_fp8

    pages_seq = -(-S // 64)
    n_pages = HKV * pages_seq + 3
    table = torch.randperm(n_pages, generator=gen)[: HKV * pages_seq].reshape(HKV, pages_seq).int()
    vals = torch.randn(n_pages, 64, D, generator=gen)
    if positive is not None:
        live = torch.rand(n_pages, 64, generator=gen) < positive
        vals = torch.where(live[..., None], vals, -vals.abs())
    if kind == "fp8":
        v8, sf = quantize_fp8(vals)
        pages = torch.cat([v8.view(torch.uint8).reshape(n_pages, -1), sf.contiguous().view(torch.uint8)
                           .reshape(n_pages, -1)], 1)
    else:
        pages = vals.to(torch.bfloat16).reshape(n_pages, 64 * D)
    return pages.to(device), table.to(device)


def queries(kind, C, gen, relu, device):
    """(q [C, HKV, G, D] e4m3 | bf16, weights [C, HKV, G] f32) as the server passes them."""
    from niah.kernels.quant import quantize_fp8

    q32 = torch.randn(C, HKV, G, D, generator=gen)
    if relu:
        q32 = q32.abs()
        q32[15::16] = 0
    q32 = q32.to(device)
    w = torch.full((C, HKV, G), (HKV * G * D) ** -0.5, device=device)
    if kind == "fp8":
        q, qs = quantize_fp8(q32)
        return q, w * qs
    return q32.to(torch.bfloat16), w


def unfused(kind, q, w, pages, table, p0, k):
    """The server's unfused selection: int32 [C, min(k, p0 + C)], `indexer_logits` a score call
    (64 MiB of scores), `topk_indices` over each call's rows."""
    from niah.kernels import indexer_logits, topk_indices

    C, S = q.shape[0], p0 + q.shape[0]
    rows = max(1, min(C, (64 << 20) // (4 * S)))
    idx = torch.full((C, min(k, S)), -1, dtype=torch.int32, device=q.device)
    for r0 in range(0, C, rows):
        r1 = min(C, r0 + rows)
        part = topk_indices(indexer_logits(q[r0:r1], w[r0:r1], pages, table, p0 + r0, kind), min(k, p0 + r1))
        idx[r0:r1, :part.shape[1]] = part
    return idx


def check(kind, q, w, pages, table, p0, k):
    """The counts of one chunk (no timing): fallbacks by reason, served rows that differ, and
    the candidate buffer's own diagnostics."""
    from niah.kernels import topk_indices
    from niah.kernels.fused_indexer.wrapper import brackets, candidates, select

    C = q.shape[0]
    lo = brackets(q, w, pages, table, p0, k, kind)
    cand = candidates(q, w, pages, table, p0, k, kind, lo=lo)
    idx, ok = select(cand, p0, k)
    cap = cand.pos.shape[1]
    n = cand.count(k)
    filled = n.clamp(max=cap)
    pos = p0 + torch.arange(C, device=q.device)
    need = (pos + 1).clamp(max=k)
    below = torch.arange(cap, device=q.device)[None, :] < filled[:, None]
    unwritten = ((cand.pos == -1) & below).any(1)
    step = cand.pos[:, 1:] - cand.pos[:, :-1]
    unordered = ((step <= 0) & below[:, 1:]).any(1)
    sel = topk_indices(cand.val, min(k, p0 + C), lengths=filled)
    past = (sel >= filled[:, None]).any(1)
    want = unfused(kind, q, w, pages, table, p0, k)
    a, b = idx.sort(1).values, want.sort(1).values
    differ = (a != b).any(1) & ok
    overflow, missed = n > cap, n < need
    return {"fallback_rows": int((~ok).sum()), "fallback_overflow": int(overflow.sum()),
            "fallback_bracket_missed": int(missed.sum()), "fallback_check": int((~ok & ~overflow & ~missed).sum()),
            "rows_differ": int(differ.sum()), "zero_bracket_rows": int((lo == 0).sum()),
            "unwritten_slot_rows": int(unwritten.sum()), "unordered_rows": int(unordered.sum()),
            "slot_past_count_rows": int(past.sum())}


def timed(fn, rep_ms):
    """Median ms of fn over rep_ms of repeats (triton do_bench, L2 flushed between calls)."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=5, rep=rep_ms, return_mode="median")


def run_case(kind, S, k, scores, a, device):
    from niah.kernels import indexer_topk

    cuda = device == "cuda"
    relu = scores == "relu"
    gen = torch.Generator().manual_seed(S + k + (7 if relu else 0))
    C = min(a.rows, S)
    p0 = S - C
    pages, table = pool(kind, S, gen, a.positive if relu else None, device)
    q, w = queries(kind, C, gen, relu, device)
    counts = check(kind, q, w, pages, table, p0, k)
    row = {"dtype": kind, "tokens": S, "rows": C, "topk": k, "scores": f"relu-{a.positive:g}" if relu else "random"}
    if cuda:   # the smoke (interpreter) times nothing
        t_un = timed(lambda: unfused(kind, q, w, pages, table, p0, k), a.rep)
        t_fu = timed(lambda: indexer_topk(q, w, pages, table, p0, k, kind), a.rep)
        row |= {"unfused_ms": round(t_un, 3), "fused_ms": round(t_fu, 3), "fused_over_unfused": round(t_fu / t_un, 3)}
    row |= counts
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        unfused(kind, q, w, pages, table, p0, k)
        peak_un = torch.cuda.max_memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
        indexer_topk(q, w, pages, table, p0, k, kind)
        peak_fu = torch.cuda.max_memory_allocated() - base
        row |= {"unfused_work_mib": round(peak_un / 2**20, 1), "fused_work_mib": round(peak_fu / 2**20, 1)}
    sweep = {}
    for c0 in range(0, S, a.rows):   # the server's chunks of the same prompt
        qc, wc = queries(kind, min(a.rows, S - c0), gen, relu, device)
        for key, v in check(kind, qc, wc, pages, table, c0, k).items():
            sweep[key] = sweep.get(key, 0) + v
    row["chunks"] = {"count": -(-S // a.rows), **sweep}
    if a.tune and cuda:
        row["tuned_ms"] = tune(kind, q, w, pages, table, p0, k)
    row["device"] = torch.cuda.get_device_name() if cuda else "cpu (interpreter)"
    return row


def tune(kind, q, w, pages, table, p0, k):
    """The fused kernel at other tile shapes (block_m x block_n x warps), brackets given; the brackets alone."""
    import triton.testing

    from niah.kernels import indexer_topk
    from niah.kernels.fused_indexer.wrapper import brackets

    lo = brackets(q, w, pages, table, p0, k, kind)
    out = {"brackets_ms": round(triton.testing.do_bench(lambda: brackets(q, w, pages, table, p0, k, kind),
                                                        warmup=5, rep=100, return_mode="median"), 3)}
    for bm in (16, 32, 64):
        for bn in (64, 128, 256):
            for nw in (4, 8):
                try:
                    t = triton.testing.do_bench(lambda: indexer_topk(
                        q, w, pages, table, p0, k, kind, block_m=bm, block_n=bn, num_warps=nw, lo=lo),
                        warmup=3, rep=60, return_mode="median")
                except Exception as e:  # noqa: BLE001 (a shape that does not compile is noted)
                    t = type(e).__name__
                out[f"m{bm}-n{bn}-w{nw}"] = t if isinstance(t, str) else round(t, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="12000,22600")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--topk", default="512")
    ap.add_argument("--dtypes", default="fp8,bf16")
    ap.add_argument("--scores", default="random,relu", help="random and/or relu (most keys score exactly 0)")
    ap.add_argument("--positive", type=float, default=0.02, help="relu: the fraction of keys that may score above 0")
    ap.add_argument("--rep", type=int, default=200, help="do_bench's ms of repeats per timing")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true", help="CPU under TRITON_INTERPRET=1: 320 tokens, 80-row chunks, "
                                                         "k 8, no timing (the relu rows' brackets are 0)")
    ap.add_argument("--tune", action="store_true", help="also time the fused kernel at other tile shapes "
                                                        "(block_m x block_n x warps) and the bracket step alone")
    a = ap.parse_args()
    if a.smoke:
        a.lengths, a.rows, a.topk = "320", 80, "8"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = open(a.out, "a") if a.out else None
    for kind in a.dtypes.split(","):
        for S in (int(x) for x in a.lengths.split(",")):
            for k in (int(x) for x in a.topk.split(",")):
                for scores in a.scores.split(","):
                    row = run_case(kind, S, k, scores, a, device)
                    print(json.dumps(row), flush=True)
                    if out:
                        out.write(json.dumps(row) + "\n")
                        out.flush()


if __name__ == "__main__":
    main()
