"""One sweep per run folder: an advisory lock on RUN/.niah.lock.

The lock is an `flock` on the file, so it ends with the process that holds it: a sweep
killed with kill -9 leaves a stale file but no lock, and a later `--resume` takes it.
The file names the holder (pid, host, command, since) for the refusal message.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
from pathlib import Path

from niah.errors import BadInput
from niah.redact import redact_argv
from niah.runs.record import now

LOCK = ".niah.lock"


class RunLock:
    def __init__(self, run_dir: Path | str):
        self.path = Path(run_dir) / LOCK
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        """Take the lock or raise BadInput naming the holder."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise BadInput(f"cannot write to run folder {self.path.parent}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = self._holder(fd)
            os.close(fd)
            raise BadInput(f"{self.path.parent} is in use by another sweep ({holder}); "
                           "wait for it to finish or stop it") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": redact_argv(sys.argv), "since": now()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self._fd = fd
        return self

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            data = json.loads(os.pread(fd, 65536, 0) or b"{}")
            cmd = " ".join(map(str, data.get("command") or []))
            return f"pid {data.get('pid')} on {data.get('host')} since {data.get('since')}: {cmd}"
        except (OSError, ValueError, AttributeError):
            return "holder unknown"

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
