"""How a sweep ends on the command line: progress while it runs, then its outcome and exit code.

`run_and_report(run, out, argv)` runs `run(progress)` with SIGTERM turned into an
interrupt (niah.sweep.interrupt), then prints the run's recall tables and outcome counts
(`print_outcome`, read back from the run folder) and returns the exit code: 0 when every
trial has an answer; 1 when any trial errored (the line names the `--resume` command
that retries them); 130 / 143 when interrupted (finished trials stay in the folder; the
line names the command that finishes the run). `resume_command` is that command: the
same arguments with --out and --resume, and never a bearer token or a secret header.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Callable

from rich.console import Console

from niah.redact import is_secret_header
from niah.runs.trials import load_run
from niah.sweep.interrupt import EXIT_ON_SIGNAL, terminate_as_interrupt
from niah.sweep.progress import SweepProgress, length_check, outcome_counts, recall_tables

def run_and_report(run: Callable[[object], object], out: Path, argv: list[str], quiet: bool = False) -> int:
    """Run `run(progress)` into `out` and print how it ended; returns the exit code (module doc)."""
    progress = None if quiet else SweepProgress(Console(stderr=True))
    try:
        with terminate_as_interrupt():
            run(progress)
    except KeyboardInterrupt as e:
        name = str(e.args[0]) if e.args else "SIGINT"
        print(f"niah: interrupted ({name}): finished trials are saved in {out}; resume with: "
              f"{resume_command(argv, out)}", file=sys.stderr, flush=True)
        return EXIT_ON_SIGNAL.get(name, 130)
    errored, total = print_outcome(out)
    if errored:
        print(f"niah: {errored} of {total} trial(s) got no answer (outcome error: see the run's trials.jsonl); "
              f"exit 1. Retry them with: {resume_command(argv, out)}", file=sys.stderr)
        return 1
    return 0


def resume_command(argv: list[str], out: Path) -> str:
    """The `niah sweep ... --resume` that finishes this run (no bearer token and no secret
    header in it: pass them again, the token through NIAH_API_KEY)."""
    args, skip = [], 0
    for i, a in enumerate(argv):
        if skip:
            skip -= 1
            continue
        if a == "--api-key":
            skip = 1
            continue
        if a.startswith("--api-key="):
            continue
        if a in ("--header", "-H") and i + 1 < len(argv) and is_secret_header(argv[i + 1].partition(":")[0]):
            skip = 1
            continue
        if a.startswith("--header=") and is_secret_header(a[len("--header="):].partition(":")[0]):
            continue
        args.append(a)
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", str(out)]
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(["niah", *args])


def print_outcome(out: Path) -> tuple[int, int]:
    """Print the run's recall tables and outcomes; returns (error trials, all trials)."""
    _, records = load_run(out, warn=False)
    stdout = Console()
    for t in recall_tables(records):
        stdout.print(t)
    lc = length_check(records)
    counts = ", ".join(f"{k} {v}" for k, v in outcome_counts(records).items() if v)
    stdout.print(f"outcomes: {counts}", soft_wrap=True)
    if lc["checked"]:
        stdout.print(
            f"length check: max |prompt_tokens - length| = {lc['max_dev']} tokens "
            f"({lc['max_rel']:.3%}); {lc['out_of_tolerance']} of {lc['checked']} trials outside max(4, 0.5%)",
            soft_wrap=True,
        )
    stdout.print(f"run folder: {out}", soft_wrap=True)
    return sum(r.get("outcome") == "error" for r in records), len(records)
