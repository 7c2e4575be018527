"""Torch reference and checks for top-k selection."""

from __future__ import annotations

import torch


def candidate_mask(logits: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    if lengths is not None:
        pos = torch.arange(logits.shape[1], device=logits.device)
        return pos[None, :] < lengths.long()[:, None]
    return ~torch.isneginf(logits)


def ref_topk_indices(logits: torch.Tensor, k: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """torch.topk over the candidates; rows with <= k candidates: candidates in index order, then -1."""
    rows, width = logits.shape
    cand = candidate_mask(logits, lengths)
    out = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
    masked = logits.masked_fill(~cand, float("-inf"))
    kk = min(k, width)
    top = torch.topk(masked, kk, dim=1).indices.int()
    n = cand.sum(1)
    for r in range(rows):
        if n[r] <= k:
            idx = cand[r].nonzero().flatten().int()
            out[r, : idx.numel()] = idx
        else:
            out[r] = top[r, :k]
    return out


def check_topk(logits: torch.Tensor, idx: torch.Tensor, k: int, lengths: torch.Tensor | None = None) -> str | None:
    """None when idx is a valid top-k selection by value; else a description of the first problem.

    Checks: distinct candidate indices; count = min(k, candidates) then -1 padding; rows with
    <= k candidates return them in index order; min(selected) >= max(unselected)."""
    cand = candidate_mask(logits, lengths)
    n = cand.sum(1).tolist()
    for r in range(logits.shape[0]):
        row = idx[r].long()
        m = min(k, n[r])
        if (row[m:] != -1).any():
            return f"row {r}: expected -1 padding after {m} indices"
        sel = row[:m]
        if (sel < 0).any() or (sel >= logits.shape[1]).any():
            return f"row {r}: index out of range"
        if not cand[r, sel].all():
            return f"row {r}: selected a non-candidate position"
        if sel.unique().numel() != m:
            return f"row {r}: duplicate indices"
        if n[r] <= k:
            if not torch.equal(sel, cand[r].nonzero().flatten()):
                return f"row {r}: short row must return its candidates in index order"
            continue
        chosen = torch.zeros_like(cand[r])
        chosen[sel] = True
        rest = cand[r] & ~chosen
        if logits[r, sel].min() < logits[r, rest].max():
            return f"row {r}: a selected score is below an unselected one"
    return None


def check_topk_fast(logits: torch.Tensor, idx: torch.Tensor, k: int, lengths: torch.Tensor | None = None) -> str | None:
    """Vectorised check_topk for full-size rows on the GPU (same conditions, no per-row loop)."""
    rows, width = logits.shape
    cand = candidate_mask(logits, lengths)
    n = cand.sum(1)
    m = torch.clamp(n, max=k)
    slot = torch.arange(k, device=idx.device)[None, :]
    used = slot < m[:, None]
    if ((idx == -1) != ~used).any():
        return "padding: -1 must fill exactly the slots past min(k, candidates)"
    safe = torch.where(used, idx.long(), 0)
    if ((safe < 0) | (safe >= width)).any():
        return "index out of range"
    hits = torch.zeros(rows, width, dtype=torch.int32, device=logits.device)
    hits.scatter_add_(1, safe, used.int())
    if (hits > 1).any():
        return "duplicate indices"
    chosen = hits > 0
    if (chosen & ~cand).any():
        return "selected a non-candidate position"
    inf = torch.tensor(float("inf"), device=logits.device)
    sel_min = torch.where(chosen, logits, inf).amin(1)
    rest_max = torch.where(cand & ~chosen, logits, -inf).amax(1)
    if (sel_min < rest_max).any():
        r = int((sel_min < rest_max).nonzero()[0])
        return f"row {r}: a selected score is below an unselected one"
    short = n <= k
    if short.any():
        order_ok = (torch.where(used, idx.long(), -1) == torch.where(used, slot.expand(rows, k), -1)) | ~used
        if lengths is not None and not order_ok[short].all():
            return "short row must return 0..L-1"
    return None
