"""Helpers for the lifecycle tests: which processes a launched server left behind."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "servers" / "tiny_server.py"


def session_members(sid: int) -> list[int]:
    """Live pids whose session id is `sid` (a launched server's session = its pid)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        state, session = fields[0], int(fields[3])
        if session == sid and state not in ("Z", "X"):
            out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in ("Z", "X")


def port_free(port: int) -> bool:
    """Could a new server listen on `port` (SO_REUSEADDR, as servers set it: connections
    left in TIME_WAIT do not count, a listener does)?"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen(1)
        except OSError:
            return False
    return True


def wait_for(cond, timeout: float = 120.0, every: float = 0.1, what: str = "condition"):
    """Poll until cond() is truthy (a liveness guard, not a timing assertion)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"gave up waiting for {what}")


def read_manifest(run: Path) -> dict:
    try:
        return json.loads((run / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}


def read_trials(run: Path) -> list[dict]:
    try:
        lines = (run / "trials.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for ln in lines:
        try:
            out.append(json.loads(ln))
        except ValueError:
            pass
    return out


def tiny_command(*extra: str) -> list[str]:
    return [sys.executable, str(TINY), "--port", "{port}", *extra]


def toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(x) for x in items) + "]"
