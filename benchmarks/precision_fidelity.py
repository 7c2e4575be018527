"""Selection fidelity of every index precision, side by side in one process.

    python benchmarks/precision_fidelity.py [--length 2000] [--topk 64] [--rows 64]
        [--synthetic-keys 8192] [--synthetic-topk 512] [--seeds 2]

1. Real keys: one forward of SmolLM2 (the embedded model) over a haystack chat prompt of
   `--length` tokens captures every layer's post-RoPE q and k; for the last `--rows` query
   rows of every layer, each arm's selection (serving/embedded/dsa.DSA: the same code the
   server runs) is compared with the exact top-k (float64 scores of the unquantised query
   against the fp32 keys). Rows whose exact k-th score is 0 (a ReLU tie) are left out: there
   the exact top-k itself is arbitrary.
2. DeepSeek-shaped synthetic keys: 64 heads x 128 dims, one shared key head, N(0, 1) keys
   with and without 4 outlier channels (fixed sign, 8-16x), random positive head weights,
   one query, top-`--synthetic-topk` of `--synthetic-keys` against float64.
Arms: fp8 / bf16 / fp4 keys with fp32 / bf16 / fp8 queries, two-stage fp8+bf16 and
fp4+bf16 with c = 2, 4, 8. Prints one line per arm (mean fidelity; synthetic: min-max
over seeds and key kinds).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ARMS = ([(d, q, None) for d in ("fp8", "bf16", "fp4") for q in ("fp32", "bf16", "fp8")]
        + [(d, "fp32", c) for d in ("fp8+bf16", "fp4+bf16") for c in (2, 4, 8)])


def arm_name(dtype: str, query: str, c: int | None) -> str:
    return f"{dtype} keys, {query} query" + (f", c={c}" if c else "")


def real_keys(length: int, topk: int, rows: int) -> dict[str, float]:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from needle_probe import build, haystack_text

    from niah.serving.embedded.dsa import DSA
    from niah.serving.embedded.model import LayerCache, dense_attention
    from niah.serving.embedded.server import Engine, ServeConfig

    engine = Engine(ServeConfig("dense"))
    messages, _ = build(engine, haystack_text(), length, 0.5, "4817263")
    ids = engine.encode(engine.render_chat(messages)).ids
    captured: dict[int, tuple] = {}

    class Capture:
        name = "capture"

        def store(self, cache, k, start):
            pass

        def __call__(self, q, cache, start):
            S = start + q.shape[2]
            captured[cache.layer_id] = (q[:, :, -rows:].clone(), cache.k[0, :, :S].clone())
            return dense_attention(q, cache, start)

    engine.model.set_attention(Capture())
    engine.model(torch.tensor([ids]), 0)
    out = {}
    for dtype, query, c in ARMS:
        hit = n = 0
        for layer, (q, k) in sorted(captured.items()):
            S = k.shape[1]
            _, H, R, D = q.shape
            kh = k.double().repeat_interleave(H // k.shape[0], dim=0)
            exact = torch.relu(torch.einsum("hrd,hsd->hrs", q[0].double(), kh)).sum(0)     # [R, S]
            causal = torch.arange(S)[None, :] <= torch.arange(S - R, S)[:, None]
            exact = exact.masked_fill(~causal, float("-inf"))
            top = exact.topk(topk, dim=-1)
            keep_rows = top.values[:, -1] > 0
            want = torch.zeros(exact.shape, dtype=torch.bool).scatter_(1, top.indices, True)
            dsa = DSA(dtype, topk, query_dtype=query, **({"rescore_factor": c} if c else {}))
            cache = LayerCache(k[None].clone(), k[None].clone(), torch.zeros_like(k))
            dsa.store(cache, k[None], 0)
            fine = dsa.fine_keys(cache) if dsa.fine else None
            got = dsa.keep_mask(dsa.index_query(q), cache.idx_k, S - R, None, fine) == 0
            hit += int((got & want)[keep_rows].sum())
            n += int(keep_rows.sum()) * topk
        out[arm_name(dtype, query, c)] = hit / n
    return out


def synthetic(n_keys: int, topk: int, seeds: int) -> dict[str, tuple[float, float]]:
    import torch

    from niah.serving.embedded import precision, selection

    res: dict[str, list[float]] = {}
    for seed in range(seeds):
        for outliers in (0, 4):
            g = torch.Generator().manual_seed(seed)
            k = torch.randn(n_keys, 128, generator=g)
            if outliers:
                sign = torch.sign(torch.randn(outliers, generator=g))
                k[:, :outliers] += sign * (8 + 8 * torch.rand(outliers, generator=g))
            q = torch.randn(64, 128, generator=g)
            w = torch.rand(64, generator=g) + 0.1
            exact = torch.relu(k.double() @ q.double().T) @ w.double()                    # [N]
            want = set(exact.topk(topk).indices.tolist())
            for dtype, query, c in ARMS:
                coarse, fine = precision.stages(dtype)
                qq = selection.quantize_query(q, query)
                s = torch.relu(selection.store_form(k, coarse) @ qq.T) @ w                 # [N] fp32
                if fine is None:
                    got = s.topk(topk).indices
                else:
                    cand = s.topk(min(c * topk, n_keys)).indices
                    r = torch.relu(selection.store_form(k[cand], fine) @ qq.T) @ w
                    got = cand[r.topk(topk).indices]
                res.setdefault(arm_name(dtype, query, c), []).append(len(want & set(got.tolist())) / topk)
    return {name: (min(v), max(v)) for name, v in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=2000)
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--synthetic-keys", type=int, default=8192)
    ap.add_argument("--synthetic-topk", type=int, default=512)
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    syn = synthetic(args.synthetic_keys, args.synthetic_topk, args.seeds)
    real = real_keys(args.length, args.topk, args.rows)
    print(f"{'arm':<34} real keys ({args.length} tokens, top-{args.topk})   "
          f"synthetic (64x128, top-{args.synthetic_topk} of {args.synthetic_keys})")
    for dtype, query, c in ARMS:
        name = arm_name(dtype, query, c)
        lo, hi = syn[name]
        print(f"{name:<34} {real[name]:.4f}                             {lo:.3f}-{hi:.3f}")


if __name__ == "__main__":
    main()
