"""Wrappers with DeepGEMM's argument order for the ragged (prefill) index logits.

    fp8_mqa_logits(q [S,H,D] e4m3, (k8 [Skv,D] e4m3, sf [Skv] f32), weights [S,H] f32,
                   cu_seq_len_k_start [S] i32, cu_seq_len_k_end [S] i32,
                   clean_logits=True, max_seqlen_k=0) -> [S, Skv] f32
    bf16_mqa_logits(q [S,H,D] bf16, k [Skv,D] bf16, weights, ks, ke, clean_logits=True,
                    max_seqlen_k=0) -> [S, Skv] f32

Row i scores keys ks[i] <= n < ke[i]; every other position of a tile the kernel visits
reads -inf, and with clean_logits=True the whole row is written. max_seqlen_k > 0 is
DeepGEMM's compressed mode: [S, max_seqlen_k], column c = key ks[i] + c (clean_logits
must then be False). The only allocation is the logits (row stride rounded up to 256
floats, DeepGEMM's 1 KiB alignment).

niah's extension, `accumulate_into=out` (with clean_logits=True, max_seqlen_k=0): out, an
earlier call's logits of the same shape ([S, Skv], the same aligned row stride), gets these
logits added where they are written (out + logits, the fp32 sum `out.add_(logits)` gives,
without its passes over the rows), and is returned: a DSA indexer's kv heads summed as they
are scored.
"""

from __future__ import annotations

import functools

import torch

from niah.kernels._common import check_device, next_pow2
from niah.kernels._launch import DirectLauncher, PlanCache, direct_ok

_ALIGN = 256


def _check(name, q, k, sf, weights, ks, ke, clean_logits, max_seqlen_k, fp8, acc=None):
    if q.dim() != 3:
        raise ValueError(f"{name}: q must be [S, H, D], got {tuple(q.shape)}")
    seq, heads, dim = q.shape
    if dim < 16 or dim & (dim - 1):
        raise ValueError(f"{name}: head dim must be a power of two >= 16, got {dim}")
    want = torch.float8_e4m3fn if fp8 else torch.bfloat16
    if q.dtype != want:
        raise ValueError(f"{name}: q must be {want}, got {q.dtype}")
    if k.dim() != 2 or k.shape[1] != dim or k.dtype != want:
        raise ValueError(f"{name}: keys must be {want} [Skv, {dim}], got {k.dtype} {tuple(k.shape)}")
    if fp8 and (sf.dim() != 1 or sf.shape[0] != k.shape[0] or sf.dtype != torch.float32):
        raise ValueError(f"{name}: key scales must be float32 [{k.shape[0]}], got {sf.dtype} {tuple(sf.shape)}")
    if weights.shape != (seq, heads) or weights.dtype != torch.float32:
        raise ValueError(f"{name}: weights must be float32 [{seq}, {heads}], "
                         f"got {weights.dtype} {tuple(weights.shape)}")
    for label, t in (("cu_seq_len_k_start", ks), ("cu_seq_len_k_end", ke)):
        if t.shape != (seq,) or t.dtype != torch.int32:
            raise ValueError(f"{name}: {label} must be int32 [{seq}], got {t.dtype} {tuple(t.shape)}")
    if max_seqlen_k < 0:
        raise ValueError(f"{name}: max_seqlen_k must be >= 0, got {max_seqlen_k}")
    if max_seqlen_k > 0 and clean_logits:
        raise ValueError(f"{name}: clean_logits must be False when max_seqlen_k > 0 (compressed logits)")
    if acc is not None:
        stride = (k.shape[0] + _ALIGN - 1) // _ALIGN * _ALIGN
        if not clean_logits or max_seqlen_k > 0:
            raise ValueError(f"{name}: accumulate_into needs clean_logits=True and max_seqlen_k=0")
        if acc.dtype != torch.float32 or acc.shape != (seq, k.shape[0]) or acc.stride() != (stride, 1):
            raise ValueError(f"{name}: accumulate_into must be an earlier call's float32 [{seq}, {k.shape[0]}] "
                             f"logits (row stride {stride}), got {acc.dtype} {tuple(acc.shape)} strides {acc.stride()}")
        if acc.device != q.device:
            raise ValueError(f"{name}: accumulate_into must be on {q.device}, got {acc.device}")
    check_device(q, k, sf, weights, ks, ke)


@functools.cache
def _launcher() -> DirectLauncher:
    from niah.kernels.mqa_logits.kernel import mqa_logits_kernel  # noqa: PLC0415 (imports triton: loaded at first launch)

    return DirectLauncher(mqa_logits_kernel)


_PLANS = PlanCache()


def _plan_key(q, k, sf, weights, ks, ke, clean_logits, max_seqlen_k, fp8, acc=None):
    """Everything the checks, the grid and the scalar arguments depend on (not the pointers)."""
    return (fp8, bool(clean_logits), max_seqlen_k, None if acc is None else (acc.get_device(),),
            q.shape, q.stride(), q.dtype, q.get_device(),
            k.shape, k.stride(), k.dtype, k.get_device(),
            None if sf is None else (sf.shape, sf.stride(), sf.dtype, sf.get_device()),
            weights.shape, weights.stride(), weights.dtype, weights.get_device(),
            ks.shape, ks.stride(), ks.dtype, ks.get_device(),
            ke.shape, ke.stride(), ke.dtype, ke.get_device())


def _launch(name, q, k, sf, weights, ks, ke, clean_logits, max_seqlen_k, fp8, acc=None, **tuning):
    """A call whose shapes, strides, dtypes and devices were served before, with every
    pointer 16-byte aligned, goes straight to its bound compiled launch (checks passed then,
    and nothing they look at has changed); any other call takes the checked path."""
    max_seqlen_k = int(max_seqlen_k)
    key = None if tuning else _plan_key(q, k, sf, weights, ks, ke, clean_logits, max_seqlen_k, fp8, acc)
    plan = _PLANS.get(key) if key is not None else None
    if plan is not None and direct_ok():
        seq, skv = q.shape[0], k.shape[0]
        n_cols = max_seqlen_k if max_seqlen_k > 0 else skv
        stride = (n_cols + _ALIGN - 1) // _ALIGN * _ALIGN
        if acc is None:
            out = torch.empty_strided((seq, n_cols), (stride, 1), dtype=torch.float32, device=q.device)
        elif acc.dtype == torch.float32 and acc.shape == (seq, n_cols) and acc.stride() == (stride, 1):
            out = acc
        else:
            out = None                     # the checked path says what is wrong with it
        if out is not None:
            kp = k.data_ptr()
            ptrs = (q.data_ptr(), kp, kp if sf is None else sf.data_ptr(), weights.data_ptr(), ks.data_ptr(),
                    ke.data_ptr(), out.data_ptr())
            if not (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | ptrs[5] | ptrs[6]) & 15:
                plan(q.get_device(), *ptrs)
                return out
    return _checked_launch(name, q, k, sf, weights, ks, ke, clean_logits, max_seqlen_k, fp8, key, acc=acc, **tuning)


def _checked_launch(name, q, k, sf, weights, ks, ke, clean_logits, max_seqlen_k, fp8, key, acc=None,
                    block_n=None, block_q=None, num_warps=None, num_stages=None):
    _check(name, q, k, sf, weights, ks, ke, clean_logits, max_seqlen_k, fp8, acc)
    seq, heads, dim = q.shape
    skv = k.shape[0]
    n_cols = max_seqlen_k if max_seqlen_k > 0 else skv
    stride = (n_cols + _ALIGN - 1) // _ALIGN * _ALIGN
    out = acc if acc is not None else \
        torch.empty_strided((seq, n_cols), (stride, 1), dtype=torch.float32, device=q.device)
    if seq == 0 or n_cols == 0:
        return out
    launch = _launcher()
    interp = not launch.compiled_mode
    copied = q.stride(2) != 1 or k.stride(1) != 1 or weights.stride(1) != 1 or ks.stride(0) != 1 or ke.stride(0) != 1
    if q.stride(2) != 1:
        q = q.contiguous()
    if k.stride(1) != 1:
        k = k.contiguous()
    if weights.stride(1) != 1:
        weights = weights.contiguous()
    if ks.stride(0) != 1:
        ks = ks.contiguous()
    if ke.stride(0) != 1:
        ke = ke.contiguous()
    block_n = block_n or (64 if interp else 256)  # H200 sweep: 256 keys x 32 queries, 4 warps (docs/kernels.md)
    block_q = block_q or (4 if interp else 32)
    sq = q.stride()
    grid = ((n_cols + block_n - 1) // block_n, (seq + block_q - 1) // block_q)
    args = (q, k, sf if fp8 else k, weights, ks, ke, out,
            seq, skv, heads, n_cols,
            sq[0], sq[1], k.stride(0), weights.stride(0), stride)
    meta = dict(D=dim, BLOCK_H=max(16, next_pow2(heads)), BLOCK_N=block_n, BLOCK_Q=block_q,
                IS_FP8=fp8, CLEAN=bool(clean_logits), COMPRESSED=max_seqlen_k > 0, UPCAST=interp,
                ACCUM=acc is not None,
                num_warps=num_warps or 4, num_stages=num_stages or (1 if interp else 3))
    launch(grid, *args, **meta)
    if key is not None and not copied:  # the fast path's pointer order: q, k, sf (or k), w, ks, ke, out
        _PLANS.put(key, launch.bind(grid, args, meta))
    return out


def fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0,
                   accumulate_into=None, **tuning):
    """DeepGEMM's fp8_mqa_logits: kv = (k8 [Skv, D] e4m3, sf [Skv] f32)."""
    if not isinstance(kv, (tuple, list)) or len(kv) != 2:
        raise ValueError("fp8_mqa_logits: kv must be a pair (k8 [Skv, D] float8_e4m3fn, sf [Skv] float32)")
    k8, sf = kv
    if sf.dim() == 2 and sf.shape[1] == 1:
        sf = sf[:, 0]
    if sf.dim() == 1 and sf.stride(0) != 1:
        sf = sf.contiguous()
    return _launch("fp8_mqa_logits", q, k8, sf, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                   clean_logits, max_seqlen_k, True, acc=accumulate_into, **tuning)


def bf16_mqa_logits(q, k, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0,
                    accumulate_into=None, **tuning):
    """The bf16-key twin: k [Skv, D] bf16, q bf16."""
    return _launch("bf16_mqa_logits", q, k, None, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                   clean_logits, max_seqlen_k, False, acc=accumulate_into, **tuning)
