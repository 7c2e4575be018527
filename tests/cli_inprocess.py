"""`niah` in-process (typer's CliRunner on niah.cli's app), with the CLI edge's rule:
a niah error is one line and its exit code. For tests where the exit code and output
matter but a subprocess start would cost more than the test."""

from __future__ import annotations

from dataclasses import dataclass

from typer.testing import CliRunner

from niah.cli import _register, app
from niah.errors import NiahError


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str


def niah_inprocess(*args, env: dict | None = None) -> Result:
    _register()
    r = CliRunner().invoke(app, [str(a) for a in args], env=env)
    err = r.stderr
    if isinstance(r.exception, NiahError):
        return Result(r.exception.exit_code, r.stdout, err + f"niah: error: {r.exception}\n")
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception  # a traceback at the edge: the test fails with it
    return Result(r.exit_code, r.stdout, err)
