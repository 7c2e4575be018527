"""Index-key quantisation: the one definition shared by the kernels, their references,
and the embedded server's emulated indexer.

SGLang / DeepGEMM fp8 index-key format: one fp32 scale per token over the whole key
(block = head dim), e4m3 values, round to nearest even:

    amax  = max(max|k|, 1e-4)
    scale = amax / 448                     (ue8m0: scale = 2 ** ceil(log2(scale)))
    k8    = float8_e4m3fn(clamp(k / scale, -448, 448))
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0
AMAX_FLOOR = 1e-4
INDEX_DTYPES = ("fp8", "bf16", "fp32")


def fp8_scale(k: torch.Tensor, ue8m0: bool = False) -> torch.Tensor:
    """Per-token scale. k: [..., D] -> scale: [...] fp32."""
    amax = k.float().abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    # IEEE division on every device: torch on CUDA turns division by a Python scalar into
    # multiplication by its reciprocal (1 ulp off at times); a tensor divisor keeps amax / 448
    # exact-rounded on CPU and GPU alike, as the store kernel computes it (div_rn).
    scale = amax / torch.full_like(amax, FP8_MAX)
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    return scale


def quantize_fp8(k: torch.Tensor, ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """k: [..., D] float -> (k8: [..., D] float8_e4m3fn, scale: [...] fp32)."""
    scale = fp8_scale(k, ue8m0)
    k8 = (k.float() / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return k8, scale


def dequantize_fp8(k8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(k8: [..., D], scale: [...]) -> k: [..., D] fp32."""
    return k8.float() * scale.unsqueeze(-1)


def store_roundtrip(k: torch.Tensor, index_dtype: str) -> torch.Tensor:
    """The key as the indexer reads it back from its cache, in fp32.

    index_dtype: "fp8" (SGLang's format), "bf16" (this project's), or "fp32" (exact).
    """
    if index_dtype == "fp8":
        return dequantize_fp8(*quantize_fp8(k))
    if index_dtype == "bf16":
        return k.to(torch.bfloat16).float()
    if index_dtype == "fp32":
        return k.float()
    raise ValueError(f"unknown index dtype {index_dtype!r}; expected one of {INDEX_DTYPES}")
