"""Torch reference of DeepSeek-V3.2's production indexer key store, written from SGLang
0.5.23's fused path (`deepseek_v32/indexer_k.cuh`: FusedKIndexerNormRopeKernel and
FusedKIndexerNormRopeStoreKernel), in the kernel's order of fp32 operations.

Per token (head dim 128, rope dim 64; one warp of 32 lanes, lane l holds dims 4l..4l+3):
  1. LayerNorm: each lane sums its 4 values in order, the warp adds lanes pairwise
     (xor-shuffle masks 16, 8, 4, 2, 1); mean = sum / 128; the same for the squared
     deviations (c = x - mean); inv_std = 1 / sqrt(var / 128 + eps);
     x = ((c * inv_std) * weight) + bias (weight, bias fp32).
  2. RoPE on dims 0..63, interleaved pairs: (2p, 2p+1) rotated by cos_sin_cache[position, p]
     (cos) and cos_sin_cache[position, 32 + p] (sin), p < 32 (SGLang's cos_sin_cache is
     [max_pos, 64] = [cos x 32 | sin x 32]; the fused path runs only when is_neox_style is
     False): re' = re*cos - im*sin, im' = re*sin + im*cos. No Hadamard rotation.
  3. Round to bf16 (round to nearest even). The bf16 row is this.
     fp8: amax = max|bf16 row| (the .cuh rounds through bf16 first); scale = max(amax, 1e-4)
     / 448; inv = 1 / scale; e4m3(clamp(x * inv, +-448)) round to nearest even; the scale is
     stored as fp32 (no ue8m0).
Not reproduced bit for bit from SGLang's own build (stated, not measured): nvcc contracts
multiply-adds into FMAs and its rsqrt is rsqrtf (approximate); here every product and sum
is rounded separately and the norm uses IEEE sqrt and division (the Triton kernel is
compiled without FP fusion to match this reference), as niah's V4 store.

Cache (page of P tokens, slot = page * P + off, a negative slot is padding and is skipped):
  fp8:  uint8 [pages, 132 * P]: 128 e4m3 bytes at off*128, fp32 scale at 128*P + off*4
        (SGLang's index_k_with_scale_buffer, 8,448 bytes a page at P = 64)
  bf16: uint8 [pages, 256 * P]: the bf16 row at off*256 (niah's bf16 pool, 16,384 bytes a page)
"""

from __future__ import annotations

import torch

from niah.kernels import forms
from niah.kernels.v4_store.reference import _rn

HEAD_DIM, ROPE_DIM = 128, 64
FP8_MAX = 448.0
ROW_BYTES = {f: forms.get(f).key_bytes(HEAD_DIM) for f in ("fp8", "bf16")}  # the row layouts this store writes


def warp_sum(v: torch.Tensor) -> torch.Tensor:
    """[N, 128] fp32 -> [N]: the .cuh's order (4 values a lane in order, then the xor butterfly)."""
    v = v.view(v.shape[0], 32, 4)
    s = ((v[..., 0] + v[..., 1]) + v[..., 2]) + v[..., 3]
    half = 16
    while half >= 1:
        s = s[:, :half] + s[:, half : 2 * half]
        half //= 2
    return s[:, 0]


def norm_rope(key: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
              cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[N, 128] -> [N, 128] fp32: steps 1-2 above (before the bf16 rounding)."""
    n = key.shape[0]
    x = key.float()
    d = torch.full((n,), float(HEAD_DIM), dtype=torch.float32, device=x.device)
    mean = warp_sum(x) / d
    c = x - mean[:, None]
    var = warp_sum(c * c) / d
    inv_std = _rn(torch.reciprocal, _rn(torch.sqrt, var + torch.tensor(eps, dtype=torch.float32, device=x.device)))
    x = ((c * inv_std[:, None]) * weight.float()[None, :]) + bias.float()[None, :]
    cs = cos_sin_cache[positions.long()].float()  # [N, 64]
    cos, sin = cs[:, : ROPE_DIM // 2], cs[:, ROPE_DIM // 2 :]
    pairs = x[:, :ROPE_DIM].reshape(n, ROPE_DIM // 2, 2)
    re, im = pairs[..., 0], pairs[..., 1]
    rot = torch.stack((re * cos - im * sin, re * sin + im * cos), dim=-1).reshape(n, ROPE_DIM)
    return torch.cat((rot, x[:, ROPE_DIM:]), dim=1)


def quantize_v32_fp8(row_bf16: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 [N, 128] -> (e4m3 [N, 128], fp32 scale [N]): the .cuh's rule (multiply by 1/scale)."""
    x = row_bf16.float()
    amax = x.abs().amax(dim=1).clamp_min(1e-4)
    scale = (amax.double() / FP8_MAX).float()  # correctly rounded fp32 division (see _rn)
    inv = _rn(torch.reciprocal, scale)
    return (x * inv[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def ref_store_v32_index_keys(key_raw, kv_cache, loc, weight, bias, eps, cos_sin_cache, positions,
                             page_size=64, index_dtype="bf16"):
    """Same contract as store_v32_index_keys (writes kv_cache in place, returns it)."""
    slot = loc.long()
    idx = (slot >= 0).nonzero().flatten()
    if idx.numel() == 0:
        return kv_cache
    row = norm_rope(key_raw[idx], weight, bias, eps, cos_sin_cache, positions[idx]).to(torch.bfloat16)
    slot = slot[idx]
    page, off = slot // page_size, slot % page_size
    pages = kv_cache.shape[0]
    if index_dtype == "fp8":
        k8, scale = quantize_v32_fp8(row)
        kv_cache[:, : HEAD_DIM * page_size].view(pages, page_size, HEAD_DIM)[page, off] = k8.view(torch.uint8)
        scales = kv_cache[:, HEAD_DIM * page_size :].view(pages, page_size, 4)
        scales[page, off] = scale.contiguous().view(torch.uint8).view(-1, 4)
    else:
        kv_cache.view(pages, page_size, 2 * HEAD_DIM)[page, off] = row.view(torch.uint8)
    return kv_cache
