"""Prefill time, dense SDPA vs DeepSeek-style sparse attention, side by side on one prompt.

    python benchmarks/dsa_prefill.py [--lengths 2048 7168] [--topk 512] [--dtypes fp8 bf16] [--reps 2]

Runs on the CPU with torch.set_num_threads(2); prints seconds and the dsa/dense ratio
(target: <= 1.35). Dense and dsa alternate within each repetition so machine noise hits
both; the best of `reps` is reported.
"""

from __future__ import annotations

import argparse
import time

import torch


def filler_ids(tok, n: int) -> list[int]:
    text = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
            "There and back again. A quiet river runs past the old mill near the town. ")
    ids: list[int] = []
    while len(ids) < n:
        ids += tok.encode(text, add_special_tokens=False).ids
    return ids[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 7168])
    ap.add_argument("--topk", type=int, default=512)
    ap.add_argument("--window", type=int, default=0)
    ap.add_argument("--dtypes", nargs="+", default=["fp8", "bf16"])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=512, help="DSA query chunk")
    ap.add_argument("--random-weights", action="store_true",
                    help="random weights of the same shapes, random token ids (timing only; no GGUF needed)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from niah.serving.embedded import weights
    from niah.serving.embedded.dsa import DSA
    from niah.serving.embedded.model import Transformer

    if args.random_weights:
        from niah.serving.embedded.model import ModelArgs

        torch.manual_seed(0)
        model = Transformer(ModelArgs()).eval()
        loaded = None
    else:
        loaded = weights.load()
        model = Transformer.from_loaded(loaded)
    configs = [("dense", None)] + [(f"dsa-{d}-k{args.topk}", DSA(d, args.topk, args.window, args.chunk))
                                   for d in args.dtypes]
    print(f"threads={torch.get_num_threads()} topk={args.topk} window={args.window} chunk={args.chunk} "
          f"weights={'random' if loaded is None else 'SmolLM2-135M'}")
    for n in args.lengths:
        ids = (torch.randint(0, model.args.vocab_size, (n,)).tolist() if loaded is None
               else filler_ids(loaded.tokenizer, n))
        x = torch.tensor([ids])
        best = {name: float("inf") for name, _ in configs}
        for _ in range(args.reps):
            for name, att in configs:
                model.set_attention(att)
                t = time.perf_counter()
                model(x, 0)
                best[name] = min(best[name], time.perf_counter() - t)
        d = best["dense"]
        for name, _ in configs:
            print(f"T={n:5d}  {name:16s} {best[name]:7.2f} s   ratio {best[name] / d:5.2f}")


if __name__ == "__main__":
    main()
