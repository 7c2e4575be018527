"""The statistics behind reports, comparisons and the gate (standard library only).

- `wilson`: Wilson score interval of a binomial proportion (vLLM's CI gate moved to it
  because a fixed tolerance both lets regressions through and flags noise).
- `mcnemar_exact`: McNemar's exact test on the discordant pairs of a paired comparison
  (a two-sided binomial test of b vs c at p = 1/2; equal to scipy's
  `binomtest(b, b + c, 0.5).pvalue`).
- `two_proportion`: unpaired fallback: pooled two-proportion z test p value and the
  Newcombe (1998, method 10) hybrid Wilson score interval for the difference.
- `trials_needed`: sample size for a paired (McNemar, Connor 1987, then checked and
  raised with the exact power of the exact test) or unpaired (Fleiss) comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

_N = NormalDist()


def z_of(confidence: float) -> float:
    """Two-sided normal quantile: 1.96 for 0.95."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return _N.inv_cdf(1 - (1 - confidence) / 2)


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials; (0, 1) when n == 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    z = z_of(confidence)
    p = k / n
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    lo, hi = centre - half, centre + half
    # exact at the edges (rounding would otherwise leave 1e-17 off 0 or 1)
    if k == 0:
        lo = 0.0
    if k == n:
        hi = 1.0
    return max(0.0, lo), min(1.0, hi)


def binom_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exact (integer arithmetic)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return sum(math.comb(n, i) for i in range(k + 1)) / (1 << n)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p value for b and c discordant pairs (1.0 when none)."""
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2 * binom_cdf_half(min(b, c), n))


@dataclass(frozen=True)
class TwoProportion:
    diff: float  # p_b - p_a
    lo: float  # Newcombe hybrid score interval of diff
    hi: float
    p: float  # pooled two-proportion z test, two-sided


def two_proportion(k_a: int, n_a: int, k_b: int, n_b: int, confidence: float = 0.95) -> TwoProportion:
    """Compare two independent proportions (B - A): Newcombe interval and z-test p."""
    if n_a <= 0 or n_b <= 0:
        return TwoProportion(math.nan, -1.0, 1.0, 1.0)
    pa, pb = k_a / n_a, k_b / n_b
    la, ua = wilson(k_a, n_a, confidence)
    lb, ub = wilson(k_b, n_b, confidence)
    d = pb - pa
    lo = d - math.sqrt((pb - lb) ** 2 + (ua - pa) ** 2)
    hi = d + math.sqrt((ub - pb) ** 2 + (pa - la) ** 2)
    pooled = (k_a + k_b) / (n_a + n_b)
    var = pooled * (1 - pooled) * (1 / n_a + 1 / n_b)
    if var <= 0:
        p = 1.0
    else:
        z = abs(d) / math.sqrt(var)
        p = min(1.0, 2 * (1 - _N.cdf(z)))
    return TwoProportion(d, max(-1.0, lo), min(1.0, hi), p)


# -- power / sample size -----------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    design: str  # "paired (nested errors)", "paired (independent errors)", "unpaired"
    n: int  # trials per side needed
    power: float  # power at n (exact for paired designs, normal approximation unpaired)
    method: str


def _log_comb_table(n: int) -> list[float]:
    lf = [0.0] * (n + 1)
    for i in range(2, n + 1):
        lf[i] = lf[i - 1] + math.log(i)
    return lf


@lru_cache(maxsize=None)
def _mcnemar_critical(d: int, alpha: float) -> int:
    """Smallest number of losses among d discordant pairs that the two-sided exact
    test rejects at alpha (as a drop, so losses > d / 2); d + 1 when none does."""
    tail, whole, crit = 0, 1 << d, d + 1
    for losses in range(d, d // 2, -1):
        tail += math.comb(d, losses)  # P(X >= losses) * 2**d
        if 2 * tail / whole < alpha:
            crit = losses
        else:
            break
    return crit


def mcnemar_power(n: int, p_loss: float, p_win: float, alpha: float = 0.05) -> float:
    """Exact power of the two-sided exact McNemar test to find a drop, with n pairs where
    a pair is a loss (A right, B wrong) with probability p_loss and a win with p_win."""
    psi = p_loss + p_win
    if n <= 0 or psi <= 0:
        return 0.0
    q = p_loss / psi
    lf = _log_comb_table(n)
    power = 0.0
    for d in range(n + 1):
        if psi >= 1 and d < n:
            continue
        log_pd = lf[n] - lf[d] - lf[n - d] + (d * math.log(psi) if d else 0.0) + (
            (n - d) * math.log1p(-psi) if n - d else 0.0)
        if log_pd < -40:
            continue
        crit = _mcnemar_critical(d, alpha)
        if crit > d:
            continue
        if q >= 1:
            sf = 1.0
        else:
            sf = 0.0
            for k in range(crit, d + 1):
                sf += math.exp(lf[d] - lf[k] - lf[d - k] + k * math.log(q) + (d - k) * math.log1p(-q))
        power += math.exp(log_pd) * sf
    return min(1.0, power)


def trials_needed(
    recall_a: float, recall_b: float, alpha: float = 0.05, power: float = 0.8, max_exact: int = 400
) -> list[Plan]:
    """Trials needed to detect recall_a -> recall_b (a drop) at two-sided alpha with the
    given power, for the three designs `niah plan` prints."""
    if not (0 <= recall_b < recall_a <= 1):
        raise ValueError("need 0 <= recall_b < recall_a <= 1 (a drop)")
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError("alpha and power must be in (0, 1)")
    za, zb = _N.inv_cdf(1 - alpha / 2), _N.inv_cdf(power)
    delta = recall_a - recall_b
    out: list[Plan] = []
    for design, p_loss, p_win in (
        ("paired (nested errors)", delta, 0.0),
        ("paired (independent errors)", recall_a * (1 - recall_b), (1 - recall_a) * recall_b),
    ):
        psi = p_loss + p_win
        n0 = math.ceil(((za * math.sqrt(psi) + zb * math.sqrt(max(psi - delta**2, 0.0))) / delta) ** 2)
        n, pw, method = n0, math.nan, "Connor (1987) normal approximation"
        if n0 <= max_exact:
            # exact power of the exact test is a sawtooth in n: take the smallest n from
            # which on it stays above the target over the next few n
            cache: dict[int, float] = {}

            def pw_at(m: int) -> float:
                if m not in cache:
                    cache[m] = mcnemar_power(m, p_loss, p_win, alpha)
                return cache[m]

            n = max(1, int(n0 * 0.6))
            while n <= 3 * max_exact:
                if all(pw_at(m) >= power for m in (n, n + 1, n + 2)):
                    break
                n += 1
            pw = pw_at(n)
            method = "exact power of the exact McNemar test"
        out.append(Plan(design, n, pw, method))
    pbar = (recall_a + recall_b) / 2
    n_u = math.ceil(
        (za * math.sqrt(2 * pbar * (1 - pbar))
         + zb * math.sqrt(recall_a * (1 - recall_a) + recall_b * (1 - recall_b))) ** 2
        / delta**2
    )
    se = math.sqrt((recall_a * (1 - recall_a) + recall_b * (1 - recall_b)) / n_u)
    pw_u = _N.cdf((delta - za * math.sqrt(2 * pbar * (1 - pbar) / n_u)) / se) if se > 0 else 1.0
    out.append(Plan("unpaired", n_u, pw_u, "Fleiss normal approximation, per side"))
    return out


# -- paired rank statistics (the indexer's needle rank) --------------------------------------
def sign_test(plus: int, minus: int) -> float:
    """Exact two-sided sign test: plus vs minus non-zero paired differences at p = 1/2
    (the same binomial test as McNemar's on discordant pairs)."""
    return mcnemar_exact(plus, minus)


@dataclass(frozen=True)
class SignedRank:
    n: int  # non-zero differences (zeros are dropped, Wilcoxon's convention)
    w_plus: float  # sum of the ranks of |d| over positive differences
    p: float  # two-sided
    method: str  # "exact" (n <= 50, no ties) or "normal" (tie-corrected, no continuity correction)
    r: float  # matched-pairs rank-biserial correlation, (W+ - W-) / (W+ + W-), in [-1, 1]


@lru_cache(maxsize=None)
def _signed_rank_null(n: int) -> tuple[int, ...]:
    """Number of sign assignments of ranks 1..n with each rank sum W+ = 0..n(n+1)/2."""
    total = n * (n + 1) // 2
    counts = [1] + [0] * total
    for k in range(1, n + 1):
        for s in range(total, k - 1, -1):
            counts[s] += counts[s - k]
    return tuple(counts)


def _average_ranks(values: list[float]) -> tuple[list[float], list[int]]:
    """Ranks of values (1-based, ties get their average) and the sizes of tie groups."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    groups = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in range(i, j + 1):
            ranks[order[m]] = (i + j) / 2 + 1
        groups.append(j - i + 1)
        i = j + 1
    return ranks, groups


def wilcoxon_signed_rank(diffs: list[float]) -> SignedRank:
    """Wilcoxon's signed-rank test of paired differences against a median of 0, two-sided.
    Equal to scipy.stats.wilcoxon(diffs) (zero_method "wilcox", no continuity correction)."""
    d = [float(x) for x in diffs if x != 0 and x == x]
    n = len(d)
    if n == 0:
        return SignedRank(0, 0.0, 1.0, "exact", 0.0)
    ranks, groups = _average_ranks([abs(x) for x in d])
    w_plus = sum(r for r, x in zip(ranks, d) if x > 0)
    total = n * (n + 1) / 2
    r_b = (2 * w_plus - total) / total
    if n <= 50 and all(g == 1 for g in groups):
        counts = _signed_rank_null(n)
        w = int(min(w_plus, total - w_plus))
        p = min(1.0, 2 * sum(counts[: w + 1]) / 2**n)
        return SignedRank(n, w_plus, p, "exact", r_b)
    var = n * (n + 1) * (2 * n + 1) / 24 - sum(g**3 - g for g in groups) / 48
    if var <= 0:
        return SignedRank(n, w_plus, 1.0, "normal", r_b)
    z = (w_plus - total / 2) / math.sqrt(var)
    return SignedRank(n, w_plus, min(1.0, 2 * (1 - _N.cdf(abs(z)))), "normal", r_b)
