"""`make demo`: the whole investigation on a laptop.

For each configuration of serving/examples/demo.toml (a dense control; fp8 and bf16
index keys at several top-k), start the embedded CPU server (a real SmolLM2-135M with
DeepSeek-style sparse attention), sweep needle recall over lengths and depths on
identical prompts, stop the server, then draw the heatmaps and print where they are.

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

# Lengths up to ~7.5K tokens (the model's context is 8K), three depths, one trial per
# cell: 12 prompts, ~44K prompt tokens per configuration; 7 configurations.
DEMO_LENGTHS = [1000, 2000, 4000, 7500]
DEMO_DEPTHS = [10.0, 50.0, 90.0]
QUICK_LENGTHS = [600, 1500]
QUICK_DEPTHS = [50.0]


def demo_matrix() -> Path:
    return Path(str(resources.files("niah.serving") / "examples" / "demo.toml"))


def main(argv: list[str] | None = None) -> int:
    from niah.errors import NiahError
    from niah.report import build_report
    from niah.serving.matrix import run_matrix
    from niah.sweep import SweepSpec

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
        run_matrix(demo_matrix(), spec, out, resume=resume)
        report_dir = build_report(out)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
