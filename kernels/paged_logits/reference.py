"""Torch references for the paged index logits (decode).

- `ref_paged_mqa_logits`: the exact-arithmetic reference (fp32 on GPU, fp64 on CPU) over
  the dequantised keys and query, one request at a time, pages gathered per request
  only, so it runs at full size (B=64 x 65,536) too.
- `naive_paged_mqa_logits`: the alternative a user has today (SGLang's torch fallback
  pattern): gather every page of every request, then one bmm in bf16. Benchmarks only.
"""

from __future__ import annotations

import torch

from niah.kernels.quant import dequantize_fp8


def visible_lengths(context_lens: torch.Tensor, batch: int, next_n: int) -> torch.Tensor:
    """[B*next_n] int64: tokens row (b, j) sees. 1-D context_lens: ctx - next_n + j + 1;
    2-D [B, next_n]: context_lens[b, j] itself (DeepGEMM's 2-D convention)."""
    ctx = context_lens.to(torch.int64)
    if ctx.dim() == 2:
        return ctx.reshape(-1)
    j = torch.arange(next_n, device=ctx.device)
    return (ctx[:, None] - next_n + j[None, :] + 1).reshape(-1)


def unpack_fp8_pages(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [pages, 64, 1, D+4] -> (k8 e4m3 [pages, 64, D], sf fp32 [pages, 64])."""
    pages, block_kv, _, dp4 = kv_cache.shape
    d = dp4 - 4
    flat = kv_cache.reshape(pages, block_kv * dp4)
    k8 = flat[:, : block_kv * d].reshape(pages, block_kv, d).view(torch.float8_e4m3fn)
    sf = flat[:, block_kv * d :].contiguous().view(torch.float32).reshape(pages, block_kv)
    return k8, sf


def ref_paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    is_fp8: bool | None = None,
) -> torch.Tensor:
    """[B*next_n, max_context_len] fp32, -inf past each row's visible length."""
    batch, next_n, heads, dim = q.shape
    if is_fp8 is None:
        is_fp8 = kv_cache.dtype == torch.uint8
    acc = torch.float64 if q.device.type == "cpu" else torch.float32
    block_kv = kv_cache.shape[1]
    lens = visible_lengths(context_lens, batch, next_n).clamp(0, max_context_len).tolist()
    out = torch.full((batch * next_n, max_context_len), float("-inf"), dtype=torch.float32, device=q.device)
    if is_fp8:
        k8, sf = unpack_fp8_pages(kv_cache)
    else:
        kb = kv_cache.reshape(kv_cache.shape[0], block_kv, dim)
    for b in range(batch):
        longest = max(lens[b * next_n : (b + 1) * next_n])
        if longest <= 0:
            continue
        n_pages = (longest + block_kv - 1) // block_kv
        pages = block_table[b, :n_pages].long()
        if is_fp8:
            k = dequantize_fp8(k8[pages].reshape(-1, dim), sf[pages].reshape(-1))
        else:
            k = kb[pages].reshape(-1, dim)
        k = k[:longest].to(acc)  # [L, D]
        qb = q[b].reshape(next_n * heads, dim).to(acc)  # [next_n*H, D]
        s = torch.relu(qb @ k.T).reshape(next_n, heads, -1)  # [next_n, H, L]
        w = weights[b * next_n : (b + 1) * next_n].to(acc)  # [next_n, H]
        logits = (s * w[:, :, None]).sum(1)  # [next_n, L]
        for j in range(next_n):
            n = lens[b * next_n + j]
            out[b * next_n + j, :n] = logits[j, :n].float()
    return out


def naive_paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
) -> torch.Tensor:
    """Gather-then-bmm (next_n == 1), bf16 matmul: what SGLang's torch fallback does."""
    batch, next_n, heads, dim = q.shape
    block_kv = kv_cache.shape[1]
    n_pages = (max_context_len + block_kv - 1) // block_kv
    pages = block_table[:, :n_pages].long()
    if kv_cache.dtype == torch.uint8:
        k8, sf = unpack_fp8_pages(kv_cache)
        k = k8[pages].reshape(batch, -1, dim).to(torch.bfloat16)  # [B, P*64, D]
        scale = sf[pages].reshape(batch, -1)
    else:
        k = kv_cache.reshape(-1, block_kv, dim)[pages].reshape(batch, -1, dim)
        scale = None
    qb = q[:, 0].to(torch.bfloat16)  # [B, H, D]
    s = torch.bmm(k, qb.transpose(1, 2)).float()  # [B, L, H]
    logits = (torch.relu(s) * weights[:, None, :]).sum(-1)  # [B, L]
    if scale is not None:
        logits = logits * scale
    lens = visible_lengths(context_lens, batch, next_n)
    pos = torch.arange(logits.shape[1], device=q.device)
    logits = logits.masked_fill(pos[None, :] >= lens[:, None], float("-inf"))
    return logits[:, :max_context_len]
