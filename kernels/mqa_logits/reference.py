"""Torch references for the ragged (prefill) index logits.

- `ref_mqa_logits`: exact arithmetic (fp64 on CPU, fp32 on GPU) over dequantised inputs,
  in query chunks so the peak is one chunk's [chunk, H, Skv] scores.
- `chunked_mqa_logits`: the alternative a user has today: bf16 matmuls per 256-query
  chunk over the sequence's keys (benchmarks only).
"""

from __future__ import annotations

import torch


def _mask(out, ks, ke, n_cols, compressed):
    pos = torch.arange(n_cols, device=out.device)
    if compressed:
        valid = pos[None, :] < (ke - ks)[:, None]
    else:
        valid = (pos[None, :] >= ks[:, None]) & (pos[None, :] < ke[:, None])
    return out.masked_fill_(~valid, float("-inf"))


def ref_mqa_logits(q, k, weights, ks, ke, sf=None, max_seqlen_k=0, chunk=None):
    """q [S, H, D], k [Skv, D] (any float dtype; fp8 with sf [Skv]) -> [S, n_cols] fp32, -inf masked."""
    acc = torch.float64 if q.device.type == "cpu" else torch.float32
    seq, heads, dim = q.shape
    skv = k.shape[0]
    kf = k.to(acc)
    if sf is not None:
        kf = kf * sf.to(acc)[:, None]
    ks, ke = ks.long(), ke.long()
    n_cols = max_seqlen_k if max_seqlen_k > 0 else skv
    out = torch.empty((seq, n_cols), dtype=torch.float32, device=q.device)
    if chunk is None:
        chunk = max(1, min(seq, (1 << 28) // max(1, heads * skv * (8 if acc == torch.float64 else 4))))
    for s0 in range(0, seq, chunk):
        qc = q[s0 : s0 + chunk].to(acc)  # [c, H, D]
        wc = weights[s0 : s0 + chunk].to(acc)  # [c, H]
        if max_seqlen_k > 0:
            # compressed: column c = key ks[i] + c
            idx = (ks[s0 : s0 + chunk, None] + torch.arange(n_cols, device=q.device)[None, :]).clamp(0, skv - 1)
            kk = kf[idx]  # [c, n_cols, D]
            s = torch.einsum("chd,cnd->chn", qc, kk)
        else:
            s = torch.einsum("chd,nd->chn", qc, kf)
        out[s0 : s0 + chunk] = (torch.relu(s) * wc[:, :, None]).sum(1).float()
    return _mask(out, ks, ke, n_cols, max_seqlen_k > 0)


def chunked_mqa_logits(q, k, weights, ks, ke, sf=None, chunk=256):
    """bf16 torch, one 256-query chunk at a time over all keys (what a user writes today)."""
    seq, heads, dim = q.shape
    kb = k.to(torch.bfloat16)
    out = torch.empty((seq, k.shape[0]), dtype=torch.float32, device=q.device)
    for s0 in range(0, seq, chunk):
        qc = q[s0 : s0 + chunk].to(torch.bfloat16).reshape(-1, dim)  # [c*H, D]
        s = (qc @ kb.T).float().reshape(-1, heads, k.shape[0])  # [c, H, Skv]
        out[s0 : s0 + chunk] = (torch.relu(s) * weights[s0 : s0 + chunk, :, None]).sum(1)
    if sf is not None:
        out *= sf[None, :]
    return _mask(out, ks.long(), ke.long(), k.shape[0], False)
