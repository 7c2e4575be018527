"""Two-stage selection: the bf16 re-score kernel and the whole fp8 -> bf16 selection.

    bf16_paged_rescore(q, kv_cache, weights, block_table, candidates) -> [B, N] f32
        q bf16 [B, H, D]; kv_cache bf16 [pages, block_kv, 1, D] (the bf16 paged layout of
        bf16_paged_mqa_logits); weights f32 [B, H]; block_table int32 [B, max_pages];
        candidates int32 [B, N] token positions of each request (< 0: none -> -inf).
        out[b, n] = sum_h weights[b, h] * relu(q[b, h] . k[candidates[b, n]]).
    fp8_bf16_two_stage_topk(q_fp8, fp8_cache, w_fp8, q_bf16, bf16_cache, w_bf16, context_lens,
                            block_table, max_context_len, topk, factor=4) -> int32 [B, topk]
        fp8_paged_mqa_logits over every visible key (decode, next_n 1), topk_indices of the
        factor*topk best as candidates, their bf16 rows re-scored (bf16_paged_rescore: only
        those rows are read), the topk best of those (`topk_indices`, ties to the lowest candidate
        slot; final_topk="torch": torch.topk, the first version's); -1 where a row has fewer
        keys. Both caches share one block table (the store keeps both forms of every token).
    fp4_bf16_two_stage_topk(q_fp4, fp4_cache, w_fp4, q_bf16, bf16_cache, w_bf16, context_lens,
                            block_table, max_context_len, topk, factor=4, mma="auto") -> int32 [B, topk]
        the same with fp4_paged_mqa_logits as the coarse stage: q_fp4 bf16 [B, H, D] or an
        MXFP4 pair (codes [B, H, D/2], exponents int32 [B, H] or uint8 [B, H, D/32]), fp4_cache
        the fp4 pages (kernels/fp4_store), mma as fp4_paged_mqa_logits takes it.
Bytes a token and layer of the two pools: (D + 4) + 2D (fp8 with its scale, and bf16), or
(D/2 + D/32) + 2D (fp4 with its exponents, and bf16); a decode step reads every key's coarse
row plus factor*topk bf16 rows a request.
"""

from __future__ import annotations

import functools

import torch

from niah.kernels._common import check_device, interpreting, next_pow2

BLOCK_N = 64  # candidates a program
FINAL_TOPK = ("niah", "torch")  # the two-stage selection's last top-k: topk_indices or torch.topk


@functools.cache
def _kernel():
    from niah.kernels.rescore.kernel import paged_rescore_kernel  # noqa: PLC0415 (imports triton at first launch)

    return paged_rescore_kernel


def _check(q, kv_cache, weights, block_table, candidates) -> None:
    name = "bf16_paged_rescore"
    if q.dim() != 3 or q.dtype != torch.bfloat16:
        raise ValueError(f"{name}: q must be bf16 [B, H, D], got {q.dtype} {tuple(q.shape)}")
    batch, heads, dim = q.shape
    if dim < 16 or dim & (dim - 1):
        raise ValueError(f"{name}: head dim must be a power of two >= 16, got {dim}")
    ks = kv_cache.shape
    if kv_cache.dtype != torch.bfloat16 or len(ks) != 4 or ks[2] != 1 or ks[3] != dim:
        raise ValueError(f"{name}: kv_cache must be bf16 [pages, block_kv, 1, {dim}], got {kv_cache.dtype} {tuple(ks)}")
    kst = kv_cache.stride()
    if kst[3] != 1 or kst[1] != dim or kst[0] < ks[1] * dim:
        raise ValueError(f"{name}: kv_cache pages must be dense inside ([block_kv, 1, {dim}] contiguous), "
                         f"got strides {kst}")
    if weights.shape != (batch, heads) or weights.dtype != torch.float32:
        raise ValueError(f"{name}: weights must be float32 [{batch}, {heads}], got {weights.dtype} "
                         f"{tuple(weights.shape)}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"{name}: block_table must be int32 [{batch}, max_pages], got {block_table.dtype} "
                         f"{tuple(block_table.shape)}")
    if candidates.dtype != torch.int32 or candidates.dim() != 2 or candidates.shape[0] != batch:
        raise ValueError(f"{name}: candidates must be int32 [{batch}, N], got {candidates.dtype} "
                         f"{tuple(candidates.shape)}")
    check_device(q, kv_cache, weights, block_table, candidates)


def bf16_paged_rescore(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, block_table: torch.Tensor,
                       candidates: torch.Tensor) -> torch.Tensor:
    """[B, N] fp32 re-scores of the candidates (module doc)."""
    _check(q, kv_cache, weights, block_table, candidates)
    batch, heads, dim = q.shape
    n = candidates.shape[1]
    out = torch.empty((batch, n), dtype=torch.float32, device=q.device)
    if batch == 0 or n == 0:
        return out
    q, weights = q.contiguous(), weights.contiguous()
    block_table, candidates = block_table.contiguous(), candidates.contiguous()
    grid = (batch, triton_cdiv(n, BLOCK_N))
    _kernel()[grid](
        q, kv_cache, weights, block_table, candidates, out,
        heads, n, block_table.shape[1],
        q.stride(0), q.stride(1), weights.stride(0), block_table.stride(0), candidates.stride(0), out.stride(0),
        kv_cache.stride(0),
        D=dim, BLOCK_H=max(16, next_pow2(heads)), BLOCK_N=BLOCK_N, BLOCK_KV=kv_cache.shape[1],
        UPCAST=interpreting(),
    )
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_two_stage(name: str, q, topk: int, factor: int, final_topk: str) -> int:
    """The batch size of a decode query (a tensor or the first of an MXFP4 pair), after the checks."""
    if final_topk not in FINAL_TOPK:
        raise ValueError(f"{name}: final_topk must be one of {FINAL_TOPK}, got {final_topk!r}")
    if topk < 1 or factor < 1:
        raise ValueError(f"{name}: topk and factor must be >= 1, got {topk}, {factor}")
    first = q[0] if isinstance(q, (tuple, list)) else q
    if first.dim() != 3:
        raise ValueError(f"{name}: the coarse query must be [B, H, D] (decode), got {tuple(first.shape)}")
    return first.shape[0]


def _rescore_top(coarse, q_bf16, bf16_cache, w_bf16, context_lens, block_table, max_context_len, topk, factor,
                 batch, final_topk) -> torch.Tensor:
    """Stages two and three: the factor*topk best coarse logits as candidates, their bf16 re-scores, the topk
    best (final_topk "niah": topk_indices, ties to the lowest candidate slot; "torch": torch.topk, sorted)."""
    from niah.kernels.topk.wrapper import topk_indices  # noqa: PLC0415 (siblings, loaded lazily)

    m = min(factor * topk, max_context_len)
    lens = context_lens.reshape(batch, -1)[:, -1].clamp(0, max_context_len).int()
    cand = topk_indices(coarse, m, lens)                                               # [B, M], -1 padding
    resc = bf16_paged_rescore(q_bf16, bf16_cache, w_bf16, block_table, cand)           # -inf at -1
    k = min(topk, m)
    if final_topk == "niah":
        pick = topk_indices(resc, k)                                                   # slots, -1 past the last
        out = torch.where(pick >= 0, cand.gather(1, pick.clamp_min(0).long()), -1)
    else:
        vals, pick = resc.topk(k, dim=-1)
        out = torch.where(torch.isneginf(vals), -1, cand.long().gather(1, pick)).int()
    if k < topk:
        out = torch.cat([out, torch.full((batch, topk - k), -1, dtype=torch.int32, device=out.device)], 1)
    return out


def fp8_bf16_two_stage_topk(q_fp8: torch.Tensor, fp8_cache: torch.Tensor, w_fp8: torch.Tensor, q_bf16: torch.Tensor,
                            bf16_cache: torch.Tensor, w_bf16: torch.Tensor, context_lens: torch.Tensor,
                            block_table: torch.Tensor, max_context_len: int, topk: int,
                            factor: int = 4, final_topk: str = "niah") -> torch.Tensor:
    """int32 [B, topk] positions selected by the two stages (module doc)."""
    from niah.kernels.paged_logits.wrapper import fp8_paged_mqa_logits  # noqa: PLC0415 (siblings, loaded lazily)

    batch = _check_two_stage("fp8_bf16_two_stage_topk", q_fp8, topk, factor, final_topk)
    coarse = fp8_paged_mqa_logits(q_fp8[:, None], fp8_cache, w_fp8, context_lens, block_table, None,
                                  max_context_len, clean_logits=True)                  # [B, L]
    return _rescore_top(coarse, q_bf16, bf16_cache, w_bf16, context_lens, block_table, max_context_len, topk,
                        factor, batch, final_topk)


def fp4_bf16_two_stage_topk(q_fp4, fp4_cache: torch.Tensor, w_fp4: torch.Tensor, q_bf16: torch.Tensor,
                            bf16_cache: torch.Tensor, w_bf16: torch.Tensor, context_lens: torch.Tensor,
                            block_table: torch.Tensor, max_context_len: int, topk: int, factor: int = 4,
                            mma: str = "auto", final_topk: str = "niah") -> torch.Tensor:
    """int32 [B, topk] positions selected by the two stages, fp4 keys the coarse one (module doc)."""
    from niah.kernels.fp4_paged_logits.wrapper import fp4_paged_mqa_logits  # noqa: PLC0415 (as above)

    batch = _check_two_stage("fp4_bf16_two_stage_topk", q_fp4, topk, factor, final_topk)
    q = tuple(t[:, None] for t in q_fp4) if isinstance(q_fp4, (tuple, list)) else q_fp4[:, None]
    coarse = fp4_paged_mqa_logits(q, fp4_cache, w_fp4, context_lens, block_table, None, max_context_len,
                                  clean_logits=True, mma=mma)                          # [B, L]
    return _rescore_top(coarse, q_bf16, bf16_cache, w_bf16, context_lens, block_table, max_context_len, topk,
                        factor, batch, final_topk)
