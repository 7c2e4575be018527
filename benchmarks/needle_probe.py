"""Does a 7-digit needle come back under dense vs DSA (fp8 / bf16 index keys, several top-k)?

    python benchmarks/needle_probe.py [--lengths 1000 2500 4000] [--depths 10 50 90]
        [--topks 64 128 256 512] [--dtypes fp8 bf16] [--out results/needle_probe.jsonl]

In-process (no HTTP), one model, identical prompts for every configuration. Prints one
line per (length, depth, config): found or not, the answer, and the mean selection recall
(share of the needle's tokens kept for the last prompt token, averaged over layers).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

QUESTION = "\n\nWhat is the secret number mentioned in the text above? Answer with the number only."


def haystack_text() -> str:
    p = Path(__file__).resolve().parents[1] / "niah" / "corpus" / "haystack.txt"
    if p.is_file():
        return p.read_text()
    words = "the quiet river ran past an old mill where children played and farmers sold apples".split()
    rng = random.Random(0)
    return " ".join(rng.choice(words) for _ in range(20000))


def build(engine, hay: str, n_tokens: int, depth: float, secret: str) -> tuple[list[dict], tuple[int, int]]:
    """A chat prompt of about n_tokens with the needle at depth (0..1) of the haystack."""
    needle = f" The secret number is {secret}. "
    overhead = len(engine.encode(engine.render_chat([{"role": "user", "content": needle + QUESTION}])).ids)
    enc = engine.encode(hay)
    k = max(1, n_tokens - overhead)
    body = hay[: enc.offsets[min(k, len(enc.offsets)) - 1][1]]
    cut = int(len(body) * depth)
    sp = body.rfind(". ", 0, cut)
    cut = sp + 1 if sp > 0 else cut
    content = body[:cut] + needle + body[cut:] + QUESTION
    return [{"role": "user", "content": content}], (cut + 1, cut + len(needle) - 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[1000, 2500, 4000])
    ap.add_argument("--depths", type=int, nargs="+", default=[10, 50, 90])
    ap.add_argument("--topks", type=int, nargs="+", default=[64, 128, 256, 512])
    ap.add_argument("--dtypes", nargs="+", default=["fp8", "bf16"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()

    from niah.serving.embedded.dsa import DSA
    from niah.serving.embedded.generate import generate
    from niah.serving.embedded.api import _token_span
    from niah.serving.embedded.server import Engine, ServeConfig

    engine = Engine(ServeConfig("dense"))
    hay = haystack_text()
    configs = [("dense", None)] + [(f"{d}-k{k}", (d, k)) for k in args.topks for d in args.dtypes]
    out = open(args.out, "a") if args.out else None
    rng = random.Random(1234)
    for n in args.lengths:
        for depth in args.depths:
            secret = str(rng.randint(1_000_000, 9_999_999))
            msgs, span = build(engine, hay, n, depth / 100, secret)
            text = engine.render_chat(msgs)
            base = text.rfind(msgs[-1]["content"])
            enc = engine.encode(text)
            needle = _token_span(enc.offsets, base + span[0], base + span[1])
            for name, c in configs:
                engine.model.set_attention(DSA(c[0], c[1]) if c else None)
                t = time.perf_counter()
                g = generate(engine.model, engine.decode, list(enc.ids), args.max_tokens, engine.eos_ids, None, needle)
                rec = sum(g.selection_recall) / len(g.selection_recall)
                row = {"tokens": len(enc.ids), "depth": depth, "config": name, "found": secret in g.text,
                       "answer": g.text.strip()[:40], "sel_recall_mean": round(rec, 3),
                       "sel_recall_min": round(min(g.selection_recall), 3), "s": round(time.perf_counter() - t, 1)}
                print(json.dumps(row), flush=True)
                if out:
                    out.write(json.dumps(row) + "\n")
                    out.flush()


if __name__ == "__main__":
    main()
