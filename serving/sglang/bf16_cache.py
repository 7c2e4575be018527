"""The bf16 index-key cache: layout, store, gather and memory accounting (pure torch).

SGLang 0.5.23 keeps each layer's index keys in a uint8 tensor `[pages, 64 x 132]`
(64 fp8 keys of 128 bytes, then 64 fp32 scales). The bf16 cache keeps the same
uint8 `[pages, row_bytes]` container, so every SGLang caller that only moves bytes
(`_kernel_view`, cpu offload, disaggregation transfer) still works, with
`row_bytes = 64 x 256`: token-major bf16 keys, no scale. Viewed as bf16 it is
`[pages, 64, 1, 128]`, the layout `bf16_paged_mqa_logits` reads.

slot (SGLang `out_cache_loc`) = page * 64 + offset.
"""

from __future__ import annotations

import torch

PAGE_SIZE = 64
HEAD_DIM = 128
FP8_BYTES_PER_TOKEN = HEAD_DIM + HEAD_DIM // 128 * 4  # 132: fp8 key + one fp32 scale
BF16_BYTES_PER_TOKEN = HEAD_DIM * 2  # 256


def bf16_row_bytes(page_size: int = PAGE_SIZE, head_dim: int = HEAD_DIM, index_kpool: int = 1) -> int:
    """Bytes of one page row in the bf16 cache (SGLang's `_buffer_shape` second dim)."""
    return page_size // index_kpool * head_dim * 2


def bf16_cell_bytes(fp8_cell_bytes: int) -> int:
    """Per-token index-key bytes (all layers) for bf16, from SGLang's fp8 figure.

    SGLang computes `132 x layers x element_size x ratio`; the bf16 cache needs
    256 per token per layer instead. Exact when fp8_cell_bytes is a multiple of 132
    (always, for index_kpool == 1, the only pooling the bf16 cache supports).
    """
    if fp8_cell_bytes % FP8_BYTES_PER_TOKEN:
        raise ValueError(f"indexer cell size {fp8_cell_bytes} is not a multiple of {FP8_BYTES_PER_TOKEN}")
    return fp8_cell_bytes // FP8_BYTES_PER_TOKEN * BF16_BYTES_PER_TOKEN


def pages_view(buf: torch.Tensor, page_size: int = PAGE_SIZE, head_dim: int = HEAD_DIM) -> torch.Tensor:
    """uint8 `[pages, page_size*head_dim*2]` -> bf16 `[pages, page_size, 1, head_dim]` (no copy)."""
    if buf.dtype != torch.uint8 or buf.dim() != 2 or buf.shape[1] != page_size * head_dim * 2:
        raise ValueError(
            f"bf16 index-key buffer must be uint8 [pages, {page_size * head_dim * 2}], "
            f"got {buf.dtype} {list(buf.shape)}")
    return buf.view(torch.bfloat16).view(buf.shape[0], page_size, 1, head_dim)


def store_keys_torch(buf: torch.Tensor, loc: torch.Tensor, key: torch.Tensor,
                     page_size: int = PAGE_SIZE) -> None:
    """Write `key[i]` (any float dtype, [N, 128]) unquantised, as bf16, to slot `loc[i]`
    (negative slots are padding and skipped, as in the store kernel)."""
    pages = pages_view(buf, page_size, key.shape[-1])
    loc = loc.reshape(-1).long()
    key = key.reshape(loc.numel(), -1)
    keep = loc >= 0  # negative slots are padding
    loc, key = loc[keep], key[keep]
    pages[loc // page_size, loc % page_size, 0] = key.to(torch.bfloat16)


def gather_keys_torch(buf: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor,
                      seq_len_sum: int, page_size: int = PAGE_SIZE,
                      head_dim: int = HEAD_DIM) -> torch.Tensor:
    """The keys of each request's first `seq_lens[b]` tokens, requests concatenated:
    bf16 `[seq_len_sum, head_dim]` (what SGLang's GetKAndS returns for fp8, minus scales).

    page_table: `[B, max_pages]` page ids; seq_lens: `[B]`.
    """
    return gather_pages(pages_view(buf, page_size, head_dim), page_table, seq_lens, seq_len_sum)


def gather_pages(pages: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor,
                 seq_len_sum: int) -> torch.Tensor:
    """gather_keys_torch on a page view `[pages, page_size, 1, head_dim]` (any strides)."""
    page_size = pages.shape[1]
    seq_lens = seq_lens.reshape(-1).long()
    max_pages = page_table.shape[1]
    pos = torch.arange(max_pages * page_size, device=pages.device)
    valid = pos.unsqueeze(0) < seq_lens.unsqueeze(1)  # [B, max_tokens], row-major = request order
    page_ids = page_table.long()[:, pos // page_size]  # [B, max_tokens]
    offs = (pos % page_size).expand_as(page_ids)
    out = pages[page_ids[valid], offs[valid], 0]
    if out.shape[0] != seq_len_sum:
        raise ValueError(f"seq_len_sum {seq_len_sum} != sum(seq_lens) {out.shape[0]}")
    return out


def move_keys_torch(buf: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor,
                    page_size: int = PAGE_SIZE, head_dim: int = HEAD_DIM) -> None:
    """Copy the keys at slots `src_loc` to slots `tgt_loc` (SGLang's IndexKeyCache.move)."""
    pages = pages_view(buf, page_size, head_dim)
    t = tgt_loc.reshape(-1).long()
    s = src_loc.reshape(-1).long()
    pages[t // page_size, t % page_size] = pages[s // page_size, s % page_size]


def smuggle_as_fp8(keys_bf16: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Package bf16 keys `[S, D]` as SGLang's (k uint8 [S, 2D], scale uint8 [S, 4]) pair.

    SGLang's prefill path views `k` as fp8 and the scale as fp32 and hands both to the
    resolved `fp8_mqa_logits`; niah's resolver recognises the 2D-wide fp8 tensor and
    reads it back as bf16 with `unsmuggle_bf16`. Scales are 1.0.
    """
    s = keys_bf16.shape[0]
    k = keys_bf16.contiguous().view(torch.uint8).view(s, -1)
    scale = torch.ones(s, 1, dtype=torch.float32, device=keys_bf16.device).view(torch.uint8)
    return k, scale


def unsmuggle_bf16(k: torch.Tensor, head_dim: int) -> torch.Tensor | None:
    """Inverse of `smuggle_as_fp8` after SGLang's `.view(fp8)`: bf16 `[S, head_dim]`,
    or None if `k` is an ordinary fp8 key tensor `[S, head_dim]`."""
    if k.dim() == 2 and k.shape[1] == 2 * head_dim and k.element_size() == 1:
        return k.view(torch.uint8).view(torch.bfloat16)
    return None
