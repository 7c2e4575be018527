"""The indexer probe end to end: real embedded servers (launched by a matrix, as the demo
does), a sweep with the no-needle control, then report, compare and gate on that run.

The run is the `indexer_run` fixture of tests/conftest.py (made once; the report page test,
tests/report/test_report_html.py, opens the same run): dense; DSA fp8 at top-k 64 and 512. Lengths
400 (at or below k = 512: no selection there) and 1000 (above both k).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(indexer_run):
    records = [json.loads(x) for x in (indexer_run / "trials.jsonl").read_text().splitlines()]
    return indexer_run, records


def _trial(records, config, length, control=False):
    return next(r for r in records if r["config"] == config and r["length"] == length
                and bool(r.get("control")) == control)


def test_every_dsa_trial_carries_the_indexer_summary(run):
    out, records = run
    t = _trial(records, "k64", 1000)
    s = t["indexer"]
    assert s["selection_active"] is True and s["k"] == 64 and s["context"] == 1000
    assert s["steps"] > 1                                      # the last prompt token + decode steps
    assert 0 < s["rank_best"] <= s["rank_worst"] and 0 < s["fidelity"] < 1 and 0 <= s["kept"] <= 1
    assert s["value_tokens"] >= 1
    side = [json.loads(x) for x in (out / "indexer" / "k64.jsonl").read_text().splitlines()]
    detail = next(d["detail"] for d in side if d["length"] == 1000)
    steps = detail["steps"]
    assert len(steps) == s["steps"] and [x["position"] for x in steps] == list(range(999, 999 + len(steps)))
    assert all(len(x["rank_worst"]) == 30 and len(x["fidelity"]) == 30 for x in steps)
    # where the answer held the value, probing stopped at the step that completed it
    assert detail["value_complete"] == (t["needle"] in "".join(c for c in t["answer"] if c.isdigit()))


def test_dense_records_null_and_short_prompts_no_selection(run):
    _, records = run
    for length in (400, 1000):
        d = _trial(records, "dense", length)
        assert d["indexer"] is None and d["selection_recall"] is None
    short = _trial(records, "k512", 400)["indexer"]
    assert short["selection_active"] is False and short["rank_worst"] is None and short["fidelity"] is None
    assert _trial(records, "k512", 1000)["indexer"]["selection_active"] is True


def test_control_trials_have_no_needle(run):
    _, records = run
    controls = [r for r in records if r.get("control")]
    assert len(controls) == 6                                 # one per cell and configuration
    assert all(r["outcome"] in ("clean", "leak", "hallucinated") and r["needle"] is None for r in controls)
    assert all(abs(r["prompt_tokens"] - r["length"]) <= 4 for r in controls)


def _niah(*args):
    from cli_inproc import niah  # the entry point in this process (tests/cli_inproc.py)

    r = niah(*args)
    r.output = r.stdout + r.stderr
    return r


def test_report_compare_and_gate_read_the_rank(run):
    out, _ = run
    from niah.attestation import status
    from niah.runs.manifest import read_manifest

    # every embedded server proved what it ran (read before and after its sweep)
    states = {n: status(c) for n, c in read_manifest(out)["configs"].items()}
    assert {n: s for n, (s, _) in states.items()} == {"dense": "valid", "k64": "valid", "k512": "valid"}, states
    assert states["dense"][1] == "attention dense: no indexer configured"
    assert states["k64"][1].startswith("fp8/torch, 204 B/token; during the sweep: store +")
    r = _niah("report", out)
    assert r.returncode == 0, r.output
    md = (out / "report" / "summary.md").read_text()
    assert "where the needle ranks against k" in md and "≤ k=512: no selection" in md
    assert "No-needle control" in md and "Indexer kept the needle" not in md
    assert (out / "report" / "indexer.png").stat().st_size > 10_000
    r = _niah("compare", out, "--a", "k512", "--b", "k64")
    assert r.returncode == 0, r.output
    assert "Wilcoxon" in r.output and "| 1,000 | 1 |" in r.output and "| 400 | 0 (+1 no selection) |" in r.output
    r = _niah("gate", "--baseline", out, "--candidate", out, "--metric", "both")
    assert r.returncode == 0, r.output
    assert "lengths 400 are at or below index_topk 512" in r.output
