"""The GPU sparse attention's index scores: `IndexScores`, the part of CudaDSA (indexer.py)
that turns an index query into scores, kept apart so that each file holds one job.

- prefill: the fused indexer's logits (`indexer_logits`): every kv head's pages read in place
  through the block table and the kv heads summed inside the kernel (SGLang's prefill gathers
  the keys and calls DeepGEMM's `fp8_mqa_logits` once per index kv head: one in DeepSeek's
  indexer, Hkv in this model's), `score_rows` rows a call: as many as fit in `score_bytes` of
  fp32 [rows, S] scores, so the read's working memory is bounded at any length. The index
  query is quantised and padded once a chunk (`kernel_query`), each call slicing it
  (`_call_scores`); the scores are those the fused top-k (`--topk fused`) compares;
- decode: the paged kernel (`fp8_paged_mqa_logits` / `bf16_paged_mqa_logits`), the pages
  read in place through the block table, the kv heads the kernel's batch;
- fp32 keys: torch matmul (no kernel takes fp32 keys); the gather read (`bf16_read="gather"`):
  every page copied once per query, a bf16 bmm (the seed's naive read, no budget).

Contract with the class that mixes it in: attributes n_kv, dim, device, index_dtype,
bf16_read, chunk, score_bytes, _decode_w (a dict), pool (paging.IndexKeyPool, None for fp32), keys32 (fp32
[layers, n_kv, capacity, dim] when pool is None) and _memo (a dict emptied at each step's
first layer). Every call is attested by kernel name (serving/sglang/attest.py).
"""

from __future__ import annotations

import torch

from niah.kernels import bf16_paged_mqa_logits, fp8_paged_mqa_logits, indexer_logits, logits_form, quantize_query
from niah.kernels._common import next_pow2
from niah.serving.sglang import attest

SCORE_BYTES = 64 * 2**20   # fp32 [rows, S] scores a prefill score call holds (rows = SCORE_BYTES / 4S)


class IndexScores:
    """The index scores of CudaDSA (module doc: the attributes it reads from its subclass)."""

    def _memoized(self, key, make):
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = make()
        return got

    def _decode_weights(self, G: int) -> torch.Tensor:
        """A decode step's head weights, fp32 [Hkv, G]: made once and kept (a CUDA graph
        captured over them reads them at every replay)."""
        w = self._decode_w.get(G)
        if w is None:
            w = self._decode_w[G] = torch.full((self.n_kv, G), (self.n_kv * G * self.dim) ** -0.5,
                                               device=self.device)
        return w

    def _causal(self, scores: torch.Tensor, p0: int) -> torch.Tensor:
        C, S = scores.shape
        cols = torch.arange(S, device=scores.device)[None, :]
        rows = torch.arange(p0, p0 + C, device=scores.device)[:, None]
        return scores.masked_fill_(cols > rows, float("-inf"))

    def prefill_scores(self, layer: int, q: torch.Tensor, p0: int, path: str = "prefill_logits") -> torch.Tensor:
        """q: [1, H, C, D] index query of positions p0..p0+C-1 -> I [C, p0 + C] fp32, -inf where s > p.
        (path: what the call is attested as; decode steps of the gather and fp32 arms come here too.)"""
        _, H, C, D = q.shape
        if self.index_dtype in ("fp8", "bf16") and self.bf16_read == "fused":
            return self._call_scores(layer, self._score_inputs(q), q, p0, 0, C)
        G, S = H // self.n_kv, p0 + C
        qg = q[0].view(self.n_kv, G, C, D).transpose(1, 2)                 # [Hkv, C, G, D]
        total = None
        for g in range(self.n_kv):
            if self.index_dtype == "bf16":
                lg = self._gather_scores(layer, g, qg[g], p0)
                attest.record(path, "bf16", "niah.bf16_gather_bmm")
            else:
                lg = self._causal(self._torch_scores(self.keys32[layer, g, :S], qg[g]), p0)
                attest.record(path, "fp32", "torch.matmul")
            total = lg if total is None else total.add_(lg)
        return total

    def kernel_query(self, iq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The index query iq ([1, H, C, D]) as the fused indexer's kernels read it: q [C, Hkv, GP, D]
        (fp8 e4m3 with one scale per row and head folded into the weights, or bf16) and the
        weights [C, Hkv, GP] fp32, the G heads a kv head padded to GP = max(2, next_pow2(G)) with
        zero queries and weights (a padded head adds an exact 0 to its row's sum), so that no
        kernel call copies them again: one launch (`niah.kernels.quantize_query`)."""
        _, H, C, D = iq.shape
        G = H // self.n_kv
        q = iq[0].view(self.n_kv, G, C, D).permute(2, 0, 1, 3)             # [C, Hkv, G, D] (a view)
        return quantize_query(q, (H * D) ** -0.5, self.index_dtype, pad_to=max(2, next_pow2(G)))

    def _score_inputs(self, q: torch.Tensor) -> tuple | None:
        """What the fused read's score calls read for the rows of q ([1, H, C, D]), made once a
        chunk and sliced by each call: `kernel_query`'s query and weights. None for fp32 keys and
        the gather read: _call_scores then scores each call's rows of q on their own."""
        if self.index_dtype not in ("fp8", "bf16") or self.bf16_read != "fused":
            return None
        return self.kernel_query(q)

    def _call_scores(self, layer: int, inputs: tuple | None, q: torch.Tensor, p0: int, r0: int,
                     r1: int) -> torch.Tensor:
        """One score call: rows r0..r1-1 of the chunk q ([1, H, C, D]) at p0 (positions
        p0 + r0 ..) over the keys up to the last row's -> [r1 - r0, p0 + r1] fp32, -inf where
        s > p. The fused read: `indexer_logits`, every kv head's pages read in place and the
        kv heads summed in order inside the kernel, one call for all of them."""
        if inputs is None:                     # fp32 keys (or the gather read): rows r0..r1-1 on their own
            return self.prefill_scores(layer, q[:, :, r0:r1], p0 + r0)
        qk, w = inputs
        form = logits_form(self.n_kv)
        out = indexer_logits(qk[r0:r1], w[r0:r1], self.pool.layer(layer), self.pool.block_table, p0 + r0,
                             self.index_dtype, form=form)
        attest.record("prefill_logits", self.index_dtype, f"niah.indexer_logits.{form}")
        return out

    def decode_scores(self, layer: int, q: torch.Tensor, S: int) -> torch.Tensor:
        """q: [1, H, 1, D] index query of position S - 1 -> I [1, S] fp32."""
        _, H, _, D = q.shape
        G = H // self.n_kv
        qg = q[0, :, 0].view(self.n_kv, 1, G, D)                          # [Hkv, next_n=1, G, D]
        if self.index_dtype == "fp32" or self.bf16_read == "gather":
            return self.prefill_scores(layer, q, S - 1, "decode_logits")
        ctx = self._memoized(("ctx", S), lambda: torch.full((self.n_kv,), S, dtype=torch.int32, device=self.device))
        return self.paged_decode_logits(layer, qg, ctx, S).sum(0, keepdim=True)   # [1, S]

    def paged_decode_logits(self, layer: int, qg: torch.Tensor, ctx: torch.Tensor, width: int) -> torch.Tensor:
        """One decode query's logits per kv head from the paged keys (fp8 or bf16, the fused
        read): qg [Hkv, 1, G, D] fp32 (the index query, each kv head its G heads), ctx int32
        [Hkv] the context length -> [Hkv, width] fp32 (-inf from ctx on). The eager step and
        the CUDA graphs' step (CudaDSA.decode_at) both score through here."""
        G, D = qg.shape[2], qg.shape[3]
        if self.index_dtype == "fp8":
            q8, w = quantize_query(qg, (self.n_kv * G * D) ** -0.5, "fp8")    # [Hkv, 1, G, D], [Hkv, 1, G]
            out = fp8_paged_mqa_logits(q8, self.pool.paged(layer), w[:, 0], ctx, self.pool.block_table, None, width,
                                       clean_logits=True)
            attest.record("decode_logits", "fp8", "niah.fp8_paged_mqa_logits")
        else:
            out = bf16_paged_mqa_logits(qg.to(torch.bfloat16).contiguous(), self.pool.paged(layer),
                                        self._decode_weights(G), ctx, self.pool.block_table, None, width,
                                        clean_logits=True)
            attest.record("decode_logits", "bf16", "niah.bf16_paged_mqa_logits")
        return out

    def _torch_scores(self, keys: torch.Tensor, qg: torch.Tensor) -> torch.Tensor:
        """keys [S, D] fp32, qg [C, G, D] -> [C, S]: w * sum_h ReLU(q_h . k) in fp32."""
        G = qg.shape[1]
        raw = torch.matmul(qg, keys.t())                                   # [C, G, S]
        return raw.relu_().sum(1).mul_((self.n_kv * G * self.dim) ** -0.5)

    def _gather_scores(self, layer: int, g: int, qg: torch.Tensor, p0: int) -> torch.Tensor:
        """The naive bf16 read: every page of kv head g copied for every query, then a bmm."""
        C, G, _ = qg.shape
        S = p0 + C
        pages = self.pool.gather_per_query(layer, g, C, S)                 # [C, pages*64, D] bf16
        raw = torch.bmm(qg.to(torch.bfloat16), pages.transpose(1, 2))[:, :, :S]   # [C, G, S] bf16
        del pages
        scores = raw.float().relu_().sum(1).mul_((self.n_kv * G * self.dim) ** -0.5)
        return self._causal(scores, p0)


    def score_rows(self, S: int) -> int:
        """Query rows one score call takes over S keys: as many as fit in `score_bytes` of
        fp32 [rows, S] scores (at most the chunk), so the read's working memory is bounded at
        any length; the gather read takes the whole chunk (the seed's naive path)."""
        if self.index_dtype == "bf16" and self.bf16_read == "gather":
            return self.chunk
        return max(1, min(self.chunk, self.score_bytes // (4 * S)))
