"""Server lifecycle with a tiny real HTTP server (tests/servers/tiny_server.py): start,
readiness, death during start-up and mid-sweep, teardown, Ctrl-C/SIGTERM to niah, and a
whole matrix run. The embedded-model version is tests/e2e/test_lifecycle_embedded.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from niah.errors import BadInput, ServerError
from niah.serving.launch import ServerProcess, cause_from_log, describe_exit

try:
    from tests.lifecycle_helpers import (ROOT, alive, port_free, read_manifest, read_trials,
                                         session_members, tiny_command, toml_list, wait_for)
except ImportError:
    from lifecycle_helpers import (ROOT, alive, port_free, read_manifest, read_trials,  # type: ignore
                                   session_members, tiny_command, toml_list, wait_for)

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 23.10 GiB"


def tiny(tmp_path: Path, *extra: str, name: str = "tiny", **kw) -> ServerProcess:
    argv = tiny_command(*extra)
    return ServerProcess(
        name, lambda port: ([a.replace("{port}", str(port)) for a in argv], {"TINY_MARK": name}),
        log_path=tmp_path / "logs" / f"{name}.log", **kw,
    )


# -- one server --------------------------------------------------------------------------------
def test_start_ready_stop_leaves_nothing(tmp_path):
    srv = tiny(tmp_path, "--child", "--ready-after", "0.5")
    with srv:
        assert srv.dead() is None
        r = httpx.get(srv.endpoint + "/health", trust_env=False)
        assert r.status_code == 200  # ready means ready, not merely listening (503 before)
        members = session_members(srv.pid)
        assert srv.pid in members and len(members) == 2  # the server and its own child
        log = srv.log_path.read_text()
        assert "starting tiny" in log and "child pid" in log and "TINY_MARK=tiny" in log
        port = srv.port
    assert session_members(srv.pid) == []
    assert port_free(port)
    assert srv.dead() == "stopped by niah"


def test_teardown_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path):
    srv = tiny(tmp_path, "--ignore-sigterm", "--child", grace_s=0.5)
    srv.start()
    pid = srv.pid
    assert len(session_members(pid)) == 2
    srv.stop()
    assert session_members(pid) == []
    assert srv.proc.returncode == -signal.SIGKILL
    srv.stop()  # idempotent


def test_death_during_startup_fails_at_once_with_the_log_tail(tmp_path):
    srv = tiny(tmp_path, "--fail-with", OOM, ready_timeout_s=600)
    with pytest.raises(ServerError) as e:
        srv.start()
    msg = str(e.value)
    assert "server exited during start-up" in msg and "exit code 1" in msg
    assert OOM in msg and "Traceback (most recent call last):" in msg  # the last log lines
    assert srv.failure == f"exited during start-up: {OOM} (exit code 1)"
    assert session_members(srv.pid) == []


def test_a_command_that_cannot_run_is_a_start_failure(tmp_path):
    srv = ServerProcess("nope", lambda port: (["/nonexistent/server", str(port)], {}), log_path=tmp_path / "n.log")
    with pytest.raises(ServerError, match="cannot run '/nonexistent/server'"):
        srv.start()
    assert srv.failure.startswith("cannot run '/nonexistent/server'")


def test_not_ready_in_time_is_stopped(tmp_path):
    srv = tiny(tmp_path, "--ready-after", "3600", "--child", ready_timeout_s=1.0)
    with pytest.raises(ServerError, match="not ready after 1 s"):
        srv.start()
    assert session_members(srv.pid) == []


def test_a_taken_port_is_retried_on_another(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen(1)
        taken = blocker.getsockname()[1]
        calls: list[int] = []

        def command(port: int):
            calls.append(port)
            use = taken if len(calls) == 1 else port  # the first launch collides
            return tiny_command()[:2] + ["--port", str(use)], {}

        srv = ServerProcess("retry", command, log_path=tmp_path / "retry.log")
        with srv:
            assert len(calls) == 2 and srv.port == calls[1] != taken
            assert httpx.get(srv.endpoint + "/v1/models", trust_env=False).status_code == 200
    assert "Address already in use" in (tmp_path / "retry.log").read_text()


def test_dead_reports_kill_9(tmp_path):
    with tiny(tmp_path) as srv:
        os.kill(srv.pid, signal.SIGKILL)
        assert wait_for(srv.dead, what="death noticed") == "killed by SIGKILL"


def test_stop_after_the_leader_died_still_kills_what_it_left(tmp_path):
    """A server whose main process dies may leave workers holding the GPU (SGLang's
    schedulers): teardown reaches the whole process group."""
    srv = tiny(tmp_path, "--child")
    srv.start()
    leader = srv.pid
    (child,) = [p for p in session_members(leader) if p != leader]
    os.kill(leader, signal.SIGKILL)
    wait_for(srv.dead, what="death noticed")
    assert alive(child)
    srv.stop()
    assert not alive(child) and session_members(leader) == []


def test_dead_reads_the_cause_from_the_log(tmp_path):
    with tiny(tmp_path, "--die-after", "0.2", "--die-with", OOM) as srv:
        cause = wait_for(srv.dead, what="death noticed")
    assert cause == f"{OOM} (exit code 1)"


@pytest.mark.parametrize(
    "lines, cause",
    [
        (["INFO ok", "Traceback (most recent call last):", '  File "x.py"', "ValueError: bad shape"],
         "ValueError: bad shape"),
        (["[2026] Scheduler hit an exception: Traceback", "torch.OutOfMemoryError: CUDA out of memory. Tried"],
         "torch.OutOfMemoryError: CUDA out of memory. Tried"),
        (["loading", "Killed"], "Killed"),
        (["RuntimeError: CUDA error: out of memory"], "out of memory: RuntimeError: CUDA error: out of memory"),
        (["INFO: Uvicorn running", "INFO: 200 OK"], None),
        # advice about memory is not a cause; the exception is
        (["WARNING: if you run out of memory, lower --mem-fraction-static", "KeyError: 'index_topk'"],
         "KeyError: 'index_topk'"),
    ],
)
def test_cause_from_log(lines, cause):
    assert cause_from_log(lines) == cause


def test_describe_exit():
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(3) == "exit code 3"


# -- a whole matrix ----------------------------------------------------------------------------
def write_tiny_matrix(path: Path, delay: float = 0.0) -> Path:
    path.write_text(
        'engine = "command"\n'
        f"command = {toml_list(tiny_command('--delay', str(delay)))}\n"
        "\n[[config]]\nname = \"first\"\n"
        "\n[[config]]\nname = \"oom\"\n"
        f"command = {toml_list(tiny_command('--die-on-request', '3', '--die-with', OOM))}\n"
        "\n[[config]]\nname = \"nostart\"\n"
        f"command = {toml_list(tiny_command('--fail-with', 'RuntimeError: no GPU found'))}\n"
        "\n[axes]\nindex_topk = [1, 2]\n"
    )
    return path


def test_matrix_survives_deaths_and_resume_fills_only_gaps(tmp_path, capsys):
    from niah.serving.matrix import run_matrix
    from niah.sweep import SweepSpec

    spec = SweepSpec(lengths=[200, 300], depths=[0.0, 50.0, 100.0], trials=1)
    run = tmp_path / "run"
    matrix = write_tiny_matrix(tmp_path / "m.toml")
    run_matrix(matrix, spec, run)
    recs = read_trials(run)
    by: dict[str, list[dict]] = {}
    for r in recs:
        by.setdefault(r["config"], []).append(r)
    assert sorted(by) == ["first", "k1", "k2", "nostart", "oom"]
    assert all(len(v) == 6 for v in by.values())
    for name in ("first", "k1", "k2"):
        assert {r["outcome"] for r in by[name]} == {"correct"}
    # identical prompts for every configuration
    hashes = {name: {(r["length"], r["depth"], r["trial"]): r["prompt_sha256"] for r in by[name]}
              for name in ("first", "k1", "k2")}
    assert hashes["first"] == hashes["k1"] == hashes["k2"]
    # the server that died on its third request: two answers kept, the rest errors with the cause
    oom = sorted(by["oom"], key=lambda r: r["finished_at"])
    assert [r["outcome"] for r in oom].count("correct") == 2
    assert {r["error"] for r in oom if r["outcome"] == "error"} == {f"server died: {OOM} (exit code 1)"}
    # the one that never started: every trial an error naming why
    assert {r["error"] for r in by["nostart"]} == {
        "server failed to start: exited during start-up: RuntimeError: no GPU found (exit code 1)"}
    m = read_manifest(run)
    cfgs = m["configs"]
    assert cfgs["oom"]["status"] == "died" and OOM in cfgs["oom"]["cause"]
    assert cfgs["nostart"]["status"] == "failed to start"
    assert cfgs["k2"]["status"] == "done" and cfgs["k2"]["axes"] == {"index_topk": 2}
    assert cfgs["k2"]["command"][-2:] == ["--delay", "0.0"] and "--port" in cfgs["k2"]["command"]
    assert Path(cfgs["k2"]["log"]) == run / "logs" / "k2.log"
    assert m["matrix"]["configs"] == ["first", "oom", "nostart", "k1", "k2"]
    for c in cfgs.values():  # every server is gone
        assert c["pid"] and session_members(c["pid"]) == []

    # resume: drop two trials of k1; k1 is started again for those two, and the outages
    # (oom's dead server, nostart's failed start) are gaps too: retried, the old error
    # records set aside in trials.errors.jsonl
    lines = (run / "trials.jsonl").read_text().splitlines()
    keep = [ln for ln in lines if not (json.loads(ln)["config"] == "k1" and json.loads(ln)["length"] == 300
                                       and json.loads(ln)["depth"] in (0.0, 50.0))]
    assert len(keep) == len(lines) - 2
    (run / "trials.jsonl").write_text("\n".join(keep) + "\n")
    starts_before = {n: (run / "logs" / f"{n}.log").read_text().count("=== niah") for n in by}
    run_matrix(matrix, spec, run, resume=True)
    starts_after = {n: (run / "logs" / f"{n}.log").read_text().count("=== niah") for n in by}
    assert {n: starts_after[n] - starts_before[n] for n in by} == {
        "first": 0, "oom": 1, "nostart": 1, "k1": 1, "k2": 0}
    recs2 = read_trials(run)
    assert len(recs2) == len(recs)
    assert len({(r["config"], r["length"], r["depth"], r["trial"]) for r in recs2}) == len(recs2)
    archived = (run / "trials.errors.jsonl").read_text().splitlines()
    assert len(archived) == sum(r["outcome"] == "error" for r in recs)
    assert {r["outcome"] for r in recs2 if r["config"] == "k1"} == {"correct"}

    # resuming with a configuration changed under the same name is refused, naming it
    changed = tmp_path / "changed.toml"
    changed.write_text(matrix.read_text().replace("--delay", "--ready-after"))
    with pytest.raises(BadInput, match=r"changed.toml:\d+: configuration 'first' differs from the one in"):
        run_matrix(changed, spec, run, resume=True)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_niah_stops_the_server_and_keeps_trials(tmp_path, sig):
    matrix = tmp_path / "slow.toml"
    matrix.write_text(
        'engine = "command"\n'
        f"command = {toml_list(tiny_command('--delay', '0.3', '--child'))}\n"
        '[axes]\nindex_topk = [1, 2]\n'
    )
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "niah", "sweep", "--matrix", str(matrix), "--lengths", "200",
         "--depths", "0:100:20", "--trials", "2", "--out", str(run), "--quiet"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        pid = wait_for(lambda: read_manifest(run).get("configs", {}).get("k1", {}).get("pid"),
                       what="the first server to start")
        wait_for(lambda: len(read_trials(run)) >= 2, what="two finished trials")
        assert len(session_members(pid)) == 2
        port = read_manifest(run)["configs"]["k1"]["port"]
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in ((130, -signal.SIGINT) if sig == signal.SIGINT else (143,)), out
    assert "interrupted" in out
    assert session_members(pid) == [] and not alive(pid)
    assert port_free(port)
    recs = read_trials(run)
    assert len(recs) >= 2 and {r["config"] for r in recs} == {"k1"}
    assert {r["outcome"] for r in recs} == {"correct"}  # an interruption is not a server death
    assert "k2" not in read_manifest(run)["configs"]  # the next configuration never started


def test_niah_killed_outright_takes_its_server_down(tmp_path):
    """kill -9 of niah itself: the server gets SIGTERM from the kernel (PR_SET_PDEATHSIG)."""
    matrix = tmp_path / "slow.toml"
    matrix.write_text('engine = "command"\n'
                      f"command = {toml_list(tiny_command('--delay', '0.3'))}\n"
                      '[[config]]\nname = "only"\n')
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "niah", "sweep", "--matrix", str(matrix), "--lengths", "200",
         "--depths", "0:100:20", "--out", str(run), "--quiet"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        pid = wait_for(lambda: read_manifest(run).get("configs", {}).get("only", {}).get("pid"),
                       what="the server to start")
        wait_for(lambda: read_trials(run), what="a finished trial")
        proc.kill()
        proc.wait()
        wait_for(lambda: not session_members(pid), what="the orphaned server to exit")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_external_endpoints_run_concurrently_and_are_left_running(tmp_path):
    from niah.serving.matrix import run_matrix
    from niah.sweep import SweepSpec

    with tiny(tmp_path, "--delay", "0.2", name="a") as a, tiny(tmp_path, "--delay", "0.2", name="b") as b:
        matrix = tmp_path / "ext.toml"
        matrix.write_text(
            'engine = "external"\n'
            f'[[config]]\nname = "a"\nendpoint = "{a.endpoint}"\nindex_topk = 512\n'
            f'[[config]]\nname = "b"\nendpoint = "{b.endpoint}/v1"\nmodel = "tiny"\n'
        )
        run = run_matrix(matrix, SweepSpec(lengths=[200], depths=[0.0, 50.0, 100.0], trials=2), tmp_path / "run")
        assert a.dead() is None and b.dead() is None  # niah neither starts nor stops them
        recs = read_trials(run)
        assert sorted(r["config"] for r in recs) == ["a"] * 6 + ["b"] * 6
        assert {r["outcome"] for r in recs} == {"correct"}
        # concurrently: the two servers' trials interleave in the file
        order = [r["config"] for r in recs]
        assert order != sorted(order)
        m = read_manifest(run)
        assert m["configs"]["a"]["axes"] == {"index_topk": 512} and m["configs"]["a"]["engine"] == "external"
        assert "command" not in m["configs"]["a"] and not (run / "logs").exists()
