"""Cache state and reasoning in reports: the summary's sections and the gate's split by state.

A trial's cache state (niah.sweep.cache_state) is the frame's `cache_state` column, with
`UNCONTROLLED` for trials swept without `--cache-state` (every run before it too). A cell
is length x depth x cache state: `by_state` splits a baseline and a candidate into the
states they are gated in (one part, state None, when neither side controlled it), and
niah.report.data.pair_trials pairs only within a state.

Summary sections, each None when there is nothing to say:
- `cache_section`: recall per configuration, cache state and length; the repeat faults
  (two different answers to one request at temperature 0) per length; the median share of
  the prompt the server reported cached; without `--cache-state`, one line saying whether
  the usage counter warmed every prompt (the manifest's tokenizer_cost.warms_prefix_cache).
- `reasoning_section`: per configuration (thinking on, off or unsaid, from the manifest)
  and length, the trials whose value appeared only in the reasoning, in the content, in
  both, in neither; and with `--answer-prefix`, how many answers started with it.
Pure: frames and manifests in, Markdown out.
"""

from __future__ import annotations

from typing import Any

from niah.report.data import UNCONTROLLED, aggregate


def _states(df) -> list[str]:
    return list(dict.fromkeys(df["cache_state"])) if "cache_state" in df.columns and len(df) else []


def controlled(df) -> bool:
    """Does any trial carry a cache state?"""
    return any(s != UNCONTROLLED for s in _states(df))


def by_state(b, c) -> tuple[list[tuple[str | None, Any, Any]], list[str]]:
    """([(state, baseline part, candidate part)], candidate states the baseline lacks):
    one part with state None when neither side controlled the cache."""
    if not (controlled(b) or controlled(c)):
        return [(None, b, c)], []
    states = _states(b)
    return ([(s, b[b["cache_state"] == s], c[c["cache_state"] == s]) for s in states],
            [s for s in _states(c) if s not in states])


def _table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(r) + " |" for r in rows)]) + "\n"


def _recall(r) -> str:
    if r is None:
        return "—"
    if r.answered == 0:
        return f"outage ({r.errors} err)"
    return f"{r.recall:.2f} ({r.correct}/{r.answered})" + (f" ⚠{r.errors} err" if r.errors else "")


def _warmed_by_counter(manifest: dict, names) -> list[str]:
    configs = manifest.get("configs") or {}
    return [n for n in names if ((configs.get(n) or {}).get("tokenizer_cost") or {}).get("warms_prefix_cache")]


def cache_section(df, infos, lengths, manifest: dict) -> str | None:
    """Recall by cache state, repeat faults and reported cached tokens (module doc)."""
    if not controlled(df):
        warmed = _warmed_by_counter(manifest, infos)
        if not warmed:
            return None
        return ("\n## Cache state\n\nNot controlled: the usage counter sent every prompt before its trial, so "
                f"the trials of {', '.join(f'`{n}`' for n in warmed)} were prefix-cache hits "
                "(`niah sweep --cache-state cold,warm,repeat` controls it).\n")
    by = aggregate(df, ["config", "cache_state", "length"])
    idx = {(r.config, r.cache_state, r.length): r for r in by.itertuples(index=False)}
    rows = [[f"`{n}`", s, *[_recall(idx.get((n, s, L))) for L in lengths]]
            for n in infos for s in _states(df[df["config"] == n])]
    out = ["\n## Recall by cache state\n",
           "cold: a nonce opens each prompt (nothing cached); warm: the same request sent first; repeat: "
           "sent twice, the second scored. A cell is length x depth x cache state: differences pair "
           "within a state.\n", _table(["config", "cache state", *map(str, lengths)], rows)]
    rep = df[df["repeat_fault"].notna()] if "repeat_fault" in df.columns else df.iloc[0:0]
    if len(rep):
        cells = []
        for n in infos:
            d = rep[rep["config"] == n]
            if len(d):
                cells.append([f"`{n}`", *[_faults(d[d["length"] == L]) for L in lengths]])
        out += ["\n### Repeat faults (two different answers to one request at temperature 0)\n",
                _table(["config", *map(str, lengths)], cells)]
    share = _cached_share(df)
    if share:
        out += ["\n### Prompt share the server reported cached (median)\n",
                _table(["config", "cache state", "cached / prompt tokens"], share)]
    return "\n".join(out)


def _faults(d) -> str:
    if not len(d):
        return "—"
    k = int(d["repeat_fault"].astype(bool).sum())
    return f"{'⚠ ' if k else ''}{k} of {len(d)}"


def _cached_share(df) -> list[list[str]]:
    import pandas as pd

    if "cached_tokens" not in df.columns:
        return []
    d = df[df["cached_tokens"].notna() & df["prompt_tokens"].notna()]
    rows = []
    for (n, s), g in d.groupby(["config", "cache_state"], sort=False):
        share = pd.to_numeric(g["cached_tokens"]) / g["prompt_tokens"]
        rows.append([f"`{n}`", s, f"{share.median():.3f} (n={len(g)})"])
    return rows


def reasoning_section(df, infos, lengths, manifest: dict) -> str | None:
    """Where the values were found for replies with reasoning, and the answer prefix."""
    out = []
    configs = manifest.get("configs") or {}
    if "found_in" in df.columns and df["found_in"].notna().any():
        rows = []
        for n in infos:
            d = df[(df["config"] == n) & df["found_in"].notna()]
            if not len(d):
                continue
            thinking = {True: "on", False: "off"}.get((configs.get(n) or {}).get("thinking"), "unsaid")
            cells = []
            for L in lengths:
                x = d[d["length"] == L]["found_in"].value_counts()
                cells.append("—" if not len(x) else " / ".join(str(int(x.get(k, 0)))
                                                                for k in ("reasoning", "content", "both", "neither")))
            rows.append([f"`{n}`", thinking, *cells])
        out += ["\n## Where the answer was found (replies with reasoning)\n",
                "Per length: only in the reasoning / only in the content / both / neither. Only in the "
                "reasoning: the model found the value but its final answer did not say it (scored from the "
                "reasoning only when the content is empty).\n",
                _table(["config", "thinking", *map(str, lengths)], rows)]
    if "answer_prefix_ok" in df.columns and df["answer_prefix_ok"].notna().any():
        prefix = (manifest.get("args") or {}).get("answer_prefix")
        rows = []
        for n in infos:
            d = df[(df["config"] == n) & df["answer_prefix_ok"].notna()]
            cells = [f"{int(x.astype(bool).sum())} of {len(x)}" if len(x) else "—"
                     for x in (d[d["length"] == L]["answer_prefix_ok"] for L in lengths)]
            rows.append([f"`{n}`", *cells])
        out += [f"\n## Answers that began with the answer prefix{f' ({prefix!r})' if prefix else ''}\n",
                _table(["config", *map(str, lengths)], rows)]
    return "\n".join(out) if out else None
