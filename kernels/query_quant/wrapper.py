"""quantize_query(q, weight, dtype, pad_to=None) -> (q_out, w_out): an index query as the
logits kernels read it, one launch.

q: [N, Hkv, G, D] float (any strides, D contiguous or not: copied then), weight: the head
weight every head shares (a Python float, held as fp32). dtype "fp8": q_out e4m3 [N, Hkv, GP,
D] with one scale per (row, kv head, head), w_out fp32 [N, Hkv, GP] = weight * scale (the
scale is positive, so it commutes with the indexer's ReLU); "bf16": q_out bf16, w_out =
weight. GP = pad_to (>= G; default G): heads G..GP-1 are zero queries with zero weights
(a padded head adds an exact 0 to its row's sum). Bitwise the torch reference's
(reference.py: niah.kernels.quant.quantize_fp8, a multiply, zero padding): one launch where
the torch form takes ~14 (a decode step's CUDA graph and a prefill chunk's host time both
count launches).
"""

from __future__ import annotations

import torch

from niah.kernels._common import check_device, interpreting, next_pow2
from niah.kernels._launch import launcher_of

_KERNEL = ("niah.kernels.query_quant.kernel", "quantize_query_kernel")
DTYPES = ("fp8", "bf16")


def quantize_query(q: torch.Tensor, weight: float, dtype: str, pad_to: int | None = None):
    if dtype not in DTYPES:
        raise ValueError(f"quantize_query: dtype must be one of {DTYPES}, not {dtype!r}")
    if q.dim() != 4 or not q.dtype.is_floating_point or q.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError(f"quantize_query: q must be a bf16/fp16/fp32 [N, Hkv, G, D], got {q.dtype} {tuple(q.shape)}")
    N, Hkv, G, D = q.shape
    if D < 16 or D & (D - 1):
        raise ValueError(f"quantize_query: head dim must be a power of two >= 16, got {D}")
    GP = pad_to or G
    if GP < G:
        raise ValueError(f"quantize_query: pad_to ({GP}) must be >= the heads a kv head ({G})")
    check_device(q)
    if q.stride(3) != 1:
        q = q.contiguous()
    out = torch.empty((N, Hkv, GP, D), dtype=torch.float8_e4m3fn if dtype == "fp8" else torch.bfloat16,
                      device=q.device)
    w_out = torch.empty((N, Hkv, GP), dtype=torch.float32, device=q.device)
    if N * Hkv == 0:
        return out, w_out
    launcher_of(*_KERNEL)((N * Hkv,),
        q, out, w_out, float(weight), Hkv, q.stride(0), q.stride(1), q.stride(2),
        G=G, GP=GP, GB=max(2, next_pow2(GP)), D=D, IS_FP8=dtype == "fp8", INTERP=interpreting(), num_warps=1,
    )
    return out, w_out
