"""The indexer's early warning: the per-trial `indexer` summary, its side file, and lengths
relative to k (docs/run-format.md has the schema; docs/sweep.md the length rules).

A server with the `indexer_probe` extension (the embedded server) returns, per probed
query row (the last prompt token, then each decode step until the answer holds the
needle's value) and per layer: the share of the value's tokens kept, the best and worst
value token's rank / k, the margin of the worst kept one over the k-th score, and the
top-k overlap with exact fp32 keys (fidelity). `summarise` turns that detail into the
compact `indexer` object of trials.jsonl; the detail itself goes to RUN/indexer/<config>.jsonl
(niah.runs.side writes and reads it). A configuration's regime (config_regime) and the
lengths at or below k are niah.regime's, re-exported here.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable

from niah.regime import Regime, as_regime, at_or_below_k, config_regime, config_topk
from niah.runs.side import layer_rows

LAYER_KEYS = ("kept", "rank_best", "rank_worst", "margin", "fidelity")
# read here, defined below the sweep (the report reads them too, and imports nothing of niah.sweep)
__all__ = ["LAYER_KEYS", "at_or_below_k", "auto_lengths", "config_regime", "config_topk", "geometry_conflict",
           "layer_rows", "length_warnings", "request_fields", "summarise"]


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


# -- lengths relative to k ----------------------------------------------------------------
def geometry_conflict(given: dict, server: list) -> str | None:
    """What the command line's geometry says against the server's own word, or None."""
    for key, said in given.items():
        for src in server:
            if isinstance(src, dict) and src.get(key) is not None and src.get(key) != said:
                return (f"--{key.replace('_', '-')} {said} contradicts the server, which reports {key} "
                        f"{src.get(key)}; drop the option")
    return None


def length_warnings(lengths: list[int], topks: dict[str, Regime | int | None]) -> list[str]:
    """One line per configuration whose lengths are ALL at or below its k (the indexer is
    never exercised), and one naming the cells at or below k otherwise."""
    out = []
    for name, k in topks.items():
        low = at_or_below_k(lengths, k)
        if not low:
            continue
        words = as_regime(k).words()
        if len(low) == len(lengths):
            out.append(f"warning: every length of {name!r} is at or below its {words}: every key is "
                       "kept, the indexer is never exercised (use lengths above k, e.g. --lengths auto)")
        else:
            out.append(f"note: {name!r}: lengths {', '.join(map(str, low))} are at or below {words} "
                       "(no selection there; reports hatch those cells)")
    return out


def auto_lengths(topks: Iterable[Regime | int], context: int, max_tokens: int, floor: int = 128) -> list[int]:
    """s/2, s, 2s, 4s, ... for every regime's scale s (k under V3.2's rule, compression * k
    + window otherwise), up to what fits in the context with max_tokens."""
    top = context - max_tokens
    out: set[int] = set()
    for k in {as_regime(t).scale for t in topks}:
        n = k / 2
        while n <= top:
            if n >= floor:
                out.add(int(n))
            n *= 2
    return sorted(out)
