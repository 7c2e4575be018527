"""Interrupted and resumed sweeps stay comparable; every label is proven at every reading.

Real `niah sweep` subprocesses against real loopback servers: the oracle (tests/servers/
oracle.py, reporting a niah_attestation given by --attestation) and, in the slow test, the
embedded model server (`niah serve`). A sweep stopped by SIGTERM, or killed by SIGKILL,
then resumed to the end, gates PASS against itself; a server that comes back with another
index_topk, or contradicts a label at the start, is refused naming the axis; trials under
a configuration the manifest does not know are refused by compare and gate.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

try:
    from tests.conftest import OracleServer
    from tests.lifecycle_helpers import ROOT, read_manifest, read_trials, wait_for
except ImportError:
    from oracle_server import OracleServer
    from lifecycle_helpers import ROOT, read_manifest, read_trials, wait_for  # type: ignore


def niah(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "niah", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def start_sweep(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "niah", "sweep", *args, "--quiet"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def attesting(topk: int, *flags: str) -> list[str]:
    return ["--attestation", json.dumps({"facts": {"index_topk": topk}}), *flags]


def topk_matrix(tmp_path: Path, port: int, topk: int = 128) -> Path:
    m = tmp_path / "m.toml"
    m.write_text(f'engine = "external"\nendpoint = "http://127.0.0.1:{port}/v1"\n'
                 f'[[config]]\nname = "k{topk}"\nindex_topk = {topk}\n')
    return m


GRID = ("--lengths", "300", "--depths", "0:100:8", "--trials", "1")


def interrupt(proc: subprocess.Popen, run: Path, sig: int, trials: int = 2) -> tuple[str, str]:
    try:
        wait_for(lambda: len(read_trials(run)) >= trials, timeout=240, what=f"{trials} finished trials")
        proc.send_signal(sig)
        return proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_keeps_trials_says_how_to_resume_and_the_resumed_run_gates_pass(tmp_path):
    srv = OracleServer(*attesting(128, "--delay", "0.3"))
    try:
        matrix, run = topk_matrix(tmp_path, srv.port), tmp_path / "run"
        proc = start_sweep("--matrix", str(matrix), *GRID, "--out", str(run))
        _, err = interrupt(proc, run, signal.SIGTERM)
        assert proc.returncode == 143, err
        lines = [ln for ln in err.splitlines() if "interrupted" in ln]
        assert len(lines) == 1 and lines[0].startswith("niah: interrupted (SIGTERM)"), err
        assert (lines[0].endswith("--resume") and f"--out {run}" in lines[0]
                and "resume with: niah sweep --matrix" in lines[0])
        seg = read_manifest(run)["configs"]["k128"]["attestation"]["segments"]
        assert len(seg) == 1 and seg[0]["end"]["attestation"]["facts"] == {"index_topk": 128}  # read at the end
        kept = len(read_trials(run))
        assert 2 <= kept < 8
        done = niah("sweep", "--matrix", str(matrix), *GRID, "--out", str(run), "--resume", "--quiet")
        assert done.returncode == 0, done.stderr
        assert len(read_trials(run)) == 8
    finally:
        srv.stop()
    gate = niah("gate", "--baseline", str(run), "--candidate", str(run))
    assert gate.returncode == 0, gate.stdout + gate.stderr
    report = niah("report", str(run), "--out", str(tmp_path / "rep"))
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "rep" / "report.md").read_text() if (tmp_path / "rep" / "report.md").exists() else report.stdout
    assert "INVALID" not in text


def test_a_server_restarted_with_another_index_topk_is_refused_naming_the_axis(tmp_path):
    # 1 s a reply: the sweep cannot finish its 8 trials before the signal after the second
    srv = OracleServer(*attesting(128, "--delay", "1.0"))
    port = srv.port
    matrix, run = topk_matrix(tmp_path, port), tmp_path / "run"
    try:
        proc = start_sweep("--matrix", str(matrix), *GRID, "--out", str(run))
        _, err = interrupt(proc, run, signal.SIGTERM)
        assert proc.returncode == 143 and len(read_trials(run)) < 8, err  # interrupted, trials left
    finally:
        srv.stop()
    srv = OracleServer("--port", str(port), *attesting(512))  # the "same" server, restarted with top-k 512
    try:
        resumed = niah("sweep", "--matrix", str(matrix), *GRID, "--out", str(run), "--resume", "--quiet")
    finally:
        srv.stop()
    assert resumed.returncode == 2, resumed.stderr
    assert "came back different" in resumed.stderr and "index_topk 128 -> 512" in resumed.stderr
    assert "Traceback" not in resumed.stderr
    gate = niah("gate", "--baseline", str(run), "--candidate", str(run))
    assert gate.returncode == 2 and "INVALID" in gate.stderr and "index_topk 128 -> 512" in gate.stderr


def test_a_start_of_sweep_contradiction_is_refused_before_any_trial(tmp_path):
    srv = OracleServer(*attesting(512))
    try:
        run = tmp_path / "run"
        r = niah("sweep", "--matrix", str(topk_matrix(tmp_path, srv.port, topk=128)), *GRID, "--out", str(run),
                 "--quiet")
    finally:
        srv.stop()
    assert r.returncode == 2, r.stderr
    assert "labelled index_topk 128 but the server ran 512 at the start of the sweep" in r.stderr
    assert read_trials(run) == []


def test_trials_of_a_configuration_the_manifest_does_not_know_are_refused(oracle, tmp_path):
    run = tmp_path / "run"
    r = niah("sweep", "--endpoint", oracle.url, *GRID, "--out", str(run), "--quiet")
    assert r.returncode == 0, r.stderr
    ok = niah("gate", "--baseline", str(run), "--candidate", str(run))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = (run / "trials.jsonl").read_text().splitlines()
    with (run / "trials.jsonl").open("a") as f:
        for ln in lines:
            f.write(json.dumps({**json.loads(ln), "config": "intruder"}) + "\n")
    for cmd in (("gate", "--baseline", str(run), "--candidate", str(run)),
                ("compare", str(run), str(run))):
        res = niah(*cmd)
        assert res.returncode == 2, (cmd, res.stdout, res.stderr)
        assert "'intruder'" in res.stderr and "manifest does not" in res.stderr and "Traceback" not in res.stderr


# -- the embedded model server, killed and resumed ---------------------------------------------
def _serve(port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "niah", "serve", "--attention", "dsa", "--index-dtype", "bf16", "--index-topk", "64",
           "--threads", "1", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    end = time.monotonic() + 300
    for line in proc.stdout:
        if "ready on" in line:
            return proc
        if time.monotonic() > end:
            break
    proc.kill()
    raise AssertionError("niah serve did not get ready")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_an_interrupted_sweep_of_niah_serve_resumes_valid_and_gates_pass(tmp_path, sig):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    grid = ("--lengths", "400", "--depths", "0,50,100", "--trials", "1", "--max-tokens", "12")
    run, endpoint = tmp_path / "run", f"http://127.0.0.1:{port}/v1"
    server = _serve(port)
    try:
        proc = start_sweep("--endpoint", endpoint, *grid, "--out", str(run))
        _, err = interrupt(proc, run, sig, trials=1)
        assert proc.returncode == (143 if sig == signal.SIGTERM else -signal.SIGKILL), err
        if sig == signal.SIGKILL:  # and the server with it: a restart between the segments
            server.kill()
            server.wait()
            server = _serve(port)
        done = niah("sweep", "--endpoint", endpoint, *grid, "--out", str(run), "--resume", "--quiet", timeout=600)
        assert done.returncode == 0, done.stderr
    finally:
        server.kill()
        server.wait()
    segs = read_manifest(run)["configs"]["default"]["attestation"]["segments"]
    assert len(segs) == 2 and (segs[0]["end"] is None) == (sig == signal.SIGKILL)
    assert "INVALID" not in done.stderr
    gate = niah("gate", "--baseline", str(run), "--candidate", str(run))
    assert gate.returncode == 0, gate.stdout + gate.stderr


def test_measured_facts_may_change_between_readings_what_the_server_is_may_not():
    """The committed H200 run: its GPU server reports peak memory per prompt length as facts,
    which grow during a sweep; every arm stays valid. The same run with index_topk changed in
    its end reading is INVALID, naming the axis."""
    import copy

    from niah.attestation import INVALID, VALID, status

    configs = read_manifest(ROOT / "results" / "h200-seed-sweep")["configs"]
    for name, entry in configs.items():
        assert status(entry)[0] == VALID, (name, status(entry))
    entry = copy.deepcopy(configs["fp8-k512"])
    end = entry["attestation"]["segments"][-1]["end"]["attestation"]
    end["facts"]["index_topk"] = 1024
    state, reason = status(entry)
    assert state == INVALID and "index_topk 512 -> 1024" in reason, reason
