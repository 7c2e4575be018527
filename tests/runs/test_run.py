"""niah.runs.run.Run: the one way a sweep opens its folder.

A refusal (a resume with nothing to resume, a folder that is not a niah run's, a caller's
check) leaves the folder as it was and holds no lock; while a Run is open a second one is
refused naming the holder; however the block ends (an error, an interrupt) the lock is
released and every appended trial stays for a resume. The three drivers open it: a plain
sweep and a matrix through the real loop against the loopback oracle server, the spread
coordinator's refusal of an earlier run's job folders.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from niah.errors import BadInput
from niah.runs.manifest import read_manifest
from niah.runs.parts import PARTS
from niah.runs.record import error_record
from niah.runs.run import Run
from niah.runs.trials import read_trials
from niah.sweep import SweepSpec, Target, run_sweep

SPEC = dict(lengths=[300], depths=[50.0], trials=1)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _trial(n: int) -> dict:
    return error_record("cfg", "m", 300, 50.0, n, 0, "an outage")


def test_a_refused_open_changes_nothing_and_holds_no_lock(tmp_path):
    calls = []
    with pytest.raises(BadInput, match="nothing to resume"):
        Run.open(tmp_path / "typo", SweepSpec(**SPEC), resume=True, checks=[calls.append])
    assert not (tmp_path / "typo").exists() and calls == []  # the folder is checked before the caller's checks

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "manifest.json").write_text('{"name": "my-project"}\n')
    with pytest.raises(BadInput, match="is not a niah run folder"):
        Run.open(theirs, SweepSpec(**SPEC), resume=False, checks=[calls.append])
    assert _files(theirs) == {"manifest.json": b'{"name": "my-project"}\n'} and calls == []

    def refuse(folder: Path) -> None:
        calls.append(folder)
        raise BadInput("refused by the caller")

    with pytest.raises(BadInput, match="refused by the caller"):
        Run.open(tmp_path / "new", SweepSpec(**SPEC), resume=False, checks=[refuse])
    assert calls == [tmp_path / "new"] and not (tmp_path / "new").exists()


def test_one_run_at_a_time_and_the_lock_ends_with_the_block(tmp_path):
    out = tmp_path / "run"
    with Run.open(out, SweepSpec(**SPEC), resume=False) as run:
        run.append(_trial(0))
        with pytest.raises(BadInput, match="in use by another sweep"):
            Run.open(out, SweepSpec(**SPEC), resume=True)
    with pytest.raises(KeyboardInterrupt):
        with Run.open(out, SweepSpec(**SPEC), resume=True) as run:
            assert run.done == set()  # an error trial runs again on resume (set aside)
            run.append(_trial(0))
            run.append(_trial(1))
            raise KeyboardInterrupt("SIGTERM")
    with Run.open(out, SweepSpec(**SPEC), resume=True) as run:  # the interrupt released the lock
        assert len(run.done) == 0
        assert [json.loads(x)["trial"] for x in (out / "trials.errors.jsonl").read_text().splitlines()] == [0, 0, 1]
    run.close()  # closing twice does nothing
    assert len(read_manifest(out)["resumed"]) == 2


def test_a_resume_that_changes_the_prompts_is_refused_before_anything_changes(tmp_path):
    out = tmp_path / "run"
    with Run.open(out, SweepSpec(**SPEC, seed=1), resume=False) as run:
        run.append({**_trial(0), "outcome": "correct", "error": None})
    before = _files(out)
    with pytest.raises(BadInput, match="different seed"):
        Run.open(out, SweepSpec(**SPEC, seed=2), resume=True)
    assert {k: v for k, v in _files(out).items() if k != ".niah.lock"} == \
           {k: v for k, v in before.items() if k != ".niah.lock"}


def test_the_plain_sweep_opens_one_run_and_resumes_it(oracle, tmp_path):
    out = tmp_path / "run"
    run_sweep([Target(oracle.url, name="a")], SweepSpec(**SPEC), out)
    with pytest.raises(BadInput, match="already holds trials"):
        run_sweep([Target(oracle.url, name="a")], SweepSpec(**SPEC), out)
    run_sweep([Target(oracle.url, name="a")], SweepSpec(lengths=[300], depths=[50.0], trials=2), out, resume=True)
    assert sorted(r["trial"] for r in read_trials(out).records) == [0, 1]
    manifest = read_manifest(out)
    assert manifest["configs"]["a"]["endpoint"] == oracle.url and len(manifest["resumed"]) == 1
    with Run.open(out, SweepSpec(lengths=[300], depths=[50.0], trials=2), resume=True):
        pass  # the sweep released its lock


def test_a_spread_matrix_refuses_an_earlier_runs_job_folders(tmp_path):
    from niah.serving.matrix import load_matrix, spread_matrix
    from niah.serving.matrix.executor import Executor

    (tmp_path / "m.toml").write_text('[[config]]\nname = "ext"\nengine = "external"\nendpoint = "http://127.0.0.1:9/v1"\n')
    out = tmp_path / "run"
    (out / PARTS / "old").mkdir(parents=True)
    with pytest.raises(BadInput, match=r"job folders \(parts/\) of an earlier run"):
        spread_matrix(load_matrix(tmp_path / "m.toml"), SweepSpec(**SPEC), out,
                      Executor("local", {"gpus_per_config": 1, "gpus": ["0"]}))
    assert _files(out) == {}
