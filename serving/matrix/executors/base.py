"""What an executor is to the matrix: the `ExecutorKind` record each executor module fills in.

An executor module (serving/matrix/executors/<name>.py) builds one `ExecutorKind` and the
registry (serving/matrix/executors/__init__.py) lists it; the `[executor]` table's `kind`
names it. Its fields:

- `keys`: `{key: check}` for the table (`check(value)`: None, or what is wrong);
  `check(settings, where)`: rules across keys (BadInput naming `where(key)`'s line).
- `spread(settings)`: whether the configurations run as jobs at once (False: here, one
  server at a time, serving/matrix/run.py; True: serving/matrix/spread.py with a backend).
- `backend(settings, out, gpus)`: the object that runs jobs (below); `gpus` is
  {config: GPUs} where the engine says and the table does not.
- `print_plan(matrix, settings, out, file)`: the dry run's jobs (scripts, placement).
- `runs_here`: the jobs run on this host, so the engines' `preflight` checks are asked here
  (False: each job asks them where it lands).

A backend has `tool` (its executor's name, used in messages and the manifest's
`job.executor`), `poll_s` (how often to ask), `reattaches` (a job an earlier niah submitted
can be waited for again on `--resume`), and `check()`, `submit(name) -> id`,
`poll(ids) -> {id: JobInfo}`, `cancel(ids)` (returns once the jobs have stopped, or gave up
waiting), `adopt(id, name)`, `gpus_of(id)`, `record(name) -> {extra manifest job fields}`.
Every job runs `job_command(out, name)` (serving/matrix/backends.py) and writes its output to
RUN/parts/<name>/job.out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

Check = Callable[[Any], "str | None"]


def int_at_least(lo: int) -> Check:
    def check(v: Any) -> str | None:
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= lo
        return None if ok else f"must be an integer >= {lo}, not {v!r}"

    return check


def one_line(v: Any) -> str | None:
    return None if isinstance(v, str) and v.strip() and "\n" not in v else f"must be a one-line string, not {v!r}"


def one_lines(v: Any) -> str | None:
    if isinstance(v, list) and all(isinstance(x, str) and "\n" not in x for x in v):
        return None
    return f"must be a list of one-line strings, not {v!r}"


def positive_seconds(v: Any) -> str | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    return None if ok else f"must be a positive number of seconds, not {v!r}"


def _no_check(settings: dict, where) -> None:
    return None


@dataclass(frozen=True, eq=False)
class ExecutorKind:
    name: str
    keys: dict[str, Check]
    spread: Callable[[dict], bool]
    backend: Callable[..., Any] | None = None
    print_plan: Callable[..., None] | None = None
    check: Callable[[dict, Callable], None] = field(default=_no_check)
    runs_here: bool = True
