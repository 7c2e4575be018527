"""Torch reference for the key store: niah.kernels.quant's quantisation, written by slot."""

from __future__ import annotations

import torch

from niah.kernels.quant import quantize_fp8


def ref_store_index_keys(k, kv_cache, slot_mapping, ue8m0=False, block_kv=None):
    """Same contract as store_index_keys (in place, returns kv_cache)."""
    n, dim = k.shape
    fp8 = kv_cache.dtype == torch.uint8
    block_kv = kv_cache.shape[1] if kv_cache.dim() == 4 else (block_kv or 64)
    pages = kv_cache.shape[0]
    slot = slot_mapping.long()
    keep = slot >= 0
    slot, k = slot[keep], k[keep]
    page, off = slot // block_kv, slot % block_kv
    if fp8:
        flat = kv_cache.view(pages, block_kv * (dim + 4))
        k8, sf = quantize_fp8(k, ue8m0=ue8m0)
        vals = flat[:, : block_kv * dim].view(pages, block_kv, dim)
        vals[page, off] = k8.view(torch.uint8)
        scales = flat[:, block_kv * dim :].view(pages, block_kv, 4)
        scales[page, off] = sf.float().contiguous().view(torch.uint8).reshape(-1, 4)
    else:
        vals = kv_cache.view(pages, block_kv, dim)
        vals[page, off] = k.to(torch.bfloat16)
    return kv_cache
