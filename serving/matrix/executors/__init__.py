"""The executors an `[executor]` table may name (`kind = "..."`): one module each, one registry.

    from niah.serving.matrix.executors import EXECUTORS, executor_kind
    executor_kind("slurm").backend(settings, out, gpus).submit(name)

Each executor module (local.py, slurm.py) builds one `ExecutorKind`
(serving/matrix/executors/base.py: its table's keys and checks, whether it spreads, its
backend, its dry-run plan); `EXECUTORS` lists them in the order error messages name them.
Adding an executor is its module plus one line below; `register_executor` adds one at run
time (a plugin, a test). Nothing outside an executor's own module names it.
"""

from __future__ import annotations

from niah.serving.matrix.executors import local, slurm
from niah.serving.matrix.executors.base import ExecutorKind

EXECUTORS: dict[str, ExecutorKind] = {}
DEFAULT = local.EXECUTOR.name  # no [executor] table: this machine, one server at a time


def register_executor(kind: ExecutorKind) -> ExecutorKind:
    """Make `kind` nameable in `[executor]` tables and `--executor` (a later one of the same
    name replaces it)."""
    EXECUTORS[kind.name] = kind
    return kind


def executor_kind(name: str) -> ExecutorKind:
    return EXECUTORS[name]


register_executor(local.EXECUTOR)
register_executor(slurm.EXECUTOR)

__all__ = ["DEFAULT", "EXECUTORS", "ExecutorKind", "executor_kind", "register_executor"]
