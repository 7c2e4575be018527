"""`niah sweep` exits 0 only when every trial has an answer: a sweep whose requests failed
(HTTP 503 on every completion, or on some) exits 1 and says how many, bad input exits 2,
and the resume that fills the gaps exits 0. Real sweeps against the loopback oracle server,
through the real command line (docs/ci.md has the table of every command's codes)."""

from __future__ import annotations

import json
import subprocess
import sys

from niah.runs.trials import read_trials


def _sweep(url, out, *extra):
    args = ["sweep", "--endpoint", url, "--lengths", "300", "--depths", "0,100", "--trials", "2",
            "--retries", "0", "--out", out, "--quiet", *extra]
    return subprocess.run([sys.executable, "-m", "niah", *map(str, args)], capture_output=True, text=True)


def test_a_sweep_whose_every_request_failed_exits_1(oracle_factory, tmp_path):
    srv = oracle_factory("--fail-first", "100000")  # HTTP 503 on every completion
    r = _sweep(srv.url, tmp_path / "run")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "4 of 4 trial(s) got no answer" in r.stderr and "--resume" in r.stderr
    assert "Traceback" not in r.stderr
    assert [x["outcome"] for x in read_trials(tmp_path / "run").records] == ["error"] * 4


def test_some_failed_exits_1_and_the_resume_that_answers_them_exits_0(oracle_factory, tmp_path):
    srv = oracle_factory("--fail-first", "1")  # the first completion gets a 503, the rest answer
    out = tmp_path / "run"
    r = _sweep(srv.url, out)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 of 4 trial(s) got no answer" in r.stderr
    r = _sweep(srv.url, out, "--resume")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(x["outcome"] for x in read_trials(out).records) == ["correct"] * 4


def test_every_answer_exits_0_and_bad_input_exits_2(oracle, tmp_path):
    r = _sweep(oracle.url, tmp_path / "run")
    assert r.returncode == 0, r.stdout + r.stderr
    assert all(json.loads(x)["outcome"] == "correct"
               for x in (tmp_path / "run" / "trials.jsonl").read_text().splitlines())
    r = _sweep(oracle.url, tmp_path / "run")  # the folder holds trials: --resume or another --out
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    r = _sweep(oracle.url, tmp_path / "bad", "--depths", "150")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
