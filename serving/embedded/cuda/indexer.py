"""DeepSeek-style sparse attention on the GPU, run by the bundled kernels (niah.kernels).

The same selection as the CPU emulation (serving/embedded/dsa.py: per layer and query t at
position p, I[t, s] = sum_h w_h ReLU(q[t, h] . k~[s, g(h)]) over s <= p with w_h =
(H*D)^-0.5, the top-K kept, all of them while p + 1 <= K, attention over the kept keys
only), computed the way a DSA server computes it:

- keys: written as they arrive by `niah.kernels.store_index_keys` into the paged pool
  (paging.py: SGLang's layout, fp8 e4m3 + fp32 scale per row, or bf16 rows); fp32 (exact)
  keeps plain fp32 keys and scores them in torch (no kernel takes fp32 keys);
- index query: quantised like SGLang's: fp8 e4m3 with one scale per (token, head) folded
  into the head weights (scales are positive, so they commute with the ReLU), or bf16;
  fp32 for fp32 keys. (The CPU emulation keeps the query fp32: there only the key varies.)
- scores (scores.py, `IndexScores`): prefill through the fused indexer's logits
  (`indexer_logits`: rows of queries over the sequence's keys, every kv head's pages read in
  place and the kv heads summed inside the kernel), as many rows a call as fit in
  `score_bytes` of fp32 scores (64 MiB: `score_rows`; each call's top-k taken before the
  next, the attention once a chunk), so the read's working memory is bounded at any length;
  decode through the paged kernel (`fp8_paged_mqa_logits` / `bf16_paged_mqa_logits`, the
  pages read in place through the block table, the kv heads its batch).
- `bf16_read="gather"` (bf16 only): the seed's naive read instead, every page copied once
  per query of the whole chunk ([chunk, S, D] bf16) and scored by a bf16 torch bmm: same
  selection up to bf16 rounding of the products, and the memory that killed the seed's 22K
  prompt (it grows with chunk x S: no budget, as the seed's path had none).
- top-k: `niah.kernels.topk_indices` by default ("niah"): graph-safe, ties at the cut keep
  the lowest positions (deterministic), rows with fewer candidates padded with -1 exactly
  as the attention kernel wants them; `topk="torch"` uses torch.topk (ties arbitrary).
- `topk="fused"` (fp8 and bf16 keys, fused read): prefill rows go through
  `niah.kernels.fused_indexer`, which scores the pages in place, sums the heads and kv heads
  inside one kernel and keeps only each row's candidates (no [rows, S] scores, so no
  `score_rows` split); the same selection rule as "niah" (ties at the cut keep the lowest
  positions) over the same scores (one tile function computes both kernels' scores).
  A chunk where a row's sampled bracket missed or its candidate buffer
  overflowed is scored again the unfused way (whose kernels attest their own calls;
  `fused_calls` counts them). Decode steps
  and the probe's reference row stay on the unfused kernels.
- attention: `attend.sparse_attention`, each query over its own kept keys, fp32 (with
  attend.PREFILL_SHARE > 0 a prefill chunk's tiles of that many queries go through
  `attend.union_attention`, each over the union of its queries' kept keys; 4 by default). A prompt's
  rows at positions < K keep every key, so they attend densely (`dense_attention`, the
  dense arm's SDPA) and are not scored at all, as the whole prompt is while it is at most K
  tokens: the same keys as the kernel's, the sums in another order (`dense_when_short`
  False: every row through the indexer and the kernel, as tests compare).
- decode from a CUDA graph (graphs.py): `store_at` / `decode_at` are the same store and
  selection with the position on the device and every shape fixed by a width W.

Attestation (serving/sglang/attest.py, as the CPU server reports it): one `record` per
kernel launch by name, pool bytes per token and layer (3 kv heads: fp8 204, bf16 384,
fp32 768), facts attention, index_topk, window (0: no window on this path), rotation,
device, query precision, bf16_read, topk, score_bytes.
"""

from __future__ import annotations

import torch

from niah.kernels import indexer_topk, store_index_keys
from niah.kernels import forms, topk_indices
from niah.kernels.rotation import ROTATIONS, rotate
from niah.serving.embedded.cuda.attend import sparse_attention
from niah.serving.embedded.cuda.paging import PAGE, IndexKeyPool
from niah.serving.embedded.cuda.scores import SCORE_BYTES, IndexScores
from niah.serving.embedded.model import LayerCache, dense_attention
from niah.serving.embedded.cuda.probe_rows import ProbeRows
from niah.serving.embedded.probe import STAT_KEYS
from niah.serving.sglang import attest

BF16_READS = ("fused", "gather")
TOPK_IMPLS = ("niah", "torch", "fused")
KERNELS = "niah-cuda"      # the arm's kernels: niah's Triton kernels in the embedded server


class CudaDSA(IndexScores):
    name = "dsa"
    owns_index_keys = True       # Transformer.set_attention allocates no cache.idx_k

    def __init__(self, n_layer: int, n_kv: int, dim: int, capacity: int, index_dtype: str = "fp8",
                 topk: int = 512, chunk: int = 4096, rotation: str = "none", bf16_read: str = "fused",
                 topk_impl: str = "niah", device: str | torch.device = "cuda", dense_when_short: bool = True,
                 score_bytes: int = SCORE_BYTES):
        if index_dtype not in forms.names(forms.CUDA):
            raise ValueError(f"index dtype must be one of {forms.names(forms.CUDA)}, not {index_dtype!r}")
        if rotation not in ROTATIONS:
            raise ValueError(f"index rotation must be one of {ROTATIONS}, not {rotation!r}")
        if bf16_read not in BF16_READS or (bf16_read == "gather" and index_dtype != "bf16"):
            raise ValueError(f"bf16_read must be one of {BF16_READS} ('gather' needs bf16 keys), not {bf16_read!r}")
        if topk_impl not in TOPK_IMPLS:
            raise ValueError(f"topk must be one of {TOPK_IMPLS}, not {topk_impl!r}")
        if topk_impl == "fused" and (index_dtype not in ("fp8", "bf16") or bf16_read != "fused"):
            raise ValueError("topk 'fused' scores fp8 or bf16 pages in place (not fp32 keys, not the gather read)")
        if topk < 1 or chunk < 1 or score_bytes < 1:
            raise ValueError("topk, chunk and score_bytes must be >= 1")
        self.score_bytes = score_bytes
        self.fused_calls = {"calls": 0, "fallbacks": 0, "fallback_rows": 0}   # topk="fused": chunks scored again
        self.fused_cap: int | None = None      # the fused kernel's candidate slots a row (None: its own; tests)
        self.index_dtype, self.topk, self.chunk, self.rotation = index_dtype, topk, chunk, rotation
        self.bf16_read, self.topk_impl, self.dense_when_short = bf16_read, topk_impl, dense_when_short
        self.window = 0
        self.n_layer, self.n_kv, self.dim = n_layer, n_kv, dim
        self._rows: ProbeRows | None = None     # the last prompt row of each layer so far (_last_row)
        self.device = torch.device(device)
        self._memo: dict = {}          # small per-shape tensors reused across layers (weights, lengths, slots)
        self._decode_w: dict = {}      # the decode step's head weights (kept: graphs read them)
        if index_dtype == "fp32":
            self.pool = None
            self.keys32 = torch.zeros(n_layer, n_kv, capacity, dim, device=self.device)
            self.bytes_per_token = n_kv * 4 * dim
        else:
            self.pool = IndexKeyPool(n_layer, n_kv, dim, capacity, index_dtype, self.device)
            self.bytes_per_token = self.pool.bytes_per_token
        attest.configure(index_dtype, KERNELS, self.bytes_per_token)
        attest.set_facts(attention="dsa", index_topk=topk, window=0, rotation=rotation, device=str(self.device),
                         query=index_dtype, bf16_read=bf16_read if index_dtype == "bf16" else None,
                         topk=self._topk_name(), score_bytes=self.score_bytes)

    def _topk_name(self) -> str:
        return {"niah": "niah.topk_indices", "torch": "torch.topk", "fused": "niah.indexer_topk"}[self.topk_impl]

    # -- the index-key store --------------------------------------------------------------
    def store(self, cache: LayerCache, k: torch.Tensor, start: int) -> None:
        """k: [1, Hkv, T, D] post-RoPE keys of positions start..start+T-1 -> the pool."""
        _, Hkv, T, D = k.shape
        kk = rotate(k[0], self.rotation)                                   # [Hkv, T, D] fp32
        if cache.layer_id == 0:
            self._memo = {}                        # a new step: its lengths and slots
        if self.pool is None:
            self.keys32[cache.layer_id, :, start:start + T] = kk
            attest.record("store", "fp32", "torch.copy_")
            return
        if cache.layer_id == 0:                    # the block table is shared by every layer
            if start == 0:
                self.pool.reset()
            self.pool.ensure(start + T)
            self._memo["slots"] = self.pool.slots(start, T)       # this step's slots, for every layer
        store_index_keys(kk.reshape(Hkv * T, D), self.pool.layer(cache.layer_id), self._memo["slots"],
                         block_kv=64)
        attest.record("store", self.index_dtype, "niah.store_index_keys")

    def index_query(self, q: torch.Tensor) -> torch.Tensor:
        return rotate(q, self.rotation) if self.rotation != "none" else q

    # -- the decode step of a CUDA graph (graphs.py): the position on the device, width W ----
    def store_at(self, cache: LayerCache, k: torch.Tensor, pos: torch.Tensor) -> None:
        """store() of one token at the device position pos (int64 [1]); its page is already
        in the block table (pool.ensure on the host before the step)."""
        _, Hkv, _, D = k.shape
        kk = rotate(k[0], self.rotation)                                   # [Hkv, 1, D] fp32
        if self.pool is None:
            self.keys32[cache.layer_id].index_copy_(1, pos, kk)
            attest.record("store", "fp32", "torch.copy_")
            return
        if cache.layer_id == 0:
            page = self.pool.block_table.index_select(1, pos // PAGE)      # [Hkv, 1] int32
            self._slots_at = (page.to(torch.int64) * PAGE + pos % PAGE).reshape(-1)
        store_index_keys(kk.reshape(Hkv, D), self.pool.layer(cache.layer_id), self._slots_at, block_kv=64)
        attest.record("store", self.index_dtype, "niah.store_index_keys")

    def decode_at(self, q: torch.Tensor, cache: LayerCache, ctx: torch.Tensor, valid: torch.Tensor, W: int,
                  rows=None) -> torch.Tensor:
        """The selection and sparse attention of one decode query (q [1, H, 1, D]) at the
        position where `valid` ([W] bool, s <= pos) ends; ctx: int32 [Hkv] = pos + 1.
        Scores over W positions (-inf past pos), the top-k; with the probe's `rows`
        (probe_rows.ProbeRows) this layer's index scores, kept keys and query row go into
        its row (the stats are computed for every layer at once after the last). Needs
        pos + 1 > top-k (graphs.py serves shorter rows dense)."""
        layer = cache.layer_id
        _, H, _, D = q.shape
        G = H // self.n_kv
        iq = self.index_query(q)
        in_place = False
        if self.index_dtype == "fp32" or self.bf16_read == "gather":
            qg = iq[0].view(self.n_kv, G, 1, D).transpose(1, 2)               # [Hkv, 1, G, D]
            scores = None
            for g in range(self.n_kv):
                if self.index_dtype == "fp32":
                    lg = self._torch_scores(self.keys32[layer, g, :W], qg[g])
                    attest.record("decode_logits", "fp32", "torch.matmul")
                else:
                    pages = self.pool.gather_per_query(layer, g, 1, W)        # [1, W, D] bf16
                    raw = torch.bmm(qg[g].to(torch.bfloat16), pages.transpose(1, 2))[:, :, :W]
                    lg = raw.float().relu_().sum(1).mul_((self.n_kv * G * self.dim) ** -0.5)
                    attest.record("decode_logits", "bf16", "niah.bf16_gather_bmm")
                scores = lg if scores is None else scores.add_(lg)
            scores = scores.masked_fill_(~valid[None, :], float("-inf"))       # [1, W]
        else:
            out = self.paged_decode_logits(layer, iq[0, :, 0].view(self.n_kv, 1, G, D), ctx, W)   # [Hkv, W]
            if rows is not None:                   # the probe's row written in place: no copy
                scores = torch.sum(out, 0, keepdim=True, out=rows.scores[layer:layer + 1])
                in_place = True
            else:
                scores = out.sum(0, keepdim=True)                                  # [1, W]
        idx = self.select(scores)                                              # [1, K]
        if rows is not None:
            rows.put(layer, cache, idx[0], q[0, :, 0], None if in_place else scores[0])
        return sparse_attention(q, cache.k, cache.v, idx)

    # -- selection --------------------------------------------------------------------------
    def select(self, scores: torch.Tensor) -> torch.Tensor:
        """scores [C, S] (-inf = not a candidate) -> kept positions int32 [C, min(K, S)], -1 pads."""
        k = min(self.topk, scores.shape[1])
        if self.topk_impl == "torch":
            attest.record("topk", "fp32", "torch.topk")
        else:
            attest.record("topk", "fp32", "niah.topk_indices")
        if self.topk_impl != "torch":
            return topk_indices(scores, k)
        top = scores.topk(k, dim=-1, sorted=False)
        return torch.where(torch.isneginf(top.values), -1, top.indices).to(torch.int32)

    # -- the attention (installed by Transformer.set_attention) ----------------------------
    def _prefill_select(self, layer: int, iq: torch.Tensor, p0: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Kept positions of the C queries of iq ([1, H, C, D] at p0..p0+C-1): int32 [C, min(K, p0+C)]
        (-1 pads), scored `score_rows` rows at a time; and the last row's scores [p0 + C]."""
        C = iq.shape[2]
        if self.topk_impl == "fused":
            idx = self._fused_select(layer, iq, p0)
            if idx is not None:
                return idx, None
        rows = self.score_rows(p0 + C)
        if rows >= C:
            scores = self.prefill_scores(layer, iq, p0)
            return self.select(scores), scores[-1]
        # the fused read (the gather takes the whole chunk): the query quantised and padded once
        # a chunk, each call a slice of its rows over the keys up to its last row's (fp32 keys:
        # each call scored on its own)
        inputs = self._score_inputs(iq)
        idx = torch.full((C, min(self.topk, p0 + C)), -1, dtype=torch.int32, device=iq.device)
        for r0 in range(0, C, rows):
            r1 = min(C, r0 + rows)
            scores = self._call_scores(layer, inputs, iq, p0, r0, r1)
            part = self.select(scores)
            idx[r0:r1, :part.shape[1]] = part
        return idx, scores[-1]

    def _fused_select(self, layer: int, iq: torch.Tensor, p0: int) -> torch.Tensor | None:
        """Kept positions of iq's C rows from the fused indexer + top-k, or None when a row is not
        ok (its bracket missed, its buffer overflowed or failed its check; the caller then scores
        the chunk unfused)."""
        q, w = self.kernel_query(iq)
        idx, ok = indexer_topk(q, w, self.pool.layer(layer), self.pool.block_table, p0, self.topk, self.index_dtype,
                               cap=self.fused_cap)
        attest.record("prefill_logits", self.index_dtype, "niah.indexer_topk")
        attest.record("topk", "fp32", "niah.indexer_topk")
        self.fused_calls["calls"] += 1
        if bool(ok.all()):
            return idx
        self.fused_calls["fallbacks"] += 1          # the unfused kernels then attest their own calls
        self.fused_calls["fallback_rows"] += int((~ok).sum())
        return None

    def __call__(self, q: torch.Tensor, cache: LayerCache, start: int) -> torch.Tensor:
        _, H, T, D = q.shape
        S = start + T
        needle = cache.stats.get("needle_positions")
        probe = cache.stats.get("probe")
        if S <= self.topk and self.dense_when_short:                      # everything kept: dense
            if needle is not None:
                cache.stats.setdefault("selection_recall", {})[cache.layer_id] = 1.0
            if probe is not None:
                probe.record(cache.layer_id, S - 1, S, None)
            return dense_attention(q, cache, start)
        out = torch.empty_like(q)
        iq = self.index_query(q)
        for a0 in range(0, T, self.chunk):
            c1 = min(T, a0 + self.chunk)
            c0 = a0 + self._dense_rows(start + a0, c1 - a0)   # the chunk's first row that selects
            if c0 > a0:                            # rows at positions < K keep every key: dense
                out[:, :, a0:c0] = dense_attention(q[:, :, a0:c0], cache, start + a0)
            if c0 == c1:                           # (the last chunk always has a row that selects)
                continue
            p0 = start + c0
            if c1 - c0 == 1 and p0 > 0:
                scores = self.decode_scores(cache.layer_id, iq[:, :, c0:c1], p0 + 1)
                idx, last = self.select(scores), scores[-1]
            else:
                idx, last = self._prefill_select(cache.layer_id, iq[:, :, c0:c1], p0)      # [C, K], [p0 + C]
            if c1 == T and (needle is not None or probe is not None):
                if probe is not None and last is None:   # the fused select wrote no scores: the last row's, unfused
                    last = self.prefill_scores(cache.layer_id, iq[:, :, c1 - 1:c1], p0 + c1 - c0 - 1)[-1]
                self._last_row(cache, idx[-1], q[0, :, c1 - 1], last if probe is not None else None,
                               p0 + c1 - c0, needle, probe)
            out[:, :, c0:c1] = sparse_attention(q[:, :, c0:c1], cache.k, cache.v, idx, end=p0 + c1 - c0)
        return out

    def _dense_rows(self, p0: int, n: int) -> int:
        """How many of n rows at positions p0.. keep every key (position < K) and so attend
        densely, as the whole prompt does while it is no longer than K: the same keys as the
        sparse kernel's, in another order of sums. 0 with dense_when_short off (tests)."""
        return max(0, min(n, self.topk - p0)) if self.dense_when_short else 0

    def _last_row(self, cache: LayerCache, idx_row: torch.Tensor, q_row: torch.Tensor,
                  scores_row: torch.Tensor | None, S: int, needle, probe) -> None:
        """The last prompt row of a layer into this forward's ProbeRows (made at layer 0);
        after the last layer every layer's selection recall (a device scalar each, read once
        after the prefill: generate.selection_recall) and probe stats, all layers at once."""
        layer = cache.layer_id
        if layer == 0 or self._rows is None:
            self._rows = ProbeRows(self.n_layer, S, idx_row.shape[0], q_row.shape[0], q_row.shape[1], q_row.device)
        rows = self._rows
        rows.put(layer, cache, idx_row, q_row, scores_row)
        if layer != self.n_layer - 1:
            return
        self._rows = None
        if needle is not None:
            a, b = needle
            rec = rows.recall(a, b) if b > a else None
            got = cache.stats.setdefault("selection_recall", {})
            for i in range(self.n_layer):
                got[i] = 1.0 if rec is None else rec[i]
        if probe is not None:
            a, b = probe.span
            if b > a:
                stats = rows.stats(self.n_kv, self.topk, torch.tensor([a, b], device=q_row.device))
            else:
                stats = torch.full((self.n_layer, len(STAT_KEYS)), float("nan"), dtype=torch.float64,
                                   device=q_row.device)
            for i in range(self.n_layer):
                probe.record(i, S - 1, S, stats[i])

    def exact_scores(self, q_row: torch.Tensor, cache: LayerCache, S: int,
                     out: torch.Tensor | None = None) -> torch.Tensor:
        """The probe's reference (as the CPU server's): the unrotated query row [1, H, 1, D]
        against the fp32 keys of the KV cache -> [S] (written into `out` when given)."""
        _, H, _, D = q_row.shape
        G = H // self.n_kv
        k = cache.k[0, :, :S]                                              # [Hkv, S, D]
        raw = torch.matmul(q_row[0, :, 0].view(self.n_kv, G, D), k.transpose(1, 2))   # [Hkv, G, S]
        return torch.sum(raw.relu_(), (0, 1), out=out).mul_((H * D) ** -0.5)

    def describe(self) -> dict:
        d = {"attention": "dsa", "index_dtype": self.index_dtype, "index_rotation": self.rotation,
             "index_topk": self.topk, "window": 0, "query_chunk": self.chunk, "topk": self.topk_impl,
             "score_bytes": self.score_bytes}
        if self.index_dtype == "bf16":
            d["bf16_read"] = self.bf16_read
        return d
