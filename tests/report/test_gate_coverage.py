"""The gate sees everything or fails: a candidate must cover every (length, depth, prompt)
of the baseline it is gated on. What it lacks is an outage (exit 1), named in the Markdown,
the JUnit file and the step summary; a baseline exported from a run still gates PASS
against that run."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from cli_inproc import niah
from report_runs import make_run

from niah.report.gate import run_gate
from niah.sweep import SweepSpec, Target, run_sweep

LENGTHS = (1024, 2048, 4096)
DEPTHS = (0.0, 50.0, 100.0)


def _run(path, **kw):
    return make_run(path, {"embedded": {}}, lengths=LENGTHS, depths=DEPTHS, trials=4, seed=5, **kw)


def _gate(tmp_path, base, cand, *extra):
    step = tmp_path / "step.md"
    r = niah("gate", "--baseline", base, "--candidate", cand, "--junit", tmp_path / "j.xml",
             "--summary", tmp_path / "s.md", *extra, env={"GITHUB_STEP_SUMMARY": str(step)})
    cases = {}
    for tc in ET.parse(tmp_path / "j.xml").getroot().iter("testcase"):
        kind = next((t for t in ("failure", "error", "skipped") if tc.find(t) is not None), "pass")
        el = tc.find(kind) if kind != "pass" else None
        cases[tc.get("name")] = (kind, el.get("message") if el is not None else "")
    return r, cases, (tmp_path / "s.md").read_text(), step.read_text()


def test_a_whole_missing_length_is_an_outage_not_skipped(tmp_path):
    base = _run(tmp_path / "base")
    cand = _run(tmp_path / "cand", skip=lambda c, n, d, t: n == 4096)
    r, cases, md, step = _gate(tmp_path, base, cand)
    assert r.returncode == 1, r.stdout + r.stderr
    kind, msg = cases["length 4096"]
    assert kind == "error" and "length not in the candidate" in msg and "12 trial(s)" in msg
    assert cases["length 1024"][0] == "pass" and cases["length 2048"][0] == "pass"
    for text in (md, step, r.stdout):
        assert "## niah gate: OUTAGE" in text and "length not in the candidate" in text
        assert "`embedded` length 4096 (outage)" in text


def test_a_missing_depth_or_trial_within_a_length_is_an_outage_that_names_it(tmp_path):
    base = _run(tmp_path / "base")
    cand = _run(tmp_path / "cand",
                skip=lambda c, n, d, t: (n == 1024 and d == 100.0) or (n == 2048 and d == 50.0 and t == 3))
    r, cases, md, step = _gate(tmp_path, base, cand)
    assert r.returncode == 1, r.stdout + r.stderr
    kind, msg = cases["length 1024"]
    assert kind == "error" and "candidate lacks 4 of the baseline's 12 prompt(s) here" in msg
    assert "depth 100% trial 0" in msg and "answered nothing at depth 100%" in msg
    kind, msg = cases["length 2048"]
    assert kind == "error" and "lacks 1 of the baseline's 12" in msg and "depth 50% trial 3" in msg
    assert cases["length 4096"][0] == "pass"
    assert "depth 50% trial 3" in md and "depth 50% trial 3" in step


def test_a_cell_with_nothing_answered_is_an_outage_even_under_the_error_rate(tmp_path):
    base = _run(tmp_path / "base")
    cand = _run(tmp_path / "cand", outcome=lambda c, n, d, t, rng: "error" if (n, d) == (2048, 0.0) else "correct")
    # 4 of 12 trials errored at 2048: under a 50% error rate the old gate passed it
    r, cases, _, _ = _gate(tmp_path, base, cand, "--max-error-rate", "0.5")
    assert r.returncode == 1, r.stdout
    kind, msg = cases["length 2048"]
    assert kind == "error" and "answered nothing at depth 0%" in msg


def test_a_baseline_file_candidate_that_lacks_trials_is_an_outage(tmp_path):
    base = _run(tmp_path / "base")
    assert niah("baseline", "export", base, "-o", tmp_path / "b.json").returncode == 0
    data = json.loads((tmp_path / "b.json").read_text())
    trials = data["configs"]["embedded"]["trials"]
    data["configs"]["embedded"]["trials"] = [t for t in trials if not (t["length"] == 1024 and t["trial"] == 0)]
    (tmp_path / "c.json").write_text(json.dumps(data))
    res = run_gate(tmp_path / "b.json", tmp_path / "c.json")
    assert res.exit_code == 1 and res.verdict == "OUTAGE"
    (case,) = [c for c in res.cases if c.length == 1024]
    assert case.status == "outage" and "lacks 3 of the baseline's 12" in case.message


def test_an_exported_baseline_gates_pass_against_its_own_run(tmp_path):
    run = _run(tmp_path / "run",
               outcome=lambda c, n, d, t, rng: "wrong" if t == 0 else ("error" if t == 1 and n == 1024 else "correct"))
    assert niah("baseline", "export", run, "-o", tmp_path / "b.json").returncode == 0
    for base, cand in ((tmp_path / "b.json", run), (run, run), (tmp_path / "b.json", tmp_path / "b.json")):
        res = run_gate(base, cand, max_error_rate=0.5)
        assert res.exit_code == 0 and res.verdict == "PASS", [(c.name, c.status, c.message) for c in res.failed]


def test_a_real_sweep_gates_pass_against_its_export_and_an_early_stop_does_not(oracle, tmp_path):
    spec = dict(lengths=[300, 600], depths=[0, 50, 100], trials=2, seed=0)
    run = run_sweep([Target(oracle.url)], SweepSpec(**spec), tmp_path / "run")
    assert niah("baseline", "export", run, "-o", tmp_path / "b.json").returncode == 0
    r, cases, md, _ = _gate(tmp_path, tmp_path / "b.json", run, "--metric", "both")
    assert r.returncode == 0 and "paired by prompt hash" in md, r.stdout + r.stderr
    assert {k for k, _ in cases.values()} <= {"pass", "skipped"}

    # the same server, a run stopped after its first length: the old gate passed it
    short = run_sweep([Target(oracle.url)], SweepSpec(**{**spec, "lengths": [300]}), tmp_path / "short")
    r, cases, md, _ = _gate(tmp_path, tmp_path / "b.json", short)
    assert r.returncode == 1 and cases["length 600"][0] == "error" and cases["length 300"][0] == "pass", r.stdout
