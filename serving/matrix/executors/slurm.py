"""kind = "slurm": one Slurm batch job per launched configuration (sbatch / scontrol / scancel).

    [executor]
    kind = "slurm"
    partition = "gpu"              # optional: the cluster's default partition otherwise
    account = "team"               # optional
    time = "04:00:00"              # optional: the job's time limit (sbatch --time)
    gpus = 8                       # GPUs per job (--gres=gpu:N); default: what the engine says
                                   # (an SGLang arm's tp), else none
    nodes = 1                      # nodes per job (--nodes)
    cpus_per_task = 16             # optional (--cpus-per-task)
    extra = ["--qos=high"]         # more sbatch options, one `#SBATCH` line each
    setup = ["module load cuda"]   # shell lines run in the job before niah
    poll_s = 5                     # how often scontrol is asked (default 5 s)

`SlurmBackend`: `job_script` is the script (also what `--dry-run` prints); `sbatch
--parsable` submits it; `scontrol show job -o ID` reads the state, reason, node list and exit
code (no sacct: a cluster without slurmdbd has none); a job Slurm has already forgotten
(older than MinJobAge) is judged by the status file the job wrote (backends.from_status);
`scancel` cancels, then waits up to 30 s for the jobs to stop their servers. Slurm's states
are kept as Slurm names them (PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, FAILED, ...).
A job an earlier niah submitted is waited for again on `--resume` (`reattaches`). Jobs run
on other nodes, so the engines' preflight checks run in each job, not here.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from niah.errors import BadInput
from niah.serving.matrix.backends import JobInfo, from_status, job_command, job_gpus
from niah.serving.matrix.executors.base import ExecutorKind, int_at_least, one_line, one_lines, positive_seconds
from niah.runs.parts import JOB_OUTPUT, JOB_SCRIPT, part_dir, write_job_script


def _time(v: Any) -> str | None:
    if not isinstance(v, (str, int)):  # time = 04:00:00 unquoted is a TOML time of day
        return f"must be a quoted time limit as sbatch takes it, e.g. \"04:00:00\", not {v!r}"
    # sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return None
    if isinstance(v, str) and re.fullmatch(r"(\d+-)?\d+(:\d{1,2}){0,2}", v.strip()):
        return None
    return f"must be a time limit as sbatch takes it (minutes, HH:MM:SS or D-HH:MM:SS), not {v!r}"


KEYS = {"partition": one_line, "account": one_line, "time": _time, "gpus": int_at_least(0),
        "nodes": int_at_least(1), "cpus_per_task": int_at_least(1), "extra": one_lines, "setup": one_lines,
        "poll_s": positive_seconds}


class SlurmBackend:
    tool = "slurm"
    reattaches = True

    def __init__(self, settings: dict[str, Any], out: Path, gpus: dict[str, int] | None = None):
        self.settings, self.out = settings, Path(out)
        self.gpus = gpus or {}  # per configuration, where the table does not say (an SGLang arm's tp)
        self.names: dict[str, str] = {}
        self.poll_s = float(settings.get("poll_s", 5.0))

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

    def record(self, name: str) -> dict:
        return {"script": str(part_dir(self.out, name).resolve() / JOB_SCRIPT)}

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
                    out[job_id] = from_status(self.out, self.names[job_id])
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
        """scancel, then wait up to 30 s: Slurm signals the job, which stops its server."""
        if ids:
            _slurm(["scancel", *ids])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not any(i.active for i in self.poll(ids).values()):
                break
            time.sleep(0.5)

    def adopt(self, job_id: str, name: str) -> None:
        """A job an earlier niah submitted for `name` (a resume after niah itself was killed)."""
        self.names[job_id] = name

    def gpus_of(self, job_id: str) -> str | None:
        return None  # known once the job writes its status (job.status.json)


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


def print_plan(matrix, settings: dict[str, Any], out: Path, file) -> None:
    """The dry run: every batch script it would submit."""
    launched = [c for c in matrix.configs if c.launched]
    backend = SlurmBackend(settings, out, job_gpus(matrix))
    print(f"\n# slurm executor: {len(launched)} job(s), one per configuration, each submitted with "
          f"`sbatch --parsable {out}/parts/<config>/{JOB_SCRIPT}` and writing only under "
          f"{out}/parts/<config>/ (merged into {out} as each ends)", file=file)
    for cfg in launched:
        print(f"\n# --- {cfg.name}: {part_dir(out, cfg.name) / JOB_SCRIPT}", file=file)
        print(backend.job_script(cfg.name), end="", file=file)


EXECUTOR = ExecutorKind("slurm", KEYS, spread=lambda settings: True, backend=SlurmBackend, print_plan=print_plan,
                        runs_here=False)
