"""Torch reference for the fp4 key store: niah.kernels.quant's quantize_fp4, written by slot."""

from __future__ import annotations

import torch

from niah.kernels.quant import quantize_fp4


def fp4_row_bytes(dim: int) -> int:
    """Bytes a token: D/2 code bytes + D/32 exponent bytes (68 at D = 128)."""
    return dim // 2 + dim // 32


def ref_store_fp4_index_keys(k, kv_cache, slot_mapping, rne=False, block_kv=64):
    """Same contract as store_fp4_index_keys (in place on the 2-D uint8 view, returns kv_cache)."""
    dim = k.shape[1]
    pages = kv_cache.shape[0]
    flat = kv_cache.view(pages, -1)
    slot = slot_mapping.long()
    keep = slot >= 0
    slot, k = slot[keep], k[keep]
    page, off = slot // block_kv, slot % block_kv
    codes, exps = quantize_fp4(k, rne=rne)
    half, groups = dim // 2, dim // 32
    flat[:, : block_kv * half].view(pages, block_kv, half)[page, off] = codes
    flat[:, block_kv * half : block_kv * (half + groups)].view(pages, block_kv, groups)[page, off] = exps
    return kv_cache


def unpack_fp4_pages(kv_cache: torch.Tensor, dim: int, block_kv: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 pages -> (codes uint8 [pages, block_kv, D/2], exponents uint8 [pages, block_kv, D/32])."""
    pages = kv_cache.shape[0]
    flat = kv_cache.reshape(pages, -1)
    half, groups = dim // 2, dim // 32
    codes = flat[:, : block_kv * half].reshape(pages, block_kv, half)
    exps = flat[:, block_kv * half : block_kv * (half + groups)].reshape(pages, block_kv, groups)
    return codes, exps
