"""Torch reference of V4's indexer key store, written from SGLang 0.5.23's
`fused_norm_rope_indexer` (fused_norm_rope_v2.cuh), in the kernel's order of fp32 operations.

Per compressed token (head dim 128, rope dim 64, one warp of 32 lanes x 4 values):
  1. RMSNorm: each lane sums its 4 squares in order, the warp adds lanes pairwise
     (xor-shuffle masks 16, 8, 4, 2, 1); norm = 1 / sqrt(sum / 128 + eps);
     x = (x * norm) * weight (weight cast to the input dtype first, as SGLang does).
  2. RoPE on dims 64..127: pairs (64+2j, 65+2j) rotated by freqs_cis[position, 2j:2j+2]
     (interleaved cos, sin: torch.view_as_real of SGLang's complex table).
  3. Hadamard: butterflies (a+b, a-b) over index bits 0..6 in that order, times fp32(1/sqrt(128)).
  4. fp8: scale = max(amax, 1e-4) / 448, inv = 1 / scale, e4m3(clamp(x * inv, +-448)) round
     to nearest even; bf16: a bf16 row of the same x (the only difference is this cast).
Not reproduced bit for bit from SGLang's own build (stated, not measured): nvcc contracts
multiply-adds into FMAs and its rsqrt is rsqrtf (approximate); here every product and sum is
rounded separately and the norm uses IEEE sqrt and division (the Triton kernel is compiled
without FP fusion to match this reference).

Cache rows (page of P tokens; pages are kvcache rows, page_stride bytes apart, default
row bytes * P; token `off = out_loc % P` of page `out_loc // P`):
  fp8:  uint8 [pages, 132 * P]: 128 e4m3 bytes at off*128, fp32 scale at 128*P + off*4
  bf16: uint8 [pages, 256 * P] (a bf16 [pages, P*128] buffer viewed as bytes): row at off*256.
Plans: decode plan rows [B, 16] bytes (uint32 seq_len first; a token is written only when
seq_len % ratio == 0, at out_loc[i]); prefill plan rows [Nc, 16] bytes (uint32 seq_len,
0xFFFFFFFF = invalid; uint16 ragged_id at bytes 4..5; written at out_loc[ragged_id]).
Position = seq_len - ratio.
"""

from __future__ import annotations

import math

import torch

from niah.kernels import forms

HEAD_DIM, ROPE_DIM = 128, 64
HADAMARD_SCALE = float(torch.tensor(1 / math.sqrt(HEAD_DIM), dtype=torch.float32))
FP8_MAX = 448.0
ROW_BYTES = {f: forms.get(f).key_bytes(HEAD_DIM) for f in ("fp8", "bf16")}  # the row layouts this store writes


def _rn(op, x: torch.Tensor) -> torch.Tensor:
    """fp32 sqrt / reciprocal, correctly rounded on every device: computed in float64, then
    rounded once to fp32 (exact for these ops: 53 >= 2 * 24 + 2 bits). torch's CPU fp32 sqrt
    is not always correctly rounded; the kernel uses sqrt_rn / div_rn."""
    return op(x.double()).float()


def plan_targets(plan_bytes: torch.Tensor, out_loc: torch.Tensor, is_decode: bool, ratio: int):
    """(valid [N] bool, position [N] int64, slot [N] int64) from SGLang's plan rows."""
    words = plan_bytes.contiguous().view(torch.int32).reshape(plan_bytes.shape[0], 4)
    seq_len = words[:, 0].long() & 0xFFFFFFFF
    if is_decode:
        valid = seq_len % ratio == 0
        slot = out_loc.long()
    else:
        valid = seq_len != 0xFFFFFFFF
        ragged = (words[:, 1].long() & 0xFFFF).clamp_max(max(out_loc.numel() - 1, 0))
        slot = out_loc.long()[ragged] if out_loc.numel() else torch.zeros_like(seq_len)
    valid = valid & (slot >= 0)
    return valid, seq_len - ratio, slot


def norm_rope_hadamard(kv: torch.Tensor, weight: torch.Tensor, eps: float,
                       freqs: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """[N, 128] float -> [N, 128] fp32, steps 1-3 above. freqs: [max_pos, 64] fp32."""
    n = kv.shape[0]
    x = kv.float()
    w = weight.to(kv.dtype).float()
    sq = (x * x).view(n, 32, 4)
    s = ((sq[..., 0] + sq[..., 1]) + sq[..., 2]) + sq[..., 3]
    half = 16
    while half >= 1:
        s = s[:, :half] + s[:, half : 2 * half]
        half //= 2
    mean = s[:, 0] / torch.full_like(s[:, 0], float(HEAD_DIM))
    denom = _rn(torch.sqrt, mean + torch.tensor(eps, dtype=torch.float32, device=x.device))
    norm = _rn(torch.reciprocal, denom)
    x = (x * norm[:, None]) * w[None, :]
    f = freqs[position.clamp_min(0)].float().view(n, ROPE_DIM // 2, 2)
    pairs = x[:, HEAD_DIM - ROPE_DIM :].reshape(n, ROPE_DIM // 2, 2)
    re, im, fr, fi = pairs[..., 0], pairs[..., 1], f[..., 0], f[..., 1]
    rot = torch.stack((re * fr - im * fi, re * fi + im * fr), dim=-1).view(n, ROPE_DIM)
    x = torch.cat((x[:, : HEAD_DIM - ROPE_DIM], rot), dim=1)
    for bit in range(7):
        v = x.view(n, HEAD_DIM >> (bit + 1), 2, 1 << bit)
        a, b = v[:, :, 0], v[:, :, 1]
        x = torch.stack((a + b, a - b), dim=2).reshape(n, HEAD_DIM)
    return x * HADAMARD_SCALE


def quantize_v4_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, 128] fp32 -> (e4m3 [N, 128], fp32 scale [N]): V4's indexer rule (multiply by 1/scale)."""
    amax = x.abs().amax(dim=1).clamp_min(1e-4)
    scale = (amax.double() / FP8_MAX).float()  # correctly rounded fp32 division (see _rn)
    inv = _rn(torch.reciprocal, scale)
    return (x * inv[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def ref_store_v4_index_keys(kv, plan_bytes, is_decode, compress_ratio, norm_weight, eps,
                            freqs, out_loc, kvcache, key_dtype, page_size=64, page_stride=None):
    """Same contract as store_v4_index_keys (writes kvcache in place, returns it); the page
    stride is kvcache's row length (page_stride is accepted for the same call)."""
    valid, position, slot = plan_targets(plan_bytes, out_loc, is_decode, compress_ratio)
    idx = valid.nonzero().flatten()
    if idx.numel() == 0:
        return kvcache
    x = norm_rope_hadamard(kv[idx], norm_weight, eps, freqs, position[idx])
    slot = slot[idx]
    page, off = slot // page_size, slot % page_size
    pages = kvcache.shape[0]
    kvcache_rows = kvcache[:, : ROW_BYTES[key_dtype] * page_size]
    if key_dtype == "fp8":
        k8, scale = quantize_v4_fp8(x)
        vals = kvcache_rows[:, : 128 * page_size].view(pages, page_size, 128)
        vals[page, off] = k8.view(torch.uint8)
        scales = kvcache_rows[:, 128 * page_size :].view(pages, page_size, 4)
        scales[page, off] = scale.contiguous().view(torch.uint8).view(-1, 4)
    else:
        rows = kvcache_rows.view(pages, page_size, 256)
        rows[page, off] = x.to(torch.bfloat16).view(torch.uint8)
    return kvcache
