"""The fp4 key store kernel: its pages equal, byte for byte, SGLang 0.5.23's own fp4 index-K
store (`store_fp4_index_k_cache`, its Triton kernels from the wheel: tests/sglang_fp4_lift.py)
and the torch reference on the same keys and slots; every byte outside the written slots is
untouched. TRITON_INTERPRET=1 without a GPU (tests/kernels/conftest.py)."""

import pytest
import torch
from sglang_fp4_lift import fp4_store

from niah.kernels import store_fp4_index_keys
from niah.kernels.fp4_store.reference import ref_store_fp4_index_keys, unpack_fp4_pages
from niah.kernels.quant import dequantize_fp4, fp4_sglang_layout, quantize_fp4, store_roundtrip

DEV = "cuda" if torch.cuda.is_available() else "cpu"
PAGES = 3


def inputs(n, dtype, seed=0, dim=128):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, dim, generator=g) * (10 ** torch.empty(n, 1).uniform_(-2, 2, generator=g))
    k[1] = 0
    k[2, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4)  # ties
    slots = torch.randperm(PAGES * 64, generator=g)[:n]
    return k.to(dtype), slots


def poison(page_bytes, seed=2):
    return torch.randint(0, 256, (PAGES, page_bytes), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_pages_equal_sglang_store(dtype):
    """SGLang's store on its 68-byte slots (one interpreted program a token: kept to 12 tokens)."""
    k, slots = inputs(12, dtype)
    want, got = poison(64 * 68), poison(64 * 68).to(DEV)
    fp4_store().store_fp4_index_k_cache(k, want, slots, page_size=64)
    store_fp4_index_keys(k.to(DEV), got, slots.to(DEV))
    assert not torch.equal(want, poison(64 * 68)), "SGLang's store wrote nothing"
    assert torch.equal(got.cpu(), want), f"{int((got.cpu() != want).sum())} bytes differ"
    # and SGLang's own gather reads back what niah's quantiser makes
    codes, sf = fp4_store().gather_fp4_index_k(got.cpu(), slots, page_size=64)
    want_codes, want_sf = fp4_sglang_layout(*quantize_fp4(k))
    assert torch.equal(codes, want_codes) and torch.equal(sf, want_sf)


@pytest.mark.parametrize("rne", [False, True], ids=["threshold", "rne"])
@pytest.mark.parametrize("dim", [128, 64])
@pytest.mark.parametrize("int_dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
def test_store_equals_reference(rne, dim, int_dtype):
    k, slots = inputs(37, torch.bfloat16, seed=1, dim=dim)
    slots[5] = -1  # padding: skipped
    row = dim // 2 + dim // 32
    want, got = poison(64 * row), poison(64 * row).to(DEV)
    ref_store_fp4_index_keys(k, want, slots, rne=rne)
    store_fp4_index_keys(k.to(DEV), got, slots.to(int_dtype).to(DEV), rne=rne)
    assert torch.equal(got.cpu(), want), f"{int((got.cpu() != want).sum())} bytes differ"
    codes, exps = unpack_fp4_pages(want, dim)
    keep = slots >= 0
    s = slots[keep]
    back = dequantize_fp4(codes.reshape(-1, dim // 2)[s], exps.reshape(-1, dim // 32)[s])
    if not rne:
        assert torch.equal(back, store_roundtrip(k[keep], "fp4"))


def test_four_d_view_and_padded_page_stride():
    k, slots = inputs(20, torch.float32, seed=4)
    flat = torch.zeros(PAGES, 64 * 68, dtype=torch.uint8, device=DEV)
    store_fp4_index_keys(k.to(DEV), flat.view(PAGES, 64, 1, 68), slots.to(DEV))
    pool = torch.zeros(PAGES, 64 * 68 + 32, dtype=torch.uint8, device=DEV)
    store_fp4_index_keys(k.to(DEV), pool[:, : 64 * 68], slots.to(DEV))
    assert torch.equal(pool[:, : 64 * 68], flat) and not pool[:, 64 * 68:].any()


def test_bad_inputs_raise_clear_errors():
    k, slots = inputs(4, torch.float32)
    cache = torch.zeros(PAGES, 64 * 68, dtype=torch.uint8)
    with pytest.raises(ValueError, match="power of two >= 32"):
        store_fp4_index_keys(k[:, :48], cache, slots)
    with pytest.raises(ValueError, match=r"\[pages, 4352\]"):
        store_fp4_index_keys(k, cache[:, :100], slots)
    with pytest.raises(ValueError, match="uint8"):
        store_fp4_index_keys(k, cache.float(), slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        store_fp4_index_keys(k, cache, slots[:2])
