"""The GPU sparse attention's index scores: `IndexScores`, the part of CudaDSA (indexer.py)
that turns an index query into scores, kept apart so that each file holds one job.

- prefill: the ragged kernel (`fp8_mqa_logits` / `bf16_mqa_logits`) over the sequence's keys,
  gathered from its pages (what SGLang's prefill does), `score_rows` rows a call: as many as
  fit in `score_bytes` of fp32 [rows, S] scores, so the read's working memory is bounded at
  any length (about two such buffers live at once: the running sum over kv heads, which the
  kernel adds each kv head's logits into as it writes them, and the previous call's scores).
  The index query is quantised and each kv head's keys gathered once a chunk
  (`_score_inputs`), each call slicing them (`_call_scores`);
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

from niah.kernels import bf16_mqa_logits, bf16_paged_mqa_logits, fp8_mqa_logits, fp8_paged_mqa_logits
from niah.kernels.quant import quantize_fp8
from niah.serving.sglang import attest

SCORE_BYTES = 64 * 2**20   # fp32 [rows, S] scores a prefill score call holds (rows = SCORE_BYTES / 4S)


class IndexScores:
    """The index scores of CudaDSA (module doc: the attributes it reads from its subclass)."""

    def _memoized(self, key, make):
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = make()
        return got

    def _weights(self, rows: int, G: int) -> torch.Tensor:
        H = self.n_kv * G
        return self._memoized(("w", rows, G), lambda: torch.full((rows, G), (H * self.dim) ** -0.5, device=self.device))

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
            return self._call_scores(layer, self._score_inputs(layer, q, p0 + C), q, p0, 0, C)
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

    def _score_inputs(self, layer: int, q: torch.Tensor, S: int) -> tuple | None:
        """What the ragged kernel reads for the rows of q ([1, H, C, D]) against the first S
        keys (fp8 or bf16 keys, the fused read), made once a chunk and sliced by each score
        call: the index query per kv head ([Hkv, C, G, D]: fp8 e4m3 with one scale per row
        and head folded into the weights, or bf16), the weights ([Hkv, C, G] fp32) and each kv
        head's keys gathered from its pages (as SGLang's prefill gathers them). None for fp32
        keys and the gather read: _call_scores then scores each call's rows of q on their own."""
        if self.index_dtype not in ("fp8", "bf16") or self.bf16_read != "fused":
            return None
        _, H, C, D = q.shape
        G = H // self.n_kv
        qg = q[0].view(self.n_kv, G, C, D).transpose(1, 2)                 # [Hkv, C, G, D]
        w = self._weights(C, G)[None]                                      # [1, C, G]
        if self.index_dtype == "fp8":
            qq, qs = quantize_fp8(qg)                                      # [Hkv, C, G, D], [Hkv, C, G]
            w = w * qs
        else:
            qq = qg.to(torch.bfloat16)
        # rows padded to a multiple of 4 floats, so every call's slice w[g, r0:r1] starts
        # 16-byte aligned (the kernels' bound launch wants aligned pointers)
        wp = torch.zeros(self.n_kv, C, -(-G // 4) * 4, device=q.device)
        wp[:, :, :G] = w
        keys = [self.pool.contiguous(layer, g, S) for g in range(self.n_kv)]
        return qq.contiguous(), wp[:, :, :G], keys

    def _call_scores(self, layer: int, inputs: tuple | None, q: torch.Tensor, p0: int, r0: int,
                     r1: int) -> torch.Tensor:
        """One score call: rows r0..r1-1 of the chunk q ([1, H, C, D]) at p0 (positions
        p0 + r0 ..) over the keys up to the last row's, the kv heads summed in order (the
        kernel adds each kv head's logits to the sum so far where it writes them) ->
        [r1 - r0, p0 + r1] fp32, -inf where s > p."""
        if inputs is None:                     # fp32 keys (or the gather read): rows r0..r1-1 on their own
            return self.prefill_scores(layer, q[:, :, r0:r1], p0 + r0)
        qq, w, keys = inputs
        n, S = r1 - r0, p0 + r1
        ks = self._memoized(("ks", n), lambda: torch.zeros(n, dtype=torch.int32, device=self.device))
        ke = self._memoized(("ke", p0 + r0, n),
                            lambda: torch.arange(p0 + r0 + 1, S + 1, dtype=torch.int32, device=self.device))
        total = None                   # each kv head's logits added into the first's by the kernel
        for g in range(self.n_kv):
            if self.index_dtype == "fp8":
                vals, scales = keys[g]
                total = fp8_mqa_logits(qq[g, r0:r1], (vals[:S], scales[:S]), w[g, r0:r1], ks, ke,
                                       accumulate_into=total)
                attest.record("prefill_logits", "fp8", "niah.fp8_mqa_logits")
            else:
                total = bf16_mqa_logits(qq[g, r0:r1], keys[g][:S], w[g, r0:r1], ks, ke, accumulate_into=total)
                attest.record("prefill_logits", "bf16", "niah.bf16_mqa_logits")
        return total

    def decode_scores(self, layer: int, q: torch.Tensor, S: int) -> torch.Tensor:
        """q: [1, H, 1, D] index query of position S - 1 -> I [1, S] fp32."""
        _, H, _, D = q.shape
        G = H // self.n_kv
        qg = q[0, :, 0].view(self.n_kv, 1, G, D)                          # [Hkv, next_n=1, G, D]
        if self.index_dtype == "fp32" or self.bf16_read == "gather":
            return self.prefill_scores(layer, q, S - 1, "decode_logits")
        ctx = self._memoized(("ctx", S), lambda: torch.full((self.n_kv,), S, dtype=torch.int32, device=self.device))
        if self.index_dtype == "fp8":
            q8, qs = quantize_fp8(qg)                                      # [Hkv, 1, G, D], [Hkv, 1, G]
            out = fp8_paged_mqa_logits(q8, self.pool.paged(layer), self._decode_weights(G) * qs[:, 0],
                                       ctx, self.pool.block_table, None, S, clean_logits=True)
            attest.record("decode_logits", "fp8", "niah.fp8_paged_mqa_logits")
        else:
            out = bf16_paged_mqa_logits(qg.to(torch.bfloat16).contiguous(), self.pool.paged(layer),
                                        self._decode_weights(G), ctx, self.pool.block_table, None, S,
                                        clean_logits=True)
            attest.record("decode_logits", "bf16", "niah.bf16_paged_mqa_logits")
        return out.sum(0, keepdim=True)                                    # [1, S]

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
