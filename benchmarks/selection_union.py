"""How much neighbouring queries' selections overlap on the real model: the CPU server's DSA
(SmolLM2, the arm's index keys and top-k) prefills one committed sweep prompt, and for every
layer and every tile of consecutive selecting queries this counts the distinct kept keys of
the tile (what union_attention loads) and the 64-key blocks they touch (what a block-dense
walk would), both over K. No GPU: the selection is the CPU server's, the same rule the GPU
server's kernels compute.

    python benchmarks/selection_union.py --arm fp8-k1024 --length 12189 [--run results/h200-seed-sweep]

One JSON object: per tile size (1, 2, 4, 8, 16 queries) the median and mean of distinct keys
over K and of 64-key blocks over K, and the tiles counted. Prompts: the run's prompts.jsonl,
the first of the given length.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

TILES = (1, 2, 4, 8, 16)


def main(argv: list[str] | None = None) -> None:
    import torch

    from niah.serving.embedded import dsa as dsa_mod
    from niah.serving.embedded.cuda.bench import arm_config
    from niah.serving.embedded.generate import prefill
    from niah.serving.embedded.server import Engine

    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", default="fp8-k1024")
    ap.add_argument("--length", type=int, default=12189)
    ap.add_argument("--run", default="results/h200-seed-sweep")
    a = ap.parse_args(argv)
    cfg = arm_config(a.arm, "cpu")
    eng = Engine(cfg)
    rec = next((r for r in map(json.loads, (Path(a.run) / "prompts.jsonl").read_text().splitlines())
                if r["length"] == a.length), None)
    if rec is None:
        raise SystemExit(f"selection_union.py: no {a.length}-token prompt in {a.run}/prompts.jsonl")
    ids = eng.encode(eng.render_chat(rec["messages"])).ids
    K = cfg.index_topk
    keys = {t: [] for t in TILES}
    blocks = {t: [] for t in TILES}
    attend = dsa_mod.DSA._attend

    def counted(self, qc, cache, mask, out):
        C, S = mask.shape
        p0 = S - C
        kept = torch.zeros(C, -(-S // 64) * 64, dtype=torch.bool)
        kept[:, :S] = mask == 0
        for t0 in range(max(0, K - p0), C - 15, 16):           # selecting rows only (position >= K)
            tile16 = kept[t0:t0 + 16]
            for t in TILES:
                for i in range(0, 16, t):
                    rows = tile16[i:i + t].any(0)
                    keys[t].append(int(rows.sum()) / K)
                    blocks[t].append(int(rows.view(-1, 64).any(1).sum()) * 64 / K)
        return attend(self, qc, cache, mask, out)

    dsa_mod.DSA._attend = counted
    try:
        prefill(eng.model, ids)
    finally:
        dsa_mod.DSA._attend = attend
    print(json.dumps({"arm": a.arm, "length": a.length, "prompt_tokens": len(ids), "topk": K,
                      "tiles": {t: {"keys_over_k_median": round(statistics.median(keys[t]), 2),
                                    "keys_over_k_mean": round(statistics.mean(keys[t]), 2),
                                    "blocks_over_k_median": round(statistics.median(blocks[t]), 2),
                                    "blocks_over_k_mean": round(statistics.mean(blocks[t]), 2),
                                    "counted": len(keys[t])} for t in TILES}}))


if __name__ == "__main__":
    main()
