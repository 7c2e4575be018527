"""Triton kernel: paged index logits for decode over fp4 (MXFP4) key pages, read in place.

    logits[b*next_n + j, s] = sum_h w[b*next_n + j, h] * relu(q[b, j, h, :] . k[s, :])

k[s] is the dequantised MXFP4 key (e2m1 codes x 2^(e - 127) per group of 32), q the query:
bf16, or MXFP4 itself (SGLang's V4 fp4 path quantises its query as it does the keys).
The page is SGLang's fp4 index-K page (kernels/fp4_store): [BLOCK_KV x D/2 code bytes]
[BLOCK_KV x D/32 exponent bytes].

One program = one (next_n row j, split of pages, request b), as the fp8/bf16 kernel
(kernels/paged_logits). Two ways to multiply, chosen by the wrapper:
- unpack (SCALED False; Hopper, any GPU, the interpreter): codes and exponents are decoded
  in registers into the even and odd elements of each key (exact bf16 values) and scored as
  two K = D/2 products, q_even . k_even + q_odd . k_odd, on the bf16 tensor cores (fp32 in
  the interpreter). Bytes read: D/2 + D/32 a token, the fp4 page itself. PACKED (GPUs with fp8
  conversions): the codes become e4m3 numbers four a register (_fp4.fp4_halves_packed) and the
  values carry 2^-6 (an fp4 query's too), folded back into the head weights (w x 2^6 a factor:
  x 64 for a bf16 query, x 4096 for an fp4 one; a power of two: the same fp32 roundings, the
  same logits bit for bit). The page is read as
  [D/2, BLOCK_KV] and transposed back for the products (the layout the compiler then gives the
  decoded keys reaches shared memory by wide stores). F16 (PACKED with an fp4 query): the
  products on the f16 tensor cores with no fp32 round trip of the conversion. Each value is
  e2m1 x 2^shift, exact in f16 for shifts -F16_SPREAD..0 (_fp4.fp4_halves_f16), once a power of
  two is taken out: the query's per head (its largest group exponent qmax, 2^(qmax - 127) into
  the head's weight) and the keys' per program (eref, the largest group exponent of the keys
  its pages score, 2^(eref - 127) onto its logits). Both are positive, so they pass the ReLU,
  and powers of two, so the fp32 sums round as the packed path's do (the same logits bit for
  bit under the interpreter, tested). A program whose query heads or keys spread past
  F16_SPREAD binades below their largest (one read of its pages' exponent bytes first), or
  whose largest exponents pass F16_EXP_MAX (2^63: the factors taken out must not overflow
  where the products they multiply would not), runs the packed path instead: no value is
  approximated.
- scaled (SCALED True, fp4 query only; GPUs with fp4 MMA, SM100 / SM120): `tl.dot_scaled`
  on the packed codes with their ue8m0 exponents (e2m1 x e2m1, fp32 accumulate).
- fp8 (FP8_MMA True, fp4 query, D = 128; GPUs with fp8 MMA, SM89 / SM90): the key codes
  become e4m3 numbers e2m1 x 2^-6 (_fp4.fp4_e4m3_packed: four codes a register by inline PTX)
  and each group of 32 is one K = 32 product on the fp8 tensor cores, scaled by the key's
  group factor 2^(e - 127) and summed in fp32; the query's rows are e4m3 numbers with one power
  of two a head (_fp4.fp4_e4m3_halves), folded into its weight (positive: it passes the ReLU).
  Every group product is exact in fp32 (32 products of <= 4-bit significands within ~7
  binades), so only the fp32 sums round, as in the unpack path. A program whose query has a
  head with group exponents spread past SHIFT_MAX binades takes the unpack path instead.
  Bytes read as unpack.
"""

from __future__ import annotations

import triton
import triton.language as tl

from niah.kernels._fp4 import (F16_EXP_MAX, F16_SPREAD, SHIFT_MAX, fp4_e4m3_halves, fp4_e4m3_packed, fp4_halves,
                               fp4_halves_f16, fp4_halves_packed, ue8m0_scale)


@triton.jit
def _q_halves(q_ptr, qe_ptr, qrow, h_ok, offs_b, D: tl.constexpr, Q_FP4: tl.constexpr, OUT: tl.constexpr,
              FP8_CVT: tl.constexpr, PACKED: tl.constexpr = False, ASM: tl.constexpr = False):
    """The query's even and odd elements [BLOCK_H, D/2] in OUT (exact values; PACKED with an fp4
    query: x 2^-6, fp4_halves_packed's)."""
    if Q_FP4:
        qc = tl.load(q_ptr + qrow[:, None] * (D // 2) + offs_b[None, :], mask=h_ok[:, None], other=0)
        qx = tl.load(qe_ptr + qrow[:, None] * (D // 32) + (offs_b // 16)[None, :], mask=h_ok[:, None], other=127)
        if PACKED:
            q_even, q_odd = fp4_halves_packed(qc, qx, OUT, ASM)
        else:
            q_even, q_odd = fp4_halves(qc, qx, OUT, FP8_CVT)
    else:
        q_even = tl.load(q_ptr + qrow[:, None] * D + 2 * offs_b[None, :], mask=h_ok[:, None], other=0.0).to(OUT)
        q_odd = tl.load(q_ptr + qrow[:, None] * D + 2 * offs_b[None, :] + 1, mask=h_ok[:, None], other=0.0).to(OUT)
    return q_even, q_odd


@triton.jit
def _q8_group(q_ptr, qe_ptr, qrow, h_ok, qmin, g: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr,
              OUT8: tl.constexpr):
    """The MXFP4 query's group g as e4m3 numbers [BLOCK_H, 32] in element order: e2m1 x
    2^(e - qmin - 6) (its head's power of two, 2^(qmin - 127 + 6), left out)."""
    o16 = tl.arange(0, 16)
    qc = tl.load(q_ptr + qrow[:, None] * (D // 2) + g * 16 + o16[None, :], mask=h_ok[:, None], other=0)
    e = tl.load(qe_ptr + qrow * (D // 32) + g, mask=h_ok, other=127).to(tl.int32)           # [BLOCK_H]
    even, odd = fp4_e4m3_halves(qc, tl.broadcast_to((e - qmin)[:, None], (BLOCK_H, 16)), OUT8)
    return tl.reshape(tl.join(even, odd), (BLOCK_H, 32))


@triton.jit
def _k8_group(base, q8g, exps, live, offs_t, offs_g, g: tl.constexpr, D: tl.constexpr, BLOCK_KV: tl.constexpr,
              UPCAST: tl.constexpr):
    """Group g of a page's keys against the query's: [BLOCK_KV, BLOCK_H] fp32, the product of
    the e4m3 codes (one K = 32 tensor-core product) times each key's group factor 2^(e - 127)
    (exps: the page's exponent bytes [BLOCK_KV, D/32] as int32, loaded once a page)."""
    o16 = tl.arange(0, 16)
    codes = tl.load(base + offs_t[:, None] * (D // 2) + g * 16 + o16[None, :], mask=live, other=0)  # [BLOCK_KV, 16]
    even, odd = fp4_e4m3_packed(codes, not UPCAST)
    k8 = tl.reshape(tl.join(even, odd), (BLOCK_KV, 32))
    if UPCAST:
        k8 = k8.to(tl.float32)
    scale = ue8m0_scale(tl.sum(tl.where(offs_g[None, :] == g, exps, 0), axis=1))   # column g
    return tl.dot(k8, tl.trans(q8g)) * scale[:, None]


@triton.jit
def _page_logits(q_even, q_odd, qc, qe, w, q8, w8, kv_ptr, bt_row, out_row, page0, i, start, seq_len,
                 max_context_len, page_stride, offs_t, offs_b, offs_g, eref,
                 D: tl.constexpr, BLOCK_KV: tl.constexpr, OUT: tl.constexpr, SCALED: tl.constexpr,
                 FP8_CVT: tl.constexpr, FAST8: tl.constexpr, UPCAST: tl.constexpr, PACKED: tl.constexpr,
                 F16: tl.constexpr):
    p_start = start + i * BLOCK_KV
    live = p_start < seq_len
    page = tl.load(bt_row + page0 + i, mask=live, other=0).to(tl.int64)
    base = kv_ptr + page * page_stride
    if SCALED:
        codes = tl.load(base + offs_t[:, None] * (D // 2) + offs_b[None, :], mask=live, other=0)  # [BLOCK_KV, D/2]
        exps = tl.load(base + BLOCK_KV * (D // 2) + offs_t[:, None] * (D // 32) + offs_g[None, :], mask=live,
                       other=127)  # [BLOCK_KV, D/32]
        s = tl.dot_scaled(codes, exps, "e2m1", tl.trans(qc), qe, "e2m1")  # [BLOCK_KV, BLOCK_H]
        logits = tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1)
    elif FAST8:   # the fp8 path (D = 128: four groups), the query's groups q8 = (q8_0, .., q8_3)
        exps = tl.load(base + BLOCK_KV * (D // 2) + offs_t[:, None] * (D // 32) + offs_g[None, :], mask=live,
                       other=127).to(tl.int32)   # [BLOCK_KV, D/32]: one load a page, not one a group
        s = _k8_group(base, q8[0], exps, live, offs_t, offs_g, 0, D, BLOCK_KV, UPCAST)
        s += _k8_group(base, q8[1], exps, live, offs_t, offs_g, 1, D, BLOCK_KV, UPCAST)
        s += _k8_group(base, q8[2], exps, live, offs_t, offs_g, 2, D, BLOCK_KV, UPCAST)
        s += _k8_group(base, q8[3], exps, live, offs_t, offs_g, 3, D, BLOCK_KV, UPCAST)
        logits = tl.sum(tl.maximum(s, 0.0) * w8[None, :], axis=1)
    else:
        # the page's codes as [D/2, BLOCK_KV] (and each byte's group exponent), decoded, then transposed
        # back for the product: the layout the compiler gives this hands the decoded keys to the tensor
        # cores by 16-byte stores (sm_90a: 25 shared-memory instructions a page, not 109; sass.py)
        codes = tl.load(base + offs_t[None, :] * (D // 2) + offs_b[:, None], mask=live, other=0)
        exps = tl.load(base + BLOCK_KV * (D // 2) + offs_t[None, :] * (D // 32) + (offs_b // 16)[:, None],
                       mask=live, other=127)
        if F16:   # the f16 product (kernel doc): the query's f16 form and weights, eref the split's largest exponent
            kf_even, kf_odd = fp4_halves_f16(codes, exps.to(tl.int32) - eref, q_even.dtype, not UPCAST)
            s = tl.dot(tl.trans(kf_even), tl.trans(q_even)) + tl.dot(tl.trans(kf_odd), tl.trans(q_odd))
            logits = tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1) * ue8m0_scale(eref)
        else:
            if PACKED:   # the keys x 2^-6; the weights carry the 2^6 (the kernel's doc)
                k_even, k_odd = fp4_halves_packed(codes, exps, OUT, not UPCAST)
            else:
                k_even, k_odd = fp4_halves(codes, exps, OUT, FP8_CVT)
            s = tl.dot(tl.trans(k_even), tl.trans(q_even)) + tl.dot(tl.trans(k_odd), tl.trans(q_odd))
            logits = tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1)
    pos = p_start + offs_t
    logits = tl.where(pos < seq_len, logits, float("-inf"))
    tl.store(out_row + pos, logits, mask=(pos < max_context_len) & live)


@triton.jit
def _split_logits(n, q_even, q_odd, qc, qe, w, q8, w8, kv_ptr, bt_row, out_row, page0, start, seq_len,
                  max_context_len, page_stride, offs_t, offs_b, offs_g, eref,
                  D: tl.constexpr, BLOCK_KV: tl.constexpr, OUT: tl.constexpr, SCALED: tl.constexpr,
                  FP8_CVT: tl.constexpr, FAST8: tl.constexpr, UPCAST: tl.constexpr, NP: tl.constexpr,
                  PACKED: tl.constexpr, F16: tl.constexpr = False):
    """The split's first n pages (a runtime bound; NP > 0: all NP, the interpreter's constant bound)."""
    if NP > 0:
        for i in range(0, NP):
            _page_logits(q_even, q_odd, qc, qe, w, q8, w8, kv_ptr, bt_row, out_row, page0, i, start,
                         seq_len, max_context_len, page_stride, offs_t, offs_b, offs_g, eref, D, BLOCK_KV, OUT,
                         SCALED, FP8_CVT, FAST8, UPCAST, PACKED, F16)
    else:
        for i in range(0, n):
            _page_logits(q_even, q_odd, qc, qe, w, q8, w8, kv_ptr, bt_row, out_row, page0, i, start,
                         seq_len, max_context_len, page_stride, offs_t, offs_b, offs_g, eref, D, BLOCK_KV, OUT,
                         SCALED, FP8_CVT, FAST8, UPCAST, PACKED, F16)


@triton.jit
def _packed_split(q_ptr, qe_ptr, qrow, h_ok, n, qc, qe, w, kv_ptr, bt_row, out_row, page0, start, seq_len,
                  max_context_len, page_stride, offs_t, offs_b, offs_g, D: tl.constexpr, BLOCK_KV: tl.constexpr,
                  OUT: tl.constexpr, Q_FP4: tl.constexpr, FP8_CVT: tl.constexpr, UPCAST: tl.constexpr,
                  NP: tl.constexpr, PACKED: tl.constexpr):
    """The unpack path's split on the bf16 tensor cores, packed or the first decoding (w: the head
    weights, x 2^6 a factor where PACKED)."""
    q_even, q_odd = _q_halves(q_ptr, qe_ptr, qrow, h_ok, offs_b, D, Q_FP4, OUT, FP8_CVT, PACKED, not UPCAST)
    _split_logits(n, q_even, q_odd, qc, qe, w, (w,), w, kv_ptr, bt_row, out_row, page0, start, seq_len,
                  max_context_len, page_stride, offs_t, offs_b, offs_g, 0, D, BLOCK_KV, OUT, False, FP8_CVT, False,
                  UPCAST, NP, PACKED)


@triton.jit
def fp4_paged_mqa_logits_kernel(
    q_ptr,  # Q_FP4: codes uint8 [B, NEXT_N, H, D/2] | bf16 [B, NEXT_N, H, D]; contiguous
    qe_ptr,  # Q_FP4: exponents uint8 [B, NEXT_N, H, D/32], contiguous; else unused
    kv_ptr,  # uint8 pages, page_stride bytes apart
    w_ptr,  # [B*NEXT_N, H] fp32, contiguous
    ctx_ptr,  # [B] or [B, NEXT_N] int32
    bt_ptr,  # [B, max_pages] int32
    out_ptr,  # [B*NEXT_N, max_context_len] fp32
    H,
    max_context_len,
    max_pages,
    stride_ctx,
    stride_bt,
    page_stride,
    PAGES_PER_SPLIT: tl.constexpr,
    NEXT_N: tl.constexpr,
    CTX_2D: tl.constexpr,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    Q_FP4: tl.constexpr,
    SCALED: tl.constexpr,
    CLEAN: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter: decode to fp32 and dot in fp32 (its bf16 dot is wrong)
    LIVE_LOOP: tl.constexpr,  # loop to the last live page (a runtime bound: not under the interpreter)
    FP8_CVT: tl.constexpr,  # decode through the fp8 conversion (_fp4.e2m1_value)
    FP8_MMA: tl.constexpr = False,  # the fp8 path (module doc; Q_FP4 only)
    PACKED: tl.constexpr = False,  # unpack: the codes decoded by fp4_halves_packed (FP8_CVT; module doc)
    F16: tl.constexpr = False,  # unpack with an fp4 query and PACKED: the f16 product (module doc)
):
    OUT: tl.constexpr = tl.float32 if UPCAST else tl.bfloat16
    OUT8: tl.constexpr = tl.float32 if UPCAST else tl.float8e4nv
    OUT16: tl.constexpr = tl.float32 if UPCAST else tl.float16
    # PACKED: the keys (and an fp4 query) decoded x 2^-6, the head weights x 2^6 a factor (64 or 4096)
    WF: tl.constexpr = (4096.0 if Q_FP4 else 64.0) if PACKED else 1.0
    j = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2)
    row = b * NEXT_N + j
    if CTX_2D:
        seq_len = tl.load(ctx_ptr + b * stride_ctx + j)
    else:
        seq_len = tl.load(ctx_ptr + b * stride_ctx) - NEXT_N + j + 1
    seq_len = tl.minimum(tl.maximum(seq_len, 0), max_context_len)
    seq_len = tl.minimum(seq_len, max_pages * BLOCK_KV)
    page0 = split * PAGES_PER_SPLIT
    start = page0 * BLOCK_KV
    offs_h = tl.arange(0, BLOCK_H)
    offs_b = tl.arange(0, D // 2)
    offs_g = tl.arange(0, D // 32)
    offs_t = tl.arange(0, BLOCK_KV)
    h_ok = offs_h < H
    out_row = out_ptr + row.to(tl.int64) * max_context_len
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    if start < seq_len:
        qrow = row.to(tl.int64) * H + offs_h  # [BLOCK_H] (b, j, h) row index
        qc = tl.zeros([BLOCK_H, D // 2], tl.uint8)
        qe = tl.zeros([BLOCK_H, D // 32], tl.uint8)
        q_even = tl.zeros([BLOCK_H, D // 2], OUT)
        q_odd = q_even
        w = tl.load(w_ptr + row.to(tl.int64) * H + offs_h, mask=h_ok, other=0.0)
        n = tl.minimum((seq_len - start + BLOCK_KV - 1) // BLOCK_KV, PAGES_PER_SPLIT)   # live pages
        NP: tl.constexpr = 0 if LIVE_LOOP else PAGES_PER_SPLIT
        if SCALED:
            qc = tl.load(q_ptr + qrow[:, None] * (D // 2) + offs_b[None, :], mask=h_ok[:, None], other=0)
            qe = tl.load(qe_ptr + qrow[:, None] * (D // 32) + offs_g[None, :], mask=h_ok[:, None], other=127)
            _split_logits(n, q_even, q_odd, qc, qe, w, (w,), w, kv_ptr, bt_row, out_row, page0, start,
                          seq_len, max_context_len, page_stride, offs_t, offs_b, offs_g, 0, D, BLOCK_KV, OUT, True,
                          FP8_CVT, False, UPCAST, NP, False)
        elif FP8_MMA:   # the query's groups as e4m3 (one power of two a head, folded into its weight)
            tl.static_assert(D == 128, "the fp8 path is written for four groups of 32")
            tl.static_assert(Q_FP4, "the fp8 path takes an MXFP4 query")
            qg = tl.load(qe_ptr + qrow[:, None] * (D // 32) + offs_g[None, :], mask=h_ok[:, None],
                         other=127).to(tl.int32)
            qmin = tl.min(qg, axis=1)
            if tl.max(tl.max(qg, axis=1) - qmin, axis=0) <= SHIFT_MAX:
                q8 = (_q8_group(q_ptr, qe_ptr, qrow, h_ok, qmin, 0, BLOCK_H, D, OUT8),
                      _q8_group(q_ptr, qe_ptr, qrow, h_ok, qmin, 1, BLOCK_H, D, OUT8),
                      _q8_group(q_ptr, qe_ptr, qrow, h_ok, qmin, 2, BLOCK_H, D, OUT8),
                      _q8_group(q_ptr, qe_ptr, qrow, h_ok, qmin, 3, BLOCK_H, D, OUT8))
                w8 = w * ue8m0_scale(qmin) * 4096.0   # x 2^6 for the query's e4m3 rows and 2^6 for the key's
                _split_logits(n, q_even, q_odd, qc, qe, w, q8, w8, kv_ptr, bt_row, out_row, page0,
                              start, seq_len, max_context_len, page_stride, offs_t, offs_b, offs_g, 0, D, BLOCK_KV,
                              OUT, False, FP8_CVT, True, UPCAST, NP, False)
            else:   # a query head past SHIFT_MAX: the program unpacks
                q_even, q_odd = _q_halves(q_ptr, qe_ptr, qrow, h_ok, offs_b, D, True, OUT, FP8_CVT, PACKED,
                                          not UPCAST)
                _split_logits(n, q_even, q_odd, qc, qe, w * WF, (w,), w, kv_ptr, bt_row, out_row, page0,
                              start, seq_len, max_context_len, page_stride, offs_t, offs_b, offs_g, 0, D, BLOCK_KV,
                              OUT, False, FP8_CVT, False, UPCAST, NP, PACKED)
        else:
            if F16:   # the query's heads and the split's pages each within F16_SPREAD binades of their largest
                # exponent (the kernel's doc; one [pages, keys x groups] read of the split's exponent bytes first)
                qg = tl.load(qe_ptr + qrow[:, None] * (D // 32) + offs_g[None, :], mask=h_ok[:, None],
                             other=127).to(tl.int32)
                qmax = tl.max(qg, axis=1)
                offs_p = tl.arange(0, PAGES_PER_SPLIT)
                offs_e = tl.arange(0, BLOCK_KV * (D // 32))
                live_p = start + offs_p * BLOCK_KV < seq_len
                pg = tl.load(bt_row + page0 + offs_p, mask=live_p, other=0).to(tl.int64)
                # the keys the split scores (a page's slots past the row's length may hold anything)
                key_ok = start + offs_p[:, None] * BLOCK_KV + (offs_e // (D // 32))[None, :] < seq_len
                ee = tl.load(kv_ptr + pg[:, None] * page_stride + BLOCK_KV * (D // 2) + offs_e[None, :],
                             mask=key_ok, other=0).to(tl.int32)                        # [pages, keys x groups]
                eref = tl.max(tl.max(tl.where(key_ok, ee, 0), axis=1), axis=0)
                emin = tl.min(tl.min(tl.where(key_ok, ee, 255), axis=1), axis=0)
                if ((tl.max(qmax - tl.min(qg, axis=1), axis=0) <= F16_SPREAD) & (eref - emin <= F16_SPREAD)
                        & (tl.max(qmax, axis=0) <= F16_EXP_MAX) & (eref <= F16_EXP_MAX)):
                    qc8 = tl.load(q_ptr + qrow[:, None] * (D // 2) + offs_b[None, :], mask=h_ok[:, None], other=0)
                    qx = tl.load(qe_ptr + qrow[:, None] * (D // 32) + (offs_b // 16)[None, :], mask=h_ok[:, None],
                                 other=127).to(tl.int32)
                    qf_even, qf_odd = fp4_halves_f16(qc8, qx - qmax[:, None], OUT16, not UPCAST)
                    _split_logits(n, qf_even, qf_odd, qc, qe, w * ue8m0_scale(qmax), (w,), w, kv_ptr, bt_row,
                                  out_row, page0, start, seq_len, max_context_len, page_stride, offs_t, offs_b,
                                  offs_g, eref, D, BLOCK_KV, OUT, False, FP8_CVT, False, UPCAST, NP, PACKED, True)
                else:
                    _packed_split(q_ptr, qe_ptr, qrow, h_ok, n, qc, qe, w * WF, kv_ptr, bt_row, out_row, page0,
                                  start, seq_len, max_context_len, page_stride, offs_t, offs_b, offs_g, D, BLOCK_KV,
                                  OUT, Q_FP4, FP8_CVT, UPCAST, NP, PACKED)
            else:
                _packed_split(q_ptr, qe_ptr, qrow, h_ok, n, qc, qe, w * WF, kv_ptr, bt_row, out_row, page0, start,
                              seq_len, max_context_len, page_stride, offs_t, offs_b, offs_g, D, BLOCK_KV, OUT, Q_FP4,
                              FP8_CVT, UPCAST, NP, PACKED)
    if CLEAN:
        for i in range(0, PAGES_PER_SPLIT):
            pos = start + i * BLOCK_KV + offs_t
            tl.store(out_row + pos, tl.full([BLOCK_KV], float("-inf"), tl.float32),
                     mask=(pos >= seq_len) & (pos < max_context_len))
