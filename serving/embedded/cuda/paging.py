"""The paged index-key cache of the CUDA indexer, in SGLang's layout.

One buffer per layer, `[pages, 64 * row]` (SGLang's NSATokenToKVPool buffer; the kernels'
4-D view is `[pages, 64, 1, row]` over the same bytes):

- fp8:  one page = `[64 tokens x D e4m3 values, token-major][64 fp32 scales]`, token j's
  scale at byte 64*D + 4j; row = D + 4 bytes (SmolLM2: D = 64 -> 68 B per token and kv head);
- bf16: one page = 64 x D bf16 values, no scale (128 B per token and kv head).

SmolLM2 has 3 kv heads where DeepSeek's indexer has one shared key: each kv head's keys
live in pages of their own, and the block table has one row per kv head (the kernels'
"requests" b = kv head). Pages are handed out on demand from a free list in a fixed
scattered order (so every read really follows the block table), as tokens arrive; a new
sequence (a write at position 0) returns them all. One sequence at a time (batch 1).

slot(g, t) = block_table[g, t // 64] * 64 + t % 64   (SGLang's out_cache_loc)

Reads:
- `contiguous(layer, g, S)`: the first S keys of kv head g as DeepGEMM's prefill wants
  them (e4m3 [S, D] + fp32 scales [S], or bf16 [S, D]): one gather of the sequence's pages
  (S x row bytes), as SGLang's prefill does before its ragged logits;
- `paged(layer)`: the 4-D view the paged (decode) kernel reads in place;
- `gather_per_query(layer, g, n_queries, S)`: the seed's naive bf16 read, every page
  copied for every query ([n_queries, S, D], the memory the arm `bf16_read="gather"` spends).
"""

from __future__ import annotations

import torch

from niah.kernels import forms

PAGE = 64
LAYOUTS = ("fp8", "bf16")  # the page layouts this pool implements; a row's bytes are its form's (forms.key_bytes)


class IndexKeyPool:
    def __init__(self, n_layer: int, n_kv: int, dim: int, capacity: int, index_dtype: str,
                 device: str | torch.device = "cpu", spare_pages: int = 3, seed: int = 0):
        if index_dtype not in LAYOUTS:
            raise ValueError(f"the paged index-key pool holds fp8 or bf16 keys, not {index_dtype!r}")
        self.n_layer, self.n_kv, self.dim, self.index_dtype = n_layer, n_kv, dim, index_dtype
        self.max_pages = -(-capacity // PAGE)
        self.n_pages = n_kv * self.max_pages + spare_pages
        fp8 = index_dtype == "fp8"
        width = PAGE * (dim + 4) if fp8 else PAGE * dim
        self.buf = torch.zeros(n_layer, self.n_pages, width, dtype=torch.uint8 if fp8 else torch.bfloat16,
                               device=device)
        self.block_table = torch.full((n_kv, self.max_pages), -1, dtype=torch.int32, device=device)
        g = torch.Generator().manual_seed(seed)
        self._order = torch.randperm(self.n_pages, generator=g).tolist()   # free list order
        self._free: list[int] = []
        self.pages_used = 0      # pages per kv head handed out for the current sequence
        self.reset()

    @property
    def bytes_per_token(self) -> int:
        """Index-key bytes per token and layer (all kv heads)."""
        return self.n_kv * forms.get(self.index_dtype).key_bytes(self.dim)

    def reset(self) -> None:
        """A new sequence: every page back on the free list."""
        self._free = list(reversed(self._order))
        self.block_table.fill_(-1)
        self.pages_used = 0

    def ensure(self, n_tokens: int) -> None:
        """Pages for the first n_tokens tokens of every kv head (allocated on demand)."""
        need = -(-n_tokens // PAGE)
        if need > self.max_pages:
            raise ValueError(f"{n_tokens} tokens exceed the index-key pool of {self.max_pages * PAGE}")
        if need <= self.pages_used:
            return
        new = torch.tensor([[self._free.pop() for _ in range(need - self.pages_used)] for _ in range(self.n_kv)],
                           dtype=torch.int32)
        self.block_table[:, self.pages_used:need] = new.to(self.block_table.device, non_blocking=True)   # no sync
        self.pages_used = need

    def slots(self, start: int, n: int) -> torch.Tensor:
        """int64 [n_kv * n]: the slots of tokens start..start+n-1, kv head major."""
        dev = self.block_table.device
        t = torch.arange(start, start + n, device=dev)
        pages = self.block_table[:, t // PAGE].to(torch.int64)               # [n_kv, n]
        return (pages * PAGE + (t % PAGE)[None, :]).reshape(-1)

    def layer(self, layer: int) -> torch.Tensor:
        """SGLang's buffer of one layer: [pages, 64 * row] (uint8 for fp8, bf16 for bf16)."""
        return self.buf[layer]

    def paged(self, layer: int) -> torch.Tensor:
        """The kernels' view: fp8 uint8 [pages, 64, 1, D + 4] / bf16 [pages, 64, 1, D]."""
        row = self.dim + 4 if self.index_dtype == "fp8" else self.dim
        return self.buf[layer].view(self.n_pages, PAGE, 1, row)

    def _pages(self, layer: int, g: int, S: int) -> torch.Tensor:
        n = -(-S // PAGE)
        return self.buf[layer].index_select(0, self.block_table[g, :n].to(torch.int64))   # [n, 64 * row]

    def contiguous(self, layer: int, g: int, S: int):
        """The first S keys of kv head g: fp8 -> (e4m3 [S, D], fp32 [S]); bf16 -> bf16 [S, D]."""
        pages = self._pages(layer, g, S)
        D = self.dim
        if self.index_dtype == "bf16":
            return pages.view(-1, D)[:S]
        vals = pages[:, :PAGE * D].contiguous().view(torch.float8_e4m3fn).view(-1, D)[:S]
        scales = pages[:, PAGE * D:].contiguous().view(torch.float32).view(-1)[:S]
        return vals, scales

    def dequantized(self, layer: int, g: int, S: int) -> torch.Tensor:
        """The first S keys of kv head g as the indexer reads them, fp32 [S, D]."""
        if self.index_dtype == "bf16":
            return self.contiguous(layer, g, S).float()
        vals, scales = self.contiguous(layer, g, S)
        return vals.float() * scales[:, None]

    def gather_per_query(self, layer: int, g: int, n_queries: int, S: int) -> torch.Tensor:
        """bf16 only: every page of kv head g copied once per query (the naive read):
        [n_queries, n_pages * 64, D] bf16, n_queries x pages x 64 x D x 2 bytes."""
        if self.index_dtype != "bf16":
            raise ValueError("the per-query gather is the bf16 read path")
        n = -(-S // PAGE)
        # pages past the sequence (-1: a decode graph's fixed width) read page 0: masked by the caller
        table = self.block_table[g, :n].to(torch.int64).clamp_min(0)[None, :].expand(n_queries, n)   # [Q, n]
        return self.buf[layer].index_select(0, table.reshape(-1)).view(n_queries, n * PAGE, self.dim)  # materialised
