"""The embedded server's serving paths against the plain path, in-process, real weights.

Each path must not change what the model answers or which keys the indexer keeps where
it must agree: the paged index-key cache (any page size) with the flat one, bit for bit
(fp32 keys here, fp8 under compression);
chunked prefill with one pass (row by row, whatever the chunk), and a prefix-cache hit with
a cold prefill of the same prompt (the rows it computes, the answer), up to the top-k's
tie-break among keys tied at the cut (ReLU zeros: torch.topk breaks them as the shape of
its input leads it to, and a chunk's rows have other shapes); 4:1 index compression with
dense attention while every block is kept, and paged with flat. Short prompts (~150
tokens) at top-k 16, three generated tokens: selection runs in every layer, and each
request takes a second or two.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from paths_helpers import build, generate, prompt, tie_broken  # noqa: E402 - after the skips

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plain(path_weights, path_tok):
    """The plain path's runs of two prompts sharing their first ~110 tokens (fp32 index keys:
    fp8's rounding turns the last-bit differences of another chunking into visible ones)."""
    m = build(path_weights, index_dtype="fp32")
    return [generate(m, path_tok, prompt(s)) for s in ("4817263", "9035521")]


def test_plain_path_selects_in_every_layer(plain):
    sel = plain[0].selections
    assert {layer for layer, _ in sel} == set(range(30))
    assert all(len(kept) == 16 for (_, pos), kept in sel.items() if pos >= 16)   # top-k 16, no window
    assert plain[0].text.strip().startswith("48")


@pytest.mark.parametrize("page", [16, 5])
def test_paged_index_cache_selects_like_the_flat_one(path_weights, path_tok, plain, page):
    m = build(path_weights, index_dtype="fp32", page_size=page)
    assert m.attention_impl.keys.page_size == page and m.caches[0].idx_k is None   # no flat rows at all
    for want, secret in zip(plain, ("4817263", "9035521")):
        got = generate(m, path_tok, prompt(secret))
        assert got.text == want.text
        assert got.selections == want.selections                  # prefill and decode rows alike
    table = m.attention_impl.keys.table
    assert table != sorted(table)                                 # the reads follow a scattered block table


@pytest.mark.parametrize("chunk", [64, 48])
def test_chunked_prefill_selects_like_one_pass(path_weights, path_tok, plain, chunk):
    m = build(path_weights, index_dtype="fp32", prefill_chunk=chunk)
    got = generate(m, path_tok, prompt("4817263"))
    assert m.prefill_chunk == chunk
    assert got.text == plain[0].text
    missing = set(plain[0].selections) - set(got.selections)   # a first chunk of <= k tokens runs dense
    assert set(got.selections) <= set(plain[0].selections) and all(pos < 16 for _, pos in missing)
    assert all(len(plain[0].selections[key]) == key[1] + 1 for key in missing)   # ... as the plain path kept all
    assert tie_broken(got, plain[0], sorted(got.selections)) == []    # the same keys, but where ties at the cut


def test_prefix_hit_reuses_pages_and_selects_like_a_cold_prefill(path_weights, path_tok, plain):
    m = build(path_weights, index_dtype="fp32", page_size=16, prefix_cache=True)
    first = generate(m, path_tok, prompt("4817263"))
    assert first.prefix_hit == 0 and first.selections == plain[0].selections   # cold: the plain path
    second = generate(m, path_tok, prompt("9035521"))                  # shares its haystack's first sentences
    assert second.prefix_hit > 0 and second.prefix_hit % 16 == 0
    assert m.prefix_cache.hits == 1 and m.prefix_cache.tokens_reused == second.prefix_hit
    assert second.text == plain[1].text
    rows = [k for k in plain[1].selections if k[1] >= second.prefix_hit]
    assert set(second.selections) == set(rows)                    # only the rows past the hit were computed
    assert tie_broken(second, plain[1], rows) == []
    again = generate(m, path_tok, prompt("9035521"))                   # the whole prompt but its last page
    assert again.prefix_hit > second.prefix_hit and again.text == plain[1].text
    assert tie_broken(again, plain[1], sorted(again.selections)) == []


def test_compression_while_every_block_is_kept_is_dense(path_weights, path_tok):
    text = prompt("4817263")
    dense = generate(build(path_weights, attention="dense"), path_tok, text)
    comp = build(path_weights, index_topk=64, index_compress=4)         # ~150 tokens: <= 64 blocks
    assert generate(comp, path_tok, text).text == dense.text
    d = comp.attention_impl
    d.dense_when_short = False                                    # the indexer path, every block kept
    forced = generate(comp, path_tok, text)
    assert forced.text == dense.text and forced.selections


def test_compression_selects_blocks_paged_like_flat(path_weights, path_tok):
    text = prompt("4817263", before=6)
    flat = generate(build(path_weights, index_topk=8, index_compress=4, window=8), path_tok, text)
    paged = generate(build(path_weights, index_topk=8, index_compress=4, window=8, page_size=16), path_tok, text)
    assert flat.text == paged.text and flat.selections == paged.selections
    (layer, pos), kept = max(flat.selections.items(), key=lambda kv: kv[0][1])
    outside = {p // 4 for p in kept if p <= pos - 8}             # blocks kept before the window
    assert all({4 * b + i for i in range(4)} <= set(kept) for b in outside if 4 * b + 3 <= pos - 8)   # whole blocks
    assert 8 - 3 <= len(outside) <= 8                             # top-k 8 blocks (some may lie in the window)
    assert set(range(max(0, pos - 7), pos + 1)) <= set(kept)     # the window and the own block
    assert len(kept) <= 8 * 4 + 8 + 3
