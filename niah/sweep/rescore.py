"""The evaluate stage again: re-score a run's stored answers with the current scorer.

Scoring is a pure function of a stored record (answer, reasoning, finish_reason, error,
expected values, distractor values, a decode trial's count), through the sweep's own
`niah.sweep.judge`, so a rescore agrees with the sweep (`near` misses, a residue trial's
closest value, a decode trial scored after its count); `rescore_run` is a loop over
RUN/trials.jsonl.
A line of trials.jsonl that is not a record (other than a last line cut short by a kill,
which is left out) or a record whose fields cannot be read is refused, naming file:line,
before anything is rewritten. Records of schema 1 carry only `needle`; their distractors come from RUN/prompts.jsonl
when it holds the prompt, else none are known (and the result says so).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from niah.errors import BadInput
from niah.runs.folder import is_run_manifest
from niah.runs.lock import RunLock
from niah.runs.prompts import RUN_PROMPTS
from niah.runs.trials import TRIALS, read_trials, record_key, rewrite_trials
from niah.sweep.judge import judge
from niah.sweep.multiturn import rescore as rescore_multi_turn


@dataclass
class Rescored:
    total: int = 0
    changed: list[tuple[str, str, str]] = field(default_factory=list)  # (trial key, old, new)
    no_distractors: int = 0  # schema-1 records whose distractors are unknown
    written: bool = False


def _known_prompts(run: Path) -> dict[str, dict]:
    out: dict[str, dict] = {}
    path = run / RUN_PROMPTS
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                e = json.loads(line)
                out[e["prompt_sha256"]] = e
            except (ValueError, KeyError, TypeError):
                continue
    return out


def rescore_record(rec: dict, prompts: dict[str, dict]) -> tuple[dict, bool]:
    """The record re-scored, and whether its distractors were known."""
    if rec.get("control"):  # a no-needle control is classified against the whole sweep: kept as is
        return dict(rec), True
    if rec.get("multi_turn") is not None:  # prefix and similarity (niah.sweep.multiturn)
        return rescore_multi_turn(rec), True
    expected, distractors = rec.get("expected"), rec.get("distractors")
    known = distractors is not None
    if expected is None:
        entry = prompts.get(rec.get("prompt_sha256") or "")
        expected = entry["expected"] if entry else ([rec["needle"]] if rec.get("needle") else [])
        distractors = entry["distractors"] if entry else []
        known = entry is not None
    if not expected:  # never asked (an outage before the prompt existed)
        return dict(rec), True
    j = judge(expected, rec.get("answer"), rec.get("reasoning"), rec.get("finish_reason"), rec.get("error"),
              distractors=distractors or [], count_to=rec.get("decode_count_to"),
              keep_near=rec.get("residue") is not None)
    new = {**rec, "outcome": j.outcome, "correct": j.outcome == "correct"}
    if "hits" in rec or len(expected) > 1:
        new["hits"], new["recall_share"] = j.hits, j.recall_share
    if j.near is not None:
        new["near"] = j.near.as_dict()
    else:
        new.pop("near", None)
    return new, known


def rescore_run(run: Path | str, write: bool = True) -> Rescored:
    """Re-score every trial of RUN; rewrite trials.jsonl (atomically, under the run lock)
    when `write` and anything changed."""
    run = Path(run)
    if not (run / "manifest.json").exists() or not is_run_manifest(run / "manifest.json"):
        raise BadInput(f"{run} is not a niah run folder (no niah manifest.json)")
    res = Rescored()
    with RunLock(run):
        loaded = read_trials(run / TRIALS)
        loaded.refuse_unreadable(run / TRIALS)  # a corrupt line is never rewritten away
        prompts = _known_prompts(run)
        out = []
        for rec in loaded.records:
            new, known = rescore_record(rec, prompts)
            res.total += 1
            res.no_distractors += not known
            if new["outcome"] != rec.get("outcome"):
                res.changed.append((record_key(rec), rec.get("outcome"), new["outcome"]))
            out.append(new)
        if write and (res.changed or out != loaded.records):
            rewrite_trials(run, out)
            res.written = True
    return res
