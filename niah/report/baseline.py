"""CI baselines: a small JSON export of a run that the gate can pair against.

    {"kind": "niah-baseline", "schema_version": 2, "exported": ..., "source": {run, created,
     git_sha, niah_version, args},
     "configs": {NAME: {"model", "axes", "engine", "settings": its label keys,
                        "attestation": the run's record (niah/attestation/),
                        "attestation_status": {"state", "reason"} when exported,
                        "summary": {"<length>" | "all": {n, answered, correct, errors, recall, lo, hi}},
                        "trials": [{"key": "length|depth|trial", "length", "depth", "trial",
                                    "seed", "prompt_sha256", "outcome", "correct",
                                    "rank": needle rank / k, null without selection,
                                    "kept", "fidelity": the probe's needle kept share and
                                    selection fidelity, null without selection,
                                    "cache_state" where the sweep set one,
                                    "residue", "base_length" in a --residues run,
                                    "decode_first" in a --decode-first run}]}}}

Per-trial outcomes are kept (keyed by prompt hash) so the gate pairs a candidate with an
exported baseline exactly as with a run folder, and its attestation is judged the same
way (`niah.attestation.status`). `load_side` reads either, through the same integrity
checks (niah.runs.integrity: unreadable fields, duplicated keys, a run's trials outside its
prompt set, unreadable readings), and refuses a side with any problem (BadInput, exit 2).
A schema 1 baseline (no engine, no readings) is still read: its labels are unattested.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from niah.attestation import status
from niah.axes import LABEL_KEYS
from niah.errors import BadInput, write_output
from niah.report.data import UNCONTROLLED, aggregate, config_infos, load_frame, trials_frame
from niah.runs.integrity import check_records, load_checked, manifest_problems, refuse

KIND = "niah-baseline"
BASELINE_SCHEMA = 2
_TRIAL_FIELDS = ("length", "depth", "trial", "seed", "prompt_sha256", "outcome")


def _summary(df) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in aggregate(df, ["length"]).itertuples(index=False):
        out[str(int(r.length))] = _row(r)
    tot = aggregate(df.assign(_all=0), ["_all"])
    if len(tot):
        out["all"] = _row(next(tot.itertuples(index=False)))
    return out


def _row(r) -> dict[str, Any]:
    rec = None if r.recall != r.recall else round(float(r.recall), 6)
    return {"n": int(r.n), "answered": int(r.answered), "correct": int(r.correct), "errors": int(r.errors),
            "recall": rec, "lo": round(float(r.lo), 6) if r.lo == r.lo else None,
            "hi": round(float(r.hi), 6) if r.hi == r.hi else None}


def export_baseline(run: Path | str, out: Path | str, configs: list[str] | None = None) -> dict[str, Any]:
    """Write RUN (all configurations, or the named ones) as a baseline file; returns it."""
    run = Path(run)
    manifest, df = load_frame(run)
    if df.empty:
        raise BadInput(f"{run} has no finished trials; nothing to export")
    infos = config_infos(manifest, df)
    names = [n for n in infos if (df["config"] == n).any()]
    if configs:
        missing = [c for c in configs if c not in names]
        if missing:
            raise BadInput(f"{run} has no configuration {missing}; it has {names}")
        names = list(configs)
    data: dict[str, Any] = {
        "kind": KIND,
        "schema_version": BASELINE_SCHEMA,
        "exported": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": {
            "run": str(run),
            "created": manifest.get("created"),
            "git_sha": manifest.get("git_sha"),
            "niah_version": manifest.get("niah_version"),
            "args": {k: v for k, v in (manifest.get("args") or {}).items()
                     if k in ("lengths", "depths", "trials", "seed", "mode", "max_tokens", "tokenizer", "needle",
                                  "cache_states", "residues", "decode_first")},
        },
        "configs": {},
    }
    for name in names:
        d = df[df["config"] == name].sort_values(["length", "depth", "trial"])
        trials = []
        for r in d.itertuples(index=False):
            trials.append({
                "key": f"{int(r.length)}|{float(r.depth):g}|{int(r.trial)}"
                       + (f"|{r.cache_state}" if r.cache_state != UNCONTROLLED else ""),
                "length": int(r.length), "depth": float(r.depth), "trial": int(r.trial),
                "seed": None if r.seed is None or r.seed != r.seed else int(r.seed),
                "prompt_sha256": r.prompt_sha256, "outcome": r.outcome, "correct": bool(r.correct),
                "rank": None if r.idx_rank_worst != r.idx_rank_worst else float(r.idx_rank_worst),
                "kept": None if r.idx_kept != r.idx_kept else float(r.idx_kept),
                "fidelity": None if r.idx_fidelity != r.idx_fidelity else float(r.idx_fidelity),
                **({"cache_state": r.cache_state} if r.cache_state != UNCONTROLLED else {}),
                **({"decode_first": int(v)} if (v := getattr(r, "decode_first", None)) == v and v is not None else {}),
                **{k: int(v) for k in ("residue", "base_length")
                   if (v := getattr(r, k, None)) is not None and v == v},
                **({"multi_turn": int(v)} if (v := getattr(r, "multi_turn", None)) == v and v is not None else {}),
            })
        entry = (manifest.get("configs") or {}).get(name) or {}
        state, reason = status(entry)
        data["configs"][name] = {"model": infos[name].model, "axes": infos[name].axes,
                                 "engine": entry.get("engine"),
                                 "settings": {k: v for k, v in (entry.get("settings") or {}).items()
                                              if k in LABEL_KEYS},
                                 "attestation": entry.get("attestation"),
                                 "attestation_status": {"state": state, "reason": reason},
                                 "summary": _summary(d), "trials": trials}
    write_output(out, json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return data


def read_baseline(path: Path | str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(manifest-like dict, trial records) of a baseline file; BadInput when it is not one."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: cannot read baseline ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise BadInput(f"{path}: not a niah baseline (kind != {KIND!r})")
    version = data.get("schema_version")
    if not isinstance(version, int) or version > BASELINE_SCHEMA:
        raise BadInput(f"{path}: baseline schema_version {version!r} is not one this niah reads ({BASELINE_SCHEMA})")
    configs = data.get("configs")
    if not isinstance(configs, dict) or not configs:
        raise BadInput(f"{path}: baseline has no configurations")
    records = []
    for name, c in configs.items():
        if not isinstance(c, dict) or not isinstance(c.get("trials") or [], list):
            raise BadInput(f"{path}: configuration {name!r} is not a baseline configuration")
        for t in c.get("trials") or []:
            if not isinstance(t, dict) or not all(k in t for k in _TRIAL_FIELDS):
                raise BadInput(f"{path}: trial record of {name!r} lacks one of {_TRIAL_FIELDS}")
            rank = t.get("rank")
            records.append({**{k: t[k] for k in _TRIAL_FIELDS}, "config": name, "model": c.get("model"),
                            **({"cache_state": t["cache_state"]} if t.get("cache_state") else {}),
                            **({"decode_first": t["decode_first"]} if t.get("decode_first") else {}),
                            **{k: t[k] for k in ("residue", "base_length") if t.get(k) is not None},
                            **({"multi_turn": t["multi_turn"]} if t.get("multi_turn") else {}),
                            "indexer": {"selection_active": True, "rank_worst": rank, "kept": t.get("kept"),
                                        "fidelity": t.get("fidelity")} if rank is not None else None})
    kept = ("engine", "settings", "attestation")  # what niah.attestation.status judges
    manifest = {"created": (data.get("source") or {}).get("created"),
                "args": {k: v for k, v in ((data.get("source") or {}).get("args") or {}).items()
                         if k in ("residues", "decode_first")},
                "git_sha": (data.get("source") or {}).get("git_sha"),
                "configs": {n: {"model": c.get("model"), "axes": c.get("axes") or {},
                                **{k: c[k] for k in kept if c.get(k)}}
                            for n, c in configs.items()}}
    return manifest, records


@dataclass
class Side:
    """One side of a comparison: a run folder or a baseline file, checked."""

    manifest: dict[str, Any]
    records: list[dict[str, Any]]
    what: str  # "run PATH" or "baseline PATH"
    notes: list[str] = field(default_factory=list)  # tolerated (a run's cut last line)


def read_side(path: Path | str, empty_ok: bool = False) -> Side:
    """A run folder or a baseline file; BadInput when it is neither, has no trials (a run
    folder with none is read when `empty_ok`: a sweep stopped before its first trial, which
    the gate judges as an incomplete candidate), or has any integrity problem
    (niah.runs.integrity)."""
    path = Path(path)
    if path.is_dir():
        run = load_checked(path)
        run.refuse()
        side = Side(run.manifest, run.records, f"run {path}", run.notes)
    elif path.is_file():
        manifest, records = read_baseline(path)
        manifest, problems = manifest_problems(manifest, str(path))
        records, more = check_records(records)
        refuse(problems + more, f"baseline {path}")
        side = Side(manifest, records, f"baseline {path}")
    else:
        raise BadInput(f"{path}: no such run folder or baseline file")
    if not side.records and not (empty_ok and path.is_dir()):
        raise BadInput(f"{path}: no trials")
    known = side.manifest.get("configs") or {}
    unknown = sorted({str(r.get("config")) for r in side.records if r.get("config") not in known})
    if unknown:
        raise BadInput(f"{path}: trials of configuration(s) {', '.join(map(repr, unknown))} that its manifest does "
                       "not list (not written by a sweep of this run); refusing to compare them")
    return side


def load_side(path: Path | str):
    """(manifest, trial frame, description) of a run folder or a baseline file (read_side)."""
    side = read_side(path)
    return side.manifest, trials_frame(side.records), side.what
