"""DeepSeek-style sparse attention (DSA), emulated on a dense GQA model.

Per layer and per query token t (at position p):

    I[t, s] = sum_h w_h * ReLU(q[t, h] . k~[s, g(h)])        s <= p   (fp32 accumulate)

q are the layer's own post-RoPE queries; k~ are the layer's own post-RoPE keys as stored
in the index cache and read back (niah.kernels.quant.store_roundtrip: fp8 e4m3 with one
fp32 scale per token and kv head, the SGLang format; bf16; or fp32 = exact). The
precisions (precision.py): `index_dtype` "fp8+bf16" is two-stage selection (the store
keeps both forms; fp8 scores every key, its c*k best are re-scored from their bf16 rows,
the k best of those are kept; c = `rescore_factor`; keys whose coarse score is a ReLU tie
at 0 enter the candidates by their largest coarse head product: selection.candidate_order);
`query_dtype` quantises the index query (fp32, the default; bf16; fp8 as SGLang's fused
V3.2 query).

GQA design choice: SmolLM2 has 9 query heads sharing 3 kv heads. DeepSeek's indexer has
one shared index key per token; here each query head h is scored against the key of its
OWN group g(h) = h // 3 (the key that head really attends to), and the nine ReLU'd dot
products are summed with uniform weights w_h = H^-0.5 * D^-0.5 (no trained weights_proj
exists in this model; a uniform positive scale does not change the top-k). One selection
per token, shared by all heads, as in DSA. The index query is fp32 unless `query_dtype`
says otherwise (quantised after the rotation, as SGLang quantises its query).

Rotation (`rotation="hadamard"`, DeepSeek's reference indexer): the index query and the
key are multiplied by the normalised Hadamard matrix of the head dimension before the
key store's quantisation (niah.kernels.rotation), so the index cache holds rotated
keys and each chunk's index query is rotated once. q.k is unchanged in exact
arithmetic; only what fp8 rounding loses changes. "none" (the default) is what SGLang
0.5.23's fused V3.2 path serves. The probe's exact reference is the same for every arm:
the unrotated, unquantised query against the unrotated fp32 keys of the KV cache.

Selection: the top-K causal keys by I (all of them while the context p+1 <= K, as SGLang
does), plus the last W positions when W > 0. The main attention then reads only the kept
keys: an additive mask per query chunk fed to SDPA (rows 128 at a time; when their kept
keys are few, only that union of columns is gathered). Memory stays bounded: scores exist
for one chunk of `chunk` queries at a time ([chunk, S], plus the per-head products of one
256-key tile, [H, chunk, 256]; reused buffers), never [H, T, S]. Decode steps run the same
code with one query against the cached index keys.

The index cache holds each key as the indexer reads it back (fp32 values after the
store round-trip): numerically the same as keeping e4m3 + scale and dequantising on read.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from niah.kernels.rotation import ROTATIONS, rotate
from niah.serving.embedded import compress as compression
from niah.serving.embedded import faults as faults_mod
from niah.serving.embedded import precision, selection
from niah.serving.embedded.faults import Faults
from niah.serving.embedded.index_cache import FlatKeys
from niah.serving.embedded.model import LayerCache, dense_attention
from niah.serving.embedded.probe import row_stats
from niah.serving.sglang import attest


def attestation() -> dict | None:
    """What this process's attention ran (the same record SGLang's plugin reports, with
    the facts attention, index_topk, window), or None when nothing was configured."""
    snap = attest.snapshot()
    return snap if snap["index_dtype"] or snap["facts"] else None


TILE = 256      # key columns per indexer step (the dot products of one tile stay in cache)


class DSA:
    name = "dsa"

    def __init__(self, index_dtype: str = "fp8", topk: int = 512, window: int = 0, chunk: int = 512,
                 dense_when_short: bool = True, sub: int = 128, rotation: str = "none",
                 query_dtype: str = precision.DEFAULT_QUERY_DTYPE,
                 rescore_factor: int = precision.DEFAULT_RESCORE_FACTOR, keys=None, compress: int = 1,
                 faults: Faults | None = None, rope_base: float = 100000.0):
        self.coarse, self.fine = precision.stages(index_dtype)      # ValueError for an unknown dtype
        if compress not in (1, compression.RATIO) or (compress > 1 and self.fine is not None):
            raise ValueError(f"index compression is 1 (off) or {compression.RATIO} with a single-stage index dtype")
        if rotation not in ROTATIONS:
            raise ValueError(f"index rotation must be one of {ROTATIONS}, not {rotation!r}")
        if query_dtype not in precision.query_dtypes():
            raise ValueError(f"index query dtype must be one of {precision.query_dtypes()}, not {query_dtype!r}")
        if topk < 1 or window < 0 or chunk < 1 or rescore_factor < 1:
            raise ValueError("topk must be >= 1, window >= 0, chunk >= 1, rescore_factor >= 1")
        self.index_dtype, self.topk, self.window, self.chunk = index_dtype, topk, window, chunk
        self.rotation, self.query_dtype, self.rescore_factor = rotation, query_dtype, rescore_factor
        self.keys = keys if keys is not None else FlatKeys()         # index_cache: flat or paged
        self.owns_index_keys = self.keys.page_size is not None      # paged: no cache.idx_k
        self.compress, self.faults, self.rope_base = compress, faults or Faults(), rope_base
        self.select_k = self.faults.topk or topk                    # the `topk` fault's k, else index_topk
        self._offset = 0                                            # the `residue` fault, this request
        attest.configure(index_dtype, "torch")
        attest.set_facts(attention="dsa", index_topk=topk, window=window, rotation=rotation, query=query_dtype,
                         **({"rescore_factor": rescore_factor} if self.fine else {}))
        self._raw = self._tile = self._sum = self._mask = self._floor = None
        # While the context is <= K every key is kept, so SGLang (and we) run plain dense
        # attention there. False forces the indexer path anyway (tests use it).
        self.dense_when_short = dense_when_short
        self.sub = sub      # rows per attention call (union-of-kept-keys gather); 0 = whole chunk

    # -- the index-key cache ------------------------------------------------------------
    def store(self, cache: LayerCache, k: torch.Tensor, start: int) -> None:
        """k: [1, Hkv, T, D] post-RoPE keys -> the index cache at start..start+T-1 as read
        back (rotated first when the rotation is "hadamard"); compressed, the blocks this
        write completes (compress.py) at their block rows."""
        T = k.shape[2]
        attest.set_pool_bytes(precision.key_bytes(self.index_dtype, k.shape[1], k.shape[3]))
        row = start
        if self.compress > 1:
            blocks = compression.new_blocks(start, T, self._offset)
            if not len(blocks):
                return
            row, a = blocks.start, blocks.start * compression.RATIO + self._offset
            k = cache.k[:, :, a:a + len(blocks) * compression.RATIO]
            k = self._rope_fault(k, a).reshape(1, k.shape[1], len(blocks), compression.RATIO, -1).mean(3)
        else:
            k = self._rope_fault(k, start)
        kr = rotate(k[0], self.rotation)
        attest.record("store", self.coarse, "niah.store_roundtrip")
        self.keys.write(cache, 0, row, selection.store_form(kr, self.coarse))
        if self.fine is not None:                                   # two-stage: the re-score form too
            attest.record("store", self.fine, "niah.store_roundtrip")
            self.keys.write(cache, 1, row, selection.store_form(kr, self.fine))

    def _rope_fault(self, k: torch.Tensor, start: int) -> torch.Tensor:
        """The `rope-base` fault: keys at positions start.. as another RoPE base rotates them."""
        return k if self.faults.rope_base is None else faults_mod.rerope(k, start, self.rope_base,
                                                                          self.faults.rope_base)

    def fine_keys(self, cache: LayerCache) -> torch.Tensor:
        """The layer's re-score-form keys [Hkv, block_size, D] (two-stage, flat keys), allocated once."""
        return self.keys.rows(cache, 1)

    def begin_request(self, n_prompt: int) -> None:
        """A new request of n_prompt prompt tokens (generate.prefill): a new sequence of pages;
        the `residue` fault's block offset for this prompt length."""
        begin = getattr(self.keys, "begin", None)
        if begin is not None:
            begin()
        r = self.faults.residue
        self._offset = 1 if r is not None and n_prompt % compression.RATIO == r else 0

    def read_keys(self, cache: LayerCache, form: int, rows: int, decode: bool = False) -> torch.Tensor:
        """The first `rows` index keys of one form [Hkv, rows, D], as the indexer reads them
        (the `layout` fault: in the shuffled layout where the context exceeds its N)."""
        got = self.keys.read(cache, form, rows, decode)
        n = self.faults.layout
        if n is not None and rows * self.compress > n:
            got = got[..., faults_mod.shuffled(got.shape[-1])]
        return got

    def index_query(self, q: torch.Tensor) -> torch.Tensor:
        """q: [1, H, C, D] post-RoPE -> the index query (rotated like the stored keys, then
        quantised to query_dtype), fp32."""
        q = rotate(q, self.rotation) if self.rotation != "none" else q
        return selection.quantize_query(q, self.query_dtype)

    # -- the indexer --------------------------------------------------------------------
    def _buffers(self, C: int, S: int, Hkv: int, G: int) -> tuple[torch.Tensor, ...]:
        """Scratch reused across chunks and layers (fresh multi-100 MB allocations page-fault
        on every call and cost as much as the matmul): the per-head dot products of one
        column tile [Hkv, G*C, TILE] and its head sum [C, TILE] (both cache-sized), the index
        scores [C, S] and the additive attention mask [C, S]; two-stage, the largest head
        product of each score [C, S] too (the candidates' order among ReLU ties, or None)."""
        if self._raw is None or self._sum.shape[1] < S:
            cap = -(-S // 1024) * 1024
            self._raw = torch.empty(Hkv * G * self.chunk * TILE)      # per-head dot products, one tile
            self._tile = torch.empty(self.chunk * TILE)               # head sum of one tile
            self._sum = torch.empty(self.chunk, cap)                  # index scores
            self._mask = torch.empty(self.chunk, cap)                 # additive attention mask
            self._floor = torch.empty(self.chunk, cap) if self.fine is not None else None
        floor = self._floor.view(-1)[:C * S].view(C, S) if self._floor is not None else None
        return (self._raw, self._tile, self._sum.view(-1)[:C * S].view(C, S),
                self._mask.view(-1)[:C * S].view(C, S), floor)

    def index_scores(self, q: torch.Tensor, idx_k: torch.Tensor, out: tuple | None = None,
                     p0: int | None = None, floor: torch.Tensor | None = None) -> torch.Tensor:
        """q: [1, H, C, D] (fp32), idx_k: [Hkv, S, D] -> I: [C, S] fp32 (no causal mask).

        I[c, s] = (H*D)^-0.5 * sum_h ReLU(q[c, h] . idx_k[s, h // G]).

        Computed TILE key columns at a time so the [Hkv, G*C, TILE] dot products stay in
        cache through ReLU and the head sum (one [Hkv, G*C, S] pass was ~1.4x slower: it
        streams 100+ MB through memory three times). Same arithmetic per element.
        With p0 (the position of row 0), tiles are not computed for rows that see none of
        their columns (s > p): those entries are left stale and the caller masks them.
        With floor ([C, S]), it receives w * max_h q[c, h] . idx_k[s, h // G] (before the
        ReLU; <= 0 exactly where I is 0), stale where I is."""
        _, H, C, D = q.shape
        Hkv, S, _ = idx_k.shape
        G = H // Hkv
        if out is None:
            out = (torch.empty(H * C * TILE), torch.empty(C * TILE), torch.empty(C, S))
        raw_buf, tile_buf, tot = out[:3]
        qg = q[0].reshape(Hkv, G * C, D)                           # [Hkv, G*C, D], head h -> group h // G
        w = torch.full((1, H), (H * D) ** -0.5)                     # w_h, uniform
        for s0 in range(0, S, TILE):
            n = min(TILE, S - s0)
            r = 0 if p0 is None else min(C - 1, max(0, s0 - p0))   # rows < r see no column >= s0
            A = C - r
            qr = qg if r == 0 else q[0, :, r:].reshape(Hkv, G * A, D)      # [Hkv, G*A, D]
            raw = raw_buf[:H * A * n].view(Hkv, G * A, n)
            torch.bmm(qr, idx_k[:, s0:s0 + n].transpose(1, 2), out=raw)   # [Hkv, G*A, n]
            if floor is not None:
                floor[r:, s0:s0 + n] = raw.view(H, A, n).amax(0).mul_((H * D) ** -0.5)
            raw.relu_()
            part = tile_buf[:A * n].view(A, n)
            torch.mm(w, raw.view(H, A * n), out=part.view(1, A * n))      # [A, n]; 2.5x faster than sum(0)
            tot[r:, s0:s0 + n] = part
        return tot

    def keep_mask(self, q: torch.Tensor, idx_k: torch.Tensor, p0: int, bufs: tuple | None = None,
                  fine_k: torch.Tensor | None = None) -> torch.Tensor:
        """Additive mask of the kept keys for C queries at positions p0..p0+C-1, with
        idx_k: [Hkv, S, D], S = p0 + C. -> [C, S] fp32: 0 where kept, -inf elsewhere
        (causal; the top-K by index score, plus the last `window` positions).
        Two-stage (fine_k: the re-score-form keys [Hkv, S, D]): the top-K of the c*K
        best coarse candidates re-scored from fine_k; bufs[2]'s last row then holds that
        row's scores in the two-stage order (selection.composite_row, for the probe)."""
        C, S = q.shape[2], idx_k.shape[1]
        _, H, _, D = q.shape
        bufs = bufs or (torch.empty(H * C * TILE), torch.empty(C * TILE), torch.empty(C, S), torch.empty(C, S),
                        torch.empty(C, S) if fine_k is not None else None)
        mask = bufs[3]
        floor = None if fine_k is None else bufs[4] if bufs[4] is not None else torch.empty(C, S)
        future = torch.ones(C, C, dtype=torch.bool).triu_(1)       # [C, C]: s > p inside the diagonal block
        if S <= self.topk and self.dense_when_short:               # every row keeps all its (<= K) keys
            mask.zero_()
        else:
            scores = self.index_scores(q, idx_k, bufs, p0, floor)   # [C, S]; stale where s > p
            attest.record("decode_logits" if C == 1 and p0 > 0 else "prefill_logits", self.coarse,
                          "niah.embedded_index_scores")
            scores[:, p0:].masked_fill_(future, float("-inf"))      # only the diagonal block holds s > p
            attest.record("topk", "fp32", "torch.topk")
            if fine_k is None:
                top = scores.topk(min(self.select_k, S), dim=-1, sorted=False).indices   # [C, K]; rows p < K: -inf too
            else:
                top, cand, resc = selection.two_stage_top(q, scores, fine_k, self.select_k, self.rescore_factor,
                                                          floor)
                attest.record("decode_logits" if C == 1 and p0 > 0 else "prefill_logits", self.fine,
                              "niah.embedded_rescore")
                attest.record("topk", "fp32", "torch.topk")
                scores[-1] = selection.composite_row(scores[-1], cand[-1], resc[-1])
            mask.fill_(float("-inf")).scatter_(1, top, 0.0)
            if self.window > 0:
                rows = torch.arange(p0, S)[:, None]
                lo = max(0, p0 - self.window + 1)
                recent = torch.arange(lo, S)[None, :] > rows - self.window     # [C, S - lo]
                mask[:, lo:].masked_fill_(recent, 0.0)
        mask[:, p0:].masked_fill_(future, float("-inf"))
        return mask

    def select(self, q: torch.Tensor, idx_k: torch.Tensor, p0: int) -> torch.Tensor:
        """The kept keys as a bool [C, S] (for tests and diagnostics)."""
        return self.keep_mask(q, idx_k, p0) == 0

    # -- the attention (installed by Transformer.set_attention) -------------------------
    def __call__(self, q: torch.Tensor, cache: LayerCache, start: int) -> torch.Tensor:
        """q: [1, H, T, D] at positions start..start+T-1 -> [1, H, T, D]."""
        _, H, T, D = q.shape
        S = start + T
        needle = cache.stats.get("needle_positions")                # (a, b) token span or None
        probe = cache.stats.get("probe")                            # probe.ProbeLog or None
        if S // self.compress <= self.topk and self.dense_when_short:   # everything selected: dense
            if needle is not None:
                cache.stats.setdefault("selection_recall", {})[cache.layer_id] = 1.0
            if probe is not None:
                probe.record(cache.layer_id, S - 1, S, None)        # no selection happens here
            return dense_attention(q, cache, start)
        Hkv = cache.k.shape[1]
        decode = bool(cache.stats.get("decode"))                   # generate.decode_one's step (the decode-page fault)
        out = torch.empty_like(q)
        for c0 in range(0, T, self.chunk):
            c1 = min(T, c0 + self.chunk)
            Sc = start + c1                                         # keys visible to this chunk
            qc = q[:, :, c0:c1]                                     # [1, H, C, D]
            bufs = self._buffers(c1 - c0, Sc, Hkv, H // Hkv)
            if self.compress > 1:
                mask, row = self._compressed_mask(qc, cache, start + c0, Sc, decode)
            else:
                fine = self.read_keys(cache, 1, Sc, decode) if self.fine is not None else None
                mask = self.keep_mask(self.index_query(qc), self.read_keys(cache, 0, Sc, decode), start + c0, bufs,
                                      fine)                         # [C, Sc]
                row = bufs[2][-1]
            if needle is not None and c1 == T:                      # the last prompt token's row
                a, b = needle
                cache.stats.setdefault("selection_recall", {})[cache.layer_id] = (
                    (mask[-1, a:b] == 0).float().mean().item() if b > a else 1.0)
            if probe is not None and c1 == T:
                self._probe(probe, qc[:, :, -1:], cache, row.clone(), mask[-1] == 0)
            self._attend(qc, cache, mask, out[:, :, c0:c1])
        return out

    def _compressed_mask(self, qc: torch.Tensor, cache: LayerCache, p0: int, S: int,
                         decode: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """4:1 compression (compress.py): the additive [C, S] mask of C rows at p0.. from the
        top-k of their visible blocks, and the last row's scores as token scores (probe)."""
        nb = compression.visible(S, self._offset)
        scores = self.index_scores(self.index_query(qc), self.read_keys(cache, 0, nb, decode))     # [C, nb]
        attest.record("decode_logits" if qc.shape[2] == 1 and p0 > 0 else "prefill_logits", self.coarse,
                      "niah.embedded_index_scores")
        scores.masked_fill_(compression.block_causal(nb, p0, qc.shape[2], self._offset), float("-inf"))
        attest.record("topk", "fp32", "torch.topk")
        top = scores.topk(min(self.select_k, nb), dim=-1, sorted=False).indices
        return compression.token_mask(top, nb, p0, S, self.window), compression.token_scores(scores[-1], S)

    def _probe(self, probe, q_row: torch.Tensor, cache: LayerCache, scores: torch.Tensor, kept: torch.Tensor) -> None:
        """Record where the needle's value ranks for one query row (the chunk's last):
        scores/kept [S] as the selection saw them; exact-key scores from exact_scores.
        Compressed, ranks are in tokens: k is the tokens the row keeps."""
        S = scores.shape[0]
        k = int(kept.sum()) if self.compress > 1 else self.topk
        probe.record(cache.layer_id, S - 1, S, row_stats(scores, kept, self.exact_scores(q_row, cache, S), k,
                                                         probe.span))

    def exact_scores(self, q_row: torch.Tensor, cache: LayerCache, S: int) -> torch.Tensor:
        """The fidelity reference of one query row q_row [1, H, 1, D] (post-RoPE, NOT
        rotated) over its S causal keys: index scores against the fp32 keys of the KV
        cache (cache.k, never stored or rotated) -> [S]. The same for every index dtype,
        query dtype and rotation (rotating both sides would change it by fp32 rounding only)."""
        if self.compress > 1:                                       # the blocks of fp32 keys, as token scores
            nb = S // compression.RATIO
            blocks = cache.k[0, :, :nb * compression.RATIO].reshape(cache.k.shape[1], nb, compression.RATIO, -1)
            return compression.token_scores(self.index_scores(q_row, blocks.mean(2))[0], S)
        return self.index_scores(q_row, cache.k[0, :, :S])[0]

    def _attend(self, qc: torch.Tensor, cache: LayerCache, mask: torch.Tensor, out: torch.Tensor) -> None:
        """Attention of qc [1, H, C, D] over the kept keys (mask [C, Sc], additive) -> out.

        Rows are taken `sub` at a time; when the keys any of them keep are few (the union
        of their top-K sets), only those columns are gathered, so the attention costs
        C x union instead of C x Sc. Same result either way (masked columns get weight 0)."""
        C, Sc = mask.shape
        k, v = cache.k[:, :, :Sc], cache.v[:, :, :Sc]
        if self.sub <= 0 or Sc <= 2 * self.topk:
            out.copy_(F.scaled_dot_product_attention(qc, k, v, attn_mask=mask[None, None], enable_gqa=True))
            return
        p0 = Sc - C                                                 # position of row 0
        for r0 in range(0, C, self.sub):
            r1 = min(C, r0 + self.sub)
            n = p0 + r1                                             # keys visible to rows r0..r1-1
            k, v = cache.k[:, :, :n], cache.v[:, :, :n]             # later columns are all future
            m = mask[r0:r1, :n]                                     # [A, n]
            cols = (m == 0).any(0).nonzero().squeeze(1)             # [U] keys kept by any row
            if cols.numel() > 0.6 * n:
                o = F.scaled_dot_product_attention(qc[:, :, r0:r1], k, v, attn_mask=m[None, None], enable_gqa=True)
            else:
                o = F.scaled_dot_product_attention(
                    qc[:, :, r0:r1], k.index_select(2, cols), v.index_select(2, cols),
                    attn_mask=m.index_select(1, cols)[None, None], enable_gqa=True)
            out[:, :, r0:r1] = o

    def describe(self) -> dict:
        d = {"attention": "dsa", "index_dtype": self.index_dtype, "index_rotation": self.rotation,
             "index_query_dtype": self.query_dtype, "index_topk": self.topk, "window": self.window,
             "query_chunk": self.chunk}
        if self.compress > 1:
            d["index_compress"] = self.compress
        if self.fine is not None:
            d["rescore_factor"] = self.rescore_factor
        return d
