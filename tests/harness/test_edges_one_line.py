"""No traceback at the edges a user meets: `niah serve` on a taken port is one line and exit 1
(before the model loads); `niah prompts build` stopped by Ctrl-C (SIGINT) is one line and exit
130, with no file written; `--timeout` bounds the length checks too (the server's /tokenize),
not only the trials.

Real subprocesses where the process boundary is the behaviour (a signal, a port), the
in-process runner otherwise; the loopback oracle server (tests/servers/oracle.py)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

from cli_inproc import niah


def _one_line(stderr: str) -> str:
    err = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("niah: "), stderr
    assert "Traceback" not in stderr
    return err[0]


def test_serve_on_a_taken_port_is_one_line_and_exit_1(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "niah", "serve", "--port", str(port)],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    line = _one_line(r.stderr)
    assert f"127.0.0.1:{port}" in line and "could not start" in line


def test_prompts_build_interrupted_is_one_line_and_exit_130_with_no_file(oracle_factory, tmp_path):
    srv = oracle_factory("--tokenize-delay", "0.5")  # slow counts: the build is still running when stopped
    out = tmp_path / "set.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "niah", "prompts", "build", "--endpoint", srv.url,
                             "--lengths", "2000", "--depths", "0,50,100", "--trials", "3", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while srv.stats()["tokenize"] < 2 and proc.poll() is None:  # it is counting now
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    line = _one_line(stderr)
    assert "interrupted (SIGINT)" in line and str(out) in line
    assert not out.exists() and not list(tmp_path.iterdir())


def test_timeout_bounds_the_tokenize_requests_of_the_length_checks(oracle_factory, tmp_path):
    srv = oracle_factory("--tokenize-delay", "5")  # generations answer at once; /tokenize takes 5 s
    r = niah("sweep", "--endpoint", srv.url, "--tokenizer", "server", "--timeout", "1", "--lengths", "400",
             "--depths", "50", "--trials", "1", "--out", tmp_path / "run", "-q")
    assert r.returncode == 2, r.stdout + r.stderr
    line = _one_line(r.stderr)
    assert "did not answer within 1 s (--timeout)" in line
    assert not (tmp_path / "run").exists()


def test_timeout_bounds_the_attestation_reads_too(oracle_factory, tmp_path):
    # /server_info answers after 4 s: within the reads' own 10 s, past the sweep's --timeout 2
    srv = oracle_factory("--server-info-delay", "4")
    r = niah("sweep", "--endpoint", srv.url, "--tokenizer", "server", "--timeout", "2", "--lengths", "400",
             "--depths", "50", "--trials", "1", "--out", tmp_path / "run", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    text = (tmp_path / "run" / "manifest.json").read_text()
    assert "/server_info could not be read (ReadTimeout)" in text
