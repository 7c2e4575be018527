"""Run-folder integrity (niah.runs.integrity): duplicated trial keys, lines that are not
records, fields that cannot be read, trials outside the folder's prompt set and unreadable
attestation readings. `report` lists them at the top of its summary; `compare`, `gate` and
`baseline export` refuse the folder (exit 2, one line, no traceback). The last line of
trials.jsonl cut short by a kill stays tolerated, and `--resume` still repairs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_inproc import niah
from report_runs import always, make_run

from niah.sweep import SweepSpec, Target, run_sweep

LENGTHS = (1024, 2048)
DEPTHS = (0.0, 50.0, 100.0)


def _niah_process(*args):
    return subprocess.run([sys.executable, "-m", "niah", *map(str, args)], capture_output=True, text=True)


def _run(path, **kw):
    return make_run(path, {"embedded": {}}, lengths=LENGTHS, depths=DEPTHS, trials=4, seed=3, **kw)


def _lines(run):
    return (run / "trials.jsonl").read_text().splitlines()


def _write(run, lines):
    (run / "trials.jsonl").write_text("".join(line + "\n" for line in lines))


def _summary_head(run, tmp_path) -> str:
    r = niah("report", run, "--out", tmp_path / "rep")
    assert r.returncode == 0, r.stdout + r.stderr
    text = (tmp_path / "rep" / "summary.md").read_text()
    return text[: text.index("## Recall by configuration and length")], r.stdout


def _one_line_refusal(r, *words):
    assert r.returncode == 2, r.stdout + r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("niah: error:"), r.stderr
    for w in words:
        assert w in err[0], err[0]
    assert "Traceback" not in r.stderr


# -- duplicated trial keys ----------------------------------------------------------------------
def test_a_duplicated_trial_key_is_refused_by_compare_and_gate_and_named_by_report(tmp_path):
    base = _run(tmp_path / "base")
    cand = _run(tmp_path / "cand")
    lines = _lines(cand)
    # the same trial again, this time wrong: the old report counted both, compare/gate the first
    dup = {**json.loads(lines[0]), "outcome": "wrong", "correct": False, "answer": "0"}
    _write(cand, [*lines, json.dumps(dup)])

    _one_line_refusal(niah("gate", "--baseline", base, "--candidate", cand), "more than once", "embedded|1024|0|0")
    _one_line_refusal(niah("compare", base, cand), "more than once")
    _one_line_refusal(niah("baseline", "export", cand, "-o", tmp_path / "b.json"), "more than once")
    head, stdout = _summary_head(cand, tmp_path)
    assert "integrity problem" in head and "embedded|1024|0|0 at 1, 25" in head
    assert "WARNING" in stdout.splitlines()[0] and "more than once" in stdout
    # the tables count the trial once (the first record, as a resume does): 100%, not 24/25
    text = (tmp_path / "rep" / "summary.md").read_text()
    assert "100.0% [" in text and "(24/24)" in text and "(24/25)" not in text


# -- lines that are not records; the cut last line ---------------------------------------------
def test_a_corrupt_line_in_the_middle_is_refused_not_dropped_with_a_warning(tmp_path):
    base = _run(tmp_path / "base")
    cand = _run(tmp_path / "cand")
    lines = _lines(cand)
    _write(cand, [*lines[:5], '{"schema_version": 2, "config": "embedded", "len', *lines[5:]])

    r = _niah_process("gate", "--baseline", base, "--candidate", cand)
    _one_line_refusal(r, "line(s) 6", "not JSON")
    assert "UserWarning" not in r.stderr
    head, _ = _summary_head(cand, tmp_path)
    assert "trials.jsonl line(s) 6 are not JSON records" in head


def test_the_last_line_cut_by_a_kill_is_tolerated_but_the_gate_sees_the_trial_missing(tmp_path):
    base = _run(tmp_path / "base")
    cand = _run(tmp_path / "cand")
    lines = _lines(cand)
    last = json.loads(lines[-1])
    _write(cand, lines[:-1])
    with open(cand / "trials.jsonl", "a") as f:
        f.write(lines[-1][:40])  # what a kill in the middle of a write leaves: no newline

    head, stdout = _summary_head(cand, tmp_path)
    assert "integrity problem" not in head and f"line {len(lines)} was cut short" in head
    assert "WARNING" not in stdout and "note:" in stdout
    r = niah("gate", "--baseline", base, "--candidate", cand, "--junit", tmp_path / "j.xml")
    assert r.returncode == 1, r.stdout + r.stderr  # an outage that names the trial, not a pass
    assert f"depth {last['depth']:g}% trial {last['trial']}" in r.stdout and "was cut short" in r.stdout
    assert "OUTAGE" in r.stdout


# -- fields that cannot be read -----------------------------------------------------------------
@pytest.mark.parametrize("field, value, words", [
    ("length", "abc", "length 'abc' is not a positive integer"),
    ("depth", "50", "depth '50' is not a percentage"),
    ("outcome", "maybe", "outcome 'maybe'"),
    ("latency_s", "slow", "latency_s 'slow' is not a number"),
    ("selection_recall", ["x"], "selection_recall"),
])
def test_a_corrupt_field_is_refused_in_one_line_and_named_by_report(tmp_path, field, value, words):
    base = _run(tmp_path / "base")
    cand = _run(tmp_path / "cand")
    lines = _lines(cand)
    rec = json.loads(lines[3])
    rec[field] = value
    _write(cand, [*lines[:3], json.dumps(rec), *lines[4:]])

    _one_line_refusal(niah("gate", "--baseline", base, "--candidate", cand), "line 4", words)
    _one_line_refusal(niah("compare", cand, base), words)
    head, _ = _summary_head(cand, tmp_path)
    assert f"line 4: {words}" in head


def test_corrupt_fields_never_give_a_traceback_at_the_real_edge(tmp_path):
    base = _run(tmp_path / "base")
    cand = _run(tmp_path / "cand")
    lines = _lines(cand)
    _write(cand, [*lines[:2], json.dumps({**json.loads(lines[2]), "length": "abc"}), *lines[3:]])
    for args in (("gate", "--baseline", base, "--candidate", cand), ("compare", base, cand),
                 ("report", cand, "--out", tmp_path / "rep")):
        r = _niah_process(*args)
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode == (0 if args[0] == "report" else 2), r.stdout + r.stderr
    assert "length 'abc'" in (tmp_path / "rep" / "summary.md").read_text()


def test_a_corrupt_baseline_file_is_refused(tmp_path):
    run = _run(tmp_path / "run")
    out = tmp_path / "b.json"
    assert niah("baseline", "export", run, "-o", out).returncode == 0
    data = json.loads(out.read_text())
    data["configs"]["embedded"]["trials"][0]["rank"] = "deep"
    data["configs"]["embedded"]["trials"][1]["length"] = "abc"
    out.write_text(json.dumps(data))
    _one_line_refusal(niah("gate", "--baseline", out, "--candidate", run), "baseline", "cannot be read")
    data["configs"]["embedded"]["trials"][0]["rank"] = None
    data["configs"]["embedded"]["trials"][1] = dict(data["configs"]["embedded"]["trials"][2])
    out.write_text(json.dumps(data))
    _one_line_refusal(niah("gate", "--baseline", out, "--candidate", run), "more than once")


def test_an_attestation_reading_that_is_not_one_is_refused_and_reported(tmp_path):
    base = _run(tmp_path / "base")
    cand = _run(tmp_path / "cand")
    manifest = json.loads((cand / "manifest.json").read_text())
    manifest["configs"]["embedded"]["attestation"] = {"segments": [{"start": None, "end": "yesterday"}]}
    (cand / "manifest.json").write_text(json.dumps(manifest))
    r = _niah_process("gate", "--baseline", base, "--candidate", cand)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "segment 1's end reading" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _niah_process("report", cand, "--out", tmp_path / "rep")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    text = (tmp_path / "rep" / "summary.md").read_text()
    assert "segment 1's end reading 'yesterday' is not a reading" in text


# -- trials outside the folder's prompt set (real sweeps on a loopback server) ------------------
def test_trials_of_another_run_appended_are_refused(oracle, tmp_path):
    spec = dict(lengths=[300, 500], depths=[0, 100], trials=2)
    run = run_sweep([Target(oracle.url)], SweepSpec(**spec, seed=0), tmp_path / "run")
    other = run_sweep([Target(oracle.url)], SweepSpec(**spec, seed=1), tmp_path / "other")
    # the untouched run and a baseline exported from it gate PASS against it
    assert niah("gate", "--baseline", run, "--candidate", run).returncode == 0
    assert niah("baseline", "export", run, "-o", tmp_path / "b.json").returncode == 0
    r = niah("gate", "--baseline", tmp_path / "b.json", "--candidate", run)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr

    # another run's trial under a key this run has not recorded: a trial it never sent
    lines = _lines(run)
    _write(run, lines[:-1])
    _write(run, [*lines[:-1], _lines(other)[-1]])
    _one_line_refusal(niah("gate", "--baseline", tmp_path / "b.json", "--candidate", run),
                      "not in the run's prompt set")
    head, _ = _summary_head(run, tmp_path)
    assert "1 trial(s) whose prompt is not in the run's prompt set" in head


def test_resume_onto_a_corrupt_record_is_refused_before_anything_changes(oracle, tmp_path):
    out = tmp_path / "run"
    args = ["sweep", "--endpoint", oracle.url, "--lengths", "300", "--depths", "0,100", "--trials", "2",
            "--out", out, "--quiet"]
    assert _niah_process(*args).returncode == 0
    lines = _lines(out)
    _write(out, [*lines[:1], json.dumps({**json.loads(lines[1]), "length": "abc"}), *lines[2:]])
    before = (out / "trials.jsonl").read_bytes()
    r = _niah_process(*args, "--resume")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "trials.jsonl:2: trial record length 'abc' is not a positive integer" in r.stderr
    assert (out / "trials.jsonl").read_bytes() == before


def test_a_clean_folder_has_no_problem_and_report_says_nothing(tmp_path):
    run = _run(tmp_path / "run", outcome=always("correct"))
    head, stdout = _summary_head(run, tmp_path)
    assert "integrity" not in head and "note" not in head and "WARNING" not in stdout


def test_a_prompt_line_cut_by_a_kill_is_written_again_on_its_own_line_and_the_resume_gates_pass(oracle, tmp_path):
    out = tmp_path / "run"
    args = ["sweep", "--endpoint", oracle.url, "--lengths", "300,500", "--depths", "0,100", "--trials", "2",
            "--out", out, "--quiet"]
    assert _niah_process(*args).returncode == 0
    assert niah("baseline", "export", out, "-o", tmp_path / "b.json").returncode == 0
    # a kill while the last prompt was being logged: its line is cut, its trial never written
    lines = _lines(out)
    last = json.loads(lines[-1])
    _write(out, lines[:-1])
    prompts = (out / "prompts.jsonl").read_text().splitlines()
    (i,) = [n for n, p in enumerate(prompts) if json.loads(p)["prompt_sha256"] == last["prompt_sha256"]]
    rest = [p for n, p in enumerate(prompts) if n != i]
    (out / "prompts.jsonl").write_text("".join(p + "\n" for p in rest) + prompts[i][:100])

    r = _niah_process(*args, "--resume")
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(_lines(out)) == len(lines)
    r = niah("gate", "--baseline", tmp_path / "b.json", "--candidate", out)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
    head, _ = _summary_head(out, tmp_path)
    assert "integrity" not in head
