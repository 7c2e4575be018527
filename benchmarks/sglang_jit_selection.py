"""Which tokens the V3.2 indexer selects, per key/query precision, against a float64 indexer:
production fp8 and its variants written by SGLang 0.5.23's own JIT kernels, bf16 read by niah's.

Inputs (identical for every arm of one seed):
  keys   key_raw [N, 128] bf16, a strided view of a [N, 192] `wk_weights_proj` output (as the
         fused path passes it): N(0, 1) channels plus OUTLIER_CHANNELS persistent outlier
         channels, like LLM activation outliers that survive the LayerNorm: one fixed sign and
         magnitude m ~ U(8, 16) per channel for every token, times (1 + 0.1 N(0, 1)) per token,
         2 of them in the rope half (dims 0..63) and 2 in the nope half; LayerNorm gamma
         1 + 0.1 N(0, 1), beta 0.05 N(0, 1), eps 1e-6; RoPE theta 10,000 on dims 0..63.
  query  q [rows, 64, 128] bf16 N(0, 1) (no outliers); head gates weights_raw [rows, 64] bf16
         N(0, 1); softmax_scale * n_heads^-0.5 as SGLang's q_scale_gate.
Arms (logits by niah's kernels, top-k by SGLang's topk_v2 in every arm):
  fp8            production: SGLang's fused key store (LayerNorm, RoPE, no Hadamard, fp8 +
                 amax/448 scale) and SGLang's fused fp8 query (scale folded into the gates)
  fp8_hadamard   the unfused path (SGLANG_DISABLE_DSA_INDEXER_FUSION=1): SGLang's Hadamard JIT
                 on keys and queries, then its act_quant (block 128, ue8m0 scales, as V3.2's
                 scale_fmt); the keys rotated are the fused kernel's bf16 pre-quantisation values
                 and the query the bf16 one below (the unfused LayerNorm/RoPE modules round to
                 bf16 after each step: not reproduced)
  bf16_q8        bf16 keys (pre-quantisation values), SGLang's fp8 query upcast to bf16
  bf16_q16       bf16 keys, bf16 query (RoPE in fp32, rounded once to bf16)
Reference: float64 LayerNorm/RoPE/score on the same raw inputs, sum_h w_h relu(q_h . k).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_jit_ops import layer_norm, rope_first, write_fp8_pages

HEADS, DIM, PAGE = 64, 128, 64
EPS, THETA = 1e-6, 10000.0
OUTLIER_CHANNELS = (5, 40, 77, 110)
GATE = DIM**-0.5 * HEADS**-0.5  # q_scale_gate = softmax_scale * n_heads ** -0.5
ARMS = ("fp8", "fp8_hadamard", "bf16_q8", "bf16_q16")


def cos_sin_cache(max_pos: int, device) -> torch.Tensor:
    """RotaryEmbedding's cos_sin_cache: fp32 [max_pos, 64] = cat(cos, sin) of pos * theta^(-2i/64)."""
    inv = THETA ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat((ang.cos(), ang.sin()), 1).float().to(device)


def make_keys(n: int, g: torch.Generator) -> torch.Tensor:
    """key_raw [n, 128] bf16 with persistent outlier channels, a view of a [n, 192] buffer."""
    kw = torch.randn(n, DIM + HEADS, generator=g)
    for c in OUTLIER_CHANNELS:
        m = (8 + 8 * torch.rand((), generator=g)) * (1 if torch.rand((), generator=g) < 0.5 else -1)
        kw[:, c] = m * (1 + 0.1 * torch.randn(n, generator=g))
    return kw.bfloat16()[:, :DIM]


def make_norm(g: torch.Generator):
    return 1 + 0.1 * torch.randn(DIM, generator=g), 0.05 * torch.randn(DIM, generator=g)


@dataclass
class Batch:
    """One seed's inputs on `device`. Decode: one query row per request at its last position;
    prefill: the last `rows` positions of each request (ragged, flattened keys)."""

    lens: list
    prefill_rows: int  # 0 = decode
    device: str
    seed: int

    def __post_init__(self):
        g = torch.Generator().manual_seed(self.seed)
        d = self.device
        self.n = sum(self.lens)
        self.key_raw = make_keys(self.n, g).to(d)
        w, b = make_norm(g)
        self.ln_w, self.ln_b = w.to(d), b.to(d)
        pages = [-(-n // PAGE) for n in self.lens]
        perm = torch.randperm(sum(pages) + 2, generator=g)[: sum(pages)]
        self.n_pages = sum(pages) + 2
        self.table = torch.zeros(len(self.lens), max(pages), dtype=torch.int32)
        self.start, pos, loc, at = [], [], [], 0
        for r, (n, p) in enumerate(zip(self.lens, pages)):
            self.table[r, :p] = perm[at:at + p].int()
            at += p
            self.start.append(sum(self.lens[:r]))
            i = torch.arange(n)
            pos.append(i)
            loc.append(self.table[r, i // PAGE].long() * PAGE + i % PAGE)
        self.table, self.pos, self.loc = self.table.to(d), torch.cat(pos).to(d), torch.cat(loc).to(d)
        if self.prefill_rows:
            self.q_req = torch.arange(len(self.lens)).repeat_interleave(self.prefill_rows)
            self.q_pos = torch.cat([torch.arange(n - self.prefill_rows, n) for n in self.lens])
        else:
            self.q_req, self.q_pos = torch.arange(len(self.lens)), torch.tensor(self.lens) - 1
        rows = self.q_req.numel()
        self.q = torch.randn(rows, HEADS, DIM, generator=g).bfloat16().to(d)
        self.weights_raw = torch.randn(rows, DIM + HEADS, generator=g).bfloat16()[:, DIM:].to(d)  # kw's gate slice
        self.q_req, self.q_pos = self.q_req.to(d), self.q_pos.to(d)
        self.cos_sin = cos_sin_cache(max(self.lens) + 1, d)
        self.ks = torch.tensor(self.start, device=d)[self.q_req].int()  # flattened key window start
        self.visible = (self.q_pos + 1).int()  # keys 0..pos of the request

    def req_keys(self, r: int, rows_of_all: torch.Tensor) -> torch.Tensor:
        """Request r's keys in position order from a tensor indexed like key_raw."""
        return rows_of_all[self.start[r]:self.start[r] + self.lens[r]]


def float64_logits(b: Batch, k64: torch.Tensor, q64: torch.Tensor, w64: torch.Tensor) -> torch.Tensor:
    """[rows, max_len] float64 index scores over each row's visible keys (-inf elsewhere)."""
    width = max(b.lens)
    out = torch.full((q64.shape[0], width), float("-inf"), dtype=torch.float64, device=q64.device)
    for r in range(len(b.lens)):
        rows = (b.q_req == r).nonzero().flatten()
        keys = b.req_keys(r, k64)
        for c in range(0, rows.numel(), 16):
            rr = rows[c:c + 16]
            s = (torch.relu(torch.einsum("rhd,nd->rhn", q64[rr], keys)) * w64[rr, :, None]).sum(1)
            vis = torch.arange(keys.shape[0], device=s.device)[None, :] < b.visible[rr, None]
            out[rr, : keys.shape[0]] = s.masked_fill(~vis, float("-inf"))
    return out


def reference(b: Batch) -> torch.Tensor:
    """The float64 indexer on the raw inputs (LayerNorm, RoPE, no quantisation, no rotation)."""
    cs = b.cos_sin.double()
    k64 = rope_first(layer_norm(b.key_raw.double(), b.ln_w.double(), b.ln_b.double(), EPS), cs, b.pos)
    q64 = rope_first(b.q.double(), cs, b.q_pos)
    return float64_logits(b, k64, q64, b.weights_raw.double() * GATE)


def overlap(sel: torch.Tensor, ref: torch.Tensor, lens: torch.Tensor, k: int):
    """Per row |sel & top-k(ref)| / k for rows with more than k visible keys: (mean, min, rows)."""
    keep = lens > k
    if not bool(keep.any()):
        return None
    ref_idx = ref[keep].topk(k, dim=1).indices
    mask = torch.zeros(ref_idx.shape[0], ref.shape[1] + 1, dtype=torch.bool, device=ref.device)
    mask.scatter_(1, ref_idx, True)
    s = sel[keep].long()
    s = torch.where(s < 0, ref.shape[1], s)
    hits = mask.gather(1, s).sum(1).double() / k
    return float(hits.mean()), float(hits.min()), int(keep.sum())


def valid_selection(sel: torch.Tensor, lens: torch.Tensor, k: int) -> bool:
    """Every row holds min(k, len) distinct in-range positions, -1 after them."""
    n = torch.clamp(lens.long(), max=k)
    ok = (sel >= -1).all() and (sel < lens[:, None]).all()
    count = (sel >= 0).sum(1)
    srt = sel.sort(1).values
    dup = ((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any()
    return bool(ok and (count == n).all() and not dup)


class Arms:
    """Keys and queries of every arm for one Batch, written by SGLang's kernels (`ops`) and
    niah's store (`niah_store`, or SGLang's pre-quantisation values when niah has none)."""

    def __init__(self, b: Batch, ops, niah_store=None):
        self.b, self.ops = b, ops
        d, n_pages = b.device, b.n_pages
        self.cache8 = torch.zeros(n_pages, 132 * PAGE, dtype=torch.uint8, device=d)
        ops.k_norm_rope_store(b.key_raw, self.cache8, b.loc, b.ln_w, b.ln_b, EPS, b.cos_sin, b.pos, PAGE)
        self.pre = ops.k_norm_rope(b.key_raw, b.ln_w, b.ln_b, EPS, b.cos_sin, b.pos)  # [N, 128] bf16
        self.cache16 = torch.zeros(n_pages, 256 * PAGE, dtype=torch.uint8, device=d)
        if niah_store is not None:
            niah_store(b.key_raw, self.cache16, b.loc, b.ln_w, b.ln_b, EPS, b.cos_sin, b.pos, page_size=PAGE,
                       index_dtype="bf16")
            self.keys16_by = "niah.store_v32_index_keys"
        else:
            self.cache16.view(torch.bfloat16).view(-1, DIM)[b.loc] = self.pre
            self.keys16_by = "sglang.fused_k_indexer_norm_rope (niah's V3.2 store not available)"
        rot = ops.hadamard(self.pre, DIM**-0.5)
        k8r, sr = ops.act_quant(rot.contiguous(), 128, "ue8m0")
        self.cache8r = torch.zeros_like(self.cache8)
        write_fp8_pages(self.cache8r, b.loc, k8r, sr.squeeze(-1), PAGE)
        q8, w8 = ops.q_rope_quant(b.q.contiguous(), b.weights_raw, GATE, b.cos_sin, b.q_pos)
        self.q16 = rope_first(b.q.float(), b.cos_sin, b.q_pos).bfloat16()
        qh = ops.hadamard(self.q16, DIM**-0.5)
        q8r, qsr = ops.act_quant(qh.contiguous(), 128, "ue8m0")
        w = b.weights_raw.float() * GATE
        self.queries = {"fp8": (q8, w8.squeeze(-1)), "fp8_hadamard": (q8r, w * qsr.squeeze(-1)),
                        "bf16_q8": (q8.bfloat16(), w8.squeeze(-1)), "bf16_q16": (self.q16, w)}

    def logits(self, arm: str) -> torch.Tensor:
        from niah import kernels

        b = self.b
        q, w = self.queries[arm]
        fp8 = arm.startswith("fp8")
        cache = {"fp8": self.cache8, "fp8_hadamard": self.cache8r}.get(arm, self.cache16)
        if not b.prefill_rows:
            width = b.table.shape[1] * PAGE
            ctx = b.visible.contiguous()
            if fp8:
                return kernels.fp8_paged_mqa_logits(q[:, None], cache.view(-1, PAGE, 1, DIM + 4), w, ctx, b.table,
                                                    None, width)
            return kernels.bf16_paged_mqa_logits(q[:, None], cache.view(torch.bfloat16).view(-1, PAGE, 1, DIM), w,
                                                 ctx, b.table, None, width)
        ks, ke = b.ks, b.ks + b.visible
        if fp8:
            k8, sf = self.gather_fp8(cache)
            return kernels.fp8_mqa_logits(q, (k8, sf), w, ks, ke, clean_logits=False)
        k16 = cache.view(torch.bfloat16).view(-1, DIM)[b.loc]
        return kernels.bf16_mqa_logits(q, k16, w, ks, ke, clean_logits=False)

    def gather_fp8(self, cache: torch.Tensor):
        """The flattened (k8 [N, 128], scale [N]) SGLang's get_index_k_scale_buffer gathers."""
        b = self.b
        pg, off = b.loc // PAGE, b.loc % PAGE
        base = pg * cache.shape[1]
        vals = cache.view(-1)[(base + off * DIM)[:, None] + torch.arange(DIM, device=cache.device)]
        sc = cache.view(-1)[(base + PAGE * DIM + off * 4)[:, None] + torch.arange(4, device=cache.device)]
        return vals.view(torch.float8_e4m3fn), sc.contiguous().view(torch.float32).flatten()

    def stored_float64(self, arm: str) -> torch.Tensor:
        """float64 logits of exactly what this arm stored and queries with (for top-k fidelity)."""
        b = self.b
        q, w = self.queries[arm]
        if arm.startswith("fp8"):
            k8, sf = self.gather_fp8({"fp8": self.cache8, "fp8_hadamard": self.cache8r}[arm])
            k = k8.double() * sf.double()[:, None]
        else:
            k = self.cache16.view(torch.bfloat16).view(-1, DIM)[b.loc].double()
        return float64_logits(b, k, q.double(), w.double())

    def positions(self, logits: torch.Tensor) -> torch.Tensor:
        """An arm's logits as [rows, max_len] by position in the request, 0 where not visible."""
        b = self.b
        width = max(b.lens)
        p = torch.arange(width, device=logits.device)[None, :]
        vis = p < b.visible[:, None]
        if b.prefill_rows:
            logits = logits.gather(1, (b.ks[:, None] + p).clamp_max(logits.shape[1] - 1).long())
        return torch.where(vis, logits[:, :width].double(), 0.0)

    def select(self, logits: torch.Tensor, k: int) -> torch.Tensor:
        """SGLang's topk_v2 as the DSA backend calls it; returns positions within the request."""
        b, ops = self.b, self.ops
        if not b.prefill_rows:
            meta = type("M", (), {})()
            meta.real_page_table, meta.page_size = b.table, PAGE
            meta.topk_v2_plan = ops.plan_topk_v2(b.visible)
            slots = ops.topk_paged(logits, b.visible, k, meta)
            page_pos = torch.full((b.n_pages,), -1, dtype=torch.long, device=slots.device)
            for r in range(len(b.lens)):
                p = -(-b.lens[r] // PAGE)
                page_pos[b.table[r, :p].long()] = torch.arange(p, device=slots.device)
            s = slots.long()
            return torch.where(s >= 0, page_pos[(s // PAGE).clamp_min(0)] * PAGE + s % PAGE, -1)
        out = ops.topk_ragged(logits, b.visible, k, b.ks, b.ks)
        return torch.where(out >= 0, out.long() - b.ks[:, None], -1)


def summarize(values: list) -> dict:
    """mean and range over seeds of per-seed mean overlaps (None entries: trivial)."""
    v = [x for x in values if x is not None]
    if not v:
        return {"trivial": True}
    means = [x[0] for x in v]
    return {"mean": sum(means) / len(means), "min_seed_mean": min(means), "max_seed_mean": max(means),
            "worst_row": min(x[1] for x in v), "rows_per_seed": v[0][2], "seeds": len(v)}
