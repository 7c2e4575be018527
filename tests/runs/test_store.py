"""The run folder: durable appends, resume, truncated lines, error retry, schema checks."""

import json

import pytest

from niah.errors import BadInput
from niah.runs.trials import ERRORS, SCHEMA_VERSION, TRIALS, RunStore, load_run, read_trials
from niah.runs.manifest import write_manifest


def _trial(trial, outcome="correct", config="c"):
    return {"config": config, "length": 500, "depth": 50.0, "trial": trial,
            "outcome": outcome, "correct": outcome == "correct"}


def test_append_is_durable_and_never_writes_a_key_twice(tmp_path):
    with RunStore(tmp_path).open(resume=False) as store:
        store.append(_trial(0))
        store.append(_trial(0))  # same key: ignored
        store.append(_trial(1))
    recs = read_trials(tmp_path).records
    assert [r["trial"] for r in recs] == [0, 1]
    assert all(r["schema_version"] == SCHEMA_VERSION for r in recs)


def test_existing_trials_need_resume(tmp_path):
    with RunStore(tmp_path).open(resume=False) as store:
        store.append(_trial(0))
    with pytest.raises(BadInput, match="--resume"):
        RunStore(tmp_path).open(resume=False)


def test_truncated_last_line_is_skipped_and_dropped_on_resume(tmp_path):
    with RunStore(tmp_path).open(resume=False) as store:
        store.append(_trial(0))
        store.append(_trial(1))
    with open(tmp_path / TRIALS, "a") as f:
        f.write('{"config": "c", "length": 500, "dep')  # kill -9 mid-write
    assert read_trials(tmp_path).skipped_lines == [3]
    with RunStore(tmp_path).open(resume=True) as store:
        assert store.skipped_lines == [3]
        assert len(store.done) == 2
        store.append(_trial(2))
    loaded = read_trials(tmp_path)
    assert loaded.skipped_lines == []
    assert [r["trial"] for r in loaded.records] == [0, 1, 2]


def test_resume_retries_errors_and_keeps_one_record_per_trial(tmp_path):
    with RunStore(tmp_path).open(resume=False) as store:
        store.append(_trial(0))
        store.append(_trial(1, outcome="error"))
        store.append(_trial(2, outcome="wrong"))
    with RunStore(tmp_path).open(resume=True) as store:
        assert store.retried == 1
        assert "c|500|50|1" not in store.done  # the outage is a gap again
        store.append(_trial(1))
    recs = read_trials(tmp_path).records
    assert sorted(r["trial"] for r in recs) == [0, 1, 2]
    assert {r["trial"]: r["outcome"] for r in recs}[1] == "correct"
    archived = [json.loads(line) for line in (tmp_path / ERRORS).read_text().splitlines()]
    assert [(r["trial"], r["outcome"]) for r in archived] == [(1, "error")]


def test_newer_schema_is_refused(tmp_path):
    write_manifest(tmp_path, {"args": {}})
    (tmp_path / TRIALS).write_text(json.dumps({**_trial(0), "schema_version": SCHEMA_VERSION + 1}) + "\n")
    with pytest.raises(BadInput, match="newer"):
        load_run(tmp_path)


def test_unwritable_folder_is_bad_input(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(BadInput, match="cannot write"):
        RunStore(blocker / "run").open(resume=False)
