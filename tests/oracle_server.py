"""tests/servers/oracle.py as a real subprocess on a free loopback port (the oracle fixtures of
tests/conftest.py; tests that start their own import it from here, never from a conftest:
under pytest-xdist `conftest` can name another folder's conftest)."""

import subprocess as _subprocess
import sys as _sys
from pathlib import Path as _Path

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
