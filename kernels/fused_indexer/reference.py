"""Float64 reference of the fused indexer + top-k: the scores, and the top-k by the documented order.

    I[i, s] = sum_g sum_h w[i, g, h] * relu(q[i, g, h, :] . k_g[s, :]),  s <= p0 + i

(k_g: kv head g's keys as the indexer reads them, fp8 keys already times their scale). The
top-k of a row keeps the k largest scores; at a tie on the k-th score the lowest positions
win; a row with at most k candidates keeps them all. Selections are compared as sets.
"""

from __future__ import annotations

import torch


def reference_scores(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, p0: int) -> torch.Tensor:
    """q [C, Hkv, G, D], weights [C, Hkv, G], keys [Hkv, S, D] (any float dtypes) -> float64 [C, S],
    -inf where s > p0 + i."""
    q, w, k = q.double(), weights.double(), keys.double()
    C, S = q.shape[0], keys.shape[1]
    raw = torch.einsum("cghd,gsd->cghs", q, k).clamp_min_(0)             # [C, Hkv, G, S]
    scores = (raw * w[..., None]).sum((1, 2))
    pos = torch.arange(S, device=q.device)
    rows = p0 + torch.arange(C, device=q.device)
    return scores.masked_fill_(pos[None, :] > rows[:, None], float("-inf"))


def reference_topk(scores: torch.Tensor, k: int) -> list[set[int]]:
    """The kept positions of each row (a set), by the rule above."""
    out = []
    for row in scores:
        cand = (~torch.isneginf(row)).nonzero().flatten()
        if cand.numel() <= k:
            out.append(set(cand.tolist()))
            continue
        # sort by score descending, then position ascending: the first k
        order = sorted(cand.tolist(), key=lambda s: (-float(row[s]), s))
        out.append(set(order[:k]))
    return out
