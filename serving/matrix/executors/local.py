"""kind = "local": this machine. One server at a time, or arms at once on disjoint GPU sets.

    [executor]
    kind = "local"                 # the default: one server at a time on this machine
    gpus_per_config = 2            # optional: arms at once on disjoint GPU sets of this host
    gpus = ["0", "1", "2", "3"]    # optional: the GPUs to share out (default: CUDA_VISIBLE_DEVICES,
                                   # else every GPU nvidia-smi lists)
    configs_per_gpu = 3            # optional (default 1): arms at once on each GPU set, for a small
                                   # model that leaves a large GPU mostly idle (each its own process)

Without `gpus_per_config` it does not spread (serving/matrix/run.py runs the matrix). With
it, `LocalBackend` cuts the GPUs into disjoint sets (`gpu_slots`), each taking
`configs_per_gpu` jobs at once (default 1: two servers never share a GPU); a job starts when
a slot is free, with CUDA_VISIBLE_DEVICES set to its set; states PENDING, RUNNING,
COMPLETED, FAILED, CANCELLED. Its jobs die with niah (PR_SET_PDEATHSIG), as launched servers do.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from niah.errors import BadInput
from niah.serving.launch import _die_with_parent
from niah.serving.matrix.backends import JobInfo, job_command
from niah.serving.matrix.executors.base import ExecutorKind, int_at_least
from niah.runs.parts import open_job_output


def _gpu_list(v: Any) -> str | None:
    if isinstance(v, list) and v and all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in v) \
            and len({str(x) for x in v}) == len(v):
        return None
    return f"must be a non-empty list of distinct GPU ids, e.g. [\"0\", \"1\"], not {v!r}"


KEYS = {"gpus_per_config": int_at_least(1), "gpus": _gpu_list, "configs_per_gpu": int_at_least(1)}


def check(settings: dict[str, Any], where) -> None:
    needs = {"gpus": "lists GPUs to share out", "configs_per_gpu": "shares each GPU set among arms"}
    for key, what in needs.items():
        if key in settings and "gpus_per_config" not in settings:
            raise BadInput(f"{where(key)}: executor {key} {what}: set gpus_per_config too")


# -- GPUs of this host ------------------------------------------------------------------------
def host_gpus(settings: dict[str, Any]) -> list[str]:
    """The GPU ids to share out: the table's `gpus`, else CUDA_VISIBLE_DEVICES, else
    every GPU `nvidia-smi -L` lists (BadInput when none is found)."""
    if "gpus" in settings:
        return [str(g) for g in settings["gpus"]]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        return [g.strip() for g in visible.split(",") if g.strip()]
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            listed = ""
        n = sum(1 for line in listed.splitlines() if line.startswith("GPU "))
        if n:
            return [str(i) for i in range(n)]
    raise BadInput("executor gpus_per_config: no GPU found (no CUDA_VISIBLE_DEVICES, no nvidia-smi); "
                   "list them with gpus = [\"0\", \"1\", ...]")


def gpu_slots(gpus: list[str], per_config: int, per_gpu: int = 1) -> list[tuple[str, ...]]:
    """Disjoint GPU sets of `per_config` GPUs each (a remainder too small is left idle), each
    set listed `per_gpu` times: that many arms run on it at once. The sets come round in
    turn (0, 1, 0, 1, ...), so arms fill every set before any set takes a second one."""
    if per_config > len(gpus):
        raise BadInput(f"executor gpus_per_config = {per_config}, but only {len(gpus)} GPU(s): "
                       f"{', '.join(gpus)}")
    sets = [tuple(gpus[i:i + per_config]) for i in range(0, len(gpus) - per_config + 1, per_config)]
    return [s for _ in range(per_gpu) for s in sets]


def local_slots(settings: dict[str, Any]) -> list[tuple[str, ...]]:
    """The local executor's slots: one entry per arm that may run at once (gpu_slots)."""
    return gpu_slots(host_gpus(settings), settings["gpus_per_config"], settings.get("configs_per_gpu", 1))


# -- the backend ------------------------------------------------------------------------------
class LocalBackend:
    tool = "local"
    poll_s = 0.5
    reattaches = False  # its jobs died with the niah that started them

    def __init__(self, settings: dict[str, Any], out: Path, gpus: dict[str, int] | None = None):
        self.out = Path(out)
        self.slots = local_slots(settings)
        self.free = list(self.slots)
        self.queue: list[str] = []  # job ids waiting for a GPU set, in submission order
        self.jobs: dict[str, dict] = {}  # id -> {name, proc, slot, state}
        self.n = 0

    def check(self) -> None:
        pass

    def record(self, name: str) -> dict:
        return {}

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


def print_plan(matrix, settings: dict[str, Any], out: Path, file) -> None:
    """The dry run: where each arm would run on this host (or why a run here would stop)."""
    launched = [c for c in matrix.configs if c.launched]
    try:
        slots = local_slots(settings)
    except BadInput as e:  # a plan made where the GPUs are not (a laptop, a login node): say so, run nothing
        print(f"\n# local executor: {e}; a run here would stop there, before any server starts", file=file)
        return
    per_gpu = settings.get("configs_per_gpu", 1)
    shared = f", {per_gpu} a set" if per_gpu > 1 else ""
    print(f"\n# local executor: {len(slots)} configuration(s) at once on disjoint GPU sets{shared} "
          f"({'; '.join(','.join(s) for s in slots)}); each runs "
          f"`{shlex.join(job_command(out, '<config>'))}` with CUDA_VISIBLE_DEVICES set to its set", file=file)
    for i, cfg in enumerate(launched):
        print(f"# {cfg.name}: " + ("CUDA_VISIBLE_DEVICES=" + ",".join(slots[i]) if i < len(slots)
                                   else "waits for the first free slot"), file=file)


EXECUTOR = ExecutorKind("local", KEYS, spread=lambda settings: "gpus_per_config" in settings,
                        backend=LocalBackend, print_plan=print_plan, check=check)
