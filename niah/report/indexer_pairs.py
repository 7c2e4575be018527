"""Configurations at the same top-k, paired on identical prompts, one level below the answers.

For every pair of sparse configurations with the same index_topk whose trials carry the
indexer probe (A is the one listed first in the run): the paired fidelity (top-k overlap
with exact fp32 keys) and needle rank / k (niah/report/ranks.py: Wilcoxon signed-rank,
pairs where B is lower / higher or deeper / higher), and the answers (McNemar's exact test,
niah/report/compare.py) on the same prompts. `niah report` writes it into summary.md and
`make demo` prints it (fp8, fp8 + Hadamard rotation and bf16 index keys at one top-k).
"""

from __future__ import annotations

from dataclasses import dataclass

from niah.report.compare import ALL, Row, compare
from niah.report.ranks import FidelityRow, RankRow, fidelity_row, rank_pairs, rank_row


@dataclass
class IndexerPair:
    a: str
    b: str
    k: int
    fidelity: FidelityRow
    rank: RankRow  # over every pair with selection on both sides (group "all")
    answers: Row  # compare()'s overall row: paired on identical prompts


def same_k_pairs(df, infos, topks: dict) -> list[tuple[str, str, int]]:
    """(A, B, k) for sparse configurations at the same k with a fidelity in some trial;
    by k, then in the run's order (infos: niah.report.data.config_infos)."""
    probed = [n for n, i in infos.items() if not i.dense and topks.get(n)
              and df.loc[df["config"] == n, "idx_fidelity"].notna().any()]
    pairs = [(a, b, topks[a]) for i, a in enumerate(probed) for b in probed[i + 1:] if topks[a] == topks[b]]
    return sorted(pairs, key=lambda p: p[2])


def indexer_pairs(df, pairs: list[tuple[str, str, int]], alpha: float = 0.05) -> list[IndexerPair]:
    out = []
    for a, b, k in pairs:
        da, db = df[df["config"] == a], df[df["config"] == b]
        p = rank_pairs(da, db)
        rows, _ = compare(da, db, ["length"], alpha)
        out.append(IndexerPair(a, b, k, fidelity_row(p), rank_row(ALL, p, alpha),
                               next(r for r in rows if r.group == ALL)))
    return out


def _f(x: float, fmt: str) -> str:
    return "—" if x != x else format(x, fmt)


def _cells(r: IndexerPair) -> list[str]:
    f, k, ans = r.fidelity, r.rank, r.answers
    return [
        f"{_f(f.mean_a, '.3f')} / {_f(f.mean_b, '.3f')}",
        f"lower in {f.lower}, higher in {f.higher} of {f.n}; Wilcoxon p = {_f(f.p, '.2g')}, r = {_f(f.r, '+.2f')}",
        f"{_f(k.median_a, '.3g')} / {_f(k.median_b, '.3g')}",
        f"median ratio {_f(k.ratio, '.3g')}; deeper in {k.deeper}, higher in {k.shallower} of {k.n}; "
        f"Wilcoxon p = {_f(k.p, '.2g')}, r = {_f(k.r, '+.2f')}",
        f"{ans.k_a}/{ans.n_a} vs {ans.k_b}/{ans.n_b}; " + (
            f"losses / wins {ans.losses} / {ans.wins}, McNemar p = {_f(ans.p, '.2g')}"
            if ans.basis.startswith("paired") else "unpaired"),
    ]


def markdown(results: list[IndexerPair]) -> str | None:
    """The summary.md section, or None when no two probed configurations share a top-k."""
    if not results:
        return None
    head = ("\n## Same top-k, paired: fidelity and needle rank / k\n\n"
            "Sparse configurations at the same top-k on identical prompts (trials with selection on both sides). "
            "**Fidelity**: mean top-k overlap with the top-k exact fp32 keys give for the same query (the key "
            "precision alone; B lower / higher than A per pair). **Needle rank / k**: the per-trial geometric mean of "
            "the worst needle-value token's rank / k (> 1: below the cut), median over pairs; B deeper / higher. "
            "Both by Wilcoxon's signed-rank test (r: rank-biserial, > 0: B higher fidelity / deeper needle). "
            "**Answers**: right in A vs B, McNemar's exact test on the discordant pairs.\n\n"
            "| top-k | A → B | fidelity A / B | fidelity, paired | rank / k A / B | rank / k, paired | answers |\n"
            "|---|---|---|---|---|---|---|\n")
    rows = [f"| {r.k} | `{r.a}` → `{r.b}` | " + " | ".join(_cells(r)) + " |" for r in results]
    return head + "\n".join(rows) + "\n"


def lines(results: list[IndexerPair]) -> list[str]:
    """One plain line per pair, for the terminal (the same numbers as `markdown`)."""
    out = []
    for r in results:
        fid, fidp, ra, rap, ans = _cells(r)
        out.append(f"top-k {r.k}: {r.a} -> {r.b} ({r.fidelity.n} pairs): fidelity {fid} ({fidp}); "
                   f"needle rank/k {ra} ({rap}); answers {ans}")
    return out
