"""The indexer's early warning: the per-trial `indexer` summary, its side file, and lengths
relative to k (docs/run-format.md has the schema; docs/sweep.md the length rules).

A server with the `indexer_probe` extension (the embedded server) returns, per probed
query row (the last prompt token, then each decode step until the answer holds the
needle's value) and per layer: the share of the value's tokens kept, the best and worst
value token's rank / k, the margin of the worst kept one over the k-th score, and the
top-k overlap with exact fp32 keys (fidelity). `summarise` turns that detail into the
compact `indexer` object of trials.jsonl; the detail itself goes to RUN/indexer/<config>.jsonl.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any, Iterable

INDEXER_DIR = "indexer"
LAYER_KEYS = ("kept", "rank_best", "rank_worst", "margin", "fidelity")


def _cells(detail: dict, key: str) -> list[float]:
    """Every non-null (layer, active step) value of one per-layer key."""
    return [float(v) for s in detail.get("steps") or [] if s.get("active")
            for v in s.get(key) or [] if v is not None]


def summarise(detail: dict | None) -> dict | None:
    """The trial's `indexer` object from the server's probe detail (None -> None).

    Aggregates run over every (layer, probed step) where selection happened: means for
    `kept` and `fidelity`, geometric means for the ranks / k (they span orders of
    magnitude; a value token whose score ties at 0 ranks at the bottom, S / k, in many
    cells, so a median sits on that plateau and does not move), the median for the margin."""
    if not isinstance(detail, dict):
        return None
    steps = detail.get("steps") or []
    active = [s for s in steps if s.get("active")]
    out: dict[str, Any] = {
        "selection_active": bool(active), "k": detail.get("k"), "value_tokens": detail.get("value_tokens"),
        "context": steps[0].get("context") if steps else None, "steps": len(steps),
        "value_complete": detail.get("value_complete"),
        "kept": None, "rank_best": None, "rank_worst": None, "margin": None, "fidelity": None,
        "layers_lost": None,
    }
    if not active:
        return out
    for key, agg in (("kept", statistics.fmean), ("fidelity", statistics.fmean),
                     ("rank_best", statistics.geometric_mean), ("rank_worst", statistics.geometric_mean),
                     ("margin", statistics.median)):
        vals = _cells(detail, key)
        out[key] = round(agg(vals), 5) if vals else None
    n_layer = max(len(s.get("kept") or []) for s in active)
    out["layers_lost"] = sum(any((s.get("kept") or [1] * n_layer)[i] == 0 for s in active) for i in range(n_layer))
    return out


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


def request_fields(prepared, p) -> dict | None:
    """The niah request extensions this server takes: the needle's char span, and the
    value's (for the indexer probe)."""
    extra: dict = {}
    if prepared.needle_span:
        extra["niah_needle_span"] = list(p.needle_span)
    if prepared.indexer_probe:
        a, b = p.needle_span
        at = p.content.rindex(p.needle.value, a, b)
        extra["niah_value_span"] = [at, at + len(p.needle.value)]
    return extra or None


# -- the side file ----------------------------------------------------------------------
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


# -- lengths relative to k ----------------------------------------------------------------
def config_topk(entry: dict | None) -> int | None:
    """index_topk of one manifest configuration (None: dense or unknown): its axes, matrix
    settings, or what the server said about itself (GET /v1/models, /server_info)."""
    if not isinstance(entry, dict):
        return None
    server = entry.get("server") or {}
    models = [m for m in ((server.get("models") or {}).get("data") or []) if isinstance(m, dict)]
    sources = [entry.get("axes") or {}, entry.get("settings") or {}, *models, server.get("server_info") or {}]
    for src in sources:
        if str(src.get("attention", "")).lower() == "dense":
            return None
    for src in sources:
        k = src.get("index_topk")
        if isinstance(k, int) and not isinstance(k, bool) and k > 0:
            return k
    return None


def at_or_below_k(lengths: Iterable[int], k: int | None) -> list[int]:
    """The lengths where every key is kept (prompt not longer than k): no selection."""
    return [int(n) for n in lengths if k is not None and int(n) <= k]


def length_warnings(lengths: list[int], topks: dict[str, int | None]) -> list[str]:
    """One line per configuration whose lengths are ALL at or below its k (the indexer is
    never exercised), and one naming the cells at or below k otherwise."""
    out = []
    for name, k in topks.items():
        low = at_or_below_k(lengths, k)
        if not low:
            continue
        if len(low) == len(lengths):
            out.append(f"warning: every length of {name!r} is at or below its index_topk {k}: every key is "
                       "kept, the indexer is never exercised (use lengths above k, e.g. --lengths auto)")
        else:
            out.append(f"note: {name!r}: lengths {', '.join(map(str, low))} are at or below index_topk {k} "
                       "(no selection there; reports hatch those cells)")
    return out


def auto_lengths(topks: Iterable[int], context: int, max_tokens: int, floor: int = 128) -> list[int]:
    """k/2, k, 2k, 4k, ... for every k, up to what fits in the context with max_tokens."""
    top = context - max_tokens
    out: set[int] = set()
    for k in set(topks):
        n = k / 2
        while n <= top:
            if n >= floor:
                out.add(int(n))
            n *= 2
    return sorted(out)
