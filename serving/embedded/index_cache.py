"""Where the CPU indexer keeps its index keys: flat (one row per position) or paged.

Both hold, per layer and form (form 0: the coarse / only stored form; form 1: the bf16
re-score form of a two-stage dtype), each key as the indexer reads it back (fp32 values after
the store round-trip), and both answer the same two calls:

- `write(cache, form, start, rows)`: rows [Hkv, T, D] become positions start..start+T-1;
- `read(cache, form, S, decode=False)`: the first S positions -> [Hkv, S, D], contiguous.

`FlatKeys` (the default) is `cache.idx_k` for form 0 and one more [Hkv, block_size, D]
tensor per layer for form 1: a read is a slice.

`PagedKeys(page_size)` is SGLang's token-to-page layout: one pool per layer and form,
`[pages, page_size, Hkv, D]`, and ONE block table for the sequence (logical page -> physical
page, shared by every layer, as SGLang's req_to_token row): slot(t) = table[t // P] * P + t % P.
Pages come from a free list on demand, as tokens arrive; a new sequence (a write at
position 0 in layer 0) returns its pages to the BACK of the list, so the next sequence is
handed other pages (their rows are whatever an earlier sequence left there: nothing may
read a position before it is written). A read gathers the sequence's slots (what SGLang's
prefill does before its ragged logits); values are the flat layout's exactly, so paged
and flat selections agree bit for bit (tests). `reserve(n)` allocates pages for n tokens
without writing them (the prefix cache's restore, prefix.py).

Faults (faults.py) that live here: `decode-page:OFF` makes a decode step's read take logical
page i from physical page table[(i + OFF) % n] (the prefill's reads stay right).
"""

from __future__ import annotations

from collections import deque

import torch

SPARE_PAGES = 4


class FlatKeys:
    """Index keys one row per position (module doc)."""

    page_size = None

    def __init__(self):
        self._fine: dict[int, torch.Tensor] = {}

    def rows(self, cache, form: int) -> torch.Tensor:
        """The whole [Hkv, block_size, D] tensor of one layer and form."""
        if form == 0:
            return cache.idx_k
        got = self._fine.get(cache.layer_id)
        if got is None or got.shape != cache.idx_k.shape:
            got = self._fine[cache.layer_id] = torch.zeros_like(cache.idx_k)
        return got

    def write(self, cache, form: int, start: int, rows: torch.Tensor) -> None:
        self.rows(cache, form)[:, start:start + rows.shape[1]] = rows

    def read(self, cache, form: int, S: int, decode: bool = False) -> torch.Tensor:
        return self.rows(cache, form)[:, :S]

    def reserve(self, n_tokens: int) -> None:
        """Nothing to allocate: every position has its row."""


class PagedKeys:
    """Index keys in pages behind one block table (module doc)."""

    def __init__(self, n_layer: int, n_kv: int, dim: int, capacity: int, page_size: int, n_forms: int,
                 seed: int = 0, decode_page_offset: int = 0):
        if page_size < 1:
            raise ValueError(f"the page size must be >= 1, not {page_size}")
        self.page_size, self.n_kv, self.dim = page_size, n_kv, dim
        self.max_pages = -(-capacity // page_size)
        self.n_pages = self.max_pages + SPARE_PAGES
        self.buf = torch.zeros(n_layer, n_forms, self.n_pages * page_size, n_kv, dim)
        order = torch.randperm(self.n_pages, generator=torch.Generator().manual_seed(seed)).tolist()
        self._free = deque(order)             # scattered: a read must really follow the table
        self.table: list[int] = []            # logical page -> physical page, this sequence
        self.decode_page_offset = decode_page_offset   # a fault (faults.py); 0 = right

    def begin(self) -> None:
        """A new sequence: its pages go back to the end of the free list."""
        self._free.extend(self.table)
        self.table = []

    def reserve(self, n_tokens: int) -> None:
        need = -(-n_tokens // self.page_size)
        if need > self.max_pages:
            raise ValueError(f"{n_tokens} tokens exceed the index-key pool of {self.max_pages * self.page_size}")
        while len(self.table) < need:
            self.table.append(self._free.popleft())

    def slots(self, start: int, n: int, offset: int = 0) -> torch.Tensor:
        """int64 [n]: the slots of positions start..start+n-1 (offset: a decode-page fault)."""
        P = self.page_size
        t = torch.arange(start, start + n)
        logical = t // P
        if offset:
            logical = (logical + offset) % len(self.table)
        table = torch.tensor(self.table, dtype=torch.int64)
        return table[logical] * P + t % P

    def write(self, cache, form: int, start: int, rows: torch.Tensor) -> None:
        T = rows.shape[1]
        self.reserve(start + T)
        self.buf[cache.layer_id, form].index_copy_(0, self.slots(start, T), rows.permute(1, 0, 2))

    def read(self, cache, form: int, S: int, decode: bool = False) -> torch.Tensor:
        off = self.decode_page_offset if decode else 0
        got = self.buf[cache.layer_id, form].index_select(0, self.slots(0, S, off))   # [S, Hkv, D]
        return got.permute(1, 0, 2).contiguous()
