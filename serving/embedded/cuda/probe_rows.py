"""The indexer probe on the GPU: each layer leaves its row, every layer's stats come at once.

The probe (serving/embedded/probe.py) asks, for one query row a step (the last prompt token,
then each decode step), where the needle's value tokens rank in every layer. Computed a layer
at a time that is ~50 small launches a layer for the prefill's row and ~11 in a decode step's
CUDA graph, for a few hundred microseconds of device work: host time in the prefill, graph
nodes in decode. `ProbeRows` instead keeps what a layer selected ([L, W] index scores, the
[L, K] kept positions, the [L, H, D] query row: three copies a layer, or fewer) and `stats`
computes every layer's stats after the last one: the kept keys by one scatter, the exact-key
scores by one batched matmul over every layer's KV cache (read in place when the caches are
views of one tensor, `LayerCache.k_all`), the five stats by `rows_stats_at`.

Numbers: `rows_stats_at` gives row_stats_tensor's numbers row by row (tested); the batched
exact-key scores are the same dot products and the same head sum as `CudaDSA.exact_scores`,
up to the order cuBLAS accumulates a 64-term dot product in (at most an ulp; the stats are
reported to 5 decimals).
"""

from __future__ import annotations

import torch


def rows_stats_at(scores: torch.Tensor, kept: torch.Tensor, exact: torch.Tensor, k: int,
                  span: torch.Tensor) -> torch.Tensor:
    """probe.row_stats_tensor of R rows at once, padded to a fixed width, the span on the device.

    scores, exact: fp32 [R, W] (-inf past each row's S candidates), kept: bool [R, W] (False
    past S), span: int64 [2] (a < b), k < S, or W <= k (unpadded rows: the top-k then every
    key, as row_stats_tensor's min(k, S)). -> fp64 [R, 5] in STAT_KEYS order, each row the
    same numbers as row_stats_tensor: ranks from counts (the best-ranked value token is the
    highest-scoring one), the top-k overlap by counts against the exact k-th score (as
    probe._overlap, ties at it counted while the exact top-k has room; no torch.isin, whose
    sort-based path syncs the host). One launch per op for all R rows."""
    R, W = scores.shape
    pos = torch.arange(W, device=scores.device)
    inspan = ((pos >= span[0]) & (pos < span[1]))[None, :]                      # [1, W]
    n = (span[1] - span[0]).double()
    kk = min(k, W)
    top = scores.topk(kk, dim=1)
    vals = top.values.double()
    kth, first = vals[:, -1], vals[:, 0]                                          # [R]
    hi = torch.where(inspan, scores, float("-inf")).amax(1)
    lo = torch.where(inspan, scores, float("inf")).amin(1)
    rank_best = (scores >= hi[:, None]).sum(1).double()
    rank_worst = (scores >= lo[:, None]).sum(1).double()
    kept_n = kept & inspan
    worst_kept = torch.where(kept_n, scores.double(), torch.inf).amin(1)
    spread = first - kth
    margin = torch.where(spread > 0, (worst_kept - kth) / torch.where(spread > 0, spread, 1.0), 0.0)
    margin = torch.where(kept_n.any(1), margin, torch.nan)
    # probe._overlap row by row: the selected keys above the exact k-th score, plus those tied
    # at it while the exact top-k has room (ReLU zeros tie there in many rows)
    ekth = exact.topk(kk, dim=1).values[:, -1:]                                   # [R, 1]
    room = kk - (exact > ekth).sum(1)
    picked = exact.gather(1, top.indices)                                         # [R, k]
    overlap = ((picked > ekth).sum(1) + torch.minimum((picked == ekth).sum(1), room)).double()
    return torch.stack([kept_n.sum(1).double() / n, rank_best / k, rank_worst / k, margin, overlap / kk], dim=1)


def kept_mask(idx: torch.Tensor, W: int) -> torch.Tensor:
    """idx: int32 [R, K] kept positions (-1 pads) -> bool [R, W], True where kept; no host
    sync (a -1 pad adds 0 at position 0)."""
    hits = torch.zeros(idx.shape[0], W, dtype=torch.int32, device=idx.device)
    hits.scatter_add_(1, idx.clamp_min(0).long(), (idx >= 0).int())
    return hits > 0


def layer_keys(caches, W: int) -> torch.Tensor:
    """Every layer's first W keys, [L, Hkv, W, D]: a view of the caches' shared tensor
    (`LayerCache.k_all`) when they have one, else stacked (a copy)."""
    k_all = getattr(caches[0], "k_all", None)
    if k_all is not None and all(c.k_all is k_all for c in caches) and k_all.shape[0] == len(caches):
        return k_all[:, 0, :, :W]
    return torch.stack([c.k[0, :, :W] for c in caches])


class ProbeRows:
    """One probed query row's inputs, a row a layer, filled by the layers and turned into
    stats once after the last (`stats`).

    scores: fp32 [L, W] the selection's index scores (-inf past the row's candidates), idx:
    int32 [L, K] the kept positions (-1 pads), q: fp32 [L, H, D] the unrotated query row (the
    exact-key scores' query)."""

    def __init__(self, layers: int, W: int, K: int, H: int, D: int, device):
        self.scores = torch.full((layers, W), float("-inf"), device=device)
        self.idx = torch.full((layers, K), -1, dtype=torch.int32, device=device)
        self.q = torch.zeros(layers, H, D, device=device)
        self.caches: list = [None] * layers

    def put(self, layer: int, cache, idx_row: torch.Tensor, q_row: torch.Tensor,
            scores_row: torch.Tensor | None = None) -> None:
        """A layer's row: its kept positions [K'] (K' <= K), its query row [H, D] and, unless
        it wrote them in place into `scores[layer]`, its index scores [S'] (S' <= W)."""
        self.idx[layer, :idx_row.shape[0]].copy_(idx_row)
        self.q[layer].copy_(q_row)
        if scores_row is not None:
            self.scores[layer, :scores_row.shape[0]].copy_(scores_row)
        self.caches[layer] = cache

    def exact(self, n_kv: int) -> torch.Tensor:
        """The exact-key scores of every layer's query row, fp32 [L, W]: sum over heads of
        ReLU(q_h . k[g(h)]) * (H * D)^-0.5, as CudaDSA.exact_scores, one batched matmul."""
        L, H, D = self.q.shape
        W = self.scores.shape[1]
        keys = layer_keys(self.caches, W)                                           # [L, Hkv, W, D]
        raw = torch.matmul(self.q.view(L, n_kv, H // n_kv, D), keys.transpose(2, 3))  # [L, Hkv, G, W]
        return raw.relu_().sum((1, 2)).mul_((H * D) ** -0.5)

    def stats(self, n_kv: int, k: int, span: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """fp64 [L, 5] in STAT_KEYS order; valid: bool [W] (s <= pos; None: every column)."""
        exact = self.exact(n_kv)
        if valid is not None:
            exact = exact.masked_fill_(~valid[None, :], float("-inf"))
        return rows_stats_at(self.scores, kept_mask(self.idx, self.scores.shape[1]), exact, k, span)

    def recall(self, a: int, b: int) -> torch.Tensor:
        """fp32 [L]: each layer's share of positions a..b-1 among its kept keys."""
        return kept_mask(self.idx, self.scores.shape[1])[:, a:b].float().mean(1)
