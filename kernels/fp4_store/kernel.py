"""Triton kernel: quantise index keys to MXFP4 and write them into their pages, one launch.

fp4 page (SGLang 0.5.23's DeepSeek-V4 fp4 index-K pool, D = 128): [BLOCK_KV x D/2 code bytes,
token-major][BLOCK_KV x D/32 ue8m0 exponent bytes]; token `off` of page `p` has its codes at
byte p*BLOCK_KV*(D/2 + D/32) + off*D/2 and its exponents at p*BLOCK_KV*(D/2 + D/32) +
BLOCK_KV*D/2 + off*D/32 (group g at + g). slot = page * BLOCK_KV + off; a negative slot is
padding and is skipped.

The arithmetic is SGLang's `quantize_fp4_indexer_row` (niah.kernels.quant states it), written
with the same operations (`amax / 6.0`, the exponent from the bits, `k / scale`) so that on a
GPU it compiles to SGLang's instructions; every value the interpreter handles is an exact
integer or power-of-two operation past the one division amax / 6 (IEEE there).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e2m1_code(x, RNE: tl.constexpr):
    """fp32 x (divided by its scale) -> e2m1 code uint8 (sign in bit 3): SGLang's two rules."""
    ax = tl.minimum(tl.abs(x), 6.0)
    if RNE:
        idx = (ax >= 0.25).to(tl.uint8) + (ax >= 0.75).to(tl.uint8) + (ax >= 1.25).to(tl.uint8)
        idx += (ax >= 1.75).to(tl.uint8) + (ax >= 2.5).to(tl.uint8) + (ax >= 3.5).to(tl.uint8)
        idx += (ax >= 5.0).to(tl.uint8)
        tie = (ax == 0.25) | (ax == 0.75) | (ax == 1.25) | (ax == 1.75) | (ax == 2.5) | (ax == 3.5) | (ax == 5.0)
        idx = tl.where(tie & ((idx & 1) == 1), idx - 1, idx)
    else:
        idx = (ax > 0.25).to(tl.uint8) + (ax > 0.75).to(tl.uint8) + (ax > 1.25).to(tl.uint8)
        idx += (ax > 1.75).to(tl.uint8) + (ax > 2.5).to(tl.uint8) + (ax > 3.5).to(tl.uint8)
        idx += (ax > 5.0).to(tl.uint8)
    sign = ((x < 0) & (idx != 0)).to(tl.uint8)
    return idx | (sign << 3)


@triton.jit
def store_fp4_index_keys_kernel(
    k_ptr,  # [N, D] float
    slot_ptr,  # [N] int32 | int64
    cache_ptr,  # uint8, flat: pages of BLOCK_KV * (D/2 + D/32) bytes (page_stride apart)
    N,
    stride_k,
    page_stride,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    RNE: tl.constexpr,
):
    G: tl.constexpr = D // 32
    pid = tl.program_id(0)
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = offs_t < N
    slot = tl.load(slot_ptr + offs_t, mask=t_ok, other=-1).to(tl.int64)
    ok = t_ok & (slot >= 0)
    page = slot // BLOCK_KV
    off = slot % BLOCK_KV
    offs_g = tl.arange(0, G)
    offs_e = tl.arange(0, 32)
    # [BLOCK_T, G, 32]: group g of token t
    col = offs_g[None, :, None] * 32 + offs_e[None, None, :]
    k = tl.load(k_ptr + offs_t.to(tl.int64)[:, None, None] * stride_k + col, mask=ok[:, None, None], other=0.0)
    k = k.to(tl.float32)
    amax = tl.max(tl.abs(k), axis=2)  # [BLOCK_T, G]
    bits = tl.maximum(amax / 6.0, 1.0e-4).to(tl.int32, bitcast=True)
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    exp = tl.minimum(tl.maximum(exp, 1), 254)
    scale = (exp << 23).to(tl.float32, bitcast=True)
    x = tl.reshape(k / scale[:, :, None], (BLOCK_T, D // 2, 2))
    even, odd = tl.split(x)  # [BLOCK_T, D/2]: elements 2i and 2i + 1
    packed = (e2m1_code(even, RNE) & 0x0F) | ((e2m1_code(odd, RNE) & 0x0F) << 4)
    base = page * page_stride
    offs_b = tl.arange(0, D // 2)
    tl.store(cache_ptr + base[:, None] + off[:, None] * (D // 2) + offs_b[None, :], packed, mask=ok[:, None])
    tl.store(cache_ptr + base[:, None] + BLOCK_KV * (D // 2) + off[:, None] * G + offs_g[None, :],
             exp.to(tl.uint8), mask=ok[:, None])
