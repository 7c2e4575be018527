"""Where a matrix's configurations run: the `[executor]` table of the matrix file.

    [executor]
    kind = "local"                 # the default: one server at a time on this machine
    gpus_per_config = 2            # optional: arms at once on disjoint GPU sets of this host
    gpus = ["0", "1", "2", "3"]    # optional: the GPUs to share out (default: CUDA_VISIBLE_DEVICES,
                                   # else every GPU nvidia-smi lists)
    configs_per_gpu = 3            # optional (default 1): arms at once on each GPU set, for a small
                                   # model that leaves a large GPU mostly idle (each its own process)

    [executor]
    kind = "slurm"                 # one Slurm job per configuration (sbatch)
    partition = "gpu"              # optional: the cluster's default partition otherwise
    account = "team"               # optional
    time = "04:00:00"              # optional: the job's time limit (sbatch --time)
    gpus = 8                       # GPUs per job (--gres=gpu:N); default: an SGLang arm's tp, else none
    nodes = 1                      # nodes per job (--nodes)
    cpus_per_task = 16             # optional (--cpus-per-task)
    extra = ["--qos=high"]         # more sbatch options, one `#SBATCH` line each
    setup = ["module load cuda"]   # shell lines run in the job before niah
    poll_s = 5                     # how often squeue/scontrol is asked (default 5 s)

`parse_executor(table, where)` checks the table (BadInput naming the key's line through
`where(key)`); `override(executor, kind, settings)` applies `--executor KIND` and
`--executor-set KEY=VALUE` from the command line over the file's table, checked the same
way. Pure data and checks: serving/matrix/spread.py runs what it says.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from typing import Any, Callable

from niah.errors import BadInput

KINDS = ("local", "slurm")


def _int(lo: int) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= lo
        return None if ok else f"must be an integer >= {lo}, not {v!r}"

    return check


def _text(v: Any) -> str | None:
    return None if isinstance(v, str) and v.strip() and "\n" not in v else f"must be a one-line string, not {v!r}"


def _texts(v: Any) -> str | None:
    if isinstance(v, list) and all(isinstance(x, str) and "\n" not in x for x in v):
        return None
    return f"must be a list of one-line strings, not {v!r}"


def _time(v: Any) -> str | None:
    if not isinstance(v, (str, int)):  # time = 04:00:00 unquoted is a TOML time of day
        return f"must be a quoted time limit as sbatch takes it, e.g. \"04:00:00\", not {v!r}"
    # sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return None
    if isinstance(v, str) and re.fullmatch(r"(\d+-)?\d+(:\d{1,2}){0,2}", v.strip()):
        return None
    return f"must be a time limit as sbatch takes it (minutes, HH:MM:SS or D-HH:MM:SS), not {v!r}"


def _gpu_list(v: Any) -> str | None:
    if isinstance(v, list) and v and all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in v) \
            and len({str(x) for x in v}) == len(v):
        return None
    return f"must be a non-empty list of distinct GPU ids, e.g. [\"0\", \"1\"], not {v!r}"


def _positive(v: Any) -> str | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    return None if ok else f"must be a positive number of seconds, not {v!r}"


KEYS: dict[str, dict[str, Callable[[Any], str | None]]] = {
    "local": {"gpus_per_config": _int(1), "gpus": _gpu_list, "configs_per_gpu": _int(1)},
    "slurm": {"partition": _text, "account": _text, "time": _time, "gpus": _int(0), "nodes": _int(1),
              "cpus_per_task": _int(1), "extra": _texts, "setup": _texts, "poll_s": _positive},
}


@dataclass
class Executor:
    kind: str = "local"
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def spread(self) -> bool:
        """True when configurations run as jobs at once (slurm, or local with gpus_per_config)."""
        return self.kind == "slurm" or "gpus_per_config" in self.settings

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.settings}


def parse_executor(table: Any, where: Callable[[str | None], str]) -> Executor:
    """The checked `[executor]` table (an empty one: local). `where(key)` is "file:line"."""
    if table is None:
        return Executor()
    if not isinstance(table, dict):
        raise BadInput(f"{where(None)}: `executor` must be a table: [executor] kind = \"slurm\"")
    kind = table.get("kind", "local")
    if kind not in KINDS:
        raise BadInput(f"{where('kind')}: executor kind must be one of {', '.join(map(repr, KINDS))}, not {kind!r}")
    settings = {k: v for k, v in table.items() if k != "kind"}
    for key, v in settings.items():
        if key not in KEYS[kind]:
            other = [k for k in KINDS if k != kind and key in KEYS[k]]
            hint = f" (it is a key of executor {other[0]!r})" if other else ""
            raise BadInput(f"{where(key)}: unknown key {key!r} for executor {kind!r}{hint}; "
                           f"keys: {', '.join(sorted(KEYS[kind]))}")
        problem = KEYS[kind][key](v)
        if problem:
            raise BadInput(f"{where(key)}: executor {key} {problem}")
    needs = {"gpus": "lists GPUs to share out", "configs_per_gpu": "shares each GPU set among arms"}
    for key, what in needs.items():
        if kind == "local" and key in settings and "gpus_per_config" not in settings:
            raise BadInput(f"{where(key)}: executor {key} {what}: set gpus_per_config too")
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


# -- GPUs of this host (local executor) ----------------------------------------------------
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
