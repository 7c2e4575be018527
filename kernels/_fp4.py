"""Triton device functions shared by the fp4 logits kernels (imports triton: kernel modules only).

An MXFP4 row of D values is D/2 code bytes (element 2i in the low nibble of byte i, 2i+1 in
the high one) and D/32 ue8m0 exponent bytes; byte i belongs to group i // 16. `fp4_halves`
decodes rows in registers into their even and odd elements, each value e2m1 x 2^(e - 127)
built from its bits (the code through the fp8 conversion where the GPU has one, `e2m1_value`;
the exponent as fp32 bits): exact in fp32 and in bf16 (a one-bit mantissa, fp32's exponent range), so the
unpack path's only rounding is the dot product's fp32 accumulation.

The fp8 path's decodings (GPUs with fp8 MMA): `fp4_e4m3_packed` turns key codes into e4m3
numbers e2m1 x 2^-6 (the group exponent left to the caller, applied to a group's product),
four codes a 32-bit register by inline PTX on a GPU; `fp4_e4m3_halves` turns a query row into
e4m3 numbers e2m1 x 2^(shift - 6), shift = e - e_min (e_min its smallest group exponent), so the
row is those numbers times one power of two, 2^(e_min - 121): exact while the row's group
exponents lie within SHIFT_MAX binades of each other (the kernel checks, and unpacks where not).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e2m1_value(code, FP8_CVT: tl.constexpr):
    """e2m1 codes (0..15, uint8) -> fp32 values {0, .5, 1, 1.5, 2, 3, 4, 6} x sign, exact.

    FP8_CVT (GPUs with fp8 conversions, compute capability 8.9 and up; the interpreter): the
    code's bits s e1 e0 m placed as e4m3's sign (bit 7) and bits 4..2 make the e4m3 number of
    the same value x 2^-6, subnormals included (e = 0: m/2 x 2^-6 either way), so the
    hardware's fp8 conversion decodes it: two ands, two shifts and an or a value, then the
    conversion and the exact x 64. Otherwise the fp32 bits are built with integer operations."""
    if FP8_CVT:
        c = code.to(tl.uint8)
        bits = ((c & 7) << 2) | ((c & 8) << 4)
        return bits.to(tl.float8e4nv, bitcast=True).to(tl.float32) * 64.0
    else:
        c = code.to(tl.int32)
        e = (c >> 1) & 3
        m = c & 1
        # e > 0: (1 + m/2) 2^(e-1) -> exponent field e + 126, mantissa bit 22 = m; e == 0: m/2
        field = tl.where(e > 0, e + 126, tl.where(m == 1, 126, 0))
        mant = tl.where(e > 0, m << 22, 0)
        return (((c >> 3) << 31) | (field << 23) | mant).to(tl.float32, bitcast=True)


@triton.jit
def ue8m0_scale(exp):
    """ue8m0 exponent bytes -> fp32 2^(e - 127), from the bits (exact)."""
    return (exp.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def fp4_halves(codes, exps, OUT: tl.constexpr, FP8_CVT: tl.constexpr):
    """codes [R, D/2] uint8 and their exponents gathered per byte [R, D/2] -> (even, odd)
    elements [R, D/2] in OUT (tl.bfloat16 for the tensor cores, tl.float32 in the interpreter);
    FP8_CVT: e2m1_value's."""
    scale = ue8m0_scale(exps)
    even = (e2m1_value(codes & 0x0F, FP8_CVT) * scale).to(OUT)
    odd = (e2m1_value((codes >> 4) & 0x0F, FP8_CVT) * scale).to(OUT)
    return even, odd


@triton.jit
def fp4_halves_packed(codes, exps, OUT: tl.constexpr, ASM: tl.constexpr):
    """fp4_halves' values x 2^-6, from fewer instructions (GPUs with fp8 conversions; the
    interpreter): the codes placed as e4m3 numbers e2m1 x 2^-6 by `fp4_e4m3_packed` (four code
    bytes a register by inline PTX where ASM), converted and multiplied by the group factor
    2^(e - 127), with no x 64 a value: the caller folds 2^6 (a power of two: the same fp32
    roundings, so the same scores) into what multiplies the product (the head weights). Exact
    while e2m1 x 2^(e - 133) is a normal fp32 number (e >= 8; SGLang's floor, 1e-4, gives e >= 114)."""
    even8, odd8 = fp4_e4m3_packed(codes, ASM)
    scale = ue8m0_scale(exps)
    return (even8.to(tl.float32) * scale).to(OUT), (odd8.to(tl.float32) * scale).to(OUT)


F16_SPREAD = tl.constexpr(13)   # fp4_halves_f16 is exact for shifts -13..0: 0.5 x 2^-13 is f16's least normal
F16_EXP_MAX = tl.constexpr(190)  # the f16 product takes out factors up to 2^(190 - 127) = 2^63


@triton.jit
def fp4_halves_f16(codes, shift, OUT: tl.constexpr, ASM: tl.constexpr):
    """codes [R, C] uint8 and each byte's binade shift [R, C] (int32, -F16_SPREAD..0) -> (even,
    odd) values e2m1 x 2^shift as f16 (OUT tl.float16, for the f16 tensor cores) or their fp32
    values (OUT tl.float32, the interpreter), exact: the codes as e4m3 numbers e2m1 x 2^-6
    (`fp4_e4m3_packed`), converted to f16 (two a conversion on a GPU) and multiplied by the f16
    2^(shift + 6) (exponent field shift + 21): a power of two, the product a normal f16 number."""
    even8, odd8 = fp4_e4m3_packed(codes, ASM)
    scale = ((shift + 21) << 10).to(tl.uint16).to(tl.float16, bitcast=True)
    even, odd = even8.to(tl.float16) * scale, odd8.to(tl.float16) * scale
    if OUT == tl.float32:
        return even.to(tl.float32), odd.to(tl.float32)
    return even, odd


SHIFT_MAX = tl.constexpr(12)   # e4m3 holds e2m1 x 2^(shift - 6) exactly for shifts 0..12 (6 x 2^6 = 384 < 448)


@triton.jit
def e2m1_e4m3_bits(code, shift):
    """e2m1 codes (0..15) and binade shifts 0..SHIFT_MAX (int32, same shape) -> uint8 e4m3 bits
    of e2m1 x 2^(shift - 6), exact: the code's e m bits put at e4m3's bits 4..2 give e2m1 x 2^-6
    (_fp4.e2m1_value), the shift adds to that exponent field; the subnormal 0.5 (e = 0, m = 1)
    becomes a normal number once shifted (exponent field = shift, mantissa 0), and 0 stays 0."""
    c = code.to(tl.int32)
    c7 = c & 7
    t = (c7 << 2) + (shift << 3)
    t = tl.where(c7 == 0, 0, tl.where((c7 == 1) & (shift > 0), t - 4, t))
    return (t | ((c & 8) << 4)).to(tl.uint8)


@triton.jit
def fp4_e4m3_halves(codes, shifts, OUT: tl.constexpr):
    """codes [R, D/2] uint8 and each byte's group shift [R, D/2] (int32, 0..SHIFT_MAX) -> the
    (even, odd) elements [R, D/2] as e4m3 (OUT tl.float8e4nv, for the fp8 tensor cores) or
    their fp32 values (OUT tl.float32, the interpreter): e2m1 x 2^(shift - 6), exact."""
    even = e2m1_e4m3_bits(codes & 0x0F, shifts).to(tl.float8e4nv, bitcast=True)
    odd = e2m1_e4m3_bits((codes >> 4) & 0x0F, shifts).to(tl.float8e4nv, bitcast=True)
    if OUT == tl.float32:
        return even.to(tl.float32), odd.to(tl.float32)
    return even, odd


@triton.jit
def fp4_e4m3_packed(codes, ASM: tl.constexpr):
    """codes uint8 [...] -> (even, odd) tl.float8e4nv [...], e2m1 x 2^-6 each, exact (e2m1_value's
    bits: magnitude to bits 4..2, sign to bit 7). ASM (a GPU): four code bytes a 32-bit register,
    nine operations for the eight values (inline PTX); else the same bits by uint8 operations."""
    if ASM:
        even, odd = tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 t, u;
            shl.b32 t, $2, 2;
            shl.b32 u, $2, 4;
            and.b32 t, t, 0x1C1C1C1C;
            and.b32 u, u, 0x80808080;
            or.b32 $0, t, u;
            shr.b32 t, $2, 2;
            and.b32 t, t, 0x1C1C1C1C;
            and.b32 u, $2, 0x80808080;
            or.b32 $1, t, u;
            }""",
            constraints="=r,=r,r", args=[codes], dtype=(tl.uint8, tl.uint8), is_pure=True, pack=4)
    else:
        c = codes.to(tl.uint8)
        even = ((c & 7) << 2) | ((c & 8) << 4)
        odd = ((c >> 2) & 0x1C) | (c & 0x80)
    return even.to(tl.float8e4nv, bitcast=True), odd.to(tl.float8e4nv, bitcast=True)
