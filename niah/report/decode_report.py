"""`--decode-first` in reports: a section of the summary.

- `decode_section(records, infos, lengths)`: per configuration and length, recall of the
  trials swept with `--decode-first N` and the median of their `decode_tokens` (the reply's
  tokens before the value; niah.sweep.decode); None when no trial was swept with it (a
  default run's summary is unchanged).
Trials of different N never pair: niah.report.compare.check_pairable.
"""

from __future__ import annotations

import statistics
from typing import Any


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
