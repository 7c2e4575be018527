"""The key store kernel: bitwise equal to niah.kernels.quant's quantisation written by slot,
and what it writes reads back through the paged-logits kernel as the quantise-then-
dequantise reference. TRITON_INTERPRET=1 without a GPU (tests/kernels/conftest.py)."""

import pytest
import torch

from niah.kernels import calc_diff, fp8_paged_mqa_logits, store_index_keys
from niah.kernels._common import zero_masked
from niah.kernels.mqa_logits.reference import ref_mqa_logits
from niah.kernels.quant import quantize_fp8, store_roundtrip
from niah.kernels.store.reference import ref_store_index_keys

DEV = "cuda" if torch.cuda.is_available() else "cpu"
PAGES, D = 5, 128


def keys(n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, D, generator=g) * torch.rand(n, 1, generator=g) * 4
    k[1] = 0  # all-zero key: the 1e-4 amax floor
    k[2, :7] = 1e-6  # tiny key: subnormal e4m3 values
    return k.to(dtype)


@pytest.mark.parametrize("layout", ["4d", "2d"])
@pytest.mark.parametrize("ue8m0", [False, True], ids=["fp32scale", "ue8m0"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["k-fp32", "k-bf16"])
def test_fp8_store_bitwise_equal_to_reference(layout, ue8m0, dtype):
    k = keys(45, dtype).to(DEV)
    slots = torch.randperm(PAGES * 64, generator=torch.Generator().manual_seed(1))[:45].to(DEV)
    slots[7] = -1  # padding token: skipped
    shape = (PAGES, 64, 1, D + 4) if layout == "4d" else (PAGES, 64 * (D + 4))
    poison = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(2)).to(DEV)
    got, want = poison.clone(), poison.clone()
    store_index_keys(k, got, slots, ue8m0=ue8m0)
    ref_store_index_keys(k, want, slots, ue8m0=ue8m0)
    assert torch.equal(got, want), f"{int((got != want).sum())} bytes differ"


def test_bf16_store_bitwise_equal_to_reference():
    k = keys(30, torch.float32).to(DEV)
    slots = torch.randperm(PAGES * 64, generator=torch.Generator().manual_seed(3))[:30].int().to(DEV)
    poison = torch.randn(PAGES, 64, 1, D).bfloat16().to(DEV)
    got, want = poison.clone(), poison.clone()
    store_index_keys(k, got, slots)
    ref_store_index_keys(k, want, slots)
    assert torch.equal(got, want)


def test_ue8m0_scales_are_powers_of_two():
    k = keys(20, torch.float32).to(DEV)
    cache = torch.zeros(PAGES, 64, 1, D + 4, dtype=torch.uint8, device=DEV)
    store_index_keys(k, cache, torch.arange(20, device=DEV), ue8m0=True)
    sf = cache.reshape(PAGES, -1)[0, 64 * D :].contiguous().view(torch.float32)[:20]
    assert torch.equal(sf, torch.exp2(torch.round(torch.log2(sf))))
    assert torch.equal(sf, quantize_fp8(k, ue8m0=True)[1])


def test_store_then_paged_logits_equals_quantise_dequantise_reference():
    """The path SGLang runs: store keys by slot, then score them from the pages."""
    g = torch.Generator().manual_seed(4)
    n, heads = 150, 16
    k = torch.randn(n, D, generator=g)
    cache = torch.zeros(PAGES, 64, 1, D + 4, dtype=torch.uint8)
    page_order = torch.tensor([3, 0, 4], dtype=torch.int32)
    slots = (page_order.long()[torch.arange(n) // 64] * 64 + torch.arange(n) % 64)
    cache, slots = cache.to(DEV), slots.to(DEV)
    store_index_keys(k.to(DEV), cache, slots)
    q = torch.randn(1, 1, heads, D, generator=g)
    q8 = quantize_fp8(q)[0]
    w = torch.randn(1, heads, generator=g)
    out = fp8_paged_mqa_logits(q8.to(DEV), cache, w.to(DEV), torch.tensor([n], dtype=torch.int32, device=DEV),
                               page_order[None].to(DEV), None, 192, clean_logits=True)
    kr = store_roundtrip(k, "fp8")  # quantise-then-dequantise
    ref = ref_mqa_logits(q8[0], kr, w, torch.tensor([0], dtype=torch.int32), torch.tensor([n], dtype=torch.int32))
    assert torch.equal(torch.isneginf(out[:, :n].cpu()), torch.isneginf(ref)) and torch.isneginf(out[:, n:]).all()
    assert calc_diff(zero_masked(out[:, :n].cpu()), zero_masked(ref)) < 1e-5


def test_bad_arguments_raise_clear_errors():
    k = keys(4, torch.float32).to(DEV)
    cache = torch.zeros(PAGES, 64, 1, D + 4, dtype=torch.uint8, device=DEV)
    with pytest.raises(ValueError, match="slot_mapping"):
        store_index_keys(k, cache, torch.arange(3, device=DEV))
    with pytest.raises(ValueError, match=r"kv_cache must be \[pages, block_kv, 1, 132\]"):
        store_index_keys(k, cache[..., :128], torch.arange(4, device=DEV))
    with pytest.raises(ValueError, match="uint8 .fp8 pages. or bfloat16"):
        store_index_keys(k, cache.float(), torch.arange(4, device=DEV))
