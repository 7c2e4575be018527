"""A matrix whose configurations run as jobs at once, through an executor's backend.

    spread_matrix(matrix, spec, out, executor=Executor("slurm", {"partition": "gpu"}))

The coordinator (this process) holds RUN's lock and is the only writer of RUN's manifest
and trials. Each launched configuration with trials left becomes one job of the
executor's backend (serving/matrix/executors/: Slurm, this host's GPU sets, or any
registered one; the backend contract is serving/matrix/executors/base.py) that runs it
into RUN/parts/<config>/ and nowhere else (serving/matrix/job.py); when the job ends, its
part is merged into RUN (niah.runs.parts), so `niah report`, `compare` and `gate`
read RUN as a local run.
External endpoints are swept here, while the jobs run.

The manifest's `configs.<name>.job` records the job (`executor`, `id`, `state` as the
scheduler names it, `reason`, `nodes`, `gpus`, `exit_code`, `submitted`, `ended`,
`script`, `output`, and `cause` when it did not complete); `jobs` lists every job the
configuration had across resumes. A job cancelled, timed out or failed gets its
configuration's remaining trials recorded as `error` with that cause (`status`:
cancelled / timed out / failed), as a dead server's are locally.

`--resume` merges what the parts hold (a job may have ended while no niah watched),
re-attaches to a job an earlier niah submitted that is still pending or running (where the
backend `reattaches`, e.g. Slurm's), and submits jobs only for configurations with trials
left (or an unclosed attestation segment). Ctrl-C / SIGTERM cancel every job this niah
submitted that has not ended (recorded as CANCELLED, cause "cancelled by niah:
interrupted"), merge what they wrote, and re-raise.
"""

from __future__ import annotations

import time
from pathlib import Path

from niah.attestation import open_segment
from niah.redact import redact_settings
from niah.runs.record import now
from niah.runs.run import Run
from niah.serving.launch import cause_from_log, log_tail
from niah.serving.matrix.backends import JOB_OUTPUT, JobInfo, job_gpus
from niah.serving.matrix.executor import Executor
from niah.serving.matrix.parse import Matrix, MatrixConfig, load_matrix
from niah.runs.parts import check_no_parts, part_dir, read_status, write_job_spec
from niah.serving.matrix.run import _MatrixRun, check_platform, open_matrix_run, record_errors, sweep_matrix
from niah.sweep import SweepSpec
from niah.sweep.interrupt import terminate_as_interrupt
from niah.sweep.orchestrate import say
from niah.sweep.run import pending_trials

STATUS = {"CANCELLED": "cancelled", "TIMEOUT": "timed out", "DEADLINE": "timed out", "PREEMPTED": "preempted"}


def run_matrix(matrix_path: Path | str, spec: SweepSpec, out: Path | str, resume: bool = False, progress=None,
               force_config: bool = False, executor: Executor | None = None) -> Path:
    """Sweep every configuration of the matrix file on identical prompts into one run
    folder; `progress` is a niah.sweep.progress.SweepProgress or None. `executor`
    (serving/matrix/executor.py; default: the file's [executor] table) says where: here,
    one server at a time (serving/matrix/run.py), or as jobs at once (below)."""
    matrix = load_matrix(matrix_path)
    executor = executor or matrix.executor
    if executor.spread:
        return spread_matrix(matrix, spec, Path(out), executor, resume, progress, force_config)
    return sweep_matrix(matrix, spec, Path(out), resume, progress, force_config)


def spread_matrix(matrix: Matrix, spec: SweepSpec, out: Path, executor: Executor, resume: bool = False,
                  progress=None, force_config: bool = False) -> Path:
    """Run every configuration of `matrix` as a job of `executor` into the run folder `out`."""
    if executor.kind_of.runs_here:    # elsewhere each job asks on its own node (job.py -> sweep_matrix)
        check_platform(matrix)
    out = Path(out)
    backend = executor.kind_of.backend(executor.settings, out, job_gpus(matrix))  # bad settings fail before
    checks = [] if resume else [check_no_parts]  # a new run: an earlier run's parts would merge into it
    checks.append(lambda _folder: backend.check())  # e.g. Slurm's commands on PATH, before the folder changes
    with open_matrix_run(matrix, spec, out, resume, force_config, checks) as run:
        run.change_manifest(lambda m: m.update(executor=executor.as_dict()))
        with terminate_as_interrupt():
            _Coordinator(matrix, spec, run, backend, _MatrixRun(spec, run, progress, force_config)).run()
    return out


class _Coordinator:
    def __init__(self, matrix: Matrix, spec: SweepSpec, run: Run, backend, local: _MatrixRun):
        self.matrix, self.spec, self.out, self.folder = matrix, spec, run.dir, run
        self.backend, self.local = backend, local
        self.active: dict[str, MatrixConfig] = {}  # job id -> configuration, jobs not ended
        self.poll_s = backend.poll_s

    def run(self) -> None:
        launched = [c for c in self.matrix.configs if c.launched]
        externals = [c for c in self.matrix.configs if not c.launched]
        for cfg in launched:  # what the parts already hold (a resume): never run twice
            self.folder.merge_part(cfg.name, errors=False)
        try:
            for cfg in launched:
                self.start(cfg)
            if externals:
                self.local.externals(externals)
            self.wait()
        except KeyboardInterrupt as e:
            self.cancel_all(f"cancelled by niah: interrupted ({e.args[0] if e.args else 'SIGINT'})")
            raise

    # -- submitting -----------------------------------------------------------------------
    def start(self, cfg: MatrixConfig) -> None:
        entry = self.folder.configs().get(cfg.name) or {}
        old = entry.get("job") or {}
        if self.backend.reattaches and old.get("executor") == self.backend.tool and old.get("id") \
                and "ended" not in old:
            self.backend.adopt(old["id"], cfg.name)  # an earlier niah submitted it and did not see it end
            info = self.backend.poll([old["id"]]).get(old["id"])
            if info is not None and info.active:
                say(f"{cfg.name}: {self.backend.tool} job {old['id']} (submitted by an earlier niah) is {info.state}; "
                    "waiting for it")
                self.active[old["id"]] = cfg
                return
            if info is not None:  # it ended meanwhile: its part was merged above
                self.record_job(cfg.name, {"state": info.state, "reason": info.reason, "nodes": info.nodes,
                                           "exit_code": info.exit_code, "ended": now()})
        if not pending_trials(cfg.name, self.spec, self.folder.done) and not open_segment(entry):
            say(f"{cfg.name}: every trial is already in the run folder; not submitted")
            return
        part = part_dir(self.out, cfg.name)
        write_job_spec(self.out, cfg.name, self.matrix.path, self.spec, self.local.force)
        base = {"engine": cfg.engine, "axes": dict(cfg.axes), "settings": redact_settings(cfg.settings),
                "log": str(part.resolve() / "logs" / f"{cfg.name}.log")}
        self.folder.update_config(cfg.name, lambda e: {**base, "status": "submitted", "cause": None})
        job_id = self.backend.submit(cfg.name)
        record = {"executor": self.backend.tool, "id": job_id, "state": "PENDING", "submitted": now(),
                  "output": str(part.resolve() / JOB_OUTPUT), **self.backend.record(cfg.name)}
        self.record_job(cfg.name, record, new=True)
        self.active[job_id] = cfg
        say(f"{cfg.name}: submitted {self.backend.tool} job {job_id} (output {record['output']})")

    def record_job(self, name: str, changes: dict, new: bool = False) -> dict:
        def change(entry: dict) -> dict:
            job = changes if new else {**(entry.get("job") or {}), **changes}
            jobs = [j for j in entry.get("jobs") or [] if j.get("id") != job.get("id")] + [job]
            return {"job": job, "jobs": jobs}

        return self.folder.update_config(name, change)["job"]

    # -- waiting ----------------------------------------------------------------------------
    def wait(self) -> None:
        seen: dict[str, str] = {}
        while self.active:
            infos = self.backend.poll(list(self.active))
            for job_id, info in infos.items():
                cfg = self.active.get(job_id)
                if cfg is None:
                    continue
                if info.state != seen.get(job_id):
                    seen[job_id] = info.state
                    extra = {"gpus": gpus} if (gpus := self.gpus(job_id)) else {}
                    self.record_job(cfg.name, {"state": info.state, "reason": info.reason, "nodes": info.nodes,
                                               "exit_code": info.exit_code, **extra})
                    say(f"{cfg.name}: {self.backend.tool} job {job_id} {info.state}"
                        + (f" on {info.nodes}" if info.nodes else "") + (f" ({info.reason})" if info.reason else ""))
                if not info.active:
                    del self.active[job_id]
                    self.finish(cfg, job_id, info)
            if self.active:
                time.sleep(self.poll_s)

    def gpus(self, job_id: str) -> str | None:
        return self.backend.gpus_of(job_id)

    def finish(self, cfg: MatrixConfig, job_id: str, info: JobInfo, cause: str | None = None) -> None:
        """Merge the part; a job that did not complete gets its remaining trials as errors."""
        self.folder.merge_part(cfg.name)
        status = read_status(self.out, cfg.name)
        changes = {"ended": now(), "host": status.get("host"), "gpus": status.get("gpus") or self.gpus(job_id)}
        ok = info.state == "COMPLETED" and status.get("exit") == 0
        if not ok:
            cause = cause or describe(self.backend.tool, job_id, info, status,
                                      part_dir(self.out, cfg.name) / JOB_OUTPUT)
            changes["cause"] = cause
        self.record_job(cfg.name, changes)
        if ok:
            left = record_errors(self.folder, cfg, self.spec, f"{self.backend.tool} job {job_id} ended with this "
                                                               "trial not run")
            if left:
                say(f"{cfg.name}: job {job_id} completed with {left} trial(s) not run; recorded as errors")
            return
        n = record_errors(self.folder, cfg, self.spec, cause)
        self.folder.update_config(cfg.name, lambda e: {"status": STATUS.get(info.state, "failed"), "cause": cause})
        say(f"{cfg.name}: {cause}; {n} trial(s) recorded as errors (--resume runs them again)")

    def cancel_all(self, cause: str) -> None:
        """Ctrl-C: cancel every job not ended, record them, merge what they wrote."""
        ids = list(self.active)
        if not ids:
            return
        say(f"cancelling {len(ids)} {self.backend.tool} job(s): {', '.join(ids)}")
        self.backend.cancel(ids)  # returns once the jobs stopped their servers (or it gave up waiting)
        for job_id in ids:
            cfg = self.active.pop(job_id)
            self.folder.merge_part(cfg.name)
            status = read_status(self.out, cfg.name)
            self.record_job(cfg.name, {"state": "CANCELLED", "cause": cause, "ended": now(),
                                       "host": status.get("host"), "gpus": status.get("gpus") or self.gpus(job_id)})
            self.folder.update_config(cfg.name, lambda e: {"status": "cancelled", "cause": cause})


def describe(tool: str, job_id: str, info: JobInfo, status: dict, output: Path | None = None) -> str:
    """One line: why a job did not complete (the job's own error, else its output's telling line)."""
    head = f"{tool} job {job_id} {info.state}"
    if info.state == "TIMEOUT":
        return f"{head}: reached its time limit" + (f" ({info.time_limit})" if info.time_limit else "")
    tail = log_tail(output, 5) if output is not None and not status.get("error") else []
    why = status.get("error") or cause_from_log(tail) or (tail[-1][:300] if tail else None)
    if info.state == "CANCELLED":
        return head + (f" ({info.reason})" if info.reason else " (scancel, or the cluster cancelled it)")
    bits = [b for b in (info.reason, f"exit code {info.exit_code}" if info.exit_code else None, why) if b]
    if info.state == "COMPLETED":  # completed by Slurm's account, but the job recorded no good end
        bits.append("the job recorded no successful end")
    return head + (": " + "; ".join(bits) if bits else "")
