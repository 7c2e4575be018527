"""Torch reference for the fp4 ragged (prefill) index logits: exact arithmetic (fp64 on CPU,
fp32 on GPU) over the dequantised keys and query, through kernels/mqa_logits' reference."""

from __future__ import annotations

import torch

from niah.kernels.fp4_paged_logits.reference import fp4_query_values
from niah.kernels.mqa_logits.reference import ref_mqa_logits


def ref_fp4_mqa_logits(q, kv, weights, ks, ke) -> torch.Tensor:
    """q as fp4_mqa_logits takes it; kv = (codes [Skv, D/2], exponents) -> [S, Skv] fp32, -inf masked."""
    return ref_mqa_logits(fp4_query_values(q), fp4_query_values(kv), weights, ks, ke)
