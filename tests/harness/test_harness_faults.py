"""Faults: retries, dropped connections, kill -9 and resume, and every bad-input error."""

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter

import pytest

from niah.runs.trials import load_run, read_trials, record_key
from niah.sweep import SweepSpec, Target, run_sweep


def niah(*args, **kw):
    from cli_inproc import niah as run  # the entry point in this process (tests/cli_inproc.py)

    return run(*args, **kw)


def test_retries_injected_503s(oracle_factory, tmp_path):
    srv = oracle_factory("--fail-first", "2")
    spec = SweepSpec(lengths=[400], depths=[0, 100], trials=2, retries=3)
    run_sweep([Target(srv.url)], spec, tmp_path / "run")
    _, recs = load_run(tmp_path / "run")
    assert [r["outcome"] for r in recs] == ["correct"] * 4
    assert recs[0]["attempts"] == 3 and all(r["attempts"] == 1 for r in recs[1:])
    st = srv.stats()
    assert st["failed_503"] == 2 and st["answered"] - st["probes"] == 4


@pytest.mark.parametrize("stream", [True, False])
def test_retries_dropped_connections(oracle_factory, tmp_path, stream):
    srv = oracle_factory("--drop-every", "3")
    spec = SweepSpec(lengths=[400], depths=[0, 50, 100], trials=2, retries=2, stream=stream, concurrency=2)
    run_sweep([Target(srv.url)], spec, tmp_path / "run")
    _, recs = load_run(tmp_path / "run")
    assert len(recs) == 6 and all(r["outcome"] == "correct" for r in recs), recs
    st = srv.stats()
    assert st["dropped"] >= 2 and st["answered"] - st["probes"] == 6
    assert sum(r["attempts"] for r in recs) == st["generate"] - st["probes"]


def test_retries_are_bounded(oracle_factory, tmp_path):
    srv = oracle_factory("--fail-first", "1000")
    spec = SweepSpec(lengths=[400], depths=[50], trials=2, retries=2)
    run_sweep([Target(srv.url)], spec, tmp_path / "run")
    _, recs = load_run(tmp_path / "run")
    for r in recs:
        assert r["outcome"] == "error" and r["attempts"] == 3
        assert "HTTP 503" in r["error"] and "gave up after 3 attempts" in r["error"]
    assert srv.stats()["generate"] - srv.stats()["probes"] == 6


def test_kill_9_then_resume_gives_exactly_one_record_per_trial(oracle_factory, tmp_path):
    srv = oracle_factory("--delay", "0.25")
    out = tmp_path / "run"
    args = ["sweep", "--endpoint", srv.url, "--lengths", "300,600", "--depths", "0,50,100",
            "--trials", "3", "--out", out, "--quiet"]
    proc = subprocess.Popen([sys.executable, "-m", "niah", *map(str, args)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trials = out / "trials.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if trials.exists() and len(trials.read_bytes().splitlines()) >= 5:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = read_trials(out).records
    assert 5 <= len(kept) < 18
    with open(trials, "a") as f:  # what a kill in the middle of a write leaves behind
        f.write('{"schema_version": 1, "config": "default", "length": 600, "dep')

    r = niah(*args, "--resume")
    assert r.returncode == 0, r.stderr
    assert f"skipped unreadable line(s) [{len(kept) + 1}]" in r.stderr
    _, recs = load_run(out)
    keys = Counter(record_key(x) for x in recs)
    assert len(keys) == 18 and set(keys.values()) == {1}
    assert recs[: len(kept)] == kept  # what was measured before the kill is untouched
    sent = srv.stats()["generate"] - srv.stats()["probes"]
    assert 18 <= sent <= 19  # at most the one trial in flight was asked twice

    r = niah(*args, "--resume")  # nothing left: no request, no new line
    assert r.returncode == 0, r.stderr
    assert srv.stats()["generate"] - srv.stats()["probes"] == sent
    assert len(read_trials(out).records) == 18
    manifest, _ = load_run(out)
    assert len(manifest["resumed"]) == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line_exit_2(r):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("niah: error:"), r.stderr
    return lines[0]


def test_bad_input_errors(oracle_factory, tmp_path):
    srv = oracle_factory("--max-model-len", "2048")
    base = ["sweep", "--endpoint", srv.url, "--lengths", "500", "--depths", "50", "--trials", "1", "--quiet"]

    def run(*extra, out="run"):
        return niah(*base, "--out", tmp_path / out, *extra)

    line = _one_line_exit_2(niah("sweep", "--endpoint", f"http://127.0.0.1:{_free_port()}/v1",
                                 "--lengths", "500", "--out", tmp_path / "x"))
    assert "cannot reach" in line
    assert "outside 0-100" in _one_line_exit_2(run("--depths", "0,120"))
    assert "--trials must be at least 1" in _one_line_exit_2(run("--trials", "0"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert "cannot write to run folder" in _one_line_exit_2(niah(*base, "--out", blocker / "run"))
    assert "unknown tokenizer spec" in _one_line_exit_2(run("--tokenizer", "sentencepiece:foo"))
    line = _one_line_exit_2(run("--lengths", "300,4k"))
    assert "length 4000 + max_tokens 32" in line and "2048" in line
    assert "bad length" in _one_line_exit_2(run("--lengths", "lots"))
    assert "not served" in _one_line_exit_2(run("--model", "nope"))
    assert "too short" in _one_line_exit_2(run("--lengths", "40"))
    assert "--tokenizer server" in _one_line_exit_2(
        niah("sweep", "--endpoint", oracle_factory("--no-tokenize").url, "--tokenizer", "server",
             "--lengths", "500", "--out", tmp_path / "y"))

    big = oracle_factory("--max-model-len", "1000000")
    assert "longer than the bundled corpus" in _one_line_exit_2(
        niah("sweep", "--endpoint", big.url, "--lengths", "300k", "--out", tmp_path / "z"))

    assert run(out="ok").returncode == 0
    assert "already holds trials" in _one_line_exit_2(run(out="ok"))
    assert "different seed" in _one_line_exit_2(run("--resume", "--seed", "9", out="ok"))
    assert "unknown export format" in _one_line_exit_2(niah("export", tmp_path / "ok", "--format", "xlsx"))
    assert "no run folder" in _one_line_exit_2(niah("export", tmp_path / "not-there", "--format", "csv"))


def test_ctrl_c_keeps_finished_trials(oracle_factory, tmp_path):
    srv = oracle_factory("--delay", "0.2")
    out = tmp_path / "run"
    args = ["sweep", "--endpoint", srv.url, "--lengths", "300", "--depths", "0,50,100",
            "--trials", "4", "--concurrency", "2", "--out", out]
    proc = subprocess.Popen([sys.executable, "-m", "niah", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    trials = out / "trials.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if trials.exists() and len(trials.read_bytes().splitlines()) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted (SIGINT): finished trials are saved" in err and "--resume" in err
    kept = read_trials(out)
    assert not kept.skipped_lines and 3 <= len(kept.records) < 12
    r = niah(*args, "--resume", "--quiet")
    assert r.returncode == 0, r.stderr
    _, recs = load_run(out)
    assert len({record_key(x) for x in recs}) == len(recs) == 12
    assert all(x["outcome"] == "correct" for x in recs)


def test_a_sigterm_inside_an_anyio_task_group_reaches_the_sweep_as_an_interrupt():
    """httpx connects inside an anyio task group, which wraps the KeyboardInterrupt that SIGTERM
    raises there in an exception group; the sweep's clean-up (exit 143, trials kept) must see
    the interrupt itself, not a traceback."""
    import asyncio

    import anyio

    from niah.sweep.interrupt import run_async, terminate_as_interrupt

    async def connecting():
        async with anyio.create_task_group() as group:
            group.start_soon(anyio.sleep, 30)
            await anyio.sleep(0.01)
            os.kill(os.getpid(), signal.SIGTERM)
            await anyio.sleep(30)

    with terminate_as_interrupt():
        with pytest.raises(BaseException) as plain:
            asyncio.run(connecting())
        assert not isinstance(plain.value, KeyboardInterrupt)  # what the sweep saw before: a group
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            run_async(connecting())


@pytest.mark.parametrize("tokenizer", ["usage", "server"])
def test_external_server_gone_stops_and_resume_fills_the_gap(oracle_factory, tmp_path, tokenizer):
    """A server niah did not launch dies: nothing measured is lost, nothing is faked."""
    srv = oracle_factory("--delay", "0.2")
    out = tmp_path / "run"
    args = ["--lengths", "300,500", "--depths", "0,50,100", "--trials", "2", "--out", out,
            "--quiet", "--retries", "1", "--tokenizer", tokenizer]
    proc = subprocess.Popen([sys.executable, "-m", "niah", "sweep", "--endpoint", srv.url, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    trials = out / "trials.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if trials.exists() and len(trials.read_bytes().splitlines()) >= 3:
            break
        time.sleep(0.05)
    srv.stop()  # kill -9 of the server
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "stopped answering" in err and "rerun with --resume" in err
    kept = read_trials(out).records
    assert 3 <= len(kept) < 12 and all(r["outcome"] == "correct" for r in kept)

    again = oracle_factory()  # back, on another port: another endpoint as far as niah knows
    line = _one_line_exit_2(niah("sweep", "--endpoint", again.url, *args, "--resume"))
    assert "was measured at endpoint" in line and "--force-config" in line
    r = niah("sweep", "--endpoint", again.url, *args, "--resume", "--force-config")
    assert r.returncode == 0, r.stderr
    _, recs = load_run(out)
    assert len({record_key(x) for x in recs}) == len(recs) == 12
    assert all(x["outcome"] == "correct" for x in recs)
