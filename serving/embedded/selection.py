"""The embedded indexer's precisions computed (torch): stored key forms, the quantised
index query, and the two-stage selection's re-score (the definitions: precision.py).
"""

from __future__ import annotations

import torch

from niah.kernels import forms
from niah.kernels.quant import store_roundtrip
from niah.serving.embedded.precision import query_dtypes

def store_form(k: torch.Tensor, form: str) -> torch.Tensor:
    """One stored form of keys k [..., D] as the indexer reads it back, in fp32."""
    return store_roundtrip(k, form)


def quantize_query(q: torch.Tensor, query_dtype: str) -> torch.Tensor:
    """The index query as quantised ([..., D], per token and head for fp8), in fp32: its
    form's query quantiser (niah.kernels.forms)."""
    if query_dtype not in query_dtypes():
        raise ValueError(f"index query dtype must be one of {', '.join(query_dtypes())}, not {query_dtype!r}")
    return forms.get(query_dtype).quantize_query(q)


ROWS = 64   # query rows re-scored at once (bounds the gathered [Hkv, ROWS, M, D] candidates)


def rescore(q: torch.Tensor, fine_k: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """Re-score candidates from their re-score-form keys.

    q: [1, H, C, D] fp32 index query (head h scored against kv group h // G, as in
    dsa.DSA.index_scores); fine_k: [Hkv, S, D] (the bf16 form, read back in fp32);
    cand: [C, M] int64 key positions per query row -> [C, M] fp32:
        (H*D)^-0.5 * sum_h ReLU(q[c, h] . fine_k[cand[c, m], h // G]).
    Only the C*M candidate rows are gathered, ROWS query rows at a time."""
    _, H, C, D = q.shape
    Hkv = fine_k.shape[0]
    G = H // Hkv
    M = cand.shape[1]
    w = (H * D) ** -0.5
    qg = q[0].reshape(Hkv, G, C, D)
    out = torch.empty(C, M)
    for r0 in range(0, C, ROWS):
        r1 = min(C, r0 + ROWS)
        R = r1 - r0
        kf = fine_k[:, cand[r0:r1].reshape(-1)].reshape(Hkv * R, M, D)             # [Hkv*R, M, D]
        qr = qg[:, :, r0:r1].permute(0, 2, 1, 3).reshape(Hkv * R, G, D)           # [Hkv*R, G, D]
        dots = torch.bmm(qr, kf.transpose(1, 2)).relu_()                          # [Hkv*R, G, M]
        out[r0:r1] = dots.view(Hkv, R, G, M).sum((0, 2)) * w
    return out


def candidate_order(coarse_scores: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """The order the candidates are taken in, written over `floor` (scratch) and returned: the
    coarse score where it is above 0; where it is a ReLU tie at 0, the largest coarse head
    product (floor, w_h-scaled, <= 0 there), so those keys rank below every scoring key and
    among themselves by how near they came to scoring; -inf where the coarse score is (not
    causal). [C, S] fp32.

    Why: where fewer than c*k keys score above 0 (rows of SmolLM2's layers where only tens
    of keys do), the exact top-k holds every key whose exact score is above 0, and a key
    the coarse form rounds down to 0 from just above it is among thousands of tied zeros: a
    plain top-(c*k) takes an arbitrary few of those, and the re-score never sees the key."""
    torch.where(coarse_scores > 0, coarse_scores, floor, out=floor)
    return floor.masked_fill_(torch.isneginf(coarse_scores), float("-inf"))


def two_stage_top(q: torch.Tensor, coarse_scores: torch.Tensor, fine_k: torch.Tensor, topk: int,
                  factor: int, floor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The two-stage selection of C query rows.

    coarse_scores: [C, S] coarse-form index scores, -inf where a key is not causal;
    floor: [C, S] the largest coarse head product of each (dsa.DSA.index_scores), which
    orders the keys tied at 0 as candidates (candidate_order; overwritten).
    -> (top [C, min(k, M)] selected key positions, cand [C, M] candidate positions,
    resc [C, M] their re-scores, -inf where the coarse score was), M = min(c*k, S).
    Rows with fewer causal keys than M pick -inf candidates too; the caller's causal mask
    drops those, as it does for the one-stage top-k."""
    S = coarse_scores.shape[1]
    M = min(factor * topk, S)
    cvals, cand = candidate_order(coarse_scores, floor).topk(M, dim=-1, sorted=False)     # [C, M]
    cand, order = cand.sort(dim=-1)       # by position: ties (ReLU'd scores tie at 0) break as the one-stage top-k's
    cvals = cvals.gather(1, order)
    resc = rescore(q, fine_k, cand).masked_fill_(torch.isneginf(cvals), float("-inf"))
    pick = resc.topk(min(topk, M), dim=-1, sorted=False).indices                   # [C, K] into cand
    return cand.gather(1, pick), cand, resc


def composite_row(coarse_row: torch.Tensor, cand: torch.Tensor, resc: torch.Tensor) -> torch.Tensor:
    """One row's scores in the two-stage order, for the probe (probe.row_stats): each
    candidate scores its re-score; every other causal key scores its coarse score shifted
    below the lowest candidate's (their order among themselves is kept). [S] fp32."""
    out = coarse_row.clone()
    is_cand = torch.zeros_like(out, dtype=torch.bool)
    is_cand[cand] = True
    finite_c = resc[torch.isfinite(resc)]
    rest = ~is_cand & torch.isfinite(out)
    if bool(rest.any()) and finite_c.numel():
        shift = float(out[rest].max()) - float(finite_c.min()) + 1.0
        out[rest] -= max(shift, 0.0)
    out[cand] = resc
    return out
