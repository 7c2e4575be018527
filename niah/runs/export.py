"""Export a run's trials as one table: CSV or parquet (through pandas), or JSON.

The trials are read through the checked reader (niah/runs/integrity.py), as compare and gate
read them: a folder with a problem (a corrupt line, a duplicated trial) is refused in one line.

JSON is one array of the trial records exactly as trials.jsonl stores them (lists and
objects kept as they are, no pandas), for scripts that want one document to parse.
"""

from __future__ import annotations

import json
from pathlib import Path

from niah.errors import BadInput, writing
from niah.runs.integrity import load_checked

FORMATS = ("csv", "parquet", "json")


def export_run(run: Path | str, fmt: str = "csv", out: Path | str | None = None) -> Path:
    """RUN/trials.jsonl -> RUN/trials.<fmt> (or `out`); list fields become JSON strings in CSV."""
    if fmt not in FORMATS:
        raise BadInput(f"unknown export format {fmt!r}: use csv, parquet or json")
    run = Path(run)
    checked = load_checked(run)    # a folder with unreadable or duplicated trials is refused (exit 2)
    checked.refuse()
    records = checked.records
    out = Path(out) if out else run / f"trials.{fmt}"
    if fmt == "json":
        with writing(out):
            out.write_text(json.dumps(records, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        return out
    import pandas as pd

    df = pd.DataFrame(records)  # the records as stored (niah.report.data.trials_frame adds columns)
    with writing(out):
        if fmt == "csv":
            for col in df.columns:  # lists and objects (selection_recall, expected, indexer, ...) as JSON
                if df[col].map(lambda v: isinstance(v, (list, dict))).any():
                    df[col] = df[col].map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
            df.to_csv(out, index=False)
        else:
            try:
                df.to_parquet(out, index=False)
            except ImportError:
                raise BadInput("parquet export needs pyarrow: pip install pyarrow") from None
    return out
