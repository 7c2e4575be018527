"""Wrappers with DeepGEMM's argument order: check shapes, allocate, launch.

    fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                         max_context_len, clean_logits=False) -> [B*next_n, max_context_len] f32
    bf16_paged_mqa_logits(...same...)     kv_cache bf16 [pages, 64, 1, D]

q [B, next_n, H, D] (e4m3 for fp8, bf16 for bf16), weights [B*next_n, H] f32,
context_lens int32 [B] (row j of next_n sees context_lens[b] - next_n + j + 1 tokens) or
[B, next_n] (row j sees context_lens[b, j]), block_table int32 [B, max_pages].
Positions at or past a row's visible length read -inf inside the pages the kernel visits;
with clean_logits=True every position of the output is written (-inf where masked), as in
DeepGEMM; with clean_logits=False whole pages past the length are left unwritten.
schedule_meta is accepted for signature compatibility and not needed: the grid depends on
shapes only (CUDA-graph safe, no host sync).
"""

from __future__ import annotations

import functools

import torch

from niah.kernels._common import check_device, next_pow2
from niah.kernels._launch import DirectLauncher, PlanCache, direct_ok

SPLIT_KV = 256  # DeepGEMM's schedule granularity (tokens)


_SMS: dict[int, int] = {}


def num_sms(t: torch.Tensor) -> int:
    """SMs of the tensor's GPU (cached a device); 4 on CPU (the interpreter)."""
    index = t.get_device()
    if index < 0:
        return 4
    sms = _SMS.get(index)
    if sms is None:
        sms = _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return sms


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int) -> torch.Tensor:
    """DeepGEMM-compatible schedule: int32 [num_sms + 1, 2] of (request, 256-token split) starts,
    balancing the splits of all requests over num_sms. Computed with torch ops (no host sync).
    Our kernels do not need it; SGLang computes and passes it, so the helper keeps that path."""
    if context_lens.dim() not in (1, 2):
        raise ValueError(f"context_lens must be [B] or [B, next_n], got {tuple(context_lens.shape)}")
    if context_lens.dtype != torch.int32:
        raise ValueError(f"context_lens must be int32, got {context_lens.dtype}")
    if block_kv <= 0 or SPLIT_KV % block_kv:
        raise ValueError(f"block_kv must divide {SPLIT_KV}, got {block_kv}")
    lens = context_lens[:, -1] if context_lens.dim() == 2 else context_lens
    segs = (lens.to(torch.int64).clamp_min(0) + SPLIT_KV - 1) // SPLIT_KV
    prefix = torch.cumsum(segs, 0)
    total = prefix[-1:] if prefix.numel() else torch.zeros(1, dtype=torch.int64, device=lens.device)
    sm = torch.arange(num_sms + 1, device=lens.device, dtype=torch.int64)
    q_per, rem = total // num_sms, total % num_sms
    seg_start = sm * q_per + torch.minimum(sm, rem)
    q_idx = torch.searchsorted(prefix, seg_start, right=True)
    before = torch.where(q_idx > 0, prefix[(q_idx - 1).clamp_min(0)] if prefix.numel() else seg_start * 0, 0)
    meta = torch.stack([q_idx, seg_start - before], dim=1)
    return meta.to(torch.int32)


def _pages_per_split(batch_rows: int, n_pages: int, sms: int, override: int | None, fp8: bool) -> int:
    """Pages per program. H200 sweeps (docs/kernels.md): bf16 8 (best at B=64 x 65,536,
    within 1% on ragged batches); fp8 16 (best at B=64 uniform and ragged, 1-3% over 8);
    small jobs get 4 so that the grid still covers the chip twice."""
    if override is not None:
        return max(1, int(override))
    if batch_rows * n_pages < 8 * 2 * sms:
        return 4
    return 16 if fp8 else 8


def _check(q, kv_cache, weights, context_lens, block_table, max_context_len, fp8: bool):
    """Shapes, dtypes, layouts, devices; cheap on the valid path (one stride() call a tensor)."""
    name = "fp8_paged_mqa_logits" if fp8 else "bf16_paged_mqa_logits"
    if q.dim() != 4:
        raise ValueError(f"{name}: q must be [B, next_n, H, D], got {tuple(q.shape)}")
    batch, next_n, heads, dim = q.shape
    if next_n < 1:
        raise ValueError(f"{name}: next_n must be >= 1, got {next_n}")
    if dim < 16 or dim & (dim - 1):
        raise ValueError(f"{name}: head dim must be a power of two >= 16, got {dim}")
    q_dtype, kv_dtype, per_token = (torch.float8_e4m3fn, torch.uint8, dim + 4) if fp8 else \
        (torch.bfloat16, torch.bfloat16, dim)
    if q.dtype != q_dtype:
        raise ValueError(f"{name}: q must be {str(q_dtype)[6:]}, got {q.dtype}")
    ks = kv_cache.shape
    if kv_cache.dtype != kv_dtype or len(ks) != 4 or ks[2] != 1 or ks[3] != per_token:
        raise ValueError(
            f"{name}: kv_cache must be {str(kv_dtype)[6:]} [pages, block_kv, 1, {per_token}], "
            f"got {kv_cache.dtype} {tuple(ks)}"
        )
    block_kv = ks[1]
    if block_kv < 16 or block_kv & (block_kv - 1):
        raise ValueError(f"{name}: block_kv (kv_cache.shape[1]) must be a power of two >= 16, got {block_kv}")
    kst = kv_cache.stride()
    if kst[3] != 1 or kst[1] != per_token or kst[0] < block_kv * per_token:
        raise ValueError(
            f"{name}: kv_cache pages must be dense inside ([block_kv, 1, {per_token}] contiguous; "
            f"a page stride >= {block_kv * per_token} elements is fine), got strides {kst}"
        )
    if fp8 and (kst[0] % 16 or kv_cache.storage_offset() % 16):
        raise ValueError(f"{name}: fp8 kv_cache pages must start on 16-byte boundaries (page stride "
                         f"{kst[0]} bytes, offset {kv_cache.storage_offset()})")
    if weights.shape != (batch * next_n, heads) or weights.dtype != torch.float32:
        raise ValueError(
            f"{name}: weights must be float32 [{batch * next_n}, {heads}], got {weights.dtype} {tuple(weights.shape)}"
        )
    if context_lens.dtype != torch.int32 or context_lens.shape not in ((batch,), (batch, next_n), (batch, 1)):
        raise ValueError(
            f"{name}: context_lens must be int32 [{batch}] or [{batch}, {next_n}], "
            f"got {context_lens.dtype} {tuple(context_lens.shape)}"
        )
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(
            f"{name}: block_table must be int32 [{batch}, max_pages], "
            f"got {block_table.dtype} {tuple(block_table.shape)}"
        )
    if max_context_len < 0:
        raise ValueError(f"{name}: max_context_len must be >= 0, got {max_context_len}")
    check_device(q, kv_cache, weights, context_lens, block_table)


@functools.cache
def _launcher() -> DirectLauncher:
    from niah.kernels.paged_logits.kernel import paged_mqa_logits_kernel  # noqa: PLC0415 (imports triton: loaded at first launch)

    return DirectLauncher(paged_mqa_logits_kernel)


_PLANS = PlanCache()


def _plan_key(q, kv_cache, weights, context_lens, block_table, max_context_len, clean_logits, fp8):
    """Everything the checks, the grid and the scalar arguments depend on (not the pointers)."""
    return (fp8, bool(clean_logits), max_context_len,
            q.shape, q.stride(), q.dtype, q.get_device(),
            kv_cache.shape, kv_cache.stride(), kv_cache.dtype, kv_cache.get_device(),
            weights.shape, weights.stride(), weights.dtype, weights.get_device(),
            context_lens.shape, context_lens.stride(), context_lens.dtype, context_lens.get_device(),
            block_table.shape, block_table.stride(), block_table.dtype, block_table.get_device())


def _launch(q, kv_cache, weights, context_lens, block_table, max_context_len, clean_logits, fp8, **tuning):
    """A call whose shapes, strides, dtypes and devices were served before, with every
    pointer 16-byte aligned, goes straight to its bound compiled launch (checks passed then,
    and nothing they look at has changed); any other call takes the checked path."""
    max_context_len = int(max_context_len)
    key = None if tuning else _plan_key(q, kv_cache, weights, context_lens, block_table, max_context_len,
                                        clean_logits, fp8)
    plan = _PLANS.get(key) if key is not None else None
    if plan is not None and direct_ok():
        out = torch.empty((key[3][0] * key[3][1], max_context_len), dtype=torch.float32, device=q.device)
        ptrs = (q.data_ptr(), kv_cache.data_ptr(), weights.data_ptr(), context_lens.data_ptr(),
                block_table.data_ptr(), out.data_ptr())
        if not (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4]) & 15:
            plan(key[6], ptrs[0], ptrs[1], ptrs[1], ptrs[2], ptrs[3], ptrs[4], ptrs[5])
            return out
    return _checked_launch(q, kv_cache, weights, context_lens, block_table, max_context_len, clean_logits, fp8,
                           key, **tuning)


def _checked_launch(q, kv_cache, weights, context_lens, block_table, max_context_len, clean_logits, fp8, key,
                    pages_per_split=None, num_warps=None, num_stages=None, live_loop=None):
    _check(q, kv_cache, weights, context_lens, block_table, max_context_len, fp8)
    batch, next_n, heads, dim = q.shape
    out = torch.empty((batch * next_n, max_context_len), dtype=torch.float32, device=q.device)
    if batch == 0 or max_context_len == 0:
        return out
    launch = _launcher()
    interp = not launch.compiled_mode
    copied = q.stride(3) != 1 or weights.stride(1) != 1 or block_table.stride(1) != 1
    if q.stride(3) != 1:
        q = q.contiguous()
    if weights.stride(1) != 1:
        weights = weights.contiguous()
    if block_table.stride(1) != 1:
        block_table = block_table.contiguous()
    # [B, 1] with next_n > 1 is SGLang's flattened form: one length per request
    ctx = context_lens
    ctx_2d = ctx.dim() == 2 and ctx.shape[1] == next_n and next_n > 1
    if ctx.dim() == 2 and not ctx_2d:
        ctx = ctx[:, 0]
    if ctx_2d and ctx.stride(1) != 1:
        ctx, copied = ctx.contiguous(), True
    block_kv = kv_cache.shape[1]
    n_pages = (max_context_len + block_kv - 1) // block_kv
    pps = _pages_per_split(batch * next_n, n_pages, num_sms(q), pages_per_split, fp8)
    # the pool read in place from its first page (pages may be padded: DeepGEMM takes a page
    # stride too); page p starts at element p * page_stride of kv (fp8: of the byte view)
    page_stride = kv_cache.stride(0)
    if fp8:
        kv, sf, sf_page_stride = kv_cache.view(torch.float8_e4m3fn), kv_cache.view(torch.float32), page_stride // 4
    else:
        kv, sf, sf_page_stride = kv_cache, kv_cache, 0  # sf unused
    sq = q.stride()
    grid = (next_n, (n_pages + pps - 1) // pps, batch)
    args = (q, kv, sf, weights, ctx, block_table, out,
            heads, max_context_len, block_table.shape[1],
            sq[0], sq[1], sq[2],
            weights.stride(0), ctx.stride(0), block_table.stride(0), out.stride(0),
            page_stride, sf_page_stride)
    meta = dict(PAGES_PER_SPLIT=pps, NEXT_N=next_n, CTX_2D=ctx_2d, D=dim, BLOCK_H=max(16, next_pow2(heads)),
                BLOCK_KV=block_kv, IS_FP8=fp8, CLEAN=bool(clean_logits), UPCAST=interp,
                LIVE_LOOP=(not interp) if live_loop is None else bool(live_loop),
                num_warps=num_warps or 4, num_stages=num_stages or (1 if interp else 3))
    launch(grid, *args, **meta)
    if key is not None and not copied:  # the fast path's pointer order: q, kv, kv (scales), w, ctx, table, out
        _PLANS.put(key, launch.bind(grid, args, meta))
    return out


def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                         clean_logits=False, **tuning):
    """DeepGEMM's fp8_paged_mqa_logits on the SGLang fp8 page (uint8 [pages, 64, 1, D+4])."""
    return _launch(q, kv_cache, weights, context_lens, block_table, max_context_len, clean_logits, True, **tuning)


def bf16_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                          clean_logits=False, **tuning):
    """The bf16-key twin: kv_cache bf16 [pages, 64, 1, D], q bf16."""
    return _launch(q, kv_cache, weights, context_lens, block_table, max_context_len, clean_logits, False, **tuning)
