"""The index query's quantisation kernel: bitwise equal to niah.kernels.quant's quantisation
(fp8, the scale folded into the head weight) or the bf16 cast, heads padded with zero queries
and weights, from the strided views the GPU server hands it. TRITON_INTERPRET=1 without a GPU
(tests/kernels/conftest.py)."""

import pytest
import torch

from niah.kernels import quantize_query
from niah.kernels.query_quant.reference import ref_quantize_query

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def query(C, Hkv, G, D, seed=0):
    """An index query as the server holds it: [1, H, C, D] viewed as [C, Hkv, G, D] (strided)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, Hkv * G, C, D, generator=g) * torch.rand(1, Hkv * G, C, 1, generator=g) * 6
    q[0, 0, 1] = 0                 # an all-zero row: the 1e-4 amax floor
    q[0, 1, 2, :5] = 1e-6          # tiny values: subnormal e4m3
    q[0, 2, 3, 0] = 3e4            # one large value: the others round towards 0
    return q.to(DEV)[0].view(Hkv, G, C, D).permute(2, 0, 1, 3)


@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
@pytest.mark.parametrize("G,pad", [(3, 4), (3, None), (4, None), (1, 2)])
def test_bitwise_equal_to_the_reference(dtype, G, pad):
    q = query(9, 3, G, 64, seed=G)
    w = (9 * 64) ** -0.5
    got_q, got_w = quantize_query(q, w, dtype, pad_to=pad)
    want_q, want_w = ref_quantize_query(q, w, dtype, pad_to=pad)
    assert got_q.shape == want_q.shape == (9, 3, pad or G, 64) and got_q.dtype == want_q.dtype
    assert torch.equal(got_q.view(torch.uint8) if dtype == "fp8" else got_q.view(torch.int16),
                       want_q.view(torch.uint8) if dtype == "fp8" else want_q.view(torch.int16))
    assert torch.equal(got_w, want_w)
    if pad and pad > G:
        assert not got_q[:, :, G:].float().any() and not got_w[:, :, G:].any()


def test_a_decode_row_of_one_query():
    """The decode step's shape: [Hkv, next_n 1, G, D] from one query row, no padding."""
    q = query(4, 3, 3, 64, seed=7)[3][:, None]                      # [3, 1, 3, 64]
    got = quantize_query(q, 0.5, "fp8")
    want = ref_quantize_query(q, 0.5, "fp8")
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(got[1], want[1])


def test_bad_inputs_are_refused_with_one_line():
    q = query(4, 3, 3, 64)
    for bad, msg in ((lambda: quantize_query(q, 1.0, "fp4"), "dtype"),
                     (lambda: quantize_query(q[0], 1.0, "fp8"), "must be"),
                     (lambda: quantize_query(q, 1.0, "fp8", pad_to=2), "pad_to"),
                     (lambda: quantize_query(q[..., :24], 1.0, "fp8"), "power of two")):
        with pytest.raises(ValueError, match=msg):
            bad()
