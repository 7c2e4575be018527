"""Ragged (prefill) index logits: the Triton kernels against the fp64 torch reference.

Without a GPU the kernels run under TRITON_INTERPRET=1 on CPU tensors
(tests/kernels/conftest.py sets it before triton is imported); with one, the same tests run on CUDA.
"""

import pytest
import torch

from niah.kernels import bf16_mqa_logits, calc_diff, fp8_mqa_logits
from niah.kernels._common import compare_logits, zero_masked
from niah.kernels.mqa_logits.reference import ref_mqa_logits
from niah.kernels.quant import quantize_fp8

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def ragged(seq_lens, prefix_lens):
    """Packed prefill of several sequences: each query sees its own sequence's keys causally."""
    ks, ke, base = [], [], 0
    for n, p in zip(seq_lens, prefix_lens):
        for t in range(n):
            ks.append(base)
            ke.append(base + p + t + 1)
        base += p + n
    return torch.tensor(ks, dtype=torch.int32), torch.tensor(ke, dtype=torch.int32), base


def make_case(kind, heads, seq_lens, prefix_lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    ks, ke, skv = ragged(seq_lens, prefix_lens)
    s = ks.numel()
    q = torch.randn(s, heads, 128, generator=g)
    k = torch.randn(skv, 128, generator=g)
    w = torch.randn(s, heads, generator=g)
    if kind == "fp8":
        q8 = quantize_fp8(q)[0]
        k8, sf = quantize_fp8(k)
        return [t.to(DEV) for t in (q8, k8, sf, w, ks, ke)]
    return [q.bfloat16().to(DEV), k.bfloat16().to(DEV), None, w.to(DEV), ks.to(DEV), ke.to(DEV)]


def run(kind, q, k, sf, w, ks, ke, **kw):
    if kind == "fp8":
        return fp8_mqa_logits(q, (k, sf), w, ks, ke, **kw)
    return bf16_mqa_logits(q, k, w, ks, ke, **kw)


CASES = [
    # id, heads, seq_lens, prefix_lens
    ("one-seq-h16", 16, [9], [70]),
    ("two-seqs-h16", 16, [5, 6], [0, 40]),
    ("h64-long-prefix", 64, [3], [150]),
]


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "noclean"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_mqa_logits_match_reference(kind, clean, case):
    _, heads, seq_lens, prefix = case
    q, k, sf, w, ks, ke = make_case(kind, heads, seq_lens, prefix)
    out = run(kind, q, k, sf, w, ks, ke, clean_logits=clean)
    ref = ref_mqa_logits(q, k, w, ks, ke, sf=sf)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert out.stride(0) % 256 == 0
    valid = ~torch.isneginf(ref)
    diff, masks_equal = compare_logits(out, ref)
    if clean:
        assert masks_equal, "masks differ"
    else:
        assert torch.isfinite(out[valid]).all()
    assert diff < 1e-5, f"calc_diff {diff:.3e}"
    again = run(kind, q, k, sf, w, ks, ke, clean_logits=clean)
    assert torch.equal(out[valid], again[valid]), "reruns differ"


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_compressed_logits_window(kind):
    q, k, sf, w, ks, ke = make_case(kind, 16, [4, 4], [30, 10])
    width = int((ke - ks).max())
    out = run(kind, q, k, sf, w, ks, ke, clean_logits=False, max_seqlen_k=width)
    ref = ref_mqa_logits(q, k, w, ks, ke, sf=sf, max_seqlen_k=width)
    assert out.shape == (q.shape[0], width)
    valid = ~torch.isneginf(ref)
    assert torch.equal(torch.isneginf(out), ~valid)
    assert calc_diff(zero_masked(out), zero_masked(ref)) < 1e-5


def test_bad_arguments_raise_clear_errors():
    q, k, sf, w, ks, ke = make_case("fp8", 16, [4], [10])
    with pytest.raises(ValueError, match="kv must be a pair"):
        fp8_mqa_logits(q, k, w, ks, ke)
    with pytest.raises(ValueError, match="key scales"):
        fp8_mqa_logits(q, (k, sf[:-1]), w, ks, ke)
    with pytest.raises(ValueError, match="clean_logits must be False"):
        fp8_mqa_logits(q, (k, sf), w, ks, ke, clean_logits=True, max_seqlen_k=8)
    with pytest.raises(ValueError, match="q must be"):
        bf16_mqa_logits(q, k, w, ks, ke)
    with pytest.raises(ValueError, match="cu_seq_len_k_end"):
        fp8_mqa_logits(q, (k, sf), w, ks, ke[:-1])


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_accumulate_into_adds_a_second_call_exactly_as_add_does(kind):
    """accumulate_into: the second kv head's logits added where the kernel writes them are,
    bit for bit, the first call's logits + the second's (add_ after the kernel), -inf where
    both are masked; twice through the same shapes (the second call takes the bound launch)."""
    q, k, sf, w, ks, ke = make_case(kind, 16, [5, 6], [0, 40], seed=1)
    q2, k2, sf2, w2, _, _ = make_case(kind, 16, [5, 6], [0, 40], seed=2)
    for _ in range(2):
        first = run(kind, q, k, sf, w, ks, ke)
        want = first.clone().add_(run(kind, q2, k2, sf2, w2, ks, ke))
        got = run(kind, q2, k2, sf2, w2, ks, ke, accumulate_into=first)
        assert got.data_ptr() == first.data_ptr()
        assert torch.equal(got, want)
    assert torch.isneginf(got).any() and torch.equal(torch.isneginf(got), torch.isneginf(want))
    with pytest.raises(ValueError, match="accumulate_into must be"):
        run(kind, q2, k2, sf2, w2, ks, ke, accumulate_into=torch.zeros(first.shape, device=first.device))
    with pytest.raises(ValueError, match="accumulate_into needs clean_logits"):
        run(kind, q2, k2, sf2, w2, ks, ke, clean_logits=False, accumulate_into=first)
