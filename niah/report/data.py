"""Trials as tables: per-cell and per-length recall, pairing across configurations/runs.

Recall everywhere is `correct / answered`, where *answered* excludes `error` trials
(HTTP errors, timeouts, dead servers): an outage is counted and shown apart, never as a
miss. A cell whose trials all errored has no recall (NaN) and is drawn as an outage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from niah.axes import comparable_axes
from niah.errors import BadInput
from niah.report.stats import wilson
from niah.runs.integrity import load_checked
from niah.runs.record import OUTCOMES

# Columns every trial frame has after `trials_frame` (missing ones filled with None).
COLUMNS = (
    "config", "model", "length", "prompt_tokens", "prompt_tokens_local", "depth",
    "depth_achieved", "trial", "seed", "prompt_sha256", "outcome", "latency_s", "ttft_s",
    "error", "selection_recall", "indexer", "finished_at",
    "cache_state", "cached_tokens", "repeat_fault", "found_in", "answer_prefix_ok",
)
UNCONTROLLED = "uncontrolled"  # the cache_state of a trial swept without --cache-state
# From each trial's `indexer` summary (niah/sweep/indexer.py): NaN where not recorded or where no
# selection happened (prompt not longer than k).
INDEXER_COLUMNS = ("rank_worst", "rank_best", "kept", "margin", "fidelity")


def split_controls(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(needle trials, no-needle control trials): controls never count towards recall."""
    needle = [r for r in records if not r.get("control")]
    return needle, [r for r in records if r.get("control")]


def trials_frame(records: list[dict[str, Any]]):
    """Needle-trial records (control trials are left out) -> DataFrame with the COLUMNS
    above plus `correct`, `answered`, `is_error`; from selection_recall (NaN when not
    recorded) `sel_mean` / `sel_min` / `sel_max` over layers; from the `indexer` summary
    `idx_active` (True / False / None) and the INDEXER_COLUMNS prefixed `idx_`."""
    import numpy as np
    import pandas as pd

    df = pd.DataFrame(split_controls(list(records))[0])
    for col in COLUMNS:
        if col not in df.columns:
            df[col] = None
    if df.empty:
        df = df.astype({"length": "int64", "depth": "float64"})
    bad = sorted(set(df["outcome"].dropna()) - set(OUTCOMES))
    if bad or df["outcome"].isna().any():
        raise BadInput(f"trials with unknown outcome {bad or [None]}; expected one of {OUTCOMES}")
    df["config"] = df["config"].fillna("default").astype(str)
    df["length"] = df["length"].astype("int64")
    df["depth"] = df["depth"].astype("float64")
    df["cache_state"] = df["cache_state"].fillna(UNCONTROLLED).astype(str)
    df["correct"] = df["outcome"] == "correct"
    df["is_error"] = df["outcome"] == "error"
    df["answered"] = ~df["is_error"]

    def _layers(v: Any) -> list[float]:
        if isinstance(v, (list, tuple)):
            return [float(x) for x in v if x is not None]
        return []

    summaries = [v if isinstance(v, dict) else {} for v in df["indexer"]]
    df["idx_active"] = [s.get("selection_active") if s else None for s in summaries]
    for key in INDEXER_COLUMNS:
        df[f"idx_{key}"] = [float(s[key]) if s.get("selection_active") and s.get(key) is not None else np.nan
                            for s in summaries]

    layers = [_layers(v) for v in df["selection_recall"]]
    df["sel_mean"] = [sum(v) / len(v) if v else np.nan for v in layers]
    df["sel_min"] = [min(v) if v else np.nan for v in layers]
    df["sel_max"] = [max(v) if v else np.nan for v in layers]
    for col in ("latency_s", "ttft_s", "prompt_tokens", "prompt_tokens_local", "depth_achieved"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def aggregate(df, keys: list[str], confidence: float = 0.95):
    """Group `df` by keys: n, answered, correct, errors, recall (NaN when nothing was
    answered), Wilson lo/hi, and where recorded the selection recall: `sel` (mean over
    trials of the mean over layers), `sel_min` / `sel_max` (mean over trials of the
    weakest / strongest layer) and `sel_n` (trials that recorded it)."""
    import numpy as np
    import pandas as pd

    if df.empty:
        return pd.DataFrame(columns=[*keys, "n", "answered", "correct", "errors", "recall", "lo", "hi",
                                     "sel", "sel_min", "sel_max", "sel_n"])
    g = df.groupby(keys, sort=True)
    out = pd.DataFrame({
        "n": g.size(),
        "answered": g["answered"].sum(),
        "correct": g["correct"].sum(),
        "errors": g["is_error"].sum(),
        "sel": g["sel_mean"].mean(),
        "sel_min": g["sel_min"].mean(),
        "sel_max": g["sel_max"].mean(),
        "sel_n": g["sel_mean"].count(),
    }).reset_index()
    for c in ("n", "answered", "correct", "errors", "sel_n"):
        out[c] = out[c].astype(int)
    out["recall"] = np.where(out["answered"] > 0,
                             out["correct"] / out["answered"].where(out["answered"] > 0, 1), np.nan)
    bounds = [wilson(int(k), int(n), confidence) if n else (np.nan, np.nan)
              for k, n in zip(out["correct"], out["answered"])]
    out["lo"] = [b[0] for b in bounds]
    out["hi"] = [b[1] for b in bounds]
    return out


# -- configurations ---------------------------------------------------------------------
@dataclass
class ConfigInfo:
    name: str
    model: str
    axes: dict[str, Any]
    dense: bool
    settings: dict[str, Any] = field(default_factory=dict)  # the matrix settings (manifest)


def _is_dense(name: str, axes: dict[str, Any]) -> bool:
    if "dense" in name.lower():
        return True
    return any(str(v).lower() == "dense" for v in axes.values())


def config_infos(manifest: dict[str, Any], df) -> dict[str, ConfigInfo]:
    """Configurations in manifest order (then any only seen in trials), with their axes."""
    out: dict[str, ConfigInfo] = {}
    configs = manifest.get("configs") or {}
    present = list(dict.fromkeys(df["config"])) if len(df) else []
    for name in [*configs, *[p for p in present if p not in configs]]:
        meta = configs.get(name) or {}
        axes = dict(meta.get("axes") or {})
        model = meta.get("model")
        if not model and len(df):
            models = df.loc[df["config"] == name, "model"].dropna()
            model = models.iloc[0] if len(models) else None
        out[name] = ConfigInfo(name, str(model or "?"), axes, _is_dense(name, axes), dict(meta.get("settings") or {}))
    return out


def one_axis_pairs(infos: dict[str, ConfigInfo]) -> list[tuple[str, str, str]]:
    """(A, B, label) for every pair of configurations that differ in exactly one axis
    (same axis names, one value different), plus every sparse configuration against a
    dense control. A is the smaller numeric value, else the one listed first; the dense
    control is always A. The label says what changes ("index_dtype: fp8 -> bf16 @ index_topk=1024").
    An axis key only one side sets is completed on the other from its settings or the
    axis default (niah.axes.comparable_axes: index_rotation "none")."""
    names = list(infos)
    pairs: list[tuple[str, str, str]] = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ia, ib = infos[a], infos[b]
            if ia.dense or ib.dense:
                if ia.dense == ib.dense:
                    continue
                dense, sparse = (ia, ib) if ia.dense else (ib, ia)
                pairs.append((dense.name, sparse.name, f"dense control -> {sparse.name}"))
                continue
            axes_a, axes_b = comparable_axes(ia.axes, ib.axes, ia.settings, ib.settings)
            if not axes_a or set(axes_a) != set(axes_b):
                continue
            diff = [k for k in axes_a if axes_a[k] != axes_b[k]]
            if len(diff) != 1:
                continue
            k = diff[0]
            va, vb = axes_a[k], axes_b[k]
            both_num = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
            if both_num and va > vb:
                ia, ib, va, vb, axes_a = ib, ia, vb, va, axes_b
            fixed = ", ".join(f"{kk}={axes_a[kk]}" for kk in axes_a if kk != k)
            pairs.append((ia.name, ib.name, f"{k}: {va} -> {vb}" + (f" @ {fixed}" if fixed else "")))
    return pairs


# -- pairing ------------------------------------------------------------------------------
PAIR_FALLBACK = ["length", "depth", "trial", "seed"]


def pair_trials(a, b):
    """Pair trials of A and B that saw the same prompt (prompt_sha256); when fewer than half
    pair that way, fall back to (length, depth, trial, seed). Trials pair only within one
    cache state (a cell is length x depth x cache state), each state on its own basis.
    Returns (pairs, method) with pairs holding length, depth, cache_state, correct_a,
    correct_b, outcome_a, outcome_b (and residue, when both sides carry it); method is
    "prompt", "seed", "prompt+seed" (states paired on different bases) or None (nothing
    pairs: compare unpaired)."""
    import pandas as pd

    a, b = (x if "cache_state" in x.columns else x.assign(cache_state=UNCONTROLLED) for x in (a, b))
    parts, methods = [], []
    for state in dict.fromkeys([*a["cache_state"], *b["cache_state"]]):
        p, m = _pair(a[a["cache_state"] == state], b[b["cache_state"] == state])
        if m:
            parts.append(p.assign(cache_state=state))
            methods.append(m)
    cols = ["length", "depth", "cache_state", "correct_a", "correct_b", "outcome_a", "outcome_b"]
    cols += [c for c in ("residue",) if parts and all(c in p.columns for p in parts)]  # --residues: per pair
    if not parts:
        return pd.DataFrame(columns=cols), None
    method = methods[0] if len(set(methods)) == 1 else "prompt+seed"
    return pd.concat(parts, ignore_index=True)[cols], method


def _pair(a, b):
    """pair_trials within one cache state."""
    import pandas as pd

    extra = [c for c in ("residue",) if c in a.columns and c in b.columns]  # --residues: A's, kept per pair
    cols = ["length", "depth", "trial", "seed", "prompt_sha256", "correct", "outcome", *extra]
    a = a[cols].copy()
    b = b[[c for c in cols if c not in extra]].copy()
    best, method = None, None
    ha, hb = a.dropna(subset=["prompt_sha256"]), b.dropna(subset=["prompt_sha256"])
    if len(ha) and len(hb):
        m = ha.drop_duplicates("prompt_sha256").merge(
            hb.drop_duplicates("prompt_sha256")[["prompt_sha256", "correct", "outcome"]],
            on="prompt_sha256", suffixes=("_a", "_b"))
        if len(m) and 2 * len(m) >= min(len(a), len(b)):
            best, method = m, "prompt"
    if best is None:
        fa, fb = a.dropna(subset=["seed"]), b.dropna(subset=["seed"])
        if len(fa) and len(fb):
            m = fa.drop_duplicates(PAIR_FALLBACK).merge(
                fb.drop_duplicates(PAIR_FALLBACK)[[*PAIR_FALLBACK, "correct", "outcome"]],
                on=PAIR_FALLBACK, suffixes=("_a", "_b"))
            if len(m):
                best, method = m, "seed"
    if best is None:
        return pd.DataFrame(columns=["length", "depth", "correct_a", "correct_b", "outcome_a", "outcome_b"]), None
    keep = ["length", "depth", "correct_a", "correct_b", "outcome_a", "outcome_b", *extra]
    return best[keep].reset_index(drop=True), method


def load_frame(run: Path | str):
    """(manifest, frame) of a run folder; BadInput when it has an integrity problem
    (niah.runs.integrity)."""
    checked = load_checked(run)
    checked.refuse()
    return checked.manifest, trials_frame(checked.records)
