"""Torch reference for the fp4 paged index logits (decode): the exact-arithmetic reference
(fp64 on CPU, fp32 on GPU) over the dequantised keys and query (niah.kernels.quant's
dequantize_fp4), one request at a time, pages gathered per request only."""

from __future__ import annotations

import torch

from niah.kernels.fp4_store.reference import unpack_fp4_pages
from niah.kernels.paged_logits.reference import visible_lengths
from niah.kernels.quant import dequantize_fp4


def fp4_query_values(q) -> torch.Tensor:
    """A query as the kernels read it, in fp32: bf16 [..., D] as is, or MXFP4 (codes [..., D/2],
    exponents: uint8 [..., D/32] or int32 [...] packed, D = 128) dequantised."""
    if isinstance(q, torch.Tensor):
        return q.float()
    codes, sf = q
    if sf.dtype == torch.int32:
        sf = sf.contiguous().view(torch.uint8).reshape(*sf.shape, 4)
    return dequantize_fp4(codes, sf)


def ref_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_context_len,
                             block_kv: int = 64) -> torch.Tensor:
    """[B*next_n, max_context_len] fp32, -inf past each row's visible length. q as
    fp4_paged_mqa_logits takes it; kv_cache uint8 fp4 pages (either shape)."""
    qf = fp4_query_values(q)
    batch, next_n, heads, dim = qf.shape
    acc = torch.float64 if qf.device.type == "cpu" else torch.float32
    if kv_cache.dim() == 4:
        block_kv = kv_cache.shape[1]
    codes, exps = unpack_fp4_pages(kv_cache, dim, block_kv)
    lens = visible_lengths(context_lens, batch, next_n).clamp(0, max_context_len).tolist()
    out = torch.full((batch * next_n, max_context_len), float("-inf"), dtype=torch.float32, device=qf.device)
    for b in range(batch):
        longest = max(lens[b * next_n : (b + 1) * next_n])
        if longest <= 0:
            continue
        pages = block_table[b, : (longest + block_kv - 1) // block_kv].long()
        k = dequantize_fp4(codes[pages].reshape(-1, dim // 2), exps[pages].reshape(-1, dim // 32))[:longest].to(acc)
        s = torch.relu(qf[b].reshape(next_n * heads, dim).to(acc) @ k.T).reshape(next_n, heads, -1)
        logits = (s * weights[b * next_n : (b + 1) * next_n].to(acc)[:, :, None]).sum(1)
        for j in range(next_n):
            n = lens[b * next_n + j]
            out[b * next_n + j, :n] = logits[j, :n].float()
    return out
