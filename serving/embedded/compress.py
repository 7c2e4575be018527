"""V4-style index compression for the CPU indexer: one index key per 4 tokens.

DeepSeek-V4's indexer compresses its keys 4:1 and selects over compressed positions, plus a
sliding window of raw tokens. This model has no trained compressor, so the emulation's is
the plainest one that keeps the arithmetic of selection:

- block j holds tokens 4j..4j+3; its index key is the MEAN of those four post-RoPE keys
  (read from the KV cache's fp32 keys), rotated as the arm rotates, then stored like any
  index key (its form's round trip: fp8, bf16, ...). It is written when its last token is
  (`new_blocks`), so a decode step completes one block every 4 tokens;
- a query at position p sees the complete blocks j < (p + 1) // 4 (V4's causal mask);
  its index scores are `DSA.index_scores` over those keys; it keeps the top-k blocks;
- the attention then reads the raw tokens of the kept blocks, plus the tokens of the
  query's own incomplete block (4 * ((p + 1) // 4) .. p: they have no block key yet and
  would otherwise be invisible, itself included), plus the last `window` tokens;
- selection starts when the compressed length exceeds k: while S // 4 <= k every block
  is kept, i.e. every token, and the layer runs dense attention (as V4 Flash above 2,048).

The attention over raw tokens (not over compressed values) is a choice: V4 also attends
to compressed KV, which needs trained weights; what a gate sees of selection (which tokens
the answer can read) is kept. Faults (faults.py): `residue:R` shifts every block one token
later (tokens 4j+1..4j+4) for a request whose prompt length is R mod 4, while the
selection still expands block j to tokens 4j..4j+3: the keys and the positions they stand
for disagree by one token.
"""

from __future__ import annotations

import torch

RATIO = 4


def new_blocks(start: int, T: int, offset: int = 0) -> range:
    """The blocks a write of positions start..start+T-1 completes (offset: the residue fault)."""
    return range(max(0, start - offset) // RATIO, max(0, start + T - offset) // RATIO)


def visible(S: int, offset: int = 0) -> int:
    """Complete blocks among the first S tokens."""
    return max(0, S - offset) // RATIO


def token_mask(block_top: torch.Tensor, nb: int, p0: int, S: int, window: int) -> torch.Tensor:
    """Additive [C, S] mask of C query rows at positions p0.. from their kept blocks
    (block_top [C, k] block indices): the blocks' tokens, the query's own incomplete block,
    the last `window` tokens; causal."""
    C = block_top.shape[0]
    kept_b = torch.zeros(C, nb, dtype=torch.bool).scatter_(1, block_top, True)
    kept = torch.zeros(C, S, dtype=torch.bool)
    kept[:, :nb * RATIO] = kept_b.repeat_interleave(RATIO, 1)
    pos = torch.arange(p0, p0 + C)[:, None]
    col = torch.arange(S)[None, :]
    kept |= col >= (pos + 1) // RATIO * RATIO                  # the query's own (incomplete) block
    if window > 0:
        kept |= col > pos - window
    kept &= col <= pos
    return torch.zeros(C, S).masked_fill_(~kept, float("-inf"))


def block_causal(nb: int, p0: int, C: int, offset: int = 0) -> torch.Tensor:
    """bool [C, nb]: block j is NOT visible to the row at position p0 + c."""
    pos = torch.arange(p0, p0 + C)[:, None]
    return torch.arange(nb)[None, :] >= (pos + 1 - offset).clamp_min(0) // RATIO


def token_scores(block_row: torch.Tensor, S: int) -> torch.Tensor:
    """One row's block scores [nb] as token scores [S] (the probe's view): each token its
    block's score, the tokens past the last complete block above every score (always kept)."""
    nb = block_row.shape[0]
    finite = block_row[torch.isfinite(block_row)]
    top = float(finite.max()) + 1.0 if finite.numel() else 1.0
    out = torch.full((S,), top)
    out[:nb * RATIO] = block_row.repeat_interleave(RATIO)
    return out
