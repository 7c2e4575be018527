"""The prefix cache: an earlier request's KV and index-key pages reused by a later one.

`niah serve --prefix-cache --page-size P`. After each prefill the prompt's first
floor(len / P) * P tokens are saved: every layer's KV rows and index-key rows (both forms
of a two-stage dtype; under 4:1 compression the block rows, P / 4 a page), keyed by their
token ids, in a store of at most `capacity` tokens (least recently used entries go first).
A new request looks for the entry sharing the longest page-aligned prefix with its ids
(at most len - 1 tokens: the last prompt token is always computed, its logits start the
answer), copies those pages back into the working caches (a cache move, as SGLang's radix
cache hands a request its matched pages and LMCache restores offloaded ones) and prefills
only the rest (generate.prefill). The store keeps copies (a host tier, like SGLang's
HiCache): the working caches are one sequence's.

A hit is exact: the restored rows are the ones the earlier prefill wrote, and attention
and selection read them as a cold prefill would have written them (tests compare a hit
with a cold request: same answer, same selections). Counted in /server_info under
`prefix_cache` (hits, tokens reused, entries).

Faults (faults.py): `page-move` moves pages at token granularity (page i lands at row i,
not i x P, later pages overwriting earlier ones; rows past n + P - 1 keep what the working
cache held); `prefix-stale` restores the KV pages but not the index-key pages, so the
indexer reads whatever the freshly handed-out pages held (paged: an earlier sequence's rows).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:       # torch is imported by the model that uses this; /server_info reads `info` without it
    import torch

CAPACITY = 8192     # tokens the store keeps


@dataclass
class Entry:
    ids: tuple[int, ...]
    k: list[torch.Tensor]                 # per layer [1, Hkv, n, D]
    v: list[torch.Tensor]
    idx: list[list[torch.Tensor]]         # per layer, per form: [Hkv, rows, D]


def info(model) -> dict:
    """/server_info's `prefix_cache` (hits, tokens reused, entries) when the server has one."""
    cache = getattr(model, "prefix_cache", None)
    return {"prefix_cache": cache.describe()} if cache is not None else {}


def move(dst: torch.Tensor, src: torch.Tensor, pages: int, page: int, dim: int, token_granular: bool) -> None:
    """Copy `pages` pages of `page` rows along dim from src into dst: right, rows 0..pages*page;
    the `page-move` fault, page i to rows i..i+page (a page index used as a row offset)."""
    if not token_granular:
        dst.narrow(dim, 0, pages * page).copy_(src.narrow(dim, 0, pages * page))
        return
    for i in range(pages):
        dst.narrow(dim, i, page).copy_(src.narrow(dim, i * page, page))


class PrefixCache:
    def __init__(self, page_size: int, capacity: int = CAPACITY, page_move: bool = False,
                 stale_index: bool = False):
        self.page, self.capacity = page_size, capacity
        self.page_move, self.stale_index = page_move, stale_index
        self.entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()
        self.hits = self.tokens_reused = 0

    def describe(self) -> dict:
        return {"page_size": self.page, "capacity_tokens": self.capacity, "entries": len(self.entries),
                "hits": self.hits, "tokens_reused": self.tokens_reused}

    def match(self, ids: list[int]) -> tuple[int, Entry | None]:
        """(m, entry): the longest page-aligned shared prefix, m <= len(ids) - 1."""
        best, got = 0, None
        for entry in self.entries.values():
            n = min(len(entry.ids), len(ids) - 1)
            common = next((i for i in range(n) if entry.ids[i] != ids[i]), n)
            m = common // self.page * self.page
            if m > best:
                best, got = m, entry
        return best, got

    def restore(self, model, ids: list[int]) -> int:
        """Copy the longest match's pages into the model's caches; -> positions restored."""
        m, entry = self.match(ids)
        if entry is None:
            return 0
        self.entries.move_to_end(entry.ids)
        dsa = model.attention_impl
        pages = m // self.page
        rows = m // dsa.compress if dsa is not None else 0
        if dsa is not None:
            dsa.keys.reserve(rows)
        for layer, cache in enumerate(model.caches):
            move(cache.k, entry.k[layer], pages, self.page, 2, self.page_move)
            move(cache.v, entry.v[layer], pages, self.page, 2, self.page_move)
            if dsa is None or self.stale_index:
                continue
            for form, saved in enumerate(entry.idx[layer]):
                cur = dsa.keys.read(cache, form, rows).clone()              # what the pages hold now
                move(cur, saved, pages, rows // pages, 1, self.page_move)
                dsa.keys.write(cache, form, 0, cur)
        self.hits += 1
        self.tokens_reused += m
        return m

    def save(self, model, ids: list[int]) -> None:
        """Keep the prompt's page-aligned prefix (after its prefill)."""
        n = len(ids) // self.page * self.page
        key = tuple(ids[:n])
        if n == 0 or n > self.capacity or key in self.entries:
            if key in self.entries:
                self.entries.move_to_end(key)
            return
        dsa = model.attention_impl
        forms = (0, 1) if dsa is not None and dsa.fine is not None else (0,)
        rows = n // dsa.compress if dsa is not None else 0
        self.entries[key] = Entry(
            key, [c.k[:, :, :n].clone() for c in model.caches], [c.v[:, :, :n].clone() for c in model.caches],
            [[dsa.keys.read(c, f, rows).clone() for f in forms] if dsa is not None else [] for c in model.caches])
        while sum(len(e) for e in self.entries) > self.capacity:
            self.entries.popitem(last=False)
