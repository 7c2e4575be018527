"""topk_indices(logits, k, lengths=None) -> int32 [R, k]: the k largest logits per row.

logits fp32 [R, W] (row stride may exceed W). Candidates of row r: positions < lengths[r]
when lengths (int32 [R]) is given, else every position whose logit is not -inf. Order is
unspecified; a row with L <= k candidates returns them in index order (0..L-1 when
lengths are given), then -1. Ties at the threshold keep the lowest indices.

Supported: any k >= 1 and any width. One program holds a segment of up to 32,768
positions in registers (radix select, kernel.py); rows wider than `block` are cut into
chunks that each keep their top-k, and the survivors are selected again (rounds), which
needs block >= 2 * next_pow2(k): k <= 16,384 (k > 16,384 is refused with a clear error).
No host sync and no data-dependent shapes: CUDA-graph safe.
"""

from __future__ import annotations

import torch

from niah.kernels._common import check_device, interpreting, next_pow2

MAX_BLOCK = 32768  # positions one program holds in registers
MAX_K = MAX_BLOCK // 2
# H200 sweep (kernels/NOTES.md, run 8): defaults per shape class
MANY_ROWS = 256  # at least this many rows: one program per row when the row fits BLOCK_MANY
BLOCK_MANY = 32768
BLOCK_FEW = 8192  # few rows: small chunks, more programs in flight
FINAL_BLOCK = 16384


def _warps(block: int) -> int:
    return 4 if interpreting() else max(4, min(16, block // 2048))  # ~64 positions a thread


def _default_block(rows: int, width: int, k_pad: int) -> int:
    if rows >= MANY_ROWS and width <= BLOCK_MANY:
        return max(2 * k_pad, next_pow2(width))
    return max(2 * k_pad, BLOCK_FEW)


def topk_indices(logits: torch.Tensor, k: int, lengths: torch.Tensor | None = None,
                 block: int | None = None, final_block: int | None = None,
                 num_warps: int | None = None, final_warps: int | None = None,
                 early_exit: bool = True) -> torch.Tensor:
    """Top-k indices per row. Tuning (defaults from the H200 sweep in kernels/NOTES.md):
    block: rows wider than this are cut into chunks of `block` that each keep their top-k;
    final_block: the survivors are selected by one program per row once they fit in it;
    num_warps / final_warps: warps of the chunk rounds / of the last launch;
    early_exit: stop the radix search once a whole bin is taken."""
    from niah.kernels.topk.kernel import topk_kernel

    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"topk_indices: logits must be float32 [R, W], got {logits.dtype} {tuple(logits.shape)}")
    k = int(k)
    if k < 1 or k > MAX_K:
        raise ValueError(f"topk_indices: k must be in [1, {MAX_K}], got {k}")
    rows, width = logits.shape
    if lengths is not None and (lengths.shape != (rows,) or lengths.dtype != torch.int32):
        raise ValueError(f"topk_indices: lengths must be int32 [{rows}], got {lengths.dtype} {tuple(lengths.shape)}")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    check_device(logits, lengths)
    out = torch.empty((rows, k), dtype=torch.int32, device=logits.device)
    if rows == 0:
        return out
    k_pad = next_pow2(k)
    block = block or _default_block(rows, width, k_pad)
    final_block = max(final_block or FINAL_BLOCK, block)
    for name, b in (("block", block), ("final_block", final_block)):
        if b & (b - 1) or b < 2 * k_pad or b > MAX_BLOCK:
            raise ValueError(
                f"topk_indices: {name} must be a power of two in [2 * next_pow2(k), {MAX_BLOCK}], got {b} (k={k})"
            )
    has_len = lengths is not None

    def launch(src, idx_in, w, blk, dst_idx, dst_key, from_keys, warps):
        n_chunks = (w + blk - 1) // blk
        topk_kernel[(rows * n_chunks,)](
            src, idx_in if idx_in is not None else src, lengths if has_len else src,
            dst_idx, dst_key if dst_key is not None else dst_idx,
            w, k, n_chunks, src.stride(0), idx_in.stride(0) if idx_in is not None else 0, dst_idx.stride(0),
            BLOCK=blk, K_PAD=k_pad, FROM_KEYS=from_keys, HAS_LEN=has_len and not from_keys,
            OUT_KEYS=dst_key is not None, EARLY_EXIT=bool(early_exit), num_warps=warps or _warps(blk),
        )

    if width <= block:
        launch(logits, None, width, max(16, next_pow2(width)), out, None, False, final_warps or num_warps)
        return out
    # rounds: each chunk keeps its top-k (key, index) pairs, until the survivors fit one program
    src, idx_in, w, from_keys = logits, None, width, False
    while True:
        n_chunks = (w + block - 1) // block
        keys = torch.empty((rows, n_chunks * k), dtype=torch.int32, device=logits.device)
        idx = torch.empty_like(keys)
        launch(src, idx_in, w, block, idx, keys, from_keys, num_warps)
        src, idx_in, w, from_keys = keys, idx, n_chunks * k, True
        if w <= final_block:
            break
    launch(src, idx_in, w, max(16, next_pow2(w)), out, None, True, final_warps)
    return out
