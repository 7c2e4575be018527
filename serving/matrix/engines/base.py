"""What an engine is to the matrix: the `Engine` record each engine module fills in.

An engine module (serving/matrix/engines/<name>.py) builds one `Engine` and the registry
(serving/matrix/engines/__init__.py) lists it. Everything the matrix does differently per
engine is a field here, so nothing outside the engine's own module names it:

- `keys`: `{key: check}`, `check(value)` returns None for a good value, else what is wrong
  (the parser names the line); `required`: keys a configuration must set.
- `launched`: niah starts its server (False: an endpoint someone else runs, swept
  concurrently, never restarted); `command(cfg, port) -> (argv, env overrides)` for a
  launched one; `plan(cfg)`, the dry run's line for one that is not.
- `health_paths`, `ready_timeout_s`: readiness defaults (the file may override both).
- `check(settings, where, fail)`: more checks of one configuration after its keys
  (`where(key)` is the key's line, `fail(line, msg)` the BadInput to raise).
- `impossible(settings)`: why this combination is no arm (an `[axes]` point is skipped,
  a `[[config]]` refused with the reason), else None.
- `arm(cfg)`: what the configuration runs, in words (dry run and manifest `arms`), or None.
- `dry_run_note()`: one line the dry run prints once when a configuration uses the
  engine, or None.
- `preflight(cfg)`: why this machine cannot serve it, asked before any server starts
  (None: fine), only where the server would run.
- `job_gpus(settings)`: GPUs one job needs where the executor does not say, or None.
- `context(cfg)`: the served model's context where the matrix alone says it, or None.

Engine facts the harness needs (attestation rules) travel as data in the run folder's
manifest (the configuration's `engine`), never by importing this package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

Check = Callable[[Any], "str | None"]


def _none(*_: Any) -> None:
    return None


@dataclass(frozen=True, eq=False)
class Engine:
    name: str
    keys: dict[str, Check]
    required: tuple[str, ...] = ()
    launched: bool = True
    command: Callable[..., tuple[list[str], dict[str, Any]]] | None = None
    plan: Callable[[Any], str] | None = None
    health_paths: tuple[str, ...] = ("/health", "/v1/models")
    ready_timeout_s: float = 300.0
    check: Callable[[dict, Callable[[str], int], Callable], None] = field(default=_none)
    impossible: Callable[[dict], str | None] = field(default=_none)
    arm: Callable[[Any], dict | None] = field(default=_none)
    dry_run_note: Callable[[], str | None] = field(default=_none)
    preflight: Callable[[Any], str | None] = field(default=_none)
    job_gpus: Callable[[dict], int | None] = field(default=_none)
    context: Callable[[Any], int | None] = field(default=_none)
