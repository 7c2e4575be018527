"""Torch references for two-stage selection (exact arithmetic: fp64 on CPU, fp32 on GPU).

- `ref_paged_rescore`: the candidates' rows of a bf16 paged cache scored, one request at a
  time (what bf16_paged_rescore computes);
- `ref_two_stage_topk`: the whole selection from the dequantised fp8 and bf16 pages: fp8
  logits over every visible key, the factor*k best as candidates, their bf16 re-scores,
  the k best of those (-1 padding when a row has fewer than k keys).
"""

from __future__ import annotations

import torch

from niah.kernels.paged_logits.reference import ref_paged_mqa_logits


def _acc(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.device.type == "cpu" else torch.float32


def ref_paged_rescore(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, block_table: torch.Tensor,
                      candidates: torch.Tensor) -> torch.Tensor:
    """q [B, H, D], kv_cache bf16 [pages, block_kv, 1, D], weights [B, H], block_table int32
    [B, max_pages], candidates int32 [B, N] -> [B, N] fp32 (-inf where a candidate is < 0)."""
    acc = _acc(q)
    pages, block_kv, _, dim = kv_cache.shape
    flat = kv_cache.reshape(pages * block_kv, dim)
    cand = candidates.long()
    live = cand >= 0
    safe = cand.clamp_min(0)
    slots = block_table.long().gather(1, safe // block_kv) * block_kv + safe % block_kv       # [B, N]
    k = flat[slots].to(acc)                                                                   # [B, N, D]
    s = torch.relu(torch.einsum("bnd,bhd->bnh", k, q.to(acc)))                                 # [B, N, H]
    out = (s * weights.to(acc)[:, None, :]).sum(-1)
    return out.masked_fill(~live, float("-inf")).float()


def ref_two_stage_topk(q_fp8: torch.Tensor, fp8_cache: torch.Tensor, w_fp8: torch.Tensor, q_bf16: torch.Tensor,
                       bf16_cache: torch.Tensor, w_bf16: torch.Tensor, context_lens: torch.Tensor,
                       block_table: torch.Tensor, max_context_len: int, topk: int,
                       factor: int = 4) -> torch.Tensor:
    """-> int32 [B, topk] selected positions (-1 padding), in no particular order."""
    B = q_fp8.shape[0]
    coarse = ref_paged_mqa_logits(q_fp8[:, None], fp8_cache, w_fp8, context_lens, block_table, max_context_len)
    M = min(factor * topk, max_context_len)
    cvals, cand = coarse.topk(M, dim=-1)                                                      # [B, M]
    cand = torch.where(torch.isneginf(cvals), -1, cand).int()
    resc = ref_paged_rescore(q_bf16, bf16_cache, w_bf16, block_table, cand)
    K = min(topk, M)
    rvals, pick = resc.topk(K, dim=-1)
    out = torch.where(torch.isneginf(rvals), -1, cand.long().gather(1, pick)).int()
    if K < topk:
        out = torch.cat([out, torch.full((B, topk - K), -1, dtype=torch.int32, device=out.device)], 1)
    return out
