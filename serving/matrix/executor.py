"""Where a matrix's configurations run: the `[executor]` table of the matrix file.

    [executor]
    kind = "slurm"                 # a registered executor (serving/matrix/executors/); no table:
                                   # local, one server at a time on this machine
    partition = "gpu"              # the other keys are the kind's own (its module lists them)

`parse_executor(table, where)` checks the table (BadInput naming the key's line through
`where(key)`); `override(executor, kind, settings)` applies `--executor KIND` and
`--executor-set KEY=VALUE` from the command line over the file's table, checked the same
way. Each kind's keys, checks and whether it spreads are its module's, looked up in the
executors' registry. Pure data and checks: serving/matrix/spread.py runs what it says.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from typing import Any, Callable

from niah.errors import BadInput
from niah.serving.matrix.executors import DEFAULT, EXECUTORS, ExecutorKind


@dataclass
class Executor:
    kind: str = DEFAULT
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def kind_of(self) -> ExecutorKind:
        """The registered executor this table names (its backend, its dry-run plan)."""
        return EXECUTORS[self.kind]

    @property
    def spread(self) -> bool:
        """True when configurations run as jobs at once (e.g. slurm, or local with gpus_per_config)."""
        return self.kind_of.spread(self.settings)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.settings}


def parse_executor(table: Any, where: Callable[[str | None], str]) -> Executor:
    """The checked `[executor]` table (an empty one: local). `where(key)` is "file:line"."""
    if table is None:
        return Executor()
    if not isinstance(table, dict):
        raise BadInput(f"{where(None)}: `executor` must be a table: [executor] kind = \"slurm\"")
    kind = table.get("kind", DEFAULT)
    if not isinstance(kind, str) or kind not in EXECUTORS:
        raise BadInput(f"{where('kind')}: executor kind must be one of {', '.join(map(repr, EXECUTORS))}, "
                       f"not {kind!r}")
    keys = EXECUTORS[kind].keys
    settings = {k: v for k, v in table.items() if k != "kind"}
    for key, v in settings.items():
        if key not in keys:
            other = [k for k, e in EXECUTORS.items() if k != kind and key in e.keys]
            hint = f" (it is a key of executor {other[0]!r})" if other else ""
            raise BadInput(f"{where(key)}: unknown key {key!r} for executor {kind!r}{hint}; "
                           f"keys: {', '.join(sorted(keys))}")
        problem = keys[key](v)
        if problem:
            raise BadInput(f"{where(key)}: executor {key} {problem}")
    EXECUTORS[kind].check(settings, where)
    return Executor(kind, settings)


def override(executor: Executor, kind: str | None, pairs: list[str]) -> Executor:
    """`--executor KIND` and `--executor-set KEY=VALUE` (a TOML value; a bare word is a
    string) over the file's table. A new kind starts from an empty table."""
    table: dict[str, Any] = dict(executor.settings) if kind in (None, executor.kind) else {}
    table["kind"] = kind or executor.kind
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise BadInput(f"--executor-set {pair!r}: write KEY=VALUE, e.g. --executor-set partition=gpu")
        try:
            value = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()
        if not isinstance(value, (str, int, float, list)):
            value = raw.strip()  # 04:00:00 is a time limit here, not a TOML time of day
        table[key] = value
    return parse_executor(table, lambda key: "--executor-set" + (f" {key}" if key else ""))
