"""topk_indices(logits, k, lengths=None) -> int32 [R, k]: the k largest logits per row.

logits fp32 [R, W] (row stride may exceed W). Candidates of row r: positions < lengths[r]
when lengths (int32 [R]) is given, else every position whose logit is not -inf. Order is
unspecified; a row with L <= k candidates returns them in index order (0..L-1 when
lengths are given), then -1. Ties at the threshold keep the lowest indices.
Any 1 <= k <= 2048 (larger k work too, within register limits of one block).
"""

from __future__ import annotations

import torch

from niah.kernels._common import check_device, interpreting, next_pow2

MAX_BLOCK = 32768  # one row (or chunk) per program, held in registers


def topk_indices(logits: torch.Tensor, k: int, lengths: torch.Tensor | None = None,
                 block: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    from niah.kernels.topk.kernel import topk_kernel

    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"topk_indices: logits must be float32 [R, W], got {logits.dtype} {tuple(logits.shape)}")
    k = int(k)
    if k < 1:
        raise ValueError(f"topk_indices: k must be >= 1, got {k}")
    rows, width = logits.shape
    if lengths is not None and (lengths.shape != (rows,) or lengths.dtype != torch.int32):
        raise ValueError(f"topk_indices: lengths must be int32 [{rows}], got {lengths.dtype} {tuple(lengths.shape)}")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    check_device(logits, lengths)
    out = torch.empty((rows, k), dtype=torch.int32, device=logits.device)
    if rows == 0:
        return out
    max_block = block or MAX_BLOCK
    if max_block & (max_block - 1) or max_block < 2 * next_pow2(k):
        raise ValueError(f"topk_indices: block must be a power of two >= 2 * next_pow2(k), got {max_block}")
    k_pad = next_pow2(k)

    def launch(src, idx_in, w, dst_idx, dst_key, blk, from_keys, out_keys):
        n_chunks = (w + blk - 1) // blk
        warps = num_warps or (4 if interpreting() else max(4, min(32, blk // 1024)))
        topk_kernel[(rows, n_chunks)](
            src, idx_in if idx_in is not None else src, lengths if lengths is not None else src,
            dst_idx, dst_key if dst_key is not None else dst_idx,
            w, k, src.stride(0), idx_in.stride(0) if idx_in is not None else 0, dst_idx.stride(0),
            BLOCK=blk, K_PAD=k_pad, FROM_KEYS=from_keys, HAS_LEN=lengths is not None and not from_keys,
            OUT_KEYS=out_keys, num_warps=warps,
        )

    if width <= max_block:
        launch(logits, None, width, out, None, max(16, next_pow2(width)), False, False)
        return out
    # rounds: each chunk keeps its top-k (key, index) pairs, until one block holds the survivors
    src, idx_in, w, from_keys = logits, None, width, False
    while w > max_block:
        n_chunks = (w + max_block - 1) // max_block
        keys = torch.empty((rows, n_chunks * k), dtype=torch.int32, device=logits.device)
        idx = torch.empty_like(keys)
        launch(src, idx_in, w, idx, keys, max_block, from_keys, True)
        src, idx_in, w, from_keys = keys, idx, n_chunks * k, True
    topk_kernel[(rows, 1)](
        src, idx_in, src, out, out, w, k, src.stride(0), idx_in.stride(0), out.stride(0),
        BLOCK=max(16, next_pow2(w)), K_PAD=k_pad, FROM_KEYS=True, HAS_LEN=False, OUT_KEYS=False,
        num_warps=num_warps or (4 if interpreting() else max(4, min(32, next_pow2(w) // 1024))),
    )
    return out
