"""fp4_mqa_logits: DeepGEMM's ragged (prefill) index-logits argument order over fp4 keys.

    fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True)
        -> [S, Skv] f32 (row stride rounded up to 256 floats, as kernels/mqa_logits)

q: bf16 [S, H, D], or MXFP4 (codes uint8/int8 [S, H, D/2], exponents int32 [S, H] at D = 128
or uint8 [S, H, D/32]); kv: MXFP4 keys (codes [Skv, D/2], exponents int32 [Skv] at D = 128
or uint8 [Skv, D/32]), SGLang's `quantize_fp4_indexer_tensor` layout (niah.kernels.quant
fp4_sglang_layout). Row i scores keys ks[i] <= n < ke[i]; every other position of a tile the
kernel visits reads -inf, and with clean_logits=True the whole row is written. DeepGEMM's
compressed mode (max_seqlen_k > 0) is not offered for fp4 keys. Multiplication: the unpack
path of kernels/fp4_paged_logits (codes decoded in registers, bf16 tensor cores) on every GPU.
"""

from __future__ import annotations

import torch

from niah.kernels._common import check_device, has_fp8_conversion, next_pow2
from niah.kernels._launch import launcher_of
from niah.kernels.fp4_paged_logits.wrapper import split_fp4_query

_KERNEL = ("niah.kernels.fp4_mqa_logits.kernel", "fp4_mqa_logits_kernel")
_ALIGN = 256


def fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0,
                   block_n=None, block_q=None):
    """See the module doc."""
    name = "fp4_mqa_logits"
    if max_seqlen_k:
        raise ValueError(f"{name}: max_seqlen_k > 0 (DeepGEMM's compressed logits) is not offered for fp4 keys")
    values, qexps, dim = split_fp4_query(q, "[S, H, D]", name)
    if values.dim() != 3:
        raise ValueError(f"{name}: q must be [S, H, D], got {tuple(values.shape)}")
    if isinstance(kv, torch.Tensor):
        raise ValueError(f"{name}: kv must be MXFP4 keys (codes [Skv, D/2], exponents)")
    kcodes, kexps, kdim = split_fp4_query(kv, "", name)
    if kexps is None or kcodes.dim() != 2 or kdim != dim:
        raise ValueError(f"{name}: kv must be MXFP4 keys (codes [Skv, {dim // 2}], exponents), "
                         f"got {tuple(kcodes.shape)}")
    seq, heads = values.shape[:2]
    if dim < 32 or dim & (dim - 1):
        raise ValueError(f"{name}: head dim must be a power of two >= 32, got {dim}")
    if weights.shape != (seq, heads) or weights.dtype != torch.float32:
        raise ValueError(f"{name}: weights must be float32 [{seq}, {heads}], "
                         f"got {weights.dtype} {tuple(weights.shape)}")
    for label, t in (("cu_seq_len_k_start", cu_seq_len_k_start), ("cu_seq_len_k_end", cu_seq_len_k_end)):
        if t.shape != (seq,) or t.dtype != torch.int32:
            raise ValueError(f"{name}: {label} must be int32 [{seq}], got {t.dtype} {tuple(t.shape)}")
    check_device(values, qexps, kcodes, kexps, weights, cu_seq_len_k_start, cu_seq_len_k_end)
    skv = kcodes.shape[0]
    stride = (skv + _ALIGN - 1) // _ALIGN * _ALIGN
    out = torch.empty_strided((seq, skv), (stride, 1), dtype=torch.float32, device=values.device)
    if seq == 0 or skv == 0:
        return out
    interp = not values.is_cuda
    block_n = block_n or (64 if interp else 128)
    block_q = block_q or (4 if interp else 16)
    grid = ((skv + block_n - 1) // block_n, (seq + block_q - 1) // block_q)
    launcher_of(*_KERNEL)(grid,
        values, values if qexps is None else qexps, kcodes, kexps, weights.contiguous(),
        cu_seq_len_k_start.contiguous(), cu_seq_len_k_end.contiguous(), out, seq, skv, heads, stride,
        D=dim, BLOCK_H=max(16, next_pow2(heads)), BLOCK_N=block_n, BLOCK_Q=block_q, Q_FP4=qexps is not None,
        CLEAN=bool(clean_logits), UPCAST=interp,
        FP8_CVT=has_fp8_conversion(values.device), num_warps=4, num_stages=1 if interp else 2,
    )
    return out
