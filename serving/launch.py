"""Start, watch and stop one inference server that niah launched.

    with ServerProcess("bf16-k512", command, log_path=run / "logs" / "bf16-k512.log",
                       health_paths=("/health_generate", "/health", "/v1/models")) as srv:
        ...talk to srv.endpoint...; srv.dead() says why it died, if it did

- the port is chosen free (bind port 0 on loopback, release, retry with another port when
  the server reports the address taken);
- the server runs in its own process group (its own session), stdout+stderr appended to
  its log file; on Linux it also gets SIGTERM when niah dies (PR_SET_PDEATHSIG);
- readiness: poll the health paths until one answers 200 (404/405 = not served here, try
  the next); a process that exits meanwhile fails at once with the last lines of its log;
- `dead()` is cheap: None while the process runs, else the cause read from the log tail
  ("CUDA out of memory", the last exception line, "Killed", ...) and the exit status;
- `stop()`: SIGTERM to the whole group, SIGKILL after a grace period; idempotent; run on
  leaving the `with` block, on KeyboardInterrupt, and at interpreter exit (atexit) for
  any server still running. `niah.sweep.interrupt.terminate_as_interrupt()` makes SIGTERM/SIGHUP to niah behave
  like Ctrl-C so those paths run too.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

import httpx

from niah.errors import ServerError
from niah.redact import redact_argv, redact_env
from niah.runs.side import open_log

HOST = "127.0.0.1"
TAIL_LINES = 30

# A command builder: port -> (argv, environment overrides). An override of None removes
# the variable from the inherited environment (SGLang's stock arm: no NIAH_* variable).
CommandBuilder = Callable[[int], "tuple[list[str], dict[str, str | None]]"]


def free_port(host: str = HOST) -> int:
    """A port nothing listens on right now (the OS picks it; we release it at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# -- reading a log for the cause of death ---------------------------------------------------
def log_tail(path: Path | str, n: int = TAIL_LINES, max_bytes: int = 256 * 1024) -> list[str]:
    """The last `n` non-empty lines of a log file (reads at most `max_bytes` from its end)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    lines = [ln.rstrip() for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    # The log is appended to across starts: read only the latest start's lines, so a
    # cause from an earlier attempt or run is never blamed on this one.
    starts = [i for i, ln in enumerate(lines) if ln.startswith("=== niah ")]
    if starts:
        lines = lines[starts[-1]:]
    return lines[-n:]


# Specific phrases only: servers print advice like "if you run out of memory, lower ...".
_OOM_RE = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED"
                     r"|cudaErrorMemoryAllocation|HIP out of memory")
_EXC_RE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?$")
_KILLED_RE = re.compile(r"^\s*Killed\s*$|\bKilled process\b|\bSIGKILL\b")
_ADDR_RE = re.compile(r"address already in use|Errno 98\b|EADDRINUSE", re.I)


def cause_from_log(lines: list[str]) -> str | None:
    """The most telling line of a dead server's log tail, shortened; None if nothing stands out."""

    def last(rx: re.Pattern) -> str | None:
        for ln in reversed(lines):
            if rx.search(ln):
                return _shorten(ln.strip())
        return None

    oom = last(_OOM_RE)
    if oom:
        return oom if re.search(r"CUDA out of memory", oom) else f"out of memory: {oom}"
    exc = last(_EXC_RE)
    if exc:
        return exc
    if last(_KILLED_RE):
        return "Killed"
    return last(_ADDR_RE)


def _shorten(s: str, n: int = 300) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exit code {returncode}"


# -- the process ------------------------------------------------------------------------------
_LIVE: set["ServerProcess"] = set()
_LIVE_LOCK = threading.Lock()


def _stop_all_live() -> None:
    """atexit: nothing niah started may outlive it."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for srv in live:
        with contextlib.suppress(Exception):
            srv.stop(grace_s=5.0)


_ATEXIT = []


def _track(srv: "ServerProcess") -> None:
    with _LIVE_LOCK:
        if not _ATEXIT:
            atexit.register(_stop_all_live)
            _ATEXIT.append(True)
        _LIVE.add(srv)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except Exception:
            pass


_INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[list[int]]:
    """Hold Ctrl-C / SIGTERM / SIGHUP while a process is being spawned or stopped: a
    KeyboardInterrupt inside Popen() would leave a started child nobody knows about.
    Signals that arrive are collected in the yielded list; on leaving, KeyboardInterrupt
    is raised if any came (unless an exception is already on its way). Main thread only."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def hold(signum, frame):
        got.append(signum)

    old = {}
    try:
        for s in _INTERRUPTS:
            old[s] = signal.signal(s, hold)
        yield got
    except BaseException:
        got.clear()  # already unwinding: do not replace that exception
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if got:
        raise KeyboardInterrupt(signal.Signals(got[0]).name)


class _AddressTaken(Exception):
    pass


@dataclass(eq=False)
class ServerProcess:
    """One launched server. `start()` (or `with`) launches it and waits until it is ready."""

    name: str
    command: CommandBuilder
    log_path: Path
    health_paths: tuple[str, ...] = ("/health", "/v1/models")
    ready_timeout_s: float = 300.0
    grace_s: float = 15.0
    start_attempts: int = 3
    host: str = HOST
    poll_s: float = 0.5

    port: int | None = field(default=None, init=False)
    argv: list[str] = field(default_factory=list, init=False)
    env: dict[str, str | None] = field(default_factory=dict, init=False)
    proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    stopped: bool = field(default=False, init=False)
    ready_s: float | None = field(default=None, init=False)
    failure: str | None = field(default=None, init=False)  # why start() failed, one line

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    # -- starting ----------------------------------------------------------------------------
    def start(self) -> "ServerProcess":
        """Launch and wait for readiness. Raises ServerError (the server is stopped then)."""
        try:
            for attempt in range(1, self.start_attempts + 1):
                self._spawn()
                try:
                    self.wait_ready()
                    return self
                except _AddressTaken:
                    self.stop(grace_s=2.0)
                    self.stopped = False
                    if attempt == self.start_attempts:
                        self.failure = f"port {self.port} taken {attempt} times in a row"
                        raise ServerError(
                            f"{self.name}: port {self.port} was taken {attempt} times in a row; "
                            f"last lines of {self.log_path}:\n" + "\n".join(log_tail(self.log_path))
                        ) from None
            raise AssertionError("unreachable")
        except BaseException:
            self.stop()
            raise

    def _spawn(self) -> None:
        self.failure = None
        self.port = free_port(self.host)
        argv, env = self.command(self.port)
        self.argv, self.env = list(argv), dict(env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.env = {"PYTHONUNBUFFERED": "1", **self.env}  # timely logs: the cause of a death
        full_env = {k: v for k, v in {**os.environ, **self.env}.items() if v is not None}
        with open_log(self.log_path) as log:
            stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
            shown = redact_env(self.env)  # the log is kept with the run: no secret in it
            env_s = " ".join(f"{k}={v}" if v is not None else f"-u {k}" for k, v in shown.items())
            log.write(f"=== niah {stamp}: starting {self.name} on port {self.port}: "
                      f"{env_s + ' ' if env_s else ''}{' '.join(redact_argv(self.argv, self.env))}\n".encode())
            log.flush()
            with _signals_deferred():  # a Ctrl-C now is raised once the child is tracked
                try:
                    self.proc = subprocess.Popen(
                        self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                        env=full_env, start_new_session=True, preexec_fn=_die_with_parent,
                        close_fds=True,
                    )
                except OSError as e:
                    self.failure = f"cannot run {self.argv[0]!r}: {e.strerror or e}"
                    raise ServerError(f"{self.name}: {self.failure}") from None
                self.stopped = False
                _track(self)

    def wait_ready(self) -> None:
        """Poll the health paths until one answers 200; fail at once if the process exits."""
        t0 = time.monotonic()
        deadline = t0 + self.ready_timeout_s
        paths = list(self.health_paths)
        with httpx.Client(timeout=httpx.Timeout(10.0, connect=2.0), trust_env=False) as client:
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    tail = log_tail(self.log_path)
                    if any(_ADDR_RE.search(ln) for ln in tail[-10:]):
                        raise _AddressTaken()
                    self.failure = f"exited during start-up: {self._exit_cause(tail)}"
                    raise ServerError(
                        f"{self.name}: server exited during start-up ({self._exit_cause(tail)}); "
                        f"last lines of {self.log_path}:\n" + "\n".join(tail)
                    )
                for path in list(paths):
                    try:
                        r = client.get(self.endpoint + path)
                    except httpx.HTTPError:
                        break  # not listening yet (or busy): poll again later
                    if r.status_code == 200:
                        self.ready_s = time.monotonic() - t0
                        return
                    if r.status_code in (404, 405) and len(paths) > 1:
                        paths.remove(path)  # this server does not serve that path
                        continue
                    break  # 503 etc.: up but not ready
                if time.monotonic() > deadline:
                    self.failure = f"not ready after {self.ready_timeout_s:g} s"
                    raise ServerError(
                        f"{self.name}: not ready after {self.ready_timeout_s:g} s "
                        f"(polled {', '.join(self.health_paths)} on {self.endpoint}); "
                        f"last lines of {self.log_path}:\n" + "\n".join(log_tail(self.log_path))
                    )
                time.sleep(self.poll_s)

    # -- watching ----------------------------------------------------------------------------
    def dead(self) -> str | None:
        """None while the server runs; otherwise why it stopped (from its log tail)."""
        if self.proc is None:
            return "never started"
        if self.proc.poll() is None:
            return None
        if self.stopped:
            return "stopped by niah"
        return self._exit_cause(log_tail(self.log_path))

    def _exit_cause(self, tail: list[str]) -> str:
        status = describe_exit(self.proc.returncode) if self.proc and self.proc.returncode is not None else "exited"
        cause = cause_from_log(tail)
        return f"{cause} ({status})" if cause else status

    # -- stopping ----------------------------------------------------------------------------
    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM to the process group, SIGKILL after the grace period; returns once no
        process of the group is left. Idempotent. Ctrl-C / SIGTERM meanwhile do not cut it
        short: a first one skips straight to SIGKILL, and it is raised afterwards."""
        proc = self.proc
        if proc is None:
            return
        self.stopped = True
        grace = self.grace_s if grace_s is None else grace_s
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        with _signals_deferred() as interrupted:
            if self._group_alive(pgid):
                self._signal_group(pgid, signal.SIGTERM)
                deadline = time.monotonic() + grace
                while time.monotonic() < deadline and not interrupted and self._group_alive(pgid):
                    time.sleep(0.05)
            # SIGKILL whatever is left, until the whole group is gone (its members may
            # have been re-parented: waiting on the leader alone is not enough)
            end = time.monotonic() + 30
            while self._group_alive(pgid) and time.monotonic() < end:
                self._signal_group(pgid, signal.SIGKILL)
                time.sleep(0.05)
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
            with _LIVE_LOCK:
                _LIVE.discard(self)

    @staticmethod
    def _signal_group(pgid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def _group_alive(self, pgid: int) -> bool:
        """True while any process of the group exists. Reaps our own leader first (a zombie
        still counts as a member)."""
        if self.proc is not None:
            self.proc.poll()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def describe(self) -> dict:
        """What the manifest records about this server."""
        return {
            "command": redact_argv(self.argv, self.env),
            "env": redact_env(self.env),
            "log": str(self.log_path),
            "endpoint": self.endpoint if self.port else None,
            "port": self.port,
            "pid": self.pid,
            "ready_s": round(self.ready_s, 2) if self.ready_s is not None else None,
        }

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
