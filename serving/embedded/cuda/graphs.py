"""CUDA graphs for the GPU server's decode steps: one graph replay a generated token.

An eager decode step launches ~25 kernels a layer (dense) and ~150 with the indexer and its
probe (DSA): thousands of launches and host work per token, where the device work is a few
hundred microseconds. `DecodeGraphs.step(token, pos, probe)` runs the same step from a
captured graph instead, with everything that changes from step to step read on the device:

- static inputs, written before each replay: the token id, the position `pos` (RoPE rows by
  index_select, the KV cache written by index_copy_), the context length pos + 1 (the paged
  logits kernel's `context_lens`), the probed value span;
- shapes are fixed by a width W >= pos + 1 (a multiple of WIDTH_STEP, at most the context):
  dense attention reads the first W cache rows under the mask `s <= pos`; the indexer scores
  W positions (-inf from pos + 1 on: the paged kernel's clean logits, or the same mask), so
  the top-k keeps the same keys as the eager step (ties to the lowest positions);
- one graph per (W, mode), captured at its first use after one eager run of the same step on
  a side stream (compiles and allocates), all graphs sharing one memory pool (they never run
  concurrently). Modes: "dense" (dense arm), "short" (DSA arm while every key is kept,
  pos + 1 <= top-k: dense attention, index keys still stored), "dsa" (selection), "probe"
  (selection and the indexer probe's five stats per layer: each layer leaves its scores,
  kept keys and query row in a row of `ProbeRows` (probe_rows.py), which turns all the
  layers' rows into stats at once after the last layer).
- host work left a step: pages handed out when the token starts a page (pool.ensure, the
  block table written in place), four tiny fills, the replay, then the logits (and the
  probe's [layers, 5] stats) copied to pinned host buffers behind it and ONE wait: `step`
  returns host logits, so the caller's argmax queues no GPU work after the wait.

Attestation: the kernels' calls made while capturing are recorded as captured and tallied
for the graph, which gets one node counting its replays on the device (attest.graph_tally,
serving/sglang/attest.py): every replay adds the tally, so counts keep growing.
A step the graphs do not serve (a probe with an empty span, a context past the model's)
returns None and the caller runs the eager step. Numerics: the eager step's, up to the
order of floating-point sums (masked widths, the order the top-k returns its keys in).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from niah.serving.embedded.cuda.probe_rows import ProbeRows
from niah.serving.embedded.model import apply_rope
from niah.serving.sglang import attest

WIDTH_STEP = 2048
MAX_GRAPHS = 64


class DecodeGraphs:
    def __init__(self, model, attention=None, width_step: int = WIDTH_STEP, max_graphs: int = MAX_GRAPHS,
                 capture: bool = True):
        self.model, self.attn, self.capture = model, attention, capture   # capture False: the static step eagerly
        self.width_step, self.max_graphs = width_step, max_graphs
        dev = model.device
        self.tok = torch.zeros(1, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.ctx = torch.zeros(model.args.n_local_heads, dtype=torch.int32, device=dev)
        self.span = torch.zeros(2, dtype=torch.long, device=dev)
        self.graphs: dict = {}       # (W, mode) -> (graph, logits [1, 1, V], stats [layers, 5] or None)
        self.pool = None
        self.captures = self.replays = 0
        self.host: dict = {}         # name -> the host buffer a step's result is copied into (_to_host)

    def mode(self, pos: int, probe) -> str | None:
        if pos + 1 > self.model.args.block_size:
            return None
        if self.attn is None:
            return "dense"
        if pos + 1 <= self.attn.topk and self.attn.dense_when_short:
            return "short"
        if probe is None:
            return "dsa"
        a, b = probe.span
        return "probe" if b > a else None

    def width(self, pos: int) -> int:
        return min(self.model.args.block_size, -(-(pos + 1) // self.width_step) * self.width_step)

    @torch.inference_mode()
    def step(self, token: int, pos: int, probe=None) -> torch.Tensor | None:
        """Logits [V] of `token` fed at position pos, from a graph, on the host (CPU); None: run
        the eager step."""
        mode = self.mode(pos, probe)
        if mode is None:
            return None
        W = self.width(pos)
        if self.attn is not None and self.attn.pool is not None:
            self.attn.pool.ensure(pos + 1)
        self.tok.fill_(token)
        self.pos.fill_(pos)
        self.ctx.fill_(pos + 1)
        if mode == "probe":
            self.span[0].fill_(probe.span[0])
            self.span[1].fill_(probe.span[1])
        if self.capture:
            entry = self.graphs.get((W, mode))
            if entry is None:
                entry = self._capture(W, mode)
            graph, logits, stats = entry
            graph.replay()
            self.replays += 1
        else:
            logits, stats = self._forward(W, mode)
        # the logits and the probe's stats to the host by two copies queued behind the replay and
        # one wait: a step submits its GPU work once and waits once (the caller's argmax then
        # runs on the host; before, it and the probe's read each queued GPU work after a wait,
        # which six servers sharing a card each paid at the card's next turn)
        out = self._to_host("logits", logits[0, -1])
        rows = self._to_host("stats", stats) if probe is not None and stats is not None else None
        if out.is_pinned():
            torch.cuda.current_stream().synchronize()
        if probe is not None:
            rows = None if rows is None else rows.clone()
            for i in range(self.model.args.n_layer):
                probe.record(i, pos, pos + 1, None if rows is None else rows[i])
        return out.clone()

    def _to_host(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """t copied into this step's host buffer `name` (pinned for a CUDA tensor, made at first
        use), the copy queued on the current stream: read it after the stream's wait."""
        buf = self.host.get(name)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = self.host[name] = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
        return buf.copy_(t, non_blocking=t.is_cuda)

    def _capture(self, W: int, mode: str):
        if len(self.graphs) >= self.max_graphs:
            self.graphs.pop(next(iter(self.graphs)))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward(W, mode)               # the same step, eagerly: kernels compiled, workspaces made
        torch.cuda.current_stream().wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool), attest.graph_tally(attest.current_counter()):
            logits, stats = self._forward(W, mode)     # the kernels' calls tallied: one counting node a graph
        self.graphs[(W, mode)] = entry = (graph, logits, stats)
        self.captures += 1
        return entry

    def _forward(self, W: int, mode: str):
        """One decode step of the static inputs, every shape fixed by W (captured as is)."""
        m, a, pos = self.model, self.model.args, self.pos
        H, Hkv, D = a.n_head, a.n_local_heads, a.head_dim
        cos, sin = m.cos.index_select(0, pos), m.sin.index_select(0, pos)          # [1, D]
        valid = torch.arange(W, device=pos.device) <= pos                           # [W]
        rows = ProbeRows(a.n_layer, W, self.attn.topk, H, D, pos.device) if mode == "probe" else None
        x = m.tok_embeddings(self.tok)                                              # [1, 1, dim]
        for i, (layer, cache) in enumerate(zip(m.layers, m.caches)):
            att = layer.attention
            h = layer.attention_norm(x)
            q = att.wq(h).view(1, 1, H, D).transpose(1, 2)
            k = att.wk(h).view(1, 1, Hkv, D).transpose(1, 2)
            v = att.wv(h).view(1, 1, Hkv, D).transpose(1, 2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            cache.k.index_copy_(2, pos, k)
            cache.v.index_copy_(2, pos, v)
            if self.attn is not None:
                self.attn.store_at(cache, k, pos)
            if mode in ("dense", "short"):
                y = F.scaled_dot_product_attention(q, cache.k[:, :, :W], cache.v[:, :, :W],
                                                   attn_mask=valid[None, None, None, :], enable_gqa=True)
            else:
                y = self.attn.decode_at(q, cache, self.ctx, valid, W, rows)
            h = x + att.wo(y.transpose(1, 2).reshape(1, 1, H * D))
            x = h + layer.feed_forward(layer.ffn_norm(h))
        stats = None if rows is None else rows.stats(Hkv, self.attn.topk, self.span, valid)
        return m.output(m.norm(x)), stats
