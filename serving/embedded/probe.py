"""Where the needle ranks against k: the indexer probe of one query row in one layer.

The DSA emulation calls `row_stats` for the last prompt token and for each decode step
while a request asks for it (`niah_value_span`). Inputs are one query row's index scores
over its causal candidates, the keys it kept, and the scores the same query gives with
exact (fp32, never stored) keys. Definitions (docs/embedded-server.md, "Indexer probe"):

- kept: share of the needle value's tokens among the kept keys;
- rank of a token: the number of candidates scoring at least as high, itself included
  (1 = top; a tie ranks at the bottom of its group: ReLU'd index scores tie at 0, and a
  tied token is kept only by the top-k's tie-break); `rank_best` / `rank_worst` are the
  best and worst value token's rank divided by k (> 1: not kept, except by a tie-break);
- margin: (score of the lowest-scoring KEPT value token - the k-th score) /
  (top score - the k-th score): 0 = at the cut, 1 = the top; None when none is kept;
- fidelity: |top-k by these scores ∩ a top-k by exact-key scores| / k, the exact top-k that
  overlaps it most: every key scoring above the exact k-th score is in every exact top-k,
  and of the keys tied AT the k-th score any may complete it, so a selected key tied there
  counts while the exact top-k has room for it. Where fewer than k keys score above 0 (ReLU'd scores tie
  at 0; in some of SmolLM2's layers only 30-60 of 1,000 keys do), the exact top-k is not one
  set: any zero-score key completes it, and a plain intersection would measure whether two
  top-k calls broke the tie alike, not what the selection kept. Elsewhere the two agree.
"""

from __future__ import annotations

import torch

STAT_KEYS = ("kept", "rank_best", "rank_worst", "margin", "fidelity")


def row_stats(scores: torch.Tensor, kept: torch.Tensor, exact: torch.Tensor, k: int,
              span: tuple[int, int]) -> dict[str, float | None]:
    """scores, exact: [S] fp32 index scores of one query over its S causal candidates;
    kept: [S] bool; span: the value's token positions [a, b). -> the STAT_KEYS."""
    a, b = span
    S = scores.shape[0]
    kk = min(k, S)
    top = scores.topk(kk)                                        # sorted, descending
    kth, first = float(top.values[-1]), float(top.values[0])
    needle = scores[a:b]                                         # [n]
    if needle.numel() == 0:
        return dict.fromkeys(STAT_KEYS)
    ranks = (scores[None, :] >= needle[:, None]).sum(1)          # [n], ties at the bottom
    kept_n = kept[a:b]
    margin = None
    if bool(kept_n.any()):
        worst_kept = float(needle[kept_n].min())
        margin = (worst_kept - kth) / (first - kth) if first > kth else 0.0
    return {"kept": float(kept_n.float().mean()), "rank_best": int(ranks.min()) / k,
            "rank_worst": int(ranks.max()) / k, "margin": margin,
            "fidelity": float(_overlap(top.indices, exact, kk)) / kk}


def _overlap(selected: torch.Tensor, exact: torch.Tensor, kk: int) -> torch.Tensor:
    """|selected ∩ the exact top-kk that overlaps it most| (module doc, fidelity): the selected
    keys above the exact kk-th score, plus those tied at it while the exact top-kk has room."""
    kth = exact.topk(kk).values[-1]
    above = exact > kth
    picked = exact[selected]
    room = kk - above.sum()
    return (picked > kth).sum() + torch.minimum((picked == kth).sum(), room)


def row_stats_tensor(scores: torch.Tensor, kept: torch.Tensor, exact: torch.Tensor, k: int,
                     span: tuple[int, int]) -> "torch.Tensor | None":
    """`row_stats` computed where the tensors are, with no host sync: -> fp64 [5] in
    STAT_KEYS order (margin NaN when no value token is kept; all NaN for an empty span).
    ProbeLog turns a step's tensors into numbers with one copy (GPU path: one sync a step)."""
    a, b = span
    if b <= a:
        return torch.full((len(STAT_KEYS),), float("nan"), dtype=torch.float64, device=scores.device)
    S = scores.shape[0]
    kk = min(k, S)
    top = scores.topk(kk)
    vals = top.values.double()
    kth, first = vals[-1], vals[0]
    needle = scores[a:b]
    ranks = (scores[None, :] >= needle[:, None]).sum(1).double()
    kept_n = kept[a:b]
    worst_kept = torch.where(kept_n, needle.double(), torch.inf).min()
    spread = first - kth
    margin = torch.where(spread > 0, (worst_kept - kth) / torch.where(spread > 0, spread, 1.0), 0.0)
    margin = torch.where(kept_n.any(), margin, torch.nan)
    overlap = _overlap(top.indices, exact, kk).double()
    return torch.stack([kept_n.double().mean(), ranks.min() / k, ranks.max() / k, margin, overlap / kk])


class ProbeLog:
    """One request's probe: per probed query row (the last prompt token, then each decode
    step), the per-layer stats. The DSA layers write into `current`; `next_step` closes a row."""

    def __init__(self, span: tuple[int, int], n_layer: int, k: int):
        self.span, self.n_layer, self.k = span, n_layer, k
        self.steps: list[dict] = []
        self.current: dict[int, dict | None] = {}
        self.position = 0
        self.context = 0
        self.active = False

    def record(self, layer: int, position: int, context: int, stats) -> None:
        """stats None: no selection at this row (every key kept: context <= k); a dict of
        STAT_KEYS, or their row_stats_tensor (resolved at next_step)."""
        self.position, self.context = position, context
        self.current[layer] = stats
        self.active = self.active or stats is not None

    def _resolve(self) -> None:
        """Stats recorded as tensors (row_stats_tensor) -> dicts, all layers in one copy."""
        lazy = [i for i, v in self.current.items() if isinstance(v, torch.Tensor)]
        if not lazy:
            return
        rows = torch.stack([self.current[i] for i in lazy]).cpu().tolist()
        for i, r in zip(lazy, rows):
            self.current[i] = {key: (None if x != x else x) for key, x in zip(STAT_KEYS, r)}

    def next_step(self) -> None:
        if not self.current:
            return
        self._resolve()
        step: dict = {"position": self.position, "context": self.context,
                      "active": any(v is not None for v in self.current.values())}
        if step["active"]:
            rows = [self.current.get(i) or dict.fromkeys(STAT_KEYS) for i in range(self.n_layer)]
            for key in STAT_KEYS:
                step[key] = [None if r[key] is None else round(float(r[key]), 5) for r in rows]
        self.steps.append(step)
        self.current = {}

    def detail(self, value_complete: bool) -> dict:
        a, b = self.span
        return {"k": self.k, "value_tokens": b - a, "value_token_span": [a, b],
                "value_complete": value_complete, "steps": self.steps}
