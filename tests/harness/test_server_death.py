"""A launched server killed mid-request: its sockets close before its process can be reaped,
so the request fails (connection refused) a moment before the death can be seen. The trial
must still be recorded as the death, not as a failed request (niah.sweep.run)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from niah.sweep.run import _TargetRun


def watched(proc: subprocess.Popen) -> _TargetRun:
    run = _TargetRun.__new__(_TargetRun)   # only the death watch: no target, store or spec
    run.died = []
    run.dead = lambda: f"exit code {proc.returncode}" if proc.poll() is not None else None
    return run


def test_a_death_seen_just_after_the_failed_request_is_the_trials_cause():
    proc = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.3); sys.exit(9)"])
    try:
        run = watched(proc)
        assert run.check_dead() is None            # the first look: not yet dead
        assert asyncio.run(run.death_after_error(wait_s=5.0)) == "exit code 9"
        assert run.check_dead() == "exit code 9"   # kept for the run's later trials
    finally:
        proc.kill()
        proc.wait()


def test_a_live_server_is_no_cause():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert asyncio.run(watched(proc).death_after_error(wait_s=0.2)) is None
    finally:
        proc.kill()
        proc.wait()
