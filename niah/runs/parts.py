"""A spread matrix's run folder: one part folder per configuration, merged into RUN by one process.

    RUN/manifest.json, trials.jsonl, prompts.jsonl, indexer/   the merged run: what report,
                                   compare and gate read, in the plain sweep's format
    RUN/parts/<config>/            one configuration's own run folder, written by its job only
        job.json                   what the job runs (matrix file, configuration, sweep spec)
        job.status.json            written by the job: host, GPUs, Slurm job id, start, end, exit
        job.sh                     the Slurm batch script (slurm executor); job.out its output
        manifest.json, trials.jsonl, prompts.jsonl, logs/<config>.log, indexer/<config>.jsonl

A job writes only under its part folder (its own lock, its own manifest), so no lock is
shared across nodes. The coordinator (serving/matrix/spread.py), holding RUN's lock, merges
each part into RUN with `merge_part`: trials appended through RUN's RunStore (a key already
there is never written twice), prompts added to RUN/prompts.jsonl (one line per distinct
prompt), the indexer side file copied, and the part's manifest entry for its configuration
copied into RUN's manifest beside the job record (`job`, `jobs`) the coordinator keeps.
Merging is idempotent: merging a part again adds only what is new. A new run into a folder
that holds an earlier run's parts is refused (`check_no_parts`). The job's files are
written here too: its spec (`write_job_spec`), status (`write_status`), Slurm script
(`write_job_script`) and the output stream a local job writes to (`open_job_output`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, BinaryIO

from niah.errors import BadInput
from niah.runs.manifest import MANIFEST, read_manifest, update_config
from niah.runs.prompts import merge_prompts
from niah.runs.side import copy_details, open_log
from niah.runs.trials import TRIALS, read_trials

PARTS = "parts"
JOB_SPEC = "job.json"
JOB_STATUS = "job.status.json"
JOB_SCRIPT = "job.sh"
JOB_OUTPUT = "job.out"
_KEPT = ("job", "jobs")  # what the coordinator writes in RUN's entry; a part never has them


def part_dir(out: Path, name: str) -> Path:
    return Path(out) / PARTS / name


def write_job_spec(out: Path, name: str, matrix_path: Path, spec, force_config: bool = False) -> Path:
    """RUN/parts/<name>/job.json: what the job runs (absolute paths: it may run elsewhere)."""
    part = part_dir(out, name)
    part.mkdir(parents=True, exist_ok=True)
    data = {**job_spec(out, name, matrix_path, spec), "force_config": force_config}
    _write_json(part / JOB_SPEC, data)
    return part / JOB_SPEC


def job_spec(out: Path, name: str, matrix_path: Path, spec) -> dict[str, Any]:
    return {"matrix": str(Path(matrix_path).resolve()), "config": name, "out": str(part_dir(out, name).resolve()),
            "cwd": os.getcwd(), "spec": asdict(spec)}


def check_no_parts(out: Path) -> None:
    """A new run (no --resume) into a folder that holds an earlier spread run's job folders:
    BadInput (its parts would be merged into the new run)."""
    parts = Path(out) / PARTS
    if parts.is_dir() and any(parts.iterdir()):
        raise BadInput(f"{out} holds the job folders ({PARTS}/) of an earlier run; pass --resume to finish it, "
                       "or choose another --out")


def read_status(out: Path, name: str) -> dict[str, Any]:
    """The job's own record of itself ({} when it never started or wrote nothing)."""
    try:
        data = json.loads((part_dir(out, name) / JOB_STATUS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_status(part: Path, changes: dict[str, Any]) -> None:
    """Update the job's status file (atomically; only the job writes it)."""
    path = Path(part) / JOB_STATUS
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    _write_json(path, {**data, **changes})


def write_job_script(out: Path, name: str, text: str) -> Path:
    """RUN/parts/<name>/job.sh: the Slurm batch script of the job."""
    path = part_dir(out, name) / JOB_SCRIPT
    path.write_text(text, encoding="utf-8")
    return path


def open_job_output(out: Path, name: str) -> BinaryIO:
    """RUN/parts/<name>/job.out opened for appending bytes: a local job's stdout and stderr."""
    return open_log(part_dir(out, name) / JOB_OUTPUT)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def merge_part(out: Path, store, name: str, errors: bool = True) -> int:
    """Merge RUN/parts/<name> into RUN (module doc); returns the trials added. Without
    `errors`, trials recorded as error are left in the part (a resume runs them again)."""
    part = part_dir(out, name)
    if not part.is_dir():
        return 0
    merge_prompts(part, store.prompts)
    added = 0
    for rec in read_trials(part / TRIALS).records:  # a line cut short by a kill is skipped
        if rec.get("config") != name or (not errors and rec.get("outcome") == "error"):
            continue
        before = len(store.done)
        store.append(rec)
        added += len(store.done) - before
    copy_details(part, out)
    if (part / MANIFEST).is_file():
        entry = (read_manifest(part).get("configs") or {}).get(name)
        if isinstance(entry, dict):
            update_config(out, name, lambda old: {**{k: v for k, v in entry.items() if k not in _KEPT},
                                                  **{k: old[k] for k in _KEPT if k in old}})
    return added
