"""The paired rank metric: on identical prompts, does B's needle sit deeper in the index
scores than A's (closer to, or further past, the top-k cut)?

Per trial the metric is `indexer.rank_worst`: the geometric mean over (layer, probed step) of the
worst needle-value token's rank / k (niah/sweep/indexer.py). Trials pair by prompt hash (else
(length, depth, trial, seed)); a pair counts only when selection happened on both sides.
Per pair d = log2(rank_B / rank_A) (> 0: B's needle is deeper). Tests, two-sided:
Wilcoxon's signed-rank test on d (decides) and the exact sign test (shown). Effect size:
the median ratio rank_B / rank_A over pairs, and the matched-pairs rank-biserial r.
A regression: median ratio > 1 + tolerance, p < alpha, and B deeper (r > 0).

Fidelity (`indexer.fidelity`: the top-k overlap with the top-k exact fp32 keys give for the
same query) pairs the same way: per pair d = fidelity_B - fidelity_A, Wilcoxon's test on d,
and how many pairs it is lower / higher in B (`fidelity_row`).

The gate's two companions of the rank (`index_rows`), each over every pair, judged with the
same relative tolerance (`index_is_regression`):
- needle kept (`indexer.kept`, the share of the needle value's tokens the selection kept):
  ratio = mean_B / mean_A; a regression: Wilcoxon p < alpha, B lower, ratio < 1 - tolerance.
  What a top-k that keeps fewer keys than the model expects moves, while the scores (and so
  the rank) stay put.
- selection fidelity: ratio = the miss (1 - fidelity) of B over A's; a regression: p < alpha,
  B lower, ratio > 1 + tolerance. What a selection that reads wrong keys moves first, before
  any answer does.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from niah.report.data import PAIR_FALLBACK
from niah.report.stats import mcnemar_exact, sign_test, wilcoxon_signed_rank

ALL = "all"


@dataclass
class RankRow:
    group: Any  # a length or "all"
    n: int  # pairs with selection on both sides
    inactive: int  # pairs left out: no selection on a side (prompt not longer than k) or no probe
    median_a: float  # median rank / k of A over the pairs
    median_b: float
    ratio: float  # median over pairs of rank_B / rank_A
    deeper: int  # pairs where B's needle ranks worse
    shallower: int
    p: float  # Wilcoxon signed-rank, two-sided
    sign_p: float  # exact sign test, two-sided
    r: float  # rank-biserial correlation (> 0: B deeper)
    significant: bool

    @property
    def verdict(self) -> str:
        if self.n == 0:
            return "no data"
        if not self.significant:
            return "no significant difference"
        return "B's needle deeper" if self.r > 0 else "B's needle higher"


def rank_pairs(a, b):
    """Answered pairs of trials: DataFrame length, depth, rank_a, rank_b, fid_a, fid_b, kept_a, kept_b (NaN
    where that side had no selection or no probe), correct_a, correct_b, outcome_a, outcome_b."""
    side = ["idx_rank_worst", "idx_fidelity", "idx_kept", "correct", "outcome"]
    cols = ["length", "depth", "trial", "seed", "prompt_sha256", *side]
    a, b = a[cols], b[cols]
    ha, hb = a.dropna(subset=["prompt_sha256"]), b.dropna(subset=["prompt_sha256"])
    m = ha.drop_duplicates("prompt_sha256").merge(
        hb.drop_duplicates("prompt_sha256")[["prompt_sha256", *side]], on="prompt_sha256", suffixes=("_a", "_b"))
    if not len(m):
        fa, fb = a.dropna(subset=["seed"]), b.dropna(subset=["seed"])
        m = fa.drop_duplicates(PAIR_FALLBACK).merge(
            fb.drop_duplicates(PAIR_FALLBACK)[[*PAIR_FALLBACK, *side]], on=PAIR_FALLBACK, suffixes=("_a", "_b"))
    m = m[(m["outcome_a"] != "error") & (m["outcome_b"] != "error")]
    m = m.rename(columns={"idx_rank_worst_a": "rank_a", "idx_rank_worst_b": "rank_b",
                          "idx_fidelity_a": "fid_a", "idx_fidelity_b": "fid_b",
                          "idx_kept_a": "kept_a", "idx_kept_b": "kept_b"})
    return m.reset_index(drop=True)


def rank_row(group: Any, pairs, alpha: float) -> RankRow:
    both = pairs.dropna(subset=["rank_a", "rank_b"])
    inactive, pairs = len(pairs) - len(both), both
    ra, rb = [float(x) for x in pairs["rank_a"]], [float(x) for x in pairs["rank_b"]]
    n = len(ra)
    if n == 0:
        nan = float("nan")
        return RankRow(group, 0, inactive, nan, nan, nan, 0, 0, nan, nan, nan, False)
    d = [math.log2(y / x) for x, y in zip(ra, rb)]
    w = wilcoxon_signed_rank(d)
    deeper, shallower = sum(x > 0 for x in d), sum(x < 0 for x in d)
    ratios = sorted(y / x for x, y in zip(ra, rb))
    return RankRow(group, n, inactive, _median(ra), _median(rb), _median(ratios), deeper, shallower,
                   w.p, sign_test(deeper, shallower), w.r, w.p < alpha)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


def rank_compare(a, b, alpha: float = 0.05, overall: bool = True) -> list[RankRow]:
    """Per length (and overall): the paired rank comparison of B against A."""
    pairs = rank_pairs(a, b)
    rows = [rank_row(int(L), pairs[pairs["length"] == L], alpha) for L in sorted(set(pairs["length"]))]
    if overall:
        rows.append(rank_row(ALL, pairs, alpha))
    return rows


@dataclass
class FidelityRow:
    n: int  # pairs with a fidelity on both sides
    mean_a: float
    mean_b: float
    lower: int  # pairs where B's fidelity is lower than A's
    higher: int
    p: float  # Wilcoxon signed-rank on fidelity_B - fidelity_A, two-sided
    r: float  # rank-biserial correlation (> 0: B higher)


def fidelity_row(pairs) -> FidelityRow:
    """The paired fidelity comparison of B against A over rank_pairs' pairs."""
    both = pairs.dropna(subset=["fid_a", "fid_b"])
    fa, fb = [float(x) for x in both["fid_a"]], [float(x) for x in both["fid_b"]]
    n = len(fa)
    if n == 0:
        nan = float("nan")
        return FidelityRow(0, nan, nan, 0, 0, nan, nan)
    d = [y - x for x, y in zip(fa, fb)]
    w = wilcoxon_signed_rank(d)
    return FidelityRow(n, sum(fa) / n, sum(fb) / n, sum(x < 0 for x in d), sum(x > 0 for x in d), w.p, w.r)


def rank_is_regression(row: RankRow, tolerance: float) -> bool:
    return row.n > 0 and row.significant and row.r > 0 and row.ratio > 1 + tolerance


KEPT, FIDELITY = "kept", "fidelity"


@dataclass
class IndexRow:
    measure: str  # KEPT or FIDELITY
    n: int  # pairs with the measure on both sides
    mean_a: float
    mean_b: float
    ratio: float  # kept: mean_b / mean_a; fidelity: (1 - mean_b) / (1 - mean_a) (module doc)
    lower: int  # pairs where B's value is lower than A's (worse, for both measures)
    higher: int
    p: float  # Wilcoxon signed-rank on B - A, two-sided
    r: float  # rank-biserial correlation (> 0: B higher)
    significant: bool


def _ratio(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return math.inf if num > 0 else 1.0


def index_rows(pairs, alpha: float) -> list[IndexRow]:
    """The needle-kept and selection-fidelity comparisons of B against A over every pair."""
    out = []
    for measure, col in ((KEPT, "kept"), (FIDELITY, "fid")):
        both = pairs.dropna(subset=[f"{col}_a", f"{col}_b"])
        va, vb = [float(x) for x in both[f"{col}_a"]], [float(x) for x in both[f"{col}_b"]]
        n = len(va)
        if n == 0:
            nan = float("nan")
            out.append(IndexRow(measure, 0, nan, nan, nan, 0, 0, nan, nan, False))
            continue
        d = [y - x for x, y in zip(va, vb)]
        w = wilcoxon_signed_rank(d)
        ma, mb = sum(va) / n, sum(vb) / n
        ratio = _ratio(mb, ma) if measure == KEPT else _ratio(1 - mb, 1 - ma)
        out.append(IndexRow(measure, n, ma, mb, ratio, sum(x < 0 for x in d), sum(x > 0 for x in d), w.p, w.r,
                            w.p < alpha))
    return out


def index_is_regression(row: IndexRow, tolerance: float) -> bool:
    """B kept less of the needle, or its selection missed more of the exact top-k (module doc)."""
    if row.n == 0 or not row.significant or not row.r < 0:
        return False
    return row.ratio < 1 - tolerance if row.measure == KEPT else row.ratio > 1 + tolerance


def _f(x: float, fmt: str = ".3g") -> str:
    return "—" if x != x else format(x, fmt)


def rank_markdown(rows: list[RankRow], name_a: str = "A", name_b: str = "B") -> str:
    head = (f"| length | pairs | rank/k {name_a} | rank/k {name_b} | median ratio B/A | deeper / higher | "
            "Wilcoxon p | sign p | r | verdict |\n|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        g = "**all**" if r.group == ALL else f"{r.group:,}"
        skip = f" (+{r.inactive} no selection)" if r.inactive else ""
        lines.append(f"| {g} | {r.n}{skip} | {_f(r.median_a)} | {_f(r.median_b)} | {_f(r.ratio)} | "
                     f"{r.deeper} / {r.shallower} | {_f(r.p, '.2g')} | {_f(r.sign_p, '.2g')} | {_f(r.r, '+.2f')} | "
                     f"{r.verdict} |")
    return head + "\n".join(lines) + "\n"


# -- how many trials? a bootstrap on observed pairs ------------------------------------------
@dataclass
class PowerResult:
    metric: str  # "needle rank (Wilcoxon)" or "answer (McNemar exact)"
    n: int | None  # smallest n reaching the power; None: not within max_n
    power_at_max: float
    tried: bool = False  # resampled at all (False: nothing differs between the sides)


def _power(sample: list[tuple], n: int, test, alpha: float, reps: int, rng: random.Random) -> float:
    hits = 0
    for _ in range(reps):
        if test([sample[rng.randrange(len(sample))] for _ in range(n)]) < alpha:
            hits += 1
    return hits / reps


def _rank_test(draw: list[tuple]) -> float:
    d = [math.log2(rb / ra) for ra, rb, _, _ in draw]
    w = wilcoxon_signed_rank(d)
    return w.p if w.r > 0 else 1.0          # one direction: B deeper


def _answer_test(draw: list[tuple]) -> float:
    losses = sum(ca and not cb for _, _, ca, cb in draw)
    wins = sum(cb and not ca for _, _, ca, cb in draw)
    return mcnemar_exact(losses, wins) if losses > wins else 1.0


def trials_needed_bootstrap(pairs, alpha: float = 0.05, power: float = 0.8, max_n: int = 1000,
                            reps: int = 400, seed: int = 0) -> list[PowerResult]:
    """Paired trials each metric needs to find B worse than A with the given power, by
    resampling the observed pairs (with replacement) at n = 4, 6, 8, ... (x1.25 steps),
    `reps` times each; the same pairs feed both metrics."""
    pairs = pairs.dropna(subset=["rank_a", "rank_b"])
    sample = [(float(ra), float(rb), bool(ca), bool(cb)) for ra, rb, ca, cb in
              zip(pairs["rank_a"], pairs["rank_b"], pairs["correct_a"], pairs["correct_b"])]
    discordant = any(ca != cb for _, _, ca, cb in sample)
    moved = any(ra != rb for ra, rb, _, _ in sample)
    out = []
    for name, test in (("needle rank (Wilcoxon signed-rank)", _rank_test), ("answer (McNemar exact)", _answer_test)):
        rng = random.Random(seed)
        found, pw, n = None, 0.0, 4
        tried = bool(sample and (moved if test is _rank_test else discordant))   # nothing differs: never significant
        if tried:
            while n <= max_n:
                pw = _power(sample, n, test, alpha, reps, rng)
                if pw >= power:
                    found = n
                    break
                n = max(n + 2, int(n * 1.25))
        out.append(PowerResult(name, found, pw, tried))
    return out
