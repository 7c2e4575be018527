"""The project gates itself: a short sweep on the embedded CPU server (a real SmolLM2-135M
with DeepSeek-style sparse attention), gated against the committed baseline
results/baselines/embedded-selfgate.json. A change that breaks recall end to end (prompt
building, the server, the indexer, scoring) fails here.

Sized with `niah plan --recall 1.0 --drop 0.5 --depths 3`: 15 paired trials per length
(5 per cell at 3 depths) give the exact McNemar test 85% power to see half the needles
lost at one length; losing 7 of 15 gives p = 0.016 (with the 6 pairs per length used
before, even losing 5 of 6 passed: p = 0.0625). test_losing_half_at_one_length_fails
checks it against the committed baseline.

Regenerate the baseline (after a deliberate change of behaviour) with:

    python -m niah sweep --matrix <the SELFGATE_MATRIX below> <SWEEP_ARGS> --out RUN
    python -m niah baseline export RUN -o results/baselines/embedded-selfgate.json
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "results" / "baselines" / "embedded-selfgate.json"
SELFGATE_MATRIX = """\
engine = "embedded"

[[config]]
name = "selfgate"
attention = "dsa"
index_dtype = "fp8"
index_topk = 128
"""
SWEEP_ARGS = ["--lengths", "600,1500", "--depths", "10,50,90", "--trials", "5", "--seed", "0", "-q"]


def _niah(*args):
    from cli_inproc import niah  # the entry point in this process (tests/cli_inproc.py)

    return niah(*args)


@pytest.mark.slow
def test_embedded_sweep_holds_the_committed_baseline(tmp_path):
    matrix = tmp_path / "selfgate.toml"
    matrix.write_text(SELFGATE_MATRIX)
    run = tmp_path / "run"
    r = _niah("sweep", "--matrix", matrix, *SWEEP_ARGS, "--out", run)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    junit = tmp_path / "selfgate.xml"
    r = _niah("gate", "--baseline", BASELINE, "--candidate", run, "--junit", junit)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "paired by" in r.stdout  # same seeds and prompts as the baseline: a paired test
    cases = [tc.get("name") for tc in ET.parse(junit).getroot().iter("testcase")]
    assert cases == ["length 600", "length 1500", "all lengths"]


def test_losing_half_at_one_length_fails(tmp_path):
    """The committed baseline is large enough: a candidate that lost half the needles the
    baseline found at one length is a regression (exit 1), not a pass."""
    import json

    data = json.loads(BASELINE.read_text())
    (cfg,) = data["configs"].values()
    found = [t for t in cfg["trials"] if t["length"] == 1500 and t["outcome"] == "correct"]
    assert len(found) >= 12  # sized for it (module doc)
    for t in found[: len(found) // 2]:
        t["outcome"], t["correct"] = "wrong", False
    candidate = tmp_path / "candidate.json"
    candidate.write_text(json.dumps(data))
    r = _niah("gate", "--baseline", BASELINE, "--candidate", candidate)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "regression" in r.stdout and "1,500" in r.stdout
