"""Recall by length residue: the report's table and the gate's cases (`--residues` runs).

A trial of a `--residues` sweep carries `residue` (its counted length mod the modulus the
manifest's args.residues names, niah.sweep.residues). `residue_table(df, modulus)` is the
report's Markdown table: per configuration and residue, recall (correct / answered, errors
apart), `near` misses and their mean edit distance; None when no trial has a residue.
The gate (niah.report.gate) adds one case per residue, pooled over the common lengths and
paired as it pairs (prompt hash, else (length, depth, trial): a pair is one prompt, so it
never crosses residues), with its rule. A cell is (length, depth, residue).
"""

from __future__ import annotations

def modulus_of(manifest: dict | None) -> int | None:
    """The modulus of a run's args.residues ("4:0,1,2,3" -> 4), None without one."""
    text = ((manifest or {}).get("args") or {}).get("residues")
    try:
        return int(str(text).split(":", 1)[0]) if text else None
    except ValueError:
        return None


def has_residues(df) -> bool:
    return "residue" in df.columns and bool(df["residue"].notna().any())


def residue_table(df, modulus: int | None) -> str | None:
    if not has_residues(df):
        return None
    rows = ["| config | residue | recall | correct / answered | near | mean near distance |",
            "|---|---|---|---|---|---|"]
    for (config, res), g in df[df["residue"].notna()].groupby(["config", "residue"], sort=True):
        answered = g[g["answered"]]
        n, hits = len(answered), int(answered["correct"].sum())
        near = answered[answered["outcome"] == "near"]
        dists = [d["distance"] for d in near["near"] if isinstance(d, dict)] if "near" in g.columns else []
        recall = f"{100 * hits / n:.0f}%" if n else "—"
        mean = f"{sum(dists) / len(dists):.2f}" if dists else "—"
        rows.append(f"| `{config}` | {int(res)}{f' mod {modulus}' if modulus else ''} | {recall} | {hits}/{n} "
                    f"| {len(near)} | {mean} |")
    return "## Recall by length residue\n\n" + "\n".join(rows) + "\n"
