"""A Llama (SmolLM2-135M) in one readable file, gpt-fast style.

Dataclass config, plain modules, a preallocated KV cache, and the attention swappable in
ONE place: `Attention.forward` computes q, k, v (post-RoPE), writes the cache and then
calls `self.attend(q, cache, start)`. `Transformer.set_attention(...)` installs either
`dense_attention` (below) or a `niah.serving.embedded.dsa.DSA` object (DeepSeek-style
sparse attention). Batch size is 1: the server runs one sequence at a time.

Shapes: B=1, T = new tokens this call, S = tokens in the cache after this call,
H = 9 query heads, Hkv = 3 kv heads, D = 64 head dim.

Device: the model runs where its weights are (`from_loaded(..., device=...)`: the CPU by
default, or a CUDA device); caches, RoPE tables and token ids follow it.
RoPE scaling (`rope_scaling="yarn"`, `rope_factor`): YaRN as transformers computes it
(beta_fast 32, beta_slow 1, attention factor 0.1 ln(factor) + 1 on cos and sin) over the
original context `block_size`, which grows to factor x block_size tokens.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class ModelArgs:
    vocab_size: int = 49152
    n_layer: int = 30
    n_head: int = 9
    n_local_heads: int = 3
    dim: int = 576
    intermediate_size: int = 1536
    head_dim: int = 64
    rope_base: float = 100000.0
    norm_eps: float = 1e-5
    block_size: int = 8192          # max context (prompt + generated)
    tie_embeddings: bool = True
    rope_scaling: str = "none"      # "none" or "yarn" (then block_size = rope_factor x the original)
    rope_factor: float = 1.0
    original_block_size: int = 8192

    @classmethod
    def from_meta(cls, meta: dict, rope_scaling: str = "none", rope_factor: float = 4.0) -> "ModelArgs":
        args = cls(**{k: v for k, v in meta["config"].items() if k in cls.__dataclass_fields__})
        args.original_block_size = args.block_size
        if rope_scaling == "yarn":
            if rope_factor <= 1:
                raise ValueError(f"the YaRN factor must be > 1, not {rope_factor}")
            args.rope_scaling, args.rope_factor = "yarn", float(rope_factor)
            args.block_size = int(args.block_size * rope_factor)
        elif rope_scaling != "none":
            raise ValueError(f"rope scaling must be none or yarn, not {rope_scaling!r}")
        return args


@dataclass
class LayerCache:
    """One layer's caches. k, v: [1, Hkv, block_size, D]. idx_k: the index keys as the
    indexer reads them back (after the fp8/bf16/fp32 store round-trip), [Hkv, block_size, D];
    allocated only when the attention needs it. k_all: every layer's k, [layers, 1, Hkv,
    block_size, D], of which k is row layer_id (Transformer.setup_caches: one tensor, so that
    a step's probe reads every layer's keys in one call); None for a cache made on its own."""
    k: torch.Tensor
    v: torch.Tensor
    idx_k: torch.Tensor | None = None
    layer_id: int = 0
    stats: dict = field(default_factory=dict)   # per-request diagnostics (selection recall)
    k_all: torch.Tensor | None = None


def dense_attention(q: torch.Tensor, cache: LayerCache, start: int) -> torch.Tensor:
    """Plain causal SDPA over the whole cache. q: [1, H, T, D] -> [1, H, T, D]."""
    T = q.shape[2]
    S = start + T
    k, v = cache.k[:, :, :S], cache.v[:, :, :S]          # [1, Hkv, S, D]
    if q.is_cuda and T > 1:
        # fp32 with enable_gqa runs PyTorch's math kernel on CUDA ([H, T, S] scores: 40 GiB and
        # 2.5 s at 22.6K tokens); kv heads repeated as enable_gqa maps them, the memory-efficient one runs
        G = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
        if start == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        mask = torch.arange(S, device=q.device)[None, :] <= torch.arange(start, S, device=q.device)[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if T == 1:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    if start == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    pos = torch.arange(start, S, device=q.device)
    mask = torch.arange(S, device=q.device)[None, :] <= pos[:, None]       # [T, S]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def yarn_inv_freq(base: float, dim: int, factor: float, original: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0) -> tuple[torch.Tensor, float]:
    """YaRN's frequencies and attention factor, as transformers' _compute_yarn_parameters:
    -> (inv_freq [D/2] fp32, attention factor applied to cos and sin)."""
    def corr_dim(rot: float) -> float:
        return dim * math.log(original / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(corr_dim(beta_fast)), 0), min(math.ceil(corr_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extra = 1 - ramp                                                   # 1: keep the original frequency
    inv = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    return inv, 0.1 * math.log(factor) + 1.0


def rope_tables(args: ModelArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [block_size, D] for the NeoX (rotate-half) layout HF Llama uses."""
    scale = 1.0
    if args.rope_scaling == "yarn":
        inv, scale = yarn_inv_freq(args.rope_base, args.head_dim, args.rope_factor, args.original_block_size)
    else:
        inv = 1.0 / (args.rope_base ** (torch.arange(0, args.head_dim, 2, dtype=torch.float32) / args.head_dim))
    ang = torch.outer(torch.arange(args.block_size, dtype=torch.float32), inv)   # [S, D/2]
    ang = torch.cat([ang, ang], dim=-1)                                            # [S, D]
    return ang.cos() * scale, ang.sin() * scale


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [1, h, T, D]; cos, sin: [T, D]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.wq = nn.Linear(args.dim, args.n_head * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_local_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_local_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_head * args.head_dim, args.dim, bias=False)
        self.attend = dense_attention          # THE swappable attention (set_attention)
        self.store_index_key = None            # DSA: writes cache.idx_k

    def forward(self, x, cos, sin, cache: LayerCache, start: int) -> torch.Tensor:
        T = x.shape[1]
        a = self.args
        q = self.wq(x).view(1, T, a.n_head, a.head_dim).transpose(1, 2)          # [1, H, T, D]
        k = self.wk(x).view(1, T, a.n_local_heads, a.head_dim).transpose(1, 2)   # [1, Hkv, T, D]
        v = self.wv(x).view(1, T, a.n_local_heads, a.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        cache.k[:, :, start:start + T] = k
        cache.v[:, :, start:start + T] = v
        if self.store_index_key is not None:
            self.store_index_key(cache, k, start)
        y = self.attend(q, cache, start)                                          # [1, H, T, D]
        return self.wo(y.transpose(1, 2).reshape(1, T, a.n_head * a.head_dim))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.intermediate_size, bias=False)
        self.w3 = nn.Linear(args.dim, args.intermediate_size, bias=False)
        self.w2 = nn.Linear(args.intermediate_size, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, x, cos, sin, cache, start):
        h = x + self.attention(self.attention_norm(x), cos, sin, cache, start)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layer))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.caches: list[LayerCache] = []
        self.cos, self.sin = rope_tables(args)
        self.attention_name = "dense"
        self.attention_impl = None

    @property
    def device(self) -> torch.device:
        return self.tok_embeddings.weight.device

    def setup_caches(self, index_keys: bool = False) -> None:
        a = self.args
        shape = (1, a.n_local_heads, a.block_size, a.head_dim)
        dev = self.device
        k_all = torch.zeros((a.n_layer, *shape), device=dev)
        v_all = torch.zeros((a.n_layer, *shape), device=dev)
        self.caches = [
            LayerCache(k_all[i], v_all[i], torch.zeros(shape[1:], device=dev) if index_keys else None, layer_id=i,
                       k_all=k_all)
            for i in range(a.n_layer)
        ]

    def set_attention(self, attention=None) -> None:
        """None -> dense; else an object with `__call__(q, cache, start)` and
        `store(cache, k, start)` (see dsa.DSA). An attention with `owns_index_keys`
        (the CUDA indexer keeps its own paged pool) gets no cache.idx_k."""
        for layer in self.layers:
            layer.attention.attend = attention or dense_attention
            layer.attention.store_index_key = attention.store if attention is not None else None
        self.attention_name = getattr(attention, "name", "dense")
        self.attention_impl = attention
        self.setup_caches(index_keys=attention is not None and not getattr(attention, "owns_index_keys", False))

    @torch.inference_mode()
    def forward(self, idx: torch.Tensor, start: int, all_logits: bool = False, stats: dict | None = None):
        """idx: [1, T] token ids at positions start..start+T-1 -> logits [1, T or 1, V].

        Only the last position's logits unless all_logits (a 7K x 49K logits tensor is 1.4 GB).
        stats: a dict the attention may fill with per-layer diagnostics."""
        T = idx.shape[1]
        if start + T > self.args.block_size:
            raise ValueError(f"{start + T} tokens exceed the context of {self.args.block_size}")
        if not self.caches:
            self.setup_caches()
        cos, sin = self.cos[start:start + T], self.sin[start:start + T]
        # non_blocking: a host-to-GPU copy otherwise waits for the GPU's queued work (a sync a
        # prefill chunk); from pageable memory the copy is staged before the call returns
        x = self.tok_embeddings(idx.to(self.device, non_blocking=True))             # [1, T, dim]
        for layer, cache in zip(self.layers, self.caches):
            cache.stats = stats if stats is not None else {}
            x = layer(x, cos, sin, cache, start)
        x = self.norm(x if all_logits else x[:, -1:])
        return self.output(x)

    @classmethod
    def from_loaded(cls, loaded, device: str = "cpu", rope_scaling: str = "none",
                    rope_factor: float = 4.0) -> "Transformer":
        args = ModelArgs.from_meta(loaded.meta, rope_scaling, rope_factor)
        with torch.device("meta"):
            model = cls(args)
        sd = {k: v.to(device) for k, v in loaded.state_dict.items()}
        if args.tie_embeddings:
            sd["output.weight"] = sd["tok_embeddings.weight"]
        model.load_state_dict(sd, assign=True, strict=True)
        model.cos, model.sin = (t.to(device) for t in rope_tables(args))
        return model.eval()
