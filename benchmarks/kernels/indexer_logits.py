"""The GPU server's prefill score call, two ways, on its shape (SmolLM2-135M's indexer: 3 kv
heads x 3 heads x 64 dims; `score_rows` rows = 64 MiB of fp32 scores, the prompt's last rows):

- per kv head (the server's earlier path): each kv head's keys gathered from the paged pool
  (once a chunk: timed apart, `gather_ms`), then `fp8_mqa_logits` / `bf16_mqa_logits` once
  per kv head, each adding its logits into the running sum (`accumulate_into`): `per_head_ms`;
- `indexer_logits(form="tile")`: the pages read in place, the kv heads summed inside one kernel,
  the query's heads padded once (as the server pads them a chunk): `fused_ms` (`--tune`: its tiles);
- the same with `form="pages"`, the server's default (a program walks page positions for its
  rows, the queries loaded once, the loop pipelined): `pages_ms`, `pages_over_tile` (against `fused_ms`), and how its
  scores compare with the tile form's (`pages_vs_tile`: the same fields as below).

    python benchmarks/kernels/indexer_logits.py [--lengths 12189,22600] [--dtypes fp8,bf16]
        [--topk 512,1024] [--out F] [--tune] [--pages-tune]
    TRITON_INTERPRET=1 python benchmarks/kernels/indexer_logits.py --smoke   # CPU: tiny, no timing

One JSON line per case: the medians (triton do_bench), `fused_over_per_head` and, untimed, how
the two score tensors compare: `bitwise_equal` (all of them), `max_abs_diff` (finite entries),
`inf_mismatch` (positions -inf in one only: must be 0), and `rows_differ_k{k}`: rows whose
kept set (topk_indices, ties to the lowest positions) differs between the two. Where it is not
0, the two sum a key's heads in another order (module doc of kernels/fused_indexer/kernel.py)
and a near tie at the cut fell the other way. Exits 2 without CUDA unless --smoke.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from indexer_topk import D, G, HKV, pool, queries

GP = 4                              # G = 3 padded to a power of two, as the server pads it


def per_head_inputs(kind, pages, table, S):
    """Each kv head's first S keys gathered from its pages, as the earlier path gathered them."""
    n_pages = -(-S // 64)
    out = []
    for g in range(HKV):
        pg = pages.index_select(0, table[g, :n_pages].long())
        if kind == "bf16":
            out.append(pg.view(-1, D)[:S])
        else:
            out.append((pg[:, :64 * D].contiguous().view(torch.float8_e4m3fn).view(-1, D)[:S],
                        pg[:, 64 * D:].contiguous().view(torch.float32).view(-1)[:S]))
    return out


def per_head(kind, q, w, keys, p0):
    """[C, p0 + C] fp32: one ragged-logits call per kv head, summed in order as they are written."""
    from niah.kernels import bf16_mqa_logits, fp8_mqa_logits

    C = q.shape[0]
    ks = torch.zeros(C, dtype=torch.int32, device=q.device)
    ke = torch.arange(p0 + 1, p0 + C + 1, dtype=torch.int32, device=q.device)
    f = fp8_mqa_logits if kind == "fp8" else bf16_mqa_logits
    total = None
    for g in range(HKV):
        total = f(q[:, g].contiguous(), keys[g], w[:, g].contiguous(), ks, ke, accumulate_into=total)
    return total


def padded(q, w):
    qp = torch.zeros((*q.shape[:2], GP, D), dtype=q.dtype, device=q.device)
    qp[:, :, :G] = q
    wp = torch.zeros((*w.shape[:2], GP), device=w.device)
    wp[:, :, :G] = w
    return qp, wp


def compare(a, b, ks):
    from niah.kernels import topk_indices

    fin = torch.isfinite(a) & torch.isfinite(b)
    row = {"bitwise_equal": bool(torch.equal(a, b)),
           "max_abs_diff": float((a - b).abs()[fin].max()) if bool(fin.any()) else 0.0,
           "inf_mismatch": int((torch.isneginf(a) != torch.isneginf(b)).sum())}
    for k in ks:
        kk = min(k, a.shape[1])
        x = topk_indices(a.contiguous(), kk).sort(1).values
        y = topk_indices(b.contiguous(), kk).sort(1).values
        row[f"rows_differ_k{k}"] = int((x != y).any(1).sum())
    return row


def timed(fn, rep_ms):
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median"))


def pages_tuned(qp, wp, pages, table, p0, kind):
    """The pages form at other rows a program, warps, pipeline depths and page positions a program."""
    from niah.kernels import indexer_logits
    from niah.kernels.fused_indexer import wrapper

    before = (wrapper.PAGES_A_PROGRAM, wrapper.PAGES_STAGES)
    out = {}
    try:
        for ppp in (8, 16, 32):
            for st in (2, 3):
                wrapper.PAGES_A_PROGRAM, wrapper.PAGES_STAGES = ppp, st
                for bm, nw in ((16, 4), (16, 8), (32, 8)):
                    out[f"p{ppp}-s{st}-m{bm}-w{nw}"] = round(timed(lambda: indexer_logits(  # noqa: B023
                        qp, wp, pages, table, p0, kind, block_m=bm, num_warps=nw, form="pages"), 40), 4)  # noqa: B023
    finally:
        wrapper.PAGES_A_PROGRAM, wrapper.PAGES_STAGES = before
    return out


def run_case(kind, S, a, device):
    from niah.kernels import indexer_logits

    gen = torch.Generator().manual_seed(S + (1 if kind == "fp8" else 2))
    C = min(S, a.rows or max(1, (64 << 20) // (4 * S)))
    p0 = S - C
    pages, table = pool(kind, S, gen, None, device)
    q, w = queries(kind, C, gen, False, device)
    qp, wp = padded(q, w)
    keys = per_head_inputs(kind, pages, table, S)
    old = per_head(kind, q, w, keys, p0)
    new = indexer_logits(qp, wp, pages, table, p0, kind, form="tile")
    row = {"dtype": kind, "tokens": S, "rows": C, "heads": f"{HKV}x{G}x{D}"}
    row |= compare(old, new, a.ks)   # on the device: topk_indices runs where the scores are
    row["pages_vs_tile"] = compare(new, indexer_logits(qp, wp, pages, table, p0, kind, form="pages"), a.ks)
    if device == "cuda":
        t_g = timed(lambda: per_head_inputs(kind, pages, table, S), a.rep)
        t_old = timed(lambda: per_head(kind, q, w, keys, p0), a.rep)
        t_new = timed(lambda: indexer_logits(qp, wp, pages, table, p0, kind, form="tile"), a.rep)
        t_pages = timed(lambda: indexer_logits(qp, wp, pages, table, p0, kind, form="pages"), a.rep)
        row |= {"gather_ms": round(t_g, 4), "per_head_ms": round(t_old, 4), "fused_ms": round(t_new, 4),
                "fused_over_per_head": round(t_new / t_old, 3), "pages_ms": round(t_pages, 4),
                "pages_over_tile": round(t_pages / t_new, 3)}
        if a.pages_tune:
            row["pages_tuned_ms"] = pages_tuned(qp, wp, pages, table, p0, kind)
        if a.tune:
            row["tuned_ms"] = {f"m{bm}-n{bn}-w{nw}": round(timed(lambda: indexer_logits(  # noqa: B023
                qp, wp, pages, table, p0, kind, block_m=bm, block_n=bn, num_warps=nw, form="tile"), 60), 4)
                for bm in (16, 32, 64) for bn in (64, 128, 256) for nw in (4, 8)}
        row["device"] = torch.cuda.get_device_name()
    else:
        row["device"] = "cpu (interpreter)"
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="12189,22600")
    ap.add_argument("--dtypes", default="fp8,bf16")
    ap.add_argument("--topk", default="512,1024", help="the ks whose kept sets are compared")
    ap.add_argument("--rows", type=int, default=0, help="rows a call (0: the server's score_rows at each length)")
    ap.add_argument("--rep", type=int, default=200)
    ap.add_argument("--out", default=None)
    ap.add_argument("--tune", action="store_true", help="also time indexer_logits at other tiles")
    ap.add_argument("--pages-tune", action="store_true", help="also time the pages form at other launches")
    ap.add_argument("--smoke", action="store_true", help="CPU under TRITON_INTERPRET=1: 200 tokens, 40 rows, k 8")
    a = ap.parse_args(argv)
    if a.smoke:
        a.lengths, a.rows, a.topk = "200", 40, "8"
    elif not torch.cuda.is_available():
        print("indexer_logits.py: needs a CUDA GPU (or --smoke under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    a.ks = [int(x) for x in a.topk.split(",")]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = open(a.out, "a") if a.out else None
    for kind in a.dtypes.split(","):
        for S in (int(x) for x in a.lengths.split(",")):
            row = run_case(kind, S, a, device)
            print(json.dumps(row), flush=True)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
