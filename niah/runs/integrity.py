"""Run-folder integrity: the one reader of trials that report, compare and gate share.

    run = load_checked(RUN)          # manifest, sound records, problems, notes
    run.refuse()                     # compare / gate: BadInput (exit 2), one line, if any problem
    records, problems = check_records(records, "baseline x.json")   # a baseline file's trials

A **problem** makes the folder's numbers untrustworthy; `report` lists every one at the top
of its summary, `compare` and `gate` refuse the folder (exit 2):

- a line of trials.jsonl that is not a JSON record, other than a last line cut short (one
  with no newline at its end: the writer's last byte);
- a record whose fields cannot be read (niah.runs.record.record_problem: a length "abc",
  an unknown outcome, a missing key field): left out;
- a trial key (config, length, depth, trial) recorded more than once: the first is kept
  (the one a resume counts as done), the others are left out;
- a trial whose prompt is not in the folder's prompt set (RUN/prompts.jsonl, every prompt
  the sweep sent, built or from `--prompts`) at its (length, depth, trial): left out. A
  folder without prompts.jsonl (written by hand, or by an older niah) is not checked;
- a manifest attestation reading that is not an object (niah/attestation/ judges the
  rest): replaced by a reading that says so, which makes the configuration INVALID.

A **note** is tolerated: the last line cut short by a kill mid-write (no newline at its end) (the sweep's
`--resume` runs that trial again; a gate sees the trial missing, an outage).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from niah.errors import BadInput
from niah.runs.prompts import RUN_PROMPTS
from niah.runs.manifest import read_manifest
from niah.runs.record import record_problem
from niah.runs.trials import TRIALS, read_trials, record_key

_SHOWN = 3  # examples named per problem


@dataclass
class CheckedRun:
    path: Path
    manifest: dict[str, Any]
    records: list[dict[str, Any]]  # the sound records, in file order
    problems: list[str] = field(default_factory=list)  # one line each
    notes: list[str] = field(default_factory=list)  # tolerated (a cut last line)

    def refuse(self) -> None:
        """BadInput (one line) when the folder has any problem."""
        refuse(self.problems, f"run {self.path}", f"; `niah report {self.path}` lists them")


def refuse(problems: list[str], where: str, hint: str = "") -> None:
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise BadInput(f"{where} cannot be trusted: {problems[0]}{more}{hint}")


def _lines(ns: list[int]) -> str:
    return ", ".join(map(str, ns[:8])) + (f" and {len(ns) - 8} more" if len(ns) > 8 else "")


def _examples(items: list[str]) -> str:
    return "; ".join(items[:_SHOWN]) + (f"; and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def _where(line: int | None) -> str:
    return f"line {line}" if line is not None else "a trial"


def check_records(records: list[dict[str, Any]], lines: list[int] | None = None,
                  prompts: dict[str, set] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """(sound records, problems) of already parsed trial records: unreadable fields,
    duplicated keys (first kept) and, with `prompts` (prompt hash -> its (length, depth,
    trial) coordinates), trials whose prompt the set does not hold there."""
    lines = lines if lines is not None else [None] * len(records)
    kept: list[dict[str, Any]] = []
    bad, dups, foreign = [], {}, []
    first: dict[str, int | None] = {}
    for rec, line in zip(records, lines):
        problem = record_problem(rec) if isinstance(rec, dict) else "is not an object"
        if problem:
            bad.append(f"{_where(line)}: {problem}")
            continue
        key = record_key(rec)
        if key in first:
            dups.setdefault(key, [first[key]]).append(line)
            continue
        first[key] = line
        sha = rec.get("prompt_sha256")
        if prompts is not None and sha is not None:
            at = (int(rec["length"]), float(rec["depth"]), int(rec["trial"]), bool(rec.get("control")))
            if at not in prompts.get(sha, ()):
                foreign.append(f"{_where(line)} ({rec['config']}, length {at[0]}, depth {at[1]:g}, trial {at[2]})")
                continue
        kept.append(rec)
    problems = []
    if bad:
        problems.append(f"{len(bad)} trial record(s) with fields that cannot be read, left out: {_examples(bad)}")
    if dups:
        shown = [f"{k} at " + ", ".join("?" if n is None else str(n) for n in ns) for k, ns in dups.items()]
        problems.append(f"{len(dups)} trial key(s) recorded more than once (the first is kept): {_examples(shown)}")
    if foreign:
        problems.append(f"{len(foreign)} trial(s) whose prompt is not in the run's prompt set (prompts.jsonl), "
                        f"left out: {_examples(foreign)}")
    return kept, problems


def prompt_set(run_dir: Path | str) -> dict[str, set] | None:
    """prompt hash -> {(length, depth, trial, control)} of RUN/prompts.jsonl; None without one.
    A line that does not parse is skipped (a write cut short: the sweep writes it again)."""
    path = Path(run_dir) / RUN_PROMPTS
    if not path.exists():
        return None
    out: dict[str, set] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    for line in text.splitlines():
        try:
            e = json.loads(line)
            out.setdefault(e["prompt_sha256"], set()).add(
                (int(e["length"]), float(e["depth"]), int(e["trial"]), bool(e.get("control"))))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def manifest_problems(manifest: dict[str, Any], where: str = "manifest.json") -> tuple[dict[str, Any], list[str]]:
    """(manifest whose unreadable attestation readings are replaced by one that says so,
    problems): every configuration entry an object, its attestation an object with a
    list of segments, each reading (start, end) an object or null."""
    problems: list[str] = []
    configs = manifest.get("configs")
    if configs is None:
        return manifest, problems
    if not isinstance(configs, dict):
        return {**manifest, "configs": {}}, [f"{where}: configs is not an object"]
    fixed = copy.deepcopy(manifest)
    for name, entry in configs.items():
        if not isinstance(entry, dict):
            problems.append(f"{where}: configuration {name!r} is not an object")
            fixed["configs"][name] = {}
            continue
        rec = entry.get("attestation")
        if rec is None or (isinstance(rec, dict) and "segments" not in rec):
            continue  # none read, or an older niah's flat record
        segs = rec.get("segments") if isinstance(rec, dict) else None
        if not isinstance(segs, list):
            problems.append(f"{where}: configuration {name!r}: attestation has no list of segments")
            fixed["configs"][name]["attestation"] = {"segments": [{"start": None, "end": _unreadable()}]}
            continue
        for i, seg in enumerate(segs):
            if not isinstance(seg, dict):
                problems.append(f"{where}: configuration {name!r}: segment {i + 1} is not an object")
                fixed["configs"][name]["attestation"]["segments"][i] = {"start": None, "end": _unreadable()}
                continue
            for when in ("start", "end"):
                r = seg.get(when)
                ok = r is None or (isinstance(r, dict) and isinstance(r.get("error"), (str, type(None)))
                                   and isinstance(r.get("attestation"), (dict, type(None))))
                if not ok:
                    problems.append(f"{where}: configuration {name!r}: segment {i + 1}'s {when} reading "
                                    f"{r!r:.60} is not a reading")
                    fixed["configs"][name]["attestation"]["segments"][i][when] = _unreadable()
    return fixed, problems


def _unreadable() -> dict[str, Any]:
    return {"error": "the reading recorded in the manifest cannot be read", "attestation": None}


def load_checked(run_dir: Path | str) -> CheckedRun:
    """Read and check RUN (BadInput when it is no run folder, or of a newer schema)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BadInput(f"no run folder at {run_dir}")
    manifest, problems = manifest_problems(read_manifest(run_dir))
    loaded = read_trials(run_dir / TRIALS)
    notes = []
    corrupt = loaded.corrupt
    if loaded.cut_short is not None:
        notes.append(f"{TRIALS} line {loaded.cut_short} was cut short (a write interrupted); it is left out, "
                     "and `niah sweep --resume` runs that trial again")
    head = []
    if corrupt:
        head.append(f"{TRIALS} line(s) {_lines(corrupt)} are not JSON records (left out)")
    if loaded.bad:
        head.append(f"{len(loaded.bad)} trial record(s) with fields that cannot be read, left out: "
                    + _examples([f"line {n}: {p}" for n, p in loaded.bad]))
    records, more = check_records(loaded.records, loaded.lines, prompt_set(run_dir))
    return CheckedRun(run_dir, manifest, records, head + more + problems, notes)
