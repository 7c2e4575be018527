"""`niah gate`, `niah baseline export` and `niah plan`, run as the CLI (exit codes matter)."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

import pytest
from report_runs import always, make_run

from niah.errors import BadInput
from niah.report.gate import run_gate

LENGTHS = (1024, 2048, 4096, 8192)
DEPTHS = (0.0, 25.0, 50.0, 75.0, 100.0)


def _niah(*args, env=None):
    from cli_inproc import niah  # the entry point in this process (tests/cli_inproc.py)

    return niah(*args, env={**os.environ, **(env or {})})


def _run(path, outcome=always("correct"), seed=7, trials=4, configs=None, **kw):
    return make_run(path, configs or {"embedded": {}}, lengths=LENGTHS, depths=DEPTHS, trials=trials,
                    outcome=outcome, seed=seed, **kw)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("gate")
    return _run(d / "base")


def _junit_cases(path):
    root = ET.parse(path).getroot()
    out = {}
    for tc in root.iter("testcase"):
        status = "pass"
        for tag in ("failure", "error", "skipped"):
            if tc.find(tag) is not None:
                status = tag
        out[tc.get("name")] = (status, tc)
    return root, out


def test_identical_runs_pass(base, tmp_path):
    summary = tmp_path / "step.md"
    r = _niah("gate", "--baseline", base, "--candidate", base, "--junit", tmp_path / "j.xml",
              "--summary", tmp_path / "s.md", env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.returncode == 0, r.stdout + r.stderr
    root, cases = _junit_cases(tmp_path / "j.xml")
    assert set(cases) == {f"length {n}" for n in LENGTHS} | {"all lengths"}
    assert all(s == "pass" for s, _ in cases.values())
    assert root.get("failures") == "0"
    assert "## niah gate: PASS" in (tmp_path / "s.md").read_text()
    assert "## niah gate: PASS" in summary.read_text()  # appended to the CI step summary


def test_real_drop_at_long_lengths_fails(base, tmp_path):
    def drop(cfg, length, depth, trial, rng):
        # from 4096 on, only every other needle comes back
        return "wrong" if length >= 4096 and trial % 2 == 0 else "correct"

    cand = _run(tmp_path / "cand", drop)
    r = _niah("gate", "--baseline", base, "--candidate", cand, "--junit", tmp_path / "j.xml")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "REGRESSION" in r.stdout
    root, cases = _junit_cases(tmp_path / "j.xml")
    failing = {n for n, (s, _) in cases.items() if s == "failure"}
    assert failing == {"length 4096", "length 8192", "all lengths"}
    msg = cases["length 4096"][1].find("failure").get("message")
    assert "4096" in msg and "100.0% -> 50.0%" in msg and "McNemar" in msg
    assert cases["length 1024"][0] == "pass"
    assert root.get("failures") == "3"


def test_small_noise_passes(base, tmp_path):
    # two needles lost at one length out of 20 trials there: a drop of 10 pp that is not
    # significant (McNemar 2 vs 0: p = 0.5)
    def noise(cfg, length, depth, trial, rng):
        return "wrong" if length == 8192 and depth in (0.0, 50.0) and trial == 1 else "correct"

    cand = _run(tmp_path / "cand", noise)
    r = _niah("gate", "--baseline", base, "--candidate", cand)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| 8,192 | 100.0% (20/20) | 90.0% (18/20) | -10.0 pp | 2 lost / 0 gained, p=0.5 | ✅ pass |" in r.stdout


def test_significant_drop_within_tolerance_passes(tmp_path):
    # 1000 trials per length would make a 3 pp drop significant; the tolerance keeps it a pass
    res_base = make_run(tmp_path / "b", {"c": {}}, lengths=(1024,), depths=(0.0,), trials=1000)
    cand = make_run(tmp_path / "c", {"c": {}}, lengths=(1024,), depths=(0.0,), trials=1000,
                    outcome=lambda c, length, d, t, rng: "wrong" if t < 30 else "correct")
    res = run_gate(res_base, cand, tolerance=0.05)
    assert res.exit_code == 0
    row = res.cases[0].row
    assert row.significant and row.diff == pytest.approx(-0.03)
    assert run_gate(res_base, cand, tolerance=0.02).exit_code == 1


def test_exported_baseline_pairs_like_the_run(base, tmp_path):
    out = tmp_path / "baselines" / "embedded.json"
    r = _niah("baseline", "export", base, "-o", out)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["kind"] == "niah-baseline" and data["schema_version"] == 2
    c = data["configs"]["embedded"]
    assert len(c["trials"]) == len(LENGTHS) * len(DEPTHS) * 4
    assert c["summary"]["4096"]["correct"] == 20 and c["summary"]["all"]["recall"] == 1.0
    assert {"key", "prompt_sha256", "outcome", "correct"} <= set(c["trials"][0])

    def drop(cfg, length, depth, trial, rng):
        return "wrong" if length == 8192 and trial < 3 else "correct"

    cand = _run(tmp_path / "cand", drop)
    res = run_gate(out, cand)
    assert res.pairing["embedded"] == "prompt"
    assert [(c.length, c.status) for c in res.failed] == [(8192, "regression"), ("all", "regression")]
    assert _niah("gate", "--baseline", out, "--candidate", cand).returncode == 1
    assert _niah("gate", "--baseline", out, "--candidate", base).returncode == 0


def test_unpaired_falls_back_to_wilson(base, tmp_path):
    def drop(cfg, length, depth, trial, rng):
        return "wrong" if length == 8192 else "correct"

    cand = _run(tmp_path / "cand", drop, seed=99)  # other seeds: other prompts
    res = run_gate(base, cand)
    assert res.pairing["embedded"] is None
    assert any("unpaired" in n for n in res.notes)
    assert {c.length for c in res.failed} == {8192, "all"}
    assert "Newcombe" in res.failed[0].message


def test_outage_fails_and_is_not_a_miss(base, tmp_path):
    def outage(cfg, length, depth, trial, rng):
        return "error" if length == 2048 else "correct"

    cand = _run(tmp_path / "cand", outage)
    r = _niah("gate", "--baseline", base, "--candidate", cand, "--junit", tmp_path / "j.xml")
    assert r.returncode == 1
    _, cases = _junit_cases(tmp_path / "j.xml")
    assert cases["length 2048"][0] == "error"
    assert cases["length 1024"][0] == "pass"


def test_config_selection_and_multi_config(tmp_path):
    cfgs = {"fp8": {"index_dtype": "fp8"}, "bf16": {"index_dtype": "bf16"}}
    b = make_run(tmp_path / "b", cfgs, lengths=(1024, 2048), depths=DEPTHS, trials=4)
    c = make_run(tmp_path / "c", cfgs, lengths=(1024, 2048), depths=DEPTHS, trials=4,
                 outcome={"fp8": always("wrong"), "bf16": always("correct")})
    with pytest.raises(BadInput, match="configuration 'bf16' is unattested: labels index_dtype=bf16"):
        run_gate(b, c, config="bf16")
    # hand-written external runs: their labels are unattested, gated on their word
    assert run_gate(b, c, config="bf16", accept_unattested=True).exit_code == 0
    res = run_gate(b, c, accept_unattested=True)
    assert {c.config for c in res.failed} == {"fp8"}
    r = _niah("gate", "--baseline", b, "--candidate", c, "--config", "nope")
    assert r.returncode == 2 and "no configuration 'nope'" in r.stderr


def test_bad_input_exits_2(base, tmp_path):
    # missing files
    r = _niah("gate", "--baseline", tmp_path / "missing.json", "--candidate", base)
    assert r.returncode == 2 and r.stderr.startswith("niah: error:")
    # runs that do not overlap (no common length)
    other = make_run(tmp_path / "other", {"embedded": {}}, lengths=(65536,), depths=(0.0,), trials=2)
    r = _niah("gate", "--baseline", base, "--candidate", other)
    assert r.returncode == 2 and "do not overlap" in r.stderr
    # schema mismatch: a baseline from a newer niah, and trials from a newer run format
    future = tmp_path / "future.json"
    future.write_text(json.dumps({"kind": "niah-baseline", "schema_version": 99, "configs": {}}))
    r = _niah("gate", "--baseline", future, "--candidate", base)
    assert r.returncode == 2 and "schema_version" in r.stderr
    newer = make_run(tmp_path / "newer", lengths=(1024,), depths=(0.0,), trials=1)
    line = json.loads((newer / "trials.jsonl").read_text().splitlines()[0])
    from niah.runs.trials import SCHEMA_VERSION

    (newer / "trials.jsonl").write_text(json.dumps({**line, "schema_version": SCHEMA_VERSION + 1}) + "\n")
    r = _niah("gate", "--baseline", base, "--candidate", newer)
    assert r.returncode == 2 and "newer" in r.stderr
    # not a baseline at all
    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2]")
    assert _niah("gate", "--baseline", junk, "--candidate", base).returncode == 2
    # bad thresholds
    assert _niah("gate", "--baseline", base, "--candidate", base, "--tolerance", "2").returncode == 2


def test_plan_cli():
    r = _niah("plan", "--recall", "0.95", "--drop", "0.1", "--depths", "5")
    assert r.returncode == 0, r.stderr
    assert "paired (nested errors)" in r.stdout and "unpaired" in r.stdout
    assert " 141 " in r.stdout  # Fleiss, per side
    assert _niah("plan", "--recall", "0.5", "--drop", "0.7").returncode == 2


# -- review fixes: outages on the baseline side, missing configurations, unwritable outputs ----
def test_baseline_outage_is_skipped_not_blamed_on_the_candidate(tmp_path):
    # every baseline trial at the longest length errored; the candidate answered them all
    b = _run(tmp_path / "b", outcome=lambda c, n, d, t, r: "error" if n == LENGTHS[-1] else "correct")
    c = _run(tmp_path / "c")
    res = run_gate(b, c)
    longest = [k for k in res.cases if k.length == LENGTHS[-1]]
    assert [k.status for k in longest] == ["skipped"]
    assert not res.failed


def test_configuration_missing_from_the_candidate_fails(tmp_path):
    b = _run(tmp_path / "b", configs={"fp8": {"index_dtype": "fp8"}, "bf16": {"index_dtype": "bf16"}})
    c = _run(tmp_path / "c", configs={"fp8": {"index_dtype": "fp8"}})
    # hand-written external runs: their labels are unattested, accepted here on their word
    r = _niah("gate", "--baseline", b, "--candidate", c, "--junit", tmp_path / "j.xml", "--accept-unattested")
    assert r.returncode == 1, r.stdout + r.stderr
    _, cases = _junit_cases(tmp_path / "j.xml")
    assert any(status == "error" and "bf16" in (tc.get("classname") or "") + (tc.get("name") or "")
               for status, tc in cases.values())


def test_unwritable_junit_path_is_bad_input_not_a_regression(base, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = _niah("gate", "--baseline", base, "--candidate", base, "--junit", blocker / "sub" / "j.xml")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cannot write" in r.stderr
