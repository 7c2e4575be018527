"""fp4_paged_mqa_logits: DeepGEMM's paged-logits argument order over fp4 (MXFP4) key pages.

    fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                         max_context_len, clean_logits=False, mma="auto",
                         pages_per_split=None, num_warps=None, num_stages=None, packed=None, f16=None)
        -> [B*next_n, max_context_len] f32

q: bf16 [B, next_n, H, D], or MXFP4 as DeepGEMM's fp8_fp4_paged_mqa_logits takes it: a pair
(codes uint8/int8 [B, next_n, H, D/2], exponents int32 [B, next_n, H] (D = 128: group g in
bits 8g..8g+7, SGLang's packing) or uint8 [B, next_n, H, D/32]). kv_cache: uint8 fp4 pages,
[pages, block_kv, 1, D/2 + D/32] or [pages, block_kv * (D/2 + D/32)] (kernels/fp4_store;
68 bytes a token at D = 128), a page stride past the page allowed. weights [B*next_n, H] f32,
context_lens int32 [B] or [B, next_n], block_table int32 [B, max_pages]: as
niah.kernels.fp8_paged_mqa_logits (kernels/paged_logits), whose masking and clean_logits
rules these are. schedule_meta is accepted and not needed.

mma: "unpack" decodes the codes in registers and multiplies on the bf16 tensor cores (any
GPU; Hopper's path; the interpreter); "scaled" uses `tl.dot_scaled` (e2m1 x e2m1, an fp4
query only) and is allowed only on GPUs with fp4 MMA (compute capability 10.x / 12.x);
"auto" picks scaled there for an fp4 query, else unpack. The scaled path has not run on such
a GPU yet: on its first call on a device it is compared with the unpack path on one small
case and refused (ValueError) if they disagree. "fp8" (an fp4 query only; GPUs with fp8 MMA,
compute capability 8.9 and up, and the interpreter; head dim 128) multiplies exact e4m3 forms
of the codes on the fp8 tensor cores, a group of 32 a product (the kernel's doc); "auto" does
not pick it.

packed (the unpack path, GPUs with fp8 conversions and the interpreter; PACKED_DECODE by
default): the codes become e4m3 bytes four to a register by inline PTX and are converted and
scaled with no x 64 a value, the 2^6 folded into the head weights (`_fp4.fp4_halves_packed`):
the same logits bit for bit (tested), from fewer instructions (sm_90a: 439 against 826 in the
page loop, `benchmarks/kernels/sass.py`). packed=False: the first decoding.

f16 (with packed and an MXFP4 query; F16_PRODUCT by default): the products on the f16 tensor
cores, every value exact in f16 once a power of two is taken out (the query's per head, into
its weight; the keys' per program, onto its logits), where the exponents lie within
F16_SPREAD binades of the largest; a program past it runs as packed does (the kernel's doc).
It applies to the packed decoding only (packed=False scores in bf16 whatever f16 says).
No fp32 round trip of the conversion: sm_90a 310 instructions a page loop, packed's 439.
"""

from __future__ import annotations

import functools

import torch

from niah.kernels._common import calc_diff, check_device, has_fp8_conversion, next_pow2, zero_masked
from niah.kernels._launch import launcher_of
from niah.kernels.fp4_store.wrapper import fp4_page_layout

_KERNEL = ("niah.kernels.fp4_paged_logits.kernel", "fp4_paged_mqa_logits_kernel")
MMA = ("auto", "unpack", "scaled", "fp8")
PACKED_DECODE = True   # the unpack path decodes by fp4_halves_packed where the GPU converts fp8 (module doc)
F16_PRODUCT = True     # packed, with an fp4 query: the f16 product (module doc)


def has_fp4_mma(t: torch.Tensor) -> bool:
    """Whether the tensor's GPU has fp4 tensor-core MMA (SM100 / SM120 families)."""
    return t.is_cuda and torch.cuda.get_device_capability(t.device)[0] in (10, 12)


def split_fp4_query(q, shape_name: str, name: str):
    """(values, exponents uint8 [..., D/32] or None, D): a bf16 query or an MXFP4 pair, checked."""
    if isinstance(q, torch.Tensor):
        if q.dtype != torch.bfloat16:
            raise ValueError(f"{name}: q must be bf16 {shape_name} or an MXFP4 pair (codes, exponents), got {q.dtype}")
        return q.contiguous(), None, q.shape[-1]
    if not isinstance(q, (tuple, list)) or len(q) != 2:
        raise ValueError(f"{name}: q must be bf16 {shape_name} or an MXFP4 pair (codes, exponents)")
    codes, sf = q
    if codes.dtype not in (torch.uint8, torch.int8):
        raise ValueError(f"{name}: fp4 query codes must be uint8/int8, got {codes.dtype}")
    codes = codes.view(torch.uint8).contiguous()
    dim = codes.shape[-1] * 2
    if sf.dtype == torch.int32 and dim == 128 and sf.shape == codes.shape[:-1]:
        sf = sf.contiguous().view(torch.uint8).reshape(*sf.shape, 4)
    if sf.dtype != torch.uint8 or sf.shape != (*codes.shape[:-1], dim // 32):
        raise ValueError(f"{name}: fp4 query exponents must be uint8 [..., {dim // 32}] (or int32 [...] at D = 128), "
                         f"got {sf.dtype} {tuple(sf.shape)}")
    return codes, sf.contiguous(), dim


# the fewest registers a thread may be capped at (max_registers): below 64 ptxas refuses the f16 path's
# tensor-core product ("Insufficient registers", sm_90a, Triton 3.6, at 56); every path compiles at 64, spilling
MIN_REGISTERS = 64


def _pages_per_split(rows: int, n_pages: int, sms: int, override: int | None = None) -> int:
    """4 pages a program for few pages in all (B=1 x 131,072: the fastest of 4 / 8 / 16 in one eager
    run on one H100, launch-bound and noisy there: a second run put 16 first; unconfirmed), 16
    above (B=64 ragged <= 65,536: 0.139 ms against 0.149 at 8 and 0.174 at 4, the same H100; a
    program's fixed work, the query's decoding and the f16 path's exponent scan, spread over more
    pages)."""
    if override is not None:
        return max(1, int(override))
    return 4 if rows * n_pages < 8 * 2 * sms else 16


def fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                         clean_logits=False, mma="auto", pages_per_split=None, num_warps=None, num_stages=None,
                         packed=None, f16=None, max_registers=None):
    """See the module doc. pages_per_split / num_warps / num_stages / max_registers: the launch
    (benchmarks' sweeps; by default 4 or 16 pages a program, 4 warps, 2 stages, the registers
    ptxas picks; max_registers, an int in [MIN_REGISTERS, 255], caps them (ptxas's maxnreg,
    spilling what does not fit; the interpreter has no registers and ignores it); packed: the
    unpack path's decoding (PACKED_DECODE by default); f16: its f16 product for an fp4 query
    (F16_PRODUCT by default, with packed only). The same logits every way."""
    name = "fp4_paged_mqa_logits"
    if max_registers is not None and (isinstance(max_registers, bool) or not isinstance(max_registers, int)
                                      or not MIN_REGISTERS <= max_registers <= 255):
        raise ValueError(f"{name}: max_registers must be an int in [{MIN_REGISTERS}, 255] or None, "
                         f"got {max_registers!r}")
    values, exps, dim = split_fp4_query(q, "[B, next_n, H, D]", name)
    if values.dim() != 4:
        raise ValueError(f"{name}: q must be [B, next_n, H, D], got {tuple(values.shape)}")
    batch, next_n, heads, _ = values.shape
    if dim < 32 or dim & (dim - 1):
        raise ValueError(f"{name}: head dim must be a power of two >= 32, got {dim}")
    block_kv = fp4_page_layout(kv_cache, dim, None, name)
    if weights.shape != (batch * next_n, heads) or weights.dtype != torch.float32:
        raise ValueError(f"{name}: weights must be float32 [{batch * next_n}, {heads}], "
                         f"got {weights.dtype} {tuple(weights.shape)}")
    if context_lens.dtype != torch.int32 or context_lens.shape not in ((batch,), (batch, next_n), (batch, 1)):
        raise ValueError(f"{name}: context_lens must be int32 [B] or [B, next_n], "
                         f"got {context_lens.dtype} {tuple(context_lens.shape)}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"{name}: block_table must be int32 [{batch}, max_pages], "
                         f"got {block_table.dtype} {tuple(block_table.shape)}")
    if mma not in MMA:
        raise ValueError(f"{name}: mma must be one of {', '.join(MMA)}, got {mma!r}")
    check_device(values, exps, kv_cache, weights, context_lens, block_table)
    scaled = exps is not None and (mma == "scaled" or (mma == "auto" and has_fp4_mma(values)))
    if scaled and not has_fp4_mma(values):
        raise ValueError(f"{name}: mma='scaled' needs a GPU with fp4 MMA (compute capability 10.x / 12.x)")
    if scaled and mma == "auto":
        _check_scaled(values.device)
    if mma == "fp8" and (exps is None or dim != 128):
        raise ValueError(f"{name}: mma='fp8' needs an MXFP4 query (codes, exponents) of head dim 128")
    if mma == "fp8" and not has_fp8_mma(values):
        raise ValueError(f"{name}: mma='fp8' needs a GPU with fp8 MMA (compute capability 8.9 and up)")
    return _launch(values, exps, kv_cache, weights, context_lens, block_table, max_context_len, clean_logits,
                   block_kv, scaled, fp8=mma == "fp8", tuning=(pages_per_split, num_warps, num_stages, max_registers),
                   packed=PACKED_DECODE if packed is None else bool(packed),
                   f16=F16_PRODUCT if f16 is None else bool(f16))


def has_fp8_mma(t: torch.Tensor) -> bool:
    """Whether the tensor's GPU multiplies e4m3 on its tensor cores: the GPUs that convert fp8
    in hardware (compute capability 8.9 and up, `has_fp8_conversion`); True on the CPU, where
    the kernels run interpreted."""
    return has_fp8_conversion(t.device)


def _launch(values, exps, kv_cache, weights, context_lens, block_table, max_context_len, clean_logits, block_kv,
            scaled, fp8=False, tuning=(None, None, None, None), packed=False, f16=False):
    batch, next_n, heads = values.shape[:3]
    dim = values.shape[-1] * (2 if exps is not None else 1)
    out = torch.empty((batch * next_n, max_context_len), dtype=torch.float32, device=values.device)
    if batch == 0 or max_context_len == 0:
        return out
    interp = not values.is_cuda
    ctx = context_lens
    ctx_2d = ctx.dim() == 2 and ctx.shape[1] == next_n and next_n > 1
    if ctx.dim() == 2 and not ctx_2d:
        ctx = ctx[:, 0]
    ctx = ctx.contiguous()
    block_table = block_table.contiguous()
    n_pages = (max_context_len + block_kv - 1) // block_kv
    sms = torch.cuda.get_device_properties(values.device).multi_processor_count if values.is_cuda else 4
    pps = _pages_per_split(batch * next_n, n_pages, sms, tuning[0])
    grid = (next_n, (n_pages + pps - 1) // pps, batch)
    launcher_of(*_KERNEL)(grid,
        values, values if exps is None else exps, kv_cache, weights.contiguous(), ctx, block_table, out,
        heads, max_context_len, block_table.shape[1], ctx.stride(0), block_table.stride(0), kv_cache.stride(0),
        PAGES_PER_SPLIT=pps, NEXT_N=next_n, CTX_2D=ctx_2d, D=dim, BLOCK_H=max(16, next_pow2(heads)),
        BLOCK_KV=block_kv, Q_FP4=exps is not None, SCALED=bool(scaled), CLEAN=bool(clean_logits),
        UPCAST=interp, LIVE_LOOP=not interp,
        FP8_CVT=has_fp8_conversion(values.device), FP8_MMA=bool(fp8),
        PACKED=bool(packed) and has_fp8_conversion(values.device),
        F16=(bool(f16 and packed) and exps is not None and not scaled and not fp8
             and has_fp8_conversion(values.device) and not pps & (pps - 1)),
        num_warps=tuning[1] or 4,
        num_stages=tuning[2] or (1 if interp else 2),
        **({} if interp or tuning[3] is None else {"maxnreg": tuning[3]}),
    )
    return out


@functools.cache
def _check_scaled(device: torch.device) -> None:
    """The scaled path against the unpack path on one small case, once a device (module doc)."""
    from niah.kernels.fp4_store.wrapper import store_fp4_index_keys  # noqa: PLC0415 (first scaled call only)
    from niah.kernels.quant import quantize_fp4  # noqa: PLC0415

    g = torch.Generator(device="cpu").manual_seed(0)
    cache = torch.zeros(4, 64 * 68, dtype=torch.uint8, device=device)
    store_fp4_index_keys(torch.randn(256, 128, generator=g).to(device), cache, torch.arange(256, device=device))
    codes, exps = quantize_fp4(torch.randn(2, 1, 64, 128, generator=g).to(device))
    w = torch.rand(2, 64, generator=g).to(device)
    ctx = torch.tensor([256, 200], dtype=torch.int32, device=device)
    table = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]], dtype=torch.int32, device=device)
    args = (codes, exps, cache, w, ctx, table, 256, True, 64)
    a, b = _launch(*args, scaled=True), _launch(*args, scaled=False)
    diff = calc_diff(zero_masked(a), zero_masked(b))
    if not diff < 1e-6:
        raise ValueError(f"fp4_paged_mqa_logits: tl.dot_scaled disagrees with the unpack path on {device} "
                         f"(calc_diff {diff:.2e}); pass mma='unpack'")
