"""The lifecycle end to end with the embedded model server (`niah serve`, SmolLM2-135M on
the CPU) as the launched engine, through the real `niah sweep --matrix` command: start,
ready, sweep, kill -9 of the server mid-sweep, the next configuration still runs on the
same prompts, nothing left running; Ctrl-C while a server is still loading."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from tests.lifecycle_helpers import ROOT, alive, read_manifest, read_trials, session_members, wait_for
except ImportError:
    from lifecycle_helpers import ROOT, alive, read_manifest, read_trials, session_members, wait_for  # type: ignore

pytestmark = pytest.mark.slow

MATRIX = """
engine = "embedded"
args = ["--threads", "1"]

[[config]]
name = "dense"
attention = "dense"

[[config]]
name = "dsa-k64"
attention = "dsa"
index_dtype = "bf16"
index_topk = 64
"""


def server_children_of(pid: int) -> list[int]:
    """Children of `pid` running `niah serve` (not, say, a `git rev-parse`)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) != pid:
                continue
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in argv:
                out.append(int(entry))
    return out


def niah_sweep(matrix: Path, run: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "niah", "sweep", "--matrix", str(matrix), "--lengths", "300",
         "--max-tokens", "8", "--out", str(run), "--quiet", *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_kill_9_mid_sweep_records_errors_and_the_next_configuration_runs(tmp_path):
    matrix = tmp_path / "m.toml"
    matrix.write_text(MATRIX)
    run = tmp_path / "run"
    total = 8  # 4 depths x 2 trials per configuration
    proc = niah_sweep(matrix, run, "--depths", "0,33,66,100", "--trials", "2")
    try:
        pid = wait_for(lambda: read_manifest(run).get("configs", {}).get("dense", {}).get("pid"),
                       timeout=300, what="the dense server to be ready")
        wait_for(lambda: read_trials(run), timeout=300, what="a first trial")
        before = len(read_trials(run))
        assert before < total  # trials remain to be lost
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out  # some trials got no answer: a failed sweep fails (docs/ci.md)
    assert "trial(s) got no answer" in out
    assert "dense: the server died (killed by SIGKILL)" in out

    recs = read_trials(run)
    dense = [r for r in recs if r["config"] == "dense"]
    dsa = [r for r in recs if r["config"] == "dsa-k64"]
    assert len(dense) == total and len(dsa) == total
    answered = [r for r in dense if r["outcome"] != "error"]
    errors = [r for r in dense if r["outcome"] == "error"]
    assert len(answered) >= before >= 1  # everything measured before the kill is kept
    assert errors and {r["error"] for r in errors} == {"server died: killed by SIGKILL"}
    # the next configuration ran all its trials, on the very prompts dense was given
    assert all(r["outcome"] != "error" for r in dsa), [r["error"] for r in dsa]
    assert all(r["prompt_tokens"] == 300 for r in dsa)
    sha = {(r["depth"], r["trial"]): r["prompt_sha256"] for r in dsa}
    assert all(sha[(r["depth"], r["trial"])] == r["prompt_sha256"] for r in answered)

    m = read_manifest(run)
    d, k = m["configs"]["dense"], m["configs"]["dsa-k64"]
    assert d["status"] == "died" and d["cause"] == "killed by SIGKILL"
    # a launched server that died before its attestation was read at the end proves nothing
    from niah.attestation import status

    assert status(d) == ("INVALID", "/server_info at the end of the sweep: the server died before it was "
                                    "asked: killed by SIGKILL")
    assert "dense: INVALID configuration: /server_info at the end of the sweep" in out
    assert status(k)[0] == "valid" and status(k)[1].startswith("bf16/torch, 384 B/token; during the sweep: store +")
    assert k["status"] == "done" and k["axes"] == {"attention": "dsa", "index_dtype": "bf16", "index_topk": 64}
    assert k["command"][1:4] == ["-m", "niah", "serve"] and "--index-topk" in k["command"]
    assert (run / "logs" / "dsa-k64.log").exists() and (run / "logs" / "dense.log").exists()
    for c in (d, k):
        assert session_members(c["pid"]) == [] and not alive(c["pid"])


def test_ctrl_c_while_the_server_loads_leaves_nothing(tmp_path):
    matrix = tmp_path / "m.toml"
    matrix.write_text(MATRIX)
    run = tmp_path / "run"
    proc = niah_sweep(matrix, run, "--depths", "50", "--trials", "1")
    try:
        server = wait_for(lambda: server_children_of(proc.pid), timeout=120, what="niah to start a server")[0]
        assert session_members(server)  # loading the model, not yet ready
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # 130 from niah's handler; -SIGINT when the interrupt happened to land inside code run
    # by exec() of a string (dataclass creation during a lazy import): CPython then ends
    # the process by SIGINT even though the KeyboardInterrupt was handled. Both mean
    # "interrupted"; what matters is below.
    assert proc.returncode in (130, -signal.SIGINT), out
    assert "interrupted" in out
    assert session_members(server) == [] and not alive(server)
    assert read_trials(run) == []
