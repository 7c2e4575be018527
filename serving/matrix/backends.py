"""What runs a spread matrix's jobs: Slurm (sbatch / scontrol / scancel) or this host's GPU sets.

    backend = make_backend(executor, out)
    job_id = backend.submit(name)         # RUN/parts/<name>/job.json must exist
    infos = backend.poll([job_id])        # {id: JobInfo(state, reason, nodes, exit_code)}
    backend.cancel([job_id])

Both run the same thing, `python -m niah.serving.matrix.job RUN/parts/<name>/job.json`
(serving/matrix/job.py), with its output in RUN/parts/<name>/job.out.

`SlurmBackend`: one batch job per configuration. `job_script` is the script (also what
`--dry-run` prints); `sbatch --parsable` submits it; `scontrol show job -o ID` reads the
state, reason, node list and exit code (no sacct: a cluster without slurmdbd has none);
a job Slurm has already forgotten (older than MinJobAge) is judged by the status file the
job wrote (parts.py); `scancel` cancels. Slurm's states are kept as Slurm names them
(PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, FAILED, OUT_OF_MEMORY, NODE_FAIL, ...).

`LocalBackend` (executor local with gpus_per_config): disjoint GPU sets of this host
(executor.gpu_slots), each taking `configs_per_gpu` jobs at once (default 1: two servers
never share a GPU); a job starts when a slot is free, with CUDA_VISIBLE_DEVICES set to
its set; states PENDING, RUNNING, COMPLETED, FAILED,
CANCELLED. Its jobs die with niah (PR_SET_PDEATHSIG), as launched servers do.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from niah.errors import BadInput
from niah.serving.launch import _die_with_parent
from niah.serving.matrix.executor import Executor, local_slots
from niah.runs.parts import (JOB_OUTPUT, JOB_SCRIPT, JOB_SPEC, open_job_output, part_dir, read_status,
                              write_job_script)

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


def _from_status(out: Path, name: str) -> JobInfo:
    """A job its scheduler no longer knows: what it wrote of itself."""
    status = read_status(out, name)
    if status.get("exit") == 0:
        return JobInfo("COMPLETED", nodes=status.get("host"), exit_code="0")
    if status.get("exit") is not None:
        return JobInfo("FAILED", reason=status.get("error"), nodes=status.get("host"), exit_code=str(status["exit"]))
    return JobInfo("UNKNOWN", reason="the scheduler no longer knows the job, and it recorded no end")


# -- Slurm ------------------------------------------------------------------------------------
class SlurmBackend:
    tool = "slurm"

    def __init__(self, executor: Executor, out: Path, gpus: dict[str, int] | None = None):
        self.settings, self.out = executor.settings, Path(out)
        self.gpus = gpus or {}  # per configuration, where the table does not say (an SGLang arm's tp)
        self.names: dict[str, str] = {}

    def check(self) -> None:
        """BadInput unless Slurm's commands are here (before the run folder changes)."""
        missing = [c for c in ("sbatch", "scontrol", "scancel") if shutil.which(c) is None]
        if missing:
            raise BadInput(f"executor slurm: {', '.join(missing)} not on PATH (run niah where Slurm's commands are; "
                           "--dry-run prints the job scripts anywhere)")

    def job_script(self, name: str) -> str:
        s, part = self.settings, part_dir(self.out, name).resolve()
        opts = [f"--job-name=niah-{name}", f"--output={part / JOB_OUTPUT}", "--open-mode=append",
                f"--nodes={s.get('nodes', 1)}", "--ntasks=1"]
        opts += [f"--{key}={s[key]}" for key in ("partition", "account", "time") if key in s]
        gpus = s.get("gpus", self.gpus.get(name, 0))
        if gpus:
            opts.append(f"--gres=gpu:{gpus}")
        if "cpus_per_task" in s:
            opts.append(f"--cpus-per-task={s['cpus_per_task']}")
        opts += list(s.get("extra", []))
        lines = ["#!/bin/bash", *(f"#SBATCH {o}" for o in opts),
                 f"# niah: configuration {name}; this job writes only under {part}", "set -e",
                 *s.get("setup", []), f"cd {shlex.quote(os.getcwd())}",
                 "exec " + shlex.join(job_command(self.out, name))]
        return "\n".join(lines) + "\n"

    def submit(self, name: str) -> str:
        script = write_job_script(self.out, name, self.job_script(name))
        r = _slurm(["sbatch", "--parsable", str(script)])
        job_id = r.stdout.strip().split(";")[0]
        if r.returncode != 0 or not job_id.isdigit():
            raise BadInput(f"sbatch refused the job of {name}: {_said(r)}")
        self.names[job_id] = name
        return job_id

    def poll(self, ids: list[str]) -> dict[str, JobInfo]:
        out = {}
        for job_id in ids:
            r = _slurm(["scontrol", "show", "job", "-o", job_id])
            if r.returncode != 0 or "JobState=" not in r.stdout:
                if "Invalid job id" in (r.stderr + r.stdout) and job_id in self.names:
                    out[job_id] = _from_status(self.out, self.names[job_id])
                elif "Invalid job id" in (r.stderr + r.stdout):
                    out[job_id] = JobInfo("UNKNOWN", reason="Slurm no longer knows the job")
                continue  # scontrol did not answer this time: asked again at the next poll
            f = dict(re.findall(r"(\w[\w/:]*)=(\S*)", r.stdout))
            none = ("None", "(null)", "")
            out[job_id] = JobInfo(f.get("JobState", "UNKNOWN"), None if f.get("Reason") in none else f["Reason"],
                                  None if f.get("NodeList") in none else f["NodeList"], f.get("ExitCode"),
                                  f.get("TimeLimit"))
        return out

    def cancel(self, ids: list[str]) -> None:
        if ids:
            _slurm(["scancel", *ids])

    def adopt(self, job_id: str, name: str) -> None:
        """A job an earlier niah submitted for `name` (a resume after niah itself was killed)."""
        self.names[job_id] = name


def _slurm(argv: list[str]) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise BadInput(f"executor slurm: `{argv[0]}` is not on PATH (run niah where Slurm's commands are)")
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} did not answer in 60 s")


def _said(r: subprocess.CompletedProcess) -> str:
    text = (r.stderr or r.stdout or f"exit status {r.returncode}").strip().splitlines()
    return text[-1] if text else f"exit status {r.returncode}"


# -- this host's GPU sets -----------------------------------------------------------------------
class LocalBackend:
    tool = "local"

    def __init__(self, executor: Executor, out: Path):
        self.out = Path(out)
        self.slots = local_slots(executor.settings)
        self.free = list(self.slots)
        self.queue: list[str] = []  # job ids waiting for a GPU set, in submission order
        self.jobs: dict[str, dict] = {}  # id -> {name, proc, slot, state}
        self.n = 0

    def check(self) -> None:
        pass

    def submit(self, name: str) -> str:
        self.n += 1
        job_id = f"local-{self.n}"
        self.jobs[job_id] = {"name": name, "proc": None, "slot": None, "state": "PENDING"}
        self.queue.append(job_id)
        self._start_queued()
        return job_id

    def _start_queued(self) -> None:
        while self.queue and self.free:
            job_id = self.queue.pop(0)
            job, slot = self.jobs[job_id], self.free.pop(0)
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(slot)}
            with open_job_output(self.out, job["name"]) as log:
                job["proc"] = subprocess.Popen(job_command(self.out, job["name"]), stdin=subprocess.DEVNULL,
                                               stdout=log, stderr=subprocess.STDOUT, env=env,
                                               start_new_session=True, preexec_fn=_die_with_parent)
            job.update(slot=slot, state="RUNNING")

    def poll(self, ids: list[str]) -> dict[str, JobInfo]:
        for job in self.jobs.values():
            proc = job["proc"]
            if job["state"] == "RUNNING" and proc.poll() is not None:
                job["state"] = "COMPLETED" if proc.returncode == 0 else \
                    ("CANCELLED" if job.get("cancelled") else "FAILED")
                self.free.append(job["slot"])
        self._start_queued()
        out = {}
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job is None:
                out[job_id] = JobInfo("UNKNOWN", reason="started by an earlier niah, which ended")
                continue
            proc = job["proc"]
            code = None if proc is None or proc.returncode is None else str(proc.returncode)
            out[job_id] = JobInfo(job["state"], nodes=os.uname().nodename, exit_code=code)
        return out

    def gpus_of(self, job_id: str) -> str | None:
        slot = self.jobs.get(job_id, {}).get("slot")
        return ",".join(slot) if slot else None

    def cancel(self, ids: list[str]) -> None:
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job is None:
                continue
            if job["state"] == "PENDING":
                self.queue.remove(job_id)
                job["state"] = "CANCELLED"
            elif job["state"] == "RUNNING":
                job["cancelled"] = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(job["proc"].pid, signal.SIGTERM)
        deadline = time.monotonic() + 60  # the job stops its server, then exits
        for job_id in ids:
            proc = self.jobs.get(job_id, {}).get("proc")
            if proc is not None:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self.poll([])

    def adopt(self, job_id: str, name: str) -> None:
        pass


def job_gpus(matrix) -> dict[str, int]:
    """GPUs a job needs where the executor does not say: an SGLang arm's tensor-parallel size."""
    return {c.name: int(c.settings.get("tp", 1)) for c in matrix.configs if c.engine == "sglang"}


def print_jobs(matrix, executor: Executor, out: Path, file) -> None:
    """The dry run's jobs: each Slurm batch script, or where each arm would run on this host."""
    launched = [c for c in matrix.configs if c.launched]
    if executor.kind == "slurm":
        backend = SlurmBackend(executor, out, job_gpus(matrix))
        print(f"\n# slurm executor: {len(launched)} job(s), one per configuration, each submitted with "
              f"`sbatch --parsable {out}/parts/<config>/{JOB_SCRIPT}` and writing only under "
              f"{out}/parts/<config>/ (merged into {out} as each ends)", file=file)
        for cfg in launched:
            print(f"\n# --- {cfg.name}: {part_dir(out, cfg.name) / JOB_SCRIPT}", file=file)
            print(backend.job_script(cfg.name), end="", file=file)
        return
    try:
        slots = local_slots(executor.settings)
    except BadInput as e:  # a plan made where the GPUs are not (a laptop, a login node): say so, run nothing
        print(f"\n# local executor: {e}; a run here would stop there, before any server starts", file=file)
        return
    per_gpu = executor.settings.get("configs_per_gpu", 1)
    shared = f", {per_gpu} a set" if per_gpu > 1 else ""
    print(f"\n# local executor: {len(slots)} configuration(s) at once on disjoint GPU sets{shared} "
          f"({'; '.join(','.join(s) for s in slots)}); each runs "
          f"`{shlex.join(job_command(out, '<config>'))}` with CUDA_VISIBLE_DEVICES set to its set", file=file)
    for i, cfg in enumerate(launched):
        print(f"# {cfg.name}: " + ("CUDA_VISIBLE_DEVICES=" + ",".join(slots[i]) if i < len(slots)
                                   else "waits for the first free slot"), file=file)


def make_backend(executor: Executor, out: Path, gpus: dict[str, int] | None = None):
    if executor.kind == "slurm":
        return SlurmBackend(executor, out, gpus)
    return LocalBackend(executor, out)
