"""niah's fp4 (MXFP4) index-key quantiser (niah.kernels.quant) against SGLang 0.5.23's own:
its Triton kernels from the wheel (tests/sglang_fp4_lift.py), run under TRITON_INTERPRET=1 on
CPU (tests/kernels/conftest.py), on the same keys.
Metric: the code bytes and the packed exponent words are equal, byte for byte, for both of
SGLang's kernels (one token a program; its Blackwell rows kernel) and both tie rules; and the
round trip equals an independent float64 construction (nearest e2m1 grid point of k / 2^e)."""

import pytest
import torch
from sglang_fp4_lift import Platform, fp4_quant

from niah.kernels.quant import (
    E2M1_VALUES, dequantize_fp4, fp4_exponents, fp4_sglang_layout, quantize_fp4, store_roundtrip,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def keys(n=40, dtype=torch.float32, seed=0):
    """Rows with per-group spread, and the corners of the format."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, 128, generator=g) * (10 ** torch.empty(n, 4, 1).uniform_(-3, 2, generator=g)).expand(
        n, 4, 32).reshape(n, 128)
    k[0] = 0                                                   # all-zero key: the 1e-4 floor
    k[1, 32:64] = 0                                            # one all-zero group
    k[2, :64] = 1e-6 * torch.randn(64, generator=g)            # below the floor
    grid = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 3.0])
    k[3, :32] = torch.cat([grid, -grid, grid, grid[:2]])       # ties, scale 1 (amax 6: sf 1 exactly)
    k[4, :32] = torch.cat([grid, -grid, grid, grid[:2]]) * 2.0 ** -7  # ties at another exponent
    k[5, :32] = 3.0 * 2.0 ** torch.arange(-8, 24).float()      # amax / 6 a power of two, and not
    k[6] = -0.0
    k[7, 96:] = torch.tensor([6.0] + [-6.0 * 1.0001] * 31)     # magnitudes just past 6 clamp
    return k.to(dtype)


def sglang_quantize(x, rne, blackwell=False):
    """SGLang's kernel on x (int8 [N, 64], int32 [N]): blackwell picks _quantize_fp4_indexer_rows
    (SGLang runs it on Blackwell from 4,096 rows; launched here on the test's rows as SGLang does)."""
    mod = fp4_quant(Platform(blackwell))
    if not blackwell:
        return mod.quantize_fp4_indexer_tensor(x, rne=rne)
    import triton

    x = x.contiguous().view(-1, 128)
    codes = torch.empty((x.shape[0], 64), device=x.device, dtype=torch.int8)
    sf = torch.empty((x.shape[0],), device=x.device, dtype=torch.int32)
    mod._quantize_fp4_indexer_rows[(triton.cdiv(x.shape[0], 8),)](
        x, codes, sf, x.shape[0], 8, BLOCK_N=128, GROUP_N=32, RNE=rne, num_warps=4)
    return codes, sf


@pytest.mark.parametrize("blackwell", [False, True], ids=["token-kernel", "rows-kernel"])
@pytest.mark.parametrize("rne", [False, True], ids=["threshold", "rne"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_bytes_equal_sglang_quantiser(dtype, rne, blackwell):
    k = keys(61 if blackwell else 11, dtype)  # the token kernel is one interpreted program a row
    want_codes, want_sf = sglang_quantize(k.to(DEV), rne, blackwell)
    got_codes, got_sf = fp4_sglang_layout(*quantize_fp4(k.to(DEV), rne=rne))
    assert got_codes.dtype == want_codes.dtype and got_sf.dtype == want_sf.dtype
    assert torch.equal(got_codes.cpu(), want_codes.cpu()), f"{int((got_codes.cpu() != want_codes.cpu()).sum())} " \
        "code bytes differ"
    assert torch.equal(got_sf.cpu(), want_sf.cpu()), "exponent words differ"


def test_the_corner_rows_take_the_paths_they_name():
    """The keys above do reach the floor, the exact power of two and both tie rules."""
    k = keys()
    e = fp4_exponents(k)
    floor = (torch.tensor(1e-4).view(torch.int32) >> 23) + 1
    assert int(e[0, 0]) == int(floor) and int(e[1, 1]) == int(floor) and int(e[2, 0]) == int(floor)
    assert int(e[3, 0]) == 127                                 # amax 6: sf = 1.0, no rounding up
    assert not torch.equal(quantize_fp4(k, rne=False)[0][3], quantize_fp4(k, rne=True)[0][3])


def reference_roundtrip(k: torch.Tensor, rne: bool) -> torch.Tensor:
    """Independent float64 construction: scale 2^ceil(log2(max(amax / 6, 1e-4 in fp32))), each
    value the nearest of the 15 signed e2m1 points x scale (a tie: the lower magnitude, or the
    even code under rne), |k / scale| clamped to 6."""
    k = k.double().reshape(*k.shape[:-1], -1, 32)
    floor = float(torch.tensor(1e-4, dtype=torch.float32))
    sf = torch.clamp(k.abs().amax(-1) / 6, min=floor)
    scale = torch.exp2(torch.ceil(torch.log2(sf))).unsqueeze(-1)
    x = (k / scale).clamp(-6, 6)
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    dist = (x.abs().unsqueeze(-1) - grid).abs()
    best = dist.min(-1, keepdim=True).values
    ties = dist == best
    idx = torch.where(ties, torch.arange(8), 99).min(-1).values     # the lower code on a tie
    if rne:
        even = torch.where(ties & (torch.arange(8) % 2 == 0), torch.arange(8), 99).min(-1).values
        idx = torch.where(even < 99, even, idx)
    return (grid[idx] * torch.sign(x) * scale).reshape(*k.shape[:-2], -1)


@pytest.mark.parametrize("rne", [False, True], ids=["threshold", "rne"])
def test_roundtrip_equals_float64_construction(rne):
    k = keys(40, torch.float32, seed=3)
    got = dequantize_fp4(*quantize_fp4(k, rne=rne))
    want = reference_roundtrip(k, rne)
    assert torch.equal(got.double(), want)
    if not rne:
        assert torch.equal(store_roundtrip(k, "fp4"), got)


def test_roundtrip_error_is_the_formats():
    """N(0,1) keys lose about 11% of the norm in fp4 (fp8: 2.5%): a check on the scale, not a goal."""
    k = torch.randn(512, 128, generator=torch.Generator().manual_seed(5))
    err = float((store_roundtrip(k, "fp4") - k).norm() / k.norm())
    assert 0.09 < err < 0.13
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_fp4(torch.zeros(2, 48))
