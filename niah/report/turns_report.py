"""`--multi-turn` in reports: a section of the summary, and one rule for compare and gate.

- `turns_section(records, infos, lengths)`: per configuration and length, the trials swept
  with `--multi-turn N` found (prefix hit and similarity at least the threshold of
  niah.sweep.multiturn) out of those answered, with their mean similarity and prefix
  hits; then found by asked index i. None when no trial was swept with it (a default
  run's summary is unchanged).
- `check_same_turns(a, b, what_a, what_b)`: the option changes the prompt and the scorer,
  so trials of different N (or one side without it) never pair: BadInput, one line, when
  the two trial frames differ in it (a baseline file carries it per trial).
"""

from __future__ import annotations

from typing import Any

from niah.errors import BadInput
from niah.prompts.turns import FOUND_SIMILARITY as THRESHOLD


def _value(v: Any) -> int | None:
    return None if v is None or v != v else int(v)  # NaN (a frame's missing value) is None


def turns_values(df) -> set[int | None]:
    """The --multi-turn values of a trial frame's rows (None: swept without it)."""
    if df is None or not len(df):
        return set()
    if "multi_turn" not in df.columns:
        return {None}
    return {_value(v) for v in df["multi_turn"]}


def _say(values: set[int | None]) -> str:
    return ", ".join("none" if v is None else str(v) for v in sorted(values, key=lambda v: (v is not None, v or 0)))


def check_same_turns(a, b, what_a: str, what_b: str) -> None:
    """BadInput when the two sides were swept with different --multi-turn (module doc)."""
    va, vb = turns_values(a), turns_values(b)
    if va and vb and va != vb:
        raise BadInput(f"{what_a} was swept with --multi-turn {_say(va)} and {what_b} with {_say(vb)}: "
                       "their trials do not pair; compare runs swept with the same --multi-turn")


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
