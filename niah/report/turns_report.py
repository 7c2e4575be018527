"""`--multi-turn` in reports: a section of the summary.

- `turns_section(records, infos, lengths)`: per configuration and length, the trials swept
  with `--multi-turn N` found (prefix hit and similarity at least the threshold of
  niah.sweep.multiturn) out of those answered, with their mean similarity and prefix
  hits; then found by asked index i. None when no trial was swept with it (a default
  run's summary is unchanged).
Trials of different N never pair: niah.report.compare.check_pairable.
"""

from __future__ import annotations

from typing import Any

from niah.prompts.turns import FOUND_SIMILARITY as THRESHOLD


def _cell(trials: list[dict[str, Any]]) -> str:
    scored = [r for r in trials if r.get("outcome") != "error"]
    if not scored:
        return "—"
    sims = [float(r["similarity"]) for r in scored if r.get("similarity") is not None]
    hits = sum(bool(r.get("prefix_hit")) for r in scored)
    found = sum(bool(r.get("correct")) for r in scored)
    mean = f", sim {sum(sims) / len(sims):.2f}" if sims else ""
    return f"{found}/{len(scored)}{mean}, prefix {hits}/{len(scored)}"


def turns_section(records: list[dict[str, Any]], infos, lengths) -> str | None:
    """Markdown: found, mean similarity and prefix hits per configuration and length, then by i."""
    trials = [r for r in records if r.get("multi_turn") is not None and not r.get("control")]
    if not trials:
        return None
    ns = sorted({int(r["multi_turn"]) for r in trials})
    rows = [f"| `{name}` | " + " | ".join(
        _cell([r for r in trials if r.get("config") == name and int(r.get("length") or 0) == int(L)])
        for L in lengths) + " |" for name in infos]
    idx = sorted({int(r["asked_index"]) for r in trials if r.get("asked_index") is not None})
    by_i = [f"| `{name}` | " + " | ".join(
        _cell([r for r in trials if r.get("config") == name and r.get("asked_index") == i]) for i in idx) + " |"
        for name in infos]
    return "\n".join([
        f"\n## Multi-turn recall (--multi-turn {', '.join(map(str, ns))})\n",
        f"The chat holds N alike poems; the last turn asks for the i-th, prefixed by a random string. Found: the "
        f"reply starts with the prefix and the rest matches the poem with similarity >= {THRESHOLD:g} (difflib "
        "ratio). Per length: found / answered, mean similarity, prefix hits.\n",
        "| config | " + " | ".join(map(str, lengths)) + " |", "|" + "---|" * (len(lengths) + 1), *rows,
        "\nBy asked index i (1 = the first poem in the chat):\n",
        "| config | " + " | ".join(f"i={i}" for i in idx) + " |", "|" + "---|" * (len(idx) + 1), *by_i])
