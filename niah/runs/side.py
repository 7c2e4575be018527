"""A run folder's side files: the indexer probe's detail and the servers' logs.

    RUN/indexer/<config>.jsonl   one line per probed trial: {config, length, depth, trial,
                                 prompt_sha256, detail} (niah.sweep.indexer summarises the
                                 detail into the trial's `indexer` object)
    RUN/logs/<config>.log        what a launched server wrote (serving/launch.py)

`append_detail` appends one trial's detail (flushed, fsynced); `read_details` reads every
line back (the last one per trial wins, unreadable lines skipped); `copy_details` brings a
part folder's side files into RUN (serving/matrix/spread.py, through niah.runs.parts);
`layer_rows` is one detail per layer, for the report. `open_log` opens a log in a run
folder for appending (its folder made), the stream a child process writes to.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from pathlib import Path
from typing import BinaryIO

INDEXER_DIR = "indexer"
LOGS = "logs"


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name) or "config"


def append_detail(run_dir: Path | str, rec: dict, detail: dict) -> None:
    """Append one trial's probe detail to RUN/indexer/<config>.jsonl (flushed, fsynced)."""
    folder = Path(run_dir) / INDEXER_DIR
    folder.mkdir(parents=True, exist_ok=True)
    line = {k: rec.get(k) for k in ("config", "length", "depth", "trial", "prompt_sha256")}
    with open(folder / f"{_slug(str(rec['config']))}.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({**line, "detail": detail}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_details(run_dir: Path | str) -> list[dict]:
    """Every side-file line of a run (the last one per trial wins; unreadable lines skipped)."""
    folder = Path(run_dir) / INDEXER_DIR
    seen: dict[tuple, dict] = {}
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        for raw in path.read_text(encoding="utf-8").splitlines():
            try:
                d = json.loads(raw)
            except ValueError:
                continue
            if isinstance(d, dict) and isinstance(d.get("detail"), dict):
                seen[(d.get("config"), d.get("length"), d.get("depth"), d.get("trial"))] = d
    return list(seen.values())


def copy_details(src_run: Path | str, out: Path | str) -> None:
    """Copy src_run's indexer side files into `out` (each replaced atomically)."""
    src, dst = Path(src_run) / INDEXER_DIR, Path(out) / INDEXER_DIR
    if not src.is_dir():
        return
    dst.mkdir(exist_ok=True)
    for f in src.glob("*.jsonl"):
        tmp = dst / (f.name + ".tmp")
        shutil.copyfile(f, tmp)
        os.replace(tmp, dst / f.name)


def layer_rows(detail: dict) -> list[dict[str, float | None]]:
    """Per layer over the active steps: median worst rank / k, mean kept share."""
    active = [s for s in detail.get("steps") or [] if s.get("active")]
    if not active:
        return []
    n_layer = max(len(s.get("rank_worst") or []) for s in active)
    rows = []
    for i in range(n_layer):
        ranks = [s["rank_worst"][i] for s in active if s["rank_worst"][i] is not None]
        kept = [s["kept"][i] for s in active if s["kept"][i] is not None]
        rows.append({"rank_worst": statistics.median(ranks) if ranks else None,
                     "kept": statistics.fmean(kept) if kept else None})
    return rows


def open_log(path: Path | str) -> BinaryIO:
    """`path` opened for appending bytes, its folder made: a child process's stdout."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "ab")
