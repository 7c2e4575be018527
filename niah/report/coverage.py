"""What of a baseline a candidate did not measure: the gate's coverage rule (niah/report/gate.py).

Every baseline trial must have its counterpart in the candidate (the same prompt when the
sides pair by prompt hash, else the same (length, depth, trial)), and every (length, depth)
cell the baseline answered must have an answered candidate trial; `uncovered` names, per
length, what is missing, for the gate to turn into an outage.
"""

from __future__ import annotations

from niah.report.style import fmt_depth


def uncovered(b, c, method: str | None) -> dict[int, str]:
    """length -> what of the baseline the candidate did not measure there, for the lengths
    where anything is missing (b, c: the two sides' trial frames; method "prompt": trials pair
    by prompt hash, else by (length, depth, trial))."""
    by_prompt = method == "prompt"
    hashes = set(c["prompt_sha256"].dropna())
    keys = set(zip(c["length"], c["depth"], c["trial"]))
    answered = set(zip(c.loc[c["answered"], "length"], c.loc[c["answered"], "depth"]))
    out: dict[int, str] = {}
    for L, bl in b.groupby("length", sort=True):
        missing = []
        for r in bl.itertuples(index=False):
            sha = r.prompt_sha256
            seen = sha in hashes if by_prompt and isinstance(sha, str) else (r.length, r.depth, r.trial) in keys
            if not seen:
                missing.append(f"depth {fmt_depth(r.depth)} trial {int(r.trial)}")
        silent = sorted(d for (n, d) in set(zip(bl.loc[bl["answered"], "length"], bl.loc[bl["answered"], "depth"]))
                        if (n, d) not in answered)
        parts = []
        if missing:
            what = "prompt(s)" if by_prompt else "trial(s)"
            parts.append(f"candidate lacks {len(missing)} of the baseline's {len(bl)} {what} here ("
                         + ", ".join(missing[:4])
                         + (f", and {len(missing) - 4} more" if len(missing) > 4 else "") + ")")
        if silent:
            parts.append("candidate answered nothing at depth " + ", ".join(map(fmt_depth, silent)))
        if parts:
            out[int(L)] = "; ".join(parts)
    return out
