"""niah.report.stats against published values and scipy (a dev dependency only)."""

from __future__ import annotations

import itertools
import math

import pytest

from niah.report import stats

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("k,n", [(0, 1), (1, 1), (0, 10), (8, 10), (10, 10), (3, 7), (50, 100), (97, 100), (1, 1000)])
def test_wilson_matches_scipy(k, n):
    ref = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    lo, hi = stats.wilson(k, n)
    assert lo == pytest.approx(ref.low, abs=1e-12)
    assert hi == pytest.approx(ref.high, abs=1e-12)


def test_wilson_published_values():
    # Newcombe (1998), Stat Med 17:857, Table I: 81/263 -> 0.2553 to 0.3662 (method 3, Wilson)
    lo, hi = stats.wilson(81, 263)
    assert (round(lo, 4), round(hi, 4)) == (0.2553, 0.3662)
    # 15/148 -> 0.0624 to 0.1605
    lo, hi = stats.wilson(15, 148)
    assert (round(lo, 4), round(hi, 4)) == (0.0624, 0.1605)
    # 0/20 -> 0 to 0.1611
    lo, hi = stats.wilson(0, 20)
    assert lo == 0.0 and round(hi, 4) == 0.1611


def test_wilson_other_levels_and_empty():
    ref = scipy_stats.binomtest(7, 9).proportion_ci(confidence_level=0.9, method="wilson")
    assert stats.wilson(7, 9, 0.9) == pytest.approx((ref.low, ref.high))
    assert stats.wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        stats.wilson(5, 4)


def test_mcnemar_exact_matches_binomtest():
    for b, c in itertools.product(range(0, 26, 3), range(0, 26, 4)):
        if b + c == 0:
            assert stats.mcnemar_exact(0, 0) == 1.0
            continue
        ref = scipy_stats.binomtest(b, b + c, 0.5).pvalue
        assert stats.mcnemar_exact(b, c) == pytest.approx(ref, rel=1e-9), (b, c)


def test_mcnemar_exact_known_values():
    # 0 vs 6 discordant: 2 * 0.5**6
    assert stats.mcnemar_exact(6, 0) == pytest.approx(0.03125)
    assert stats.mcnemar_exact(0, 5) == pytest.approx(0.0625)
    # symmetric and capped at 1
    assert stats.mcnemar_exact(3, 9) == stats.mcnemar_exact(9, 3)
    assert stats.mcnemar_exact(7, 7) == 1.0
    # large n stays exact (no float overflow)
    assert stats.mcnemar_exact(600, 400) == pytest.approx(scipy_stats.binomtest(600, 1000).pvalue, rel=1e-6)


def test_two_proportion_newcombe_published():
    # Newcombe (1998) Stat Med 17:873, Table II, method 10: 56/70 - 48/80 -> 0.0524 to 0.3339
    tp = stats.two_proportion(48, 80, 56, 70)
    assert tp.diff == pytest.approx(0.2)
    assert (round(tp.lo, 4), round(tp.hi, 4)) == (0.0524, 0.3339)
    # 9/10 - 3/10 -> 0.1705 to 0.8090
    tp = stats.two_proportion(3, 10, 9, 10)
    assert (round(tp.lo, 4), round(tp.hi, 4)) == (0.1705, 0.8090)


def test_two_proportion_z_matches_chi2():
    table = [[48, 32], [56, 14]]
    chi2, p, _, _ = scipy_stats.chi2_contingency(table, correction=False)
    assert stats.two_proportion(48, 80, 56, 70).p == pytest.approx(p, rel=1e-9)


def _power_bruteforce(n, p_loss, p_win, alpha):
    """Sum over every (losses, wins, ties) outcome of n pairs, scipy's binomtest deciding."""
    total = 0.0
    ties = 1 - p_loss - p_win
    for losses in range(n + 1):
        for wins in range(n + 1 - losses):
            t = n - losses - wins
            if losses + wins == 0 or losses <= wins:
                continue
            if scipy_stats.binomtest(losses, losses + wins, 0.5).pvalue < alpha:
                prob = (math.factorial(n) // (math.factorial(losses) * math.factorial(wins) * math.factorial(t))
                        * p_loss**losses * p_win**wins * ties**t)
                total += prob
    return total


@pytest.mark.parametrize("n,p_loss,p_win", [(12, 0.2, 0.0), (15, 0.25, 0.05), (20, 0.1, 0.1), (9, 0.5, 0.1)])
def test_mcnemar_power_exact(n, p_loss, p_win):
    assert stats.mcnemar_power(n, p_loss, p_win, 0.05) == pytest.approx(_power_bruteforce(n, p_loss, p_win, 0.05),
                                                                       abs=1e-9)


def test_trials_needed():
    plans = {p.design: p for p in stats.trials_needed(0.95, 0.85, alpha=0.05, power=0.8)}
    nested, indep, unpaired = plans["paired (nested errors)"], plans["paired (independent errors)"], plans["unpaired"]
    # nested: the exact test needs >= 6 discordant pairs (2 * 0.5**6 < 0.05); P(Bin(n, 0.1) >= 6) >= 0.8
    assert nested.power >= 0.8
    assert scipy_stats.binom.sf(5, nested.n, 0.1) == pytest.approx(nested.power)
    assert scipy_stats.binom.sf(5, nested.n - 3, 0.1) < 0.8
    assert nested.n < indep.n
    # unpaired (Fleiss, no continuity correction): (1.96*sqrt(2*.9*.1) + 0.8416*sqrt(.0475+.1275))^2 / 0.1^2
    # = 140.09 -> 141 per side
    assert unpaired.n == 141
    for p in (nested, indep):
        assert p.method.startswith("exact")
    with pytest.raises(ValueError):
        stats.trials_needed(0.8, 0.9)


def test_wilcoxon_signed_rank_matches_scipy():
    import random

    scipy_stats = pytest.importorskip("scipy.stats")
    from niah.report.stats import sign_test, wilcoxon_signed_rank

    rng = random.Random(7)
    for n in (3, 9, 25, 50, 51, 120):                      # exact up to 50 without ties, normal above
        d = [rng.gauss(0.2, 1.0) for _ in range(n)]
        w = wilcoxon_signed_rank(d)
        assert w.p == pytest.approx(scipy_stats.wilcoxon(d).pvalue, rel=1e-9, abs=1e-12)
        assert w.method == ("exact" if n <= 50 else "normal")
    ties = [round(rng.gauss(0.3, 1.0)) for _ in range(40)] + [0.0, 0.0]   # ties and zeros
    w = wilcoxon_signed_rank(ties)
    assert w.method == "normal" and w.n == sum(x != 0 for x in ties)
    assert w.p == pytest.approx(scipy_stats.wilcoxon(ties).pvalue, rel=1e-9)
    assert wilcoxon_signed_rank([1.0, 2.0, 3.0]).r == 1.0 and wilcoxon_signed_rank([]).p == 1.0
    assert sign_test(9, 1) == pytest.approx(scipy_stats.binomtest(9, 10, 0.5).pvalue)
