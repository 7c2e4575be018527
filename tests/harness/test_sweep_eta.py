"""The sweep's ETA weighs each trial by its prompt length: with a server whose time per
trial is proportional to its tokens, the ETA after each trial is exactly the time the
tokens left take. The clock here is that server's: the tokens already answered, read from
the run folder's trials.jsonl (100 tokens a second), so nothing depends on the machine's
speed."""

from __future__ import annotations

import io
import json

from rich.console import Console

from niah.sweep import SweepSpec, Target, run_sweep
from niah.sweep.progress import SweepProgress


def test_the_eta_weighs_trials_by_length(oracle, tmp_path):
    run = tmp_path / "run"

    def clock() -> float:  # seconds = tokens answered so far / 100
        p = run / "trials.jsonl"
        lines = p.read_text().splitlines() if p.exists() else []
        return sum(json.loads(x)["length"] for x in lines if x.strip()) / 100

    buf = io.StringIO()
    spec = SweepSpec(lengths=[300, 3000], depths=[0.0, 100.0], trials=1)
    run_sweep([Target(oracle.url)], spec, run, progress=SweepProgress(Console(file=buf, width=120), interval=0,
                                                                      clock=clock))
    etas = [ln.rsplit("ETA ", 1)[1] for ln in buf.getvalue().splitlines()]
    # after 300, 300, 3000, 3000 tokens: 6300, 6000, 3000, 0 tokens left at 100 a second
    assert etas == ["0:01:03", "0:01:00", "0:00:30", "0:00:00"], buf.getvalue()
