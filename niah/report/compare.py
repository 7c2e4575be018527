"""A against B: paired where the prompts match, unpaired otherwise; per group and overall.

Paired (trials of A and B that saw the same prompt, both answered): recall of each side
on those pairs, the difference B - A, the discordant counts (losses: A right and B wrong;
wins: B right and A wrong) and McNemar's exact two-sided p. Significant when p < alpha.

Unpaired (nothing pairs): recall of each side on its answered trials, the difference, the
Newcombe hybrid Wilson-score interval of the difference at 1 - alpha, and the pooled
two-proportion z-test p. Significant when the interval excludes 0.

Error trials (outages) are left out of both sides and counted in errors_a / errors_b.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from niah.errors import BadInput
from niah.report.data import pair_trials
from niah.report.stats import mcnemar_exact, two_proportion

ALL = "all"


@dataclass
class Row:
    group: Any  # a length, a (length, depth) tuple, or "all"
    basis: str  # "paired (prompt)", "paired (seed)", "unpaired"
    n_a: int
    k_a: int
    n_b: int
    k_b: int
    errors_a: int
    errors_b: int
    recall_a: float
    recall_b: float
    diff: float  # recall_b - recall_a
    losses: int  # paired: A right, B wrong
    wins: int  # paired: B right, A wrong
    p: float
    lo: float  # unpaired: interval of diff; paired: NaN
    hi: float
    significant: bool

    @property
    def verdict(self) -> str:
        if self.n_a == 0 or self.n_b == 0:
            return "no data"
        if not self.significant:
            return "no significant difference"
        return "B better" if self.diff > 0 else "B worse"


def _nan() -> float:
    return float("nan")


def _paired_row(group: Any, pairs, method: str, errors_a: int, errors_b: int, alpha: float) -> Row:
    ok = pairs[(pairs["outcome_a"] != "error") & (pairs["outcome_b"] != "error")]
    ca, cb = ok["correct_a"].astype(bool), ok["correct_b"].astype(bool)
    n = len(ok)
    k_a, k_b = int(ca.sum()), int(cb.sum())
    losses, wins = int((ca & ~cb).sum()), int((~ca & cb).sum())
    p = mcnemar_exact(losses, wins) if n else _nan()
    ra, rb = (k_a / n, k_b / n) if n else (_nan(), _nan())
    return Row(group, f"paired ({method})", n, k_a, n, k_b, errors_a, errors_b, ra, rb, rb - ra,
               losses, wins, p, _nan(), _nan(), bool(n and p < alpha))


def _unpaired_row(group: Any, a, b, alpha: float) -> Row:
    aa, bb = a[a["answered"]], b[b["answered"]]
    n_a, n_b = len(aa), len(bb)
    k_a, k_b = int(aa["correct"].sum()), int(bb["correct"].sum())
    tp = two_proportion(k_a, n_a, k_b, n_b, 1 - alpha)
    if not (n_a and n_b):
        tp = type(tp)(_nan(), _nan(), _nan(), _nan())
    ra = k_a / n_a if n_a else _nan()
    rb = k_b / n_b if n_b else _nan()
    sig = bool(n_a and n_b and (tp.hi < 0 or tp.lo > 0))
    return Row(group, "unpaired", n_a, k_a, n_b, k_b, int(a["is_error"].sum()), int(b["is_error"].sum()),
               ra, rb, rb - ra, 0, 0, tp.p, tp.lo, tp.hi, sig)


def compare(a, b, by: list[str] | None = None, alpha: float = 0.05,
            overall: bool = True) -> tuple[list[Row], str | None]:
    """Compare trial frames A and B per group of `by` columns (default: length), plus an
    overall row. Returns (rows, pairing method or None when unpaired)."""
    by = by or ["length"]
    pairs, method = pair_trials(a, b)

    def split(df):
        if df.empty:
            return {}
        return {tuple(x.item() if hasattr(x, "item") else x for x in (k if isinstance(k, tuple) else (k,))): g
                for k, g in df.groupby(by, sort=False)}

    ga_all, gb_all, gp_all = split(a), split(b), split(pairs) if method else {}
    rows: list[Row] = []
    keys = sorted(set(ga_all) | set(gb_all))
    groups = [(k if len(by) > 1 else k[0], k) for k in keys]
    if overall:
        groups.append((ALL, None))
    empty_a, empty_b, empty_p = a.iloc[0:0], b.iloc[0:0], pairs.iloc[0:0]
    for label, key in groups:
        if key is None:
            ga, gb, gp = a, b, pairs
        else:
            ga, gb, gp = ga_all.get(key, empty_a), gb_all.get(key, empty_b), gp_all.get(key, empty_p)
        if method and len(gp):
            rows.append(_paired_row(label, gp, method, int(ga["is_error"].sum()), int(gb["is_error"].sum()), alpha))
        else:
            rows.append(_unpaired_row(label, ga, gb, alpha))
    return rows, method


def _pct(x: float) -> str:
    return "—" if x != x else f"{100 * x:.1f}%"


def _p(x: float) -> str:
    if x != x:
        return "—"
    return f"{x:.2g}" if x < 0.001 else f"{x:.3f}"


def rows_markdown(rows: list[Row], name_a: str = "A", name_b: str = "B", group_name: str = "length") -> str:
    """A Markdown table of comparison rows."""
    head = (f"| {group_name} | basis | {name_a} | {name_b} | B - A | losses / wins | p | verdict |\n"
            "|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        g = "**all**" if r.group == ALL else (f"{r.group:,}" if isinstance(r.group, int) else str(r.group))
        if r.basis.startswith("paired"):
            dis = f"{r.losses} / {r.wins}"
        else:
            dis = "—" if r.lo != r.lo else f"CI [{100 * r.lo:+.1f}, {100 * r.hi:+.1f}] pp"
        err_a = f", {r.errors_a} err" if r.errors_a else ""
        err_b = f", {r.errors_b} err" if r.errors_b else ""
        diff = "—" if r.diff != r.diff else f"{100 * r.diff:+.1f} pp"
        lines.append(
            f"| {g} | {r.basis} | {_pct(r.recall_a)} ({r.k_a}/{r.n_a}{err_a}) "
            f"| {_pct(r.recall_b)} ({r.k_b}/{r.n_b}{err_b}) "
            f"| {diff} | {dis} | {_p(r.p)} | {r.verdict} |")
    return head + "\n".join(lines) + "\n"


# Options that are part of the prompt and its scoring: sides swept with different values never pair.
UNPAIRABLE = (("decode_first", "--decode-first"), ("multi_turn", "--multi-turn"))


def option_values(df, column: str) -> set[int | None]:
    """The values of an option's column over a trial frame's rows (None: swept without it)."""
    if df is None or not len(df):
        return set()
    if column not in df.columns:
        return {None}
    return {None if v is None or v != v else int(v) for v in df[column]}  # NaN (missing) is None


def check_pairable(a, b, what_a: str, what_b: str) -> None:
    """BadInput when two sides were swept with different values of an UNPAIRABLE option."""
    def say(values: set[int | None]) -> str:
        return ", ".join("none" if v is None else str(v) for v in sorted(values, key=lambda v: (v is not None, v or 0)))

    for column, flag in UNPAIRABLE:
        va, vb = option_values(a, column), option_values(b, column)
        if va and vb and va != vb:
            raise BadInput(f"{what_a} was swept with {flag} {say(va)} and {what_b} with {say(vb)}: "
                           f"their trials do not pair; compare runs swept with the same {flag}")
