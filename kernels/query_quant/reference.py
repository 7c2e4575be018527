"""Torch reference for quantize_query: niah.kernels.quant's quantisation, heads padded with zeros."""

from __future__ import annotations

import torch

from niah.kernels.quant import quantize_fp8


def ref_quantize_query(q: torch.Tensor, weight: float, dtype: str, pad_to: int | None = None):
    """Same contract as quantize_query."""
    N, Hkv, G, D = q.shape
    GP = pad_to or G
    w = torch.full((N, Hkv, G), weight, dtype=torch.float32, device=q.device)
    if dtype == "fp8":
        q8, scale = quantize_fp8(q)
        w = w * scale
    else:
        q8 = q.to(torch.bfloat16)
    out = torch.zeros((N, Hkv, GP, D), dtype=q8.dtype, device=q.device)
    out[:, :, :G] = q8
    w_out = torch.zeros((N, Hkv, GP), dtype=torch.float32, device=q.device)
    w_out[:, :, :G] = w
    return out, w_out
