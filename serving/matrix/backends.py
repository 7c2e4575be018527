"""What every executor's jobs share: the job's command, its state, and GPUs an engine asks for.

    backend = executor_kind(executor.kind).backend(executor.settings, out, job_gpus(matrix))
    job_id = backend.submit(name)         # RUN/parts/<name>/job.json must exist
    infos = backend.poll([job_id])        # {id: JobInfo(state, reason, nodes, exit_code)}
    backend.cancel([job_id])

The backends themselves are their executors' (serving/matrix/executors/: local, slurm; the
contract is serving/matrix/executors/base.py). All run the same thing,
`python -m niah.serving.matrix.job RUN/parts/<name>/job.json` (`job_command`;
serving/matrix/job.py), with its output in RUN/parts/<name>/job.out. `JobInfo` is a job's
state as its scheduler names it (`ACTIVE`: not ended); `from_status` judges a job its
scheduler no longer knows by the status file it wrote (parts.py); `job_gpus` is the GPUs each
configuration's engine asks for where the executor's table does not say.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from niah.runs.parts import JOB_OUTPUT, JOB_SCRIPT, JOB_SPEC, part_dir, read_status

__all__ = ["ACTIVE", "JOB_OUTPUT", "JOB_SCRIPT", "JobInfo", "from_status", "job_command", "job_gpus"]

ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
          "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "STOPPED"}


@dataclass
class JobInfo:
    state: str
    reason: str | None = None
    nodes: str | None = None
    exit_code: str | None = None
    time_limit: str | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def job_command(out: Path, name: str) -> list[str]:
    return [sys.executable, "-m", "niah.serving.matrix.job", str((part_dir(out, name) / JOB_SPEC).resolve())]


def from_status(out: Path, name: str) -> JobInfo:
    """A job its scheduler no longer knows: what it wrote of itself."""
    status = read_status(out, name)
    if status.get("exit") == 0:
        return JobInfo("COMPLETED", nodes=status.get("host"), exit_code="0")
    if status.get("exit") is not None:
        return JobInfo("FAILED", reason=status.get("error"), nodes=status.get("host"), exit_code=str(status["exit"]))
    return JobInfo("UNKNOWN", reason="the scheduler no longer knows the job, and it recorded no end")


def job_gpus(matrix) -> dict[str, int]:
    """GPUs a job needs where the executor does not say, per configuration, as its engine
    says (`Engine.job_gpus`: an SGLang arm's tensor-parallel size)."""
    return {c.name: n for c in matrix.configs if (n := c.kind.job_gpus(c.settings)) is not None}
