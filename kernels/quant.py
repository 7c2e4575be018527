"""Index-key quantisation: the one definition shared by the kernels, their references,
and the embedded server's emulated indexer.

SGLang / DeepGEMM fp8 index-key format: one fp32 scale per token over the whole key
(block = head dim), e4m3 values, round to nearest even:

    amax  = max(max|k|, 1e-4)
    scale = amax / 448                     (ue8m0: scale = 2 ** ceil(log2(scale)))
    k8    = float8_e4m3fn(clamp(k / scale, -448, 448))

SGLang 0.5.23 MXFP4 index-key format (DeepSeek-V4, `--enable-deepseek-v4-fp4-indexer`;
its `quantize_fp4_indexer_tensor`): groups of 32 values along the key, one ue8m0 exponent
byte each, e2m1 codes, two codes a byte (even element in the low nibble):

    amax  = max|k_group|
    sf    = max(amax / 6, 1e-4)                      (fp32)
    e     = biased exponent of sf, + 1 if sf's mantissa is non-zero, clamped to 1..254
    scale = 2 ** (e - 127)                           (ue8m0 byte e)
    code  = e2m1(min(|k / scale|, 6)): the count of the boundaries .25 .75 1.25 1.75 2.5 3.5 5
            that |k / scale| exceeds, i.e. the lower code on a tie (SGLang's C4 pools; its
            `rne=True` variant, used by its V4.1 low-ratio pools and queries, rounds a tie to
            the even code); the sign in bit 3, never on code 0
    k     = E2M1[code & 7] * (-1 if code & 8) * scale,  E2M1 = 0 .5 1 1.5 2 3 4 6

A 128-dim key is 64 code bytes and 4 exponent bytes: 68 bytes a token (fp8: 132). SGLang hands
them over as int8 [N, 64] codes and int32 [N] exponents, group g's byte at bits 8g..8g+7
(`fp4_sglang_layout`).
"""

from __future__ import annotations

import torch

from niah.kernels import forms

FP8_MAX = 448.0
AMAX_FLOOR = 1e-4
FP4_GROUP = 32
E2M1_MAX = 6.0
FP4_SF_FLOOR = 1e-4
E2M1_BOUNDARIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


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


def fp4_exponents(k: torch.Tensor) -> torch.Tensor:
    """k: [..., D] (D a multiple of 32) -> ue8m0 exponent bytes: [..., D // 32] uint8."""
    groups = _fp4_groups(k)
    amax = groups.abs().amax(dim=-1)
    # IEEE division on every device (a tensor divisor, as in fp8_scale)
    sf = torch.maximum(amax / torch.full_like(amax, E2M1_MAX), torch.full_like(amax, FP4_SF_FLOOR))
    bits = sf.view(torch.int32)
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return exp.clamp(1, 254).to(torch.uint8)


def fp4_scales(exponents: torch.Tensor) -> torch.Tensor:
    """ue8m0 exponent bytes -> the fp32 scales 2 ** (e - 127) (exact: built from the bits)."""
    return (exponents.to(torch.int32) << 23).view(torch.float32)


def e2m1_codes(x: torch.Tensor, rne: bool = False) -> torch.Tensor:
    """x (already divided by its group's scale) -> e2m1 codes, uint8 0..15 (sign in bit 3).

    rne=False: the lower code on a tie (SGLang's `_fp4_e2m1_code`); rne=True: the even one."""
    ax = x.float().abs().clamp_max(E2M1_MAX)
    idx = torch.zeros(ax.shape, dtype=torch.int32, device=ax.device)
    for b in E2M1_BOUNDARIES:
        idx += (ax >= b if rne else ax > b).to(torch.int32)
    if rne:
        tie = torch.zeros_like(ax, dtype=torch.bool)
        for b in E2M1_BOUNDARIES:
            tie |= ax == b
        idx = torch.where(tie & (idx % 2 == 1), idx - 1, idx)
    sign = ((x < 0) & (idx != 0)).to(torch.int32)
    return (idx | (sign << 3)).to(torch.uint8)


def quantize_fp4(k: torch.Tensor, rne: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """k: [..., D] float -> (codes: [..., D // 2] uint8, two a byte, even element low;
    exponents: [..., D // 32] uint8 ue8m0). rne: SGLang's tie rule (see the module docstring)."""
    exponents = fp4_exponents(k)
    groups = _fp4_groups(k) / fp4_scales(exponents).unsqueeze(-1)
    codes = e2m1_codes(groups.reshape(k.shape), rne)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), exponents


def dequantize_fp4(codes: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """(codes: [..., D // 2] uint8, exponents: [..., D // 32] uint8) -> k: [..., D] fp32."""
    codes = codes.view(torch.uint8) if codes.dtype == torch.int8 else codes
    nibbles = torch.stack([codes & 0x0F, codes >> 4], dim=-1).flatten(-2).long()
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    values = table[nibbles & 7] * torch.where(nibbles >= 8, -1.0, 1.0)
    scale = fp4_scales(exponents).repeat_interleave(FP4_GROUP, dim=-1)
    return values * scale


def fp4_sglang_layout(codes: torch.Tensor, exponents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """niah's (codes uint8 [N, D // 2], exponents uint8 [N, D // 32], D = 128) -> SGLang's
    `quantize_fp4_indexer_tensor` return: (int8 [N, 64], int32 [N], group g at bits 8g..)."""
    e = exponents.to(torch.int64)
    packed = sum(e[..., g] << (8 * g) for g in range(e.shape[-1]))
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return codes.view(torch.int8), packed


def _fp4_groups(k: torch.Tensor) -> torch.Tensor:
    if k.shape[-1] % FP4_GROUP:
        raise ValueError(f"fp4 keys need a head dim that is a multiple of {FP4_GROUP}, got {k.shape[-1]}")
    return k.float().reshape(*k.shape[:-1], k.shape[-1] // FP4_GROUP, FP4_GROUP)


def roundtrip_fp8(k: torch.Tensor) -> torch.Tensor:
    return dequantize_fp8(*quantize_fp8(k))


def roundtrip_fp4(k: torch.Tensor) -> torch.Tensor:
    return dequantize_fp4(*quantize_fp4(k))


def roundtrip_fp4_rne(k: torch.Tensor) -> torch.Tensor:
    """MXFP4 with ties to the even code (SGLang's fp4 index query)."""
    return dequantize_fp4(*quantize_fp4(k, rne=True))


def roundtrip_bf16(k: torch.Tensor) -> torch.Tensor:
    return k.to(torch.bfloat16).float()


def roundtrip_fp32(k: torch.Tensor) -> torch.Tensor:
    return k.float()


def store_roundtrip(k: torch.Tensor, index_dtype: str) -> torch.Tensor:
    """The key as the indexer reads it back from its cache, in fp32: the round trip of its
    form in the table (niah.kernels.forms: "fp8" SGLang's format, "fp4" SGLang's MXFP4 format
    with its C4 tie rule, "bf16" this project's, "fp32" exact; ValueError for another)."""
    return forms.store_roundtrip(k, index_dtype)
