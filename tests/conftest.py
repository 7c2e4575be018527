"""Shared pytest fixtures; each issue keeps its own marked block."""

# ---- optional dependencies: `make test` sets NIAH_REQUIRE_EXTRAS=1, and then a missing
# [serve]/[dev]/[kernels] extra is a failure, never a silently skipped test ----
import importlib as _importlib
import os as _os_extras

import pytest as _pytest_extras


def _strict_importorskip(modname, minversion=None, reason=None, **kw):
    """pytest.importorskip that raises instead of skipping (the module must be installed)."""
    return _importlib.import_module(modname)


def pytest_configure(config):
    if _os_extras.environ.get("NIAH_REQUIRE_EXTRAS") == "1":
        _pytest_extras.importorskip = _strict_importorskip
# ---- end optional dependencies ----

# ---- the embedded model's converted weights: cached in the checkout, not in $HOME, so a
# test run depends on no state outside it (the first run converts the GGUF, ~17 s) ----
import os as _os

_os.environ.setdefault("NIAH_CACHE", str(__import__("pathlib").Path(__file__).resolve().parents[1] / ".cache" / "niah"))

# ---- harness (issue #2): the oracle server, a real OpenAI-compatible process on loopback ----
import subprocess as _subprocess
import sys as _sys
from pathlib import Path as _Path

import pytest as _pytest

ORACLE_SCRIPT = _Path(__file__).parent / "servers" / "oracle.py"


class OracleServer:
    """tests/servers/oracle.py as a subprocess on a free loopback port."""

    def __init__(self, *flags: str):
        self.proc = _subprocess.Popen(
            [_sys.executable, str(ORACLE_SCRIPT), "--port", "0", *flags],
            stdout=_subprocess.PIPE, stderr=_subprocess.STDOUT, text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"oracle server did not start: {line}{self.proc.stdout.read()}")
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def stats(self) -> dict:
        import httpx

        return httpx.get(f"http://127.0.0.1:{self.port}/stats", timeout=10).json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


@_pytest.fixture
def oracle_factory():
    """`start(*flags)` -> OracleServer; every server started is killed after the test."""
    servers: list[OracleServer] = []

    def start(*flags: str) -> OracleServer:
        s = OracleServer(*flags)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


@_pytest.fixture(scope="module")
def oracle():
    """One plain oracle server (perfect recall, max_model_len 65536) per test module."""
    s = OracleServer()
    yield s
    s.stop()
# ---- end harness (issue #2) -----------------------------------------------------------------
