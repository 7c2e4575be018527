"""bf16 index keys in SGLang's own IndexKeyCache (lifted from the 0.5.23 wheel) with the
plugin's replacement methods: allocation, store, prefill gather, move, accounting, on CPU
tensors (the indexer's fused store and decode/prefill reads: test_sglang_v32.py)."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from niah.serving.sglang import bf16_cache, replacements
from niah.serving.sglang.plugin import all_patches
from sglang_source import load_function, sglang_wheel

IKC = "sglang.srt.mem_cache.index_key_cache.IndexKeyCache"
PAGES = 6


def _sglang_index_key_cache():
    """SGLang 0.5.23's real IndexKeyCache class, compiled from the wheel (CUDA-free parts)."""
    ns = {"torch": torch, "nullcontext": contextlib.nullcontext, "GPU_MEMORY_TYPE_KV_CACHE": "kv_cache",
          "dsa_index_k_cache": None, "_use_aiter_preshuffle": False, "INDEXER_K_CACHE_PRESHUFFLE_TILE": 16}
    return load_function(sglang_wheel(), "sglang.srt.mem_cache.index_key_cache", "IndexKeyCache", ns)


def _pool(layers=2):
    """The DSATokenToKVPool attributes IndexKeyCache reads (values as SGLang sets them)."""
    return types.SimpleNamespace(
        page_size=64, index_kpool=1, index_page_size=64, index_head_dim=128, quant_block_size=128,
        index_k_with_scale_buffer_dtype=torch.uint8, device="cpu", layer_num=layers,
        skip_topk_layers=[False] + [True] * (layers - 1), start_layer=0, layer_transfer_counter=None,
        custom_mem_pool=None,
        memory_saver_adapter=types.SimpleNamespace(region=lambda _tag: contextlib.nullcontext()))


def _bf16_class(base):
    """base with the plugin's bf16 IndexKeyCache replacements, applied from its patch table."""
    cls = type("IndexKeyCacheBF16", (base,), {})
    for p in all_patches():
        if p.target.startswith(IKC + ".") and p.when == "bf16":
            name = p.target.rsplit(".", 1)[1]
            setattr(cls, name, p.factory(getattr(base, name)))
    return cls


@pytest.fixture(scope="module")
def ikc():
    return _sglang_index_key_cache()


def test_sglang_fp8_row_is_132_bytes_per_token_and_bf16_is_256(ikc):
    size = PAGES * 64 - 64 - 1  # SGLang sizes index_buf_size in tokens, pages = (size + 65) // 64
    fp8 = ikc(_pool(), size)
    bf16 = _bf16_class(ikc)(_pool(), size)
    assert fp8.buffer[0].shape == (PAGES, 64 * 132) and fp8.buffer[0].dtype == torch.uint8
    assert bf16.buffer[0].shape == (PAGES, 64 * 256) and bf16.buffer[0].dtype == torch.uint8
    assert bf16.buffer[1].shape == (0, 64 * 256)  # skip-topk layer keeps its 0-row placeholder
    assert bf16.get_local_buffer(0).shape == (PAGES, 16384)  # SGLang's own _kernel_view
    assert bf16_cache.pages_view(bf16.get_local_buffer(0)).shape == (PAGES, 64, 1, 128)


def test_kpool_is_refused_for_bf16(ikc):
    pool = _pool()
    pool.index_kpool = 2
    with pytest.raises(NotImplementedError, match="index_kpool"):
        _bf16_class(ikc)(pool, 256)


def _filled(ikc, n=150, seed=0):
    g = torch.Generator().manual_seed(seed)
    cache = _bf16_class(ikc)(_pool(), PAGES * 64)
    loc = torch.randperm(cache.buffer[0].shape[0] * 64, generator=g)[:n]
    key = torch.randn(n, 128, generator=g) * 3
    replacements.store_bf16_keys(cache.get_local_buffer(0), loc, key)
    return cache, loc, key


def test_store_is_unquantised_and_touches_only_its_slots(ikc):
    cache, loc, key = _filled(ikc)
    pages = bf16_cache.pages_view(cache.get_local_buffer(0))
    got = pages[loc // 64, loc % 64, 0]
    assert torch.equal(got, key.to(torch.bfloat16))  # bitwise: no quantisation, no scale
    written = torch.zeros(pages.shape[0] * 64, dtype=torch.bool)
    written[loc] = True
    assert torch.count_nonzero(pages.reshape(-1, 128)[~written]) == 0


def test_prefill_gather_through_sglang_plumbing(ikc):
    """get_k_and_scale -> what _get_topk_ragged does with it -> the keys, in request order."""
    cache, loc, key = _filled(ikc)
    slot_key = {int(s): key[i] for i, s in enumerate(loc)}
    # two requests whose pages are scattered through the pool
    pages_used = sorted({int(s) // 64 for s in loc})
    table = torch.tensor([[pages_used[2], pages_used[0], 0], [pages_used[1], pages_used[3], pages_used[4]]],
                         dtype=torch.int32)
    lens = torch.tensor([70, 130], dtype=torch.int32)
    k, s = cache.get_k_and_scale(0, lens, table, int(lens.sum()), int(lens.max()))
    k_fp8 = k.view(torch.float8_e4m3fn)  # exactly SGLang's next two lines
    k_scale = s.view(torch.float32).squeeze(-1)
    assert torch.equal(k_scale, torch.ones(200))
    keys = bf16_cache.unsmuggle_bf16(k_fp8, 128)
    pages = bf16_cache.pages_view(cache.get_local_buffer(0))
    want = []
    for b in range(2):
        for t in range(int(lens[b])):
            slot = int(table[b, t // 64]) * 64 + t % 64
            want.append(slot_key[slot].to(torch.bfloat16) if slot in slot_key else pages[slot // 64, slot % 64, 0])
    assert torch.equal(keys, torch.stack(want))


def test_move_copies_bf16_keys(ikc):
    cache, loc, key = _filled(ikc)
    tgt = torch.tensor([0, 1, 2])
    cache.move(tgt, loc[:3])
    pages = bf16_cache.pages_view(cache.get_local_buffer(0))
    assert torch.equal(pages[0, :3, 0], key[:3].to(torch.bfloat16))


def test_fp8_store_into_bf16_cache_is_refused(ikc):
    cache = _bf16_class(ikc)(_pool(), 256)
    with pytest.raises(RuntimeError, match="bf16"):
        cache.store_quantized(0, torch.zeros(1, dtype=torch.long), torch.zeros(1, 128), torch.ones(1, 1))


def test_memory_accounting_is_256_bytes_per_token_per_layer():
    def sglang_like(self, *, kvc, num_layers, allocate_all_layers=False):
        # SGLang: ceil_div(128 + 128 // 128 * 4, kpool) * layers * element_size(uint8)
        return -(-(128 + 128 // 128 * 4) // kvc.kpool) * num_layers * 1

    wrapped = replacements.wrap_indexer_cell_size(sglang_like)
    assert wrapped(None, kvc=types.SimpleNamespace(kpool=1), num_layers=61) == 256 * 61
    with pytest.raises(ValueError):
        wrapped(None, kvc=types.SimpleNamespace(kpool=2), num_layers=61)
