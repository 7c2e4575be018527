"""`make demo`: the whole investigation on a laptop.

For each configuration of serving/examples/demo.toml (a dense control; fp8 and bf16
index keys at two top-k; fp8 keys with DeepSeek's Hadamard rotation at top-k 64), start
the embedded CPU server (a real SmolLM2-135M with DeepSeek-style sparse attention), sweep
needle recall over lengths and depths on identical prompts, stop the server, then draw
the heatmaps, print the paired fidelity and needle rank of the arms that share a top-k,
and say where the report is.

    python -m niah.demo [--out results/demo] [--quick]

Interrupt it at any time: what was measured stays in the run folder, and running the
same command again resumes where it stopped.
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib import resources
from pathlib import Path

from niah.errors import NiahError
from niah.report import build_report, indexer_pairs
from niah.report.data import config_infos, load_frame
from niah.report.ranks import rank_pairs, trials_needed_bootstrap
from niah.serving.matrix import matrix_topks, run_matrix
from niah.sweep import SweepSpec
from niah.sweep.indexer import config_topk, length_warnings

# Lengths 1K, 2K and 4K tokens (all longer than top-k 512: every cell exercises the
# indexer), three depths, one trial per cell: 9 prompts, ~21K prompt tokens per
# configuration; 6 configurations (dense, fp8/bf16 x top-k 64/512, fp8 + rotation at 64).
# On this 2-core machine a DSA trial costs ~8.5 s at 1K, ~16 s at 2K, ~38 s at 4K and
# ~65 s at 6K (measured 2026-12-01): the 500-, 3K- and 6K-token columns went so the demo
# stays under 20 minutes with the rotated arm.
DEMO_LENGTHS = [1000, 2000, 4000]
DEMO_DEPTHS = [10.0, 50.0, 90.0]
QUICK_LENGTHS = [600, 1500]
QUICK_DEPTHS = [50.0]


def demo_matrix() -> Path:
    return Path(str(resources.files("niah.serving") / "examples" / "demo.toml"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="niah-demo", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/demo", help="run folder (resumed if it exists)")
    p.add_argument("--quick", action="store_true", help="two short lengths, one depth")
    p.add_argument("--trials", type=int, default=1)
    args = p.parse_args(argv)

    spec = SweepSpec(
        lengths=QUICK_LENGTHS if args.quick else DEMO_LENGTHS,
        depths=QUICK_DEPTHS if args.quick else DEMO_DEPTHS,
        trials=args.trials,
        seed=0,
        max_tokens=24,
    )
    out = Path(args.out)
    resume = (out / "trials.jsonl").exists()
    t0 = time.monotonic()
    try:
        for line in length_warnings(spec.lengths, matrix_topks(demo_matrix())[0]):
            print(f"niah demo: {line}", file=sys.stderr)
        run_matrix(demo_matrix(), spec, out, resume=resume)
        report_dir = build_report(out)
        print_findings(out)
    except NiahError as e:
        print(f"niah demo: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"\ninterrupted: measured trials are kept in {out}; run `make demo` again to resume")
        return 130
    minutes = (time.monotonic() - t0) / 60
    print(f"\ndemo finished in {minutes:.1f} min")
    print(f"run folder: {out}")
    print(f"heatmaps:   {report_dir}/  (grid.png shows every configuration side by side)")
    print(f"summary:    {report_dir / 'summary.md'}")
    print(f"page:       {report_dir / 'index.html'}  (all of it in one file: open it in a browser)")
    return 0


def print_findings(out: Path) -> None:
    """The arms that share a top-k (fp8, fp8 + rotation, bf16), paired on identical
    prompts: fidelity, needle rank / k and answers (niah/report/indexer_pairs.py, the same
    table as the report's summary.md); then how many paired trials each metric would need
    to see fp8 worse than bf16 (bootstrap)."""
    import pandas as pd

    manifest, df = load_frame(out)
    infos = config_infos(manifest, df)
    topks = {n: config_topk((manifest.get("configs") or {}).get(n)) for n in infos}
    print("\nsame top-k, paired on identical prompts (A -> B):")
    for line in indexer_pairs.lines(indexer_pairs.indexer_pairs(df, indexer_pairs.same_k_pairs(df, infos, topks))):
        print(line)
    pooled = []
    for k in (64, 512):
        a, b = df[df["config"] == f"bf16-k{k}"], df[df["config"] == f"fp8-k{k}"]
        if a.empty or b.empty:
            continue
        pooled.append(rank_pairs(a, b))
    if pooled:
        for res in trials_needed_bootstrap(pd.concat(pooled, ignore_index=True)):
            need = res.n if res.n else (f"more than 1000 (power there {res.power_at_max:.2f}: the observed pairs show "
                                        "no effect in that direction)")
            print(f"paired trials to see fp8 worse than bf16 (80% power, alpha 0.05), {res.metric}: {need}")


if __name__ == "__main__":
    sys.exit(main())
