"""`--decode-first` in reports: a section of the summary, and one rule for compare and gate.

- `decode_section(records, infos, lengths)`: per configuration and length, recall of the
  trials swept with `--decode-first N` and the median of their `decode_tokens` (the reply's
  tokens before the value; niah.sweep.decode); None when no trial was swept with it (a
  default run's summary is unchanged).
- `check_same_decode(a, b, what_a, what_b)`: the option changes the prompt and where the
  value is read, so trials of different N (or one side without it) never pair: BadInput,
  one line, when the two trial frames differ in it (a baseline file carries it per trial).
"""

from __future__ import annotations

import statistics
from typing import Any

from niah.errors import BadInput


def _value(v: Any) -> int | None:
    return None if v is None or v != v else int(v)  # NaN (a frame's missing value) is None


def decode_values(df) -> set[int | None]:
    """The --decode-first values of a trial frame's rows (None: swept without it)."""
    if df is None or not len(df):
        return set()
    if "decode_first" not in df.columns:
        return {None}
    return {_value(v) for v in df["decode_first"]}


def _say(values: set[int | None]) -> str:
    return ", ".join("none" if v is None else str(v) for v in sorted(values, key=lambda v: (v is not None, v or 0)))


def check_same_decode(a, b, what_a: str, what_b: str) -> None:
    """BadInput when the two sides were swept with different --decode-first (module doc)."""
    va, vb = decode_values(a), decode_values(b)
    if va and vb and va != vb:
        raise BadInput(f"{what_a} was swept with --decode-first {_say(va)} and {what_b} with {_say(vb)}: "
                       "their trials do not pair; compare runs swept with the same --decode-first")


def decode_section(records: list[dict[str, Any]], infos, lengths) -> str | None:
    """Markdown: recall and median tokens before the value, per configuration and length."""
    trials = [r for r in records if r.get("decode_first") is not None and not r.get("control")]
    if not trials:
        return None
    firsts = sorted({int(r["decode_first"]) for r in trials})
    rows = []
    for name in infos:
        cells = []
        for L in lengths:
            d = [r for r in trials if r.get("config") == name and int(r.get("length") or 0) == int(L)]
            scored = [r for r in d if r.get("outcome") != "error"]
            toks = [int(r["decode_tokens"]) for r in d if r.get("decode_tokens") is not None]
            if not scored:
                cells.append("—")
                continue
            cell = f"{sum(bool(r.get('correct')) for r in scored)}/{len(scored)}"
            cells.append(cell + (f", {statistics.median(toks):g} tok" if toks else ""))
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    head = "| config | " + " | ".join(map(str, lengths)) + " |"
    return "\n".join([
        f"\n## Recall after decoding (--decode-first {', '.join(map(str, firsts))})\n",
        "Per length: correct / answered, and the median tokens the reply held before the value (the decode "
        "position it was read at).\n",
        head, "|" + "---|" * (len(lengths) + 1), *rows])
