"""Machine-readable output of `niah compare`, `niah gate` and `niah plan` (`--json`).

One JSON object per command on stdout, each with a `schema` naming its shape and version
("niah.compare/1", "niah.gate/1", "niah.plan/1"; docs/json.md documents every field). A new
field may be added within a version; a field is never renamed or removed without a new
version. Numbers that are undefined (a recall of no trials, a p of no pairs) are `null`,
never NaN, so any JSON parser reads the output. Recalls, differences and rates are
fractions (0.95), never percentages. Pure: nothing here prints or writes.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, is_dataclass
from typing import Any

from niah.report.compare import ALL
from niah.report.gate import verdict_of

COMPARE, GATE, PLAN = "niah.compare/1", "niah.gate/1", "niah.plan/1"


def clean(x: Any) -> Any:
    """`x` with dataclasses as dicts, NaN / inf as None, tuples as lists, numpy scalars as numbers."""
    if is_dataclass(x) and not isinstance(x, type):
        return clean(asdict(x))
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return None if not math.isfinite(x) else x
    item = getattr(x, "item", None)  # numpy / pandas scalars
    if callable(item):
        return clean(item())
    return str(x)


def dumps(obj: dict) -> str:
    return json.dumps(clean(obj), indent=2, allow_nan=False, ensure_ascii=False)


def row(r) -> dict:
    """A niah.report.compare.Row: the recalls of A and B, B - A, the evidence, the verdict."""
    d = clean(r)
    d["verdict"] = r.verdict
    if isinstance(r.group, tuple):  # a (length, depth) cell, with its cache state first where controlled
        names = ("cache_state", "length", "depth") if isinstance(r.group[0], str) else ("length", "depth")
        d["group"] = {k: clean(v) for k, v in zip(names, r.group)}
    return d


def rank_row(r) -> dict:
    return clean(r)


def overall_verdict(rows) -> str:
    """The verdict of the row over every length ("all"), else "no data"."""
    ov = next((r for r in rows if r.group == ALL), None)
    return ov.verdict if ov is not None else "no data"


def compare_json(side_a: dict, side_b: dict, alpha: float, method: str | None, notes: list[str], rows, ranks,
                 fidelity, cells=None) -> dict:
    """`niah compare --json`. side_*: {"run": path, "config": name}."""
    out = {"schema": COMPARE, "a": side_a, "b": side_b, "alpha": alpha,
           "pairing": method, "verdict": overall_verdict(rows),
           "attestation_notes": list(notes), "rows": [row(r) for r in rows],
           "ranks": [rank_row(r) for r in ranks if r.n], "fidelity": None}
    if fidelity is not None and fidelity.n:
        out["fidelity"] = clean(fidelity)
    if cells is not None:
        out["cells"] = [row(r) for r in cells]
    return out


def gate_json(res) -> dict:
    """`niah gate --json`: a niah.report.gate.GateResult."""
    cases = []
    for c in res.cases:
        cases.append({"config": c.config, "baseline_config": res.config_map.get(c.config, c.config),
                      "length": ALL if c.length == ALL else int(c.length), "metric": c.metric,
                      "status": c.status, "message": c.message,
                      "row": None if c.row is None else row(c.row), **({"residue": c.residue} if c.residue else {})})
    configs = {}
    for cfg in dict.fromkeys(c.config for c in res.cases):
        mine = [c for c in res.cases if c.config == cfg]
        configs[cfg] = {"baseline_config": res.config_map.get(cfg, cfg), "pairing": res.pairing.get(cfg),
                        "attestation": res.attestation.get(cfg), "verdict": verdict_of(mine)}
    return {"schema": GATE, "verdict": res.verdict, "exit_code": res.exit_code,
            "baseline": res.baseline, "candidate": res.candidate,
            "rule": {"tolerance": res.tolerance, "alpha": res.alpha, "max_error_rate": res.max_error_rate,
                     "metric": res.metric, "rank_tolerance": res.rank_tolerance},
            "notes": list(res.notes) + [f"caveat: {c.text}" for c in res.caveats],
            "caveats": [{"kind": c.kind, "config": c.config, "text": c.text} for c in res.caveats],
            "configs": configs, "cases": cases,
            "failed": [{"config": c.config, "length": c.length if c.length == ALL else int(c.length),
                        "metric": c.metric, "status": c.status, **({"residue": c.residue} if c.residue else {})}
                       for c in res.failed]}


def _r(x, digits: int = 4):
    """`x` rounded for `niah plan --json` (None and NaN stay undefined)."""
    return None if x is None or x != x else round(float(x), digits)


def plan_json(recall: float, target: float, alpha: float, power: float, depths: int, plans) -> dict:
    """`niah plan --json` (the formula: trials each design needs). Inputs are rounded to 6
    decimals (0.95 - 0.85 is 0.1, not 0.09999999999999998), powers to 4."""
    designs = [{"design": p.design, "trials_per_side": p.n,
                "trials_per_cell": math.ceil(p.n / depths), "power": _r(p.power), "method": p.method} for p in plans]
    return {"schema": PLAN, "mode": "formula", "recall": _r(recall, 6), "target": _r(target, 6),
            "drop": _r(recall - target, 6), "alpha": _r(alpha, 6), "power": _r(power, 6), "depths": depths,
            "designs": designs}


def plan_run_json(run: str, a: str, b: str, alpha: float, power: float, reps: int, summary: dict, results) -> dict:
    """`niah plan --run RUN --json` (the bootstrap: paired trials each metric needs)."""
    metrics = [{"metric": r.metric, "trials_needed": r.n, "power_at_max": _r(r.power_at_max), "resampled": r.tried}
               for r in results]
    observed = {k: (_r(v) if isinstance(v, float) else v) for k, v in summary.items()}
    return {"schema": PLAN, "mode": "bootstrap", "run": run, "a": a, "b": b, "alpha": _r(alpha, 6),
            "power": _r(power, 6), "reps": reps, "observed": observed, "metrics": metrics}
