"""V4's indexer key store kernel: fp8 rows bitwise equal to the torch reference of
SGLang's fused_norm_rope_indexer, bf16 rows exact, and the reference itself against an
independent float64 RMSNorm + complex RoPE + Hadamard-matrix computation.
TRITON_INTERPRET=1 without a GPU (tests/kernels/conftest.py)."""

import pytest
import torch

from niah.kernels import store_v4_index_keys
from niah.kernels.v4_store.reference import (
    norm_rope_hadamard, plan_targets, ref_store_v4_index_keys,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
RATIO, EPS = 4, 1e-6


def make_plan(seq_lens, ragged=None):
    """SGLang plan rows: uint32 seq_len (bytes 0..3), uint16 ragged_id (bytes 4..5)."""
    words = torch.zeros(len(seq_lens), 4, dtype=torch.int64)
    words[:, 0] = torch.tensor(seq_lens, dtype=torch.int64)
    if ragged is not None:
        words[:, 1] = torch.tensor(ragged, dtype=torch.int64)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.view(torch.uint8).reshape(len(seq_lens), 16)


def freqs_table(max_pos=512, seed=0):
    """SGLang's complex freqs_cis (theta ** -(2j/64) per pair) as view_as_real, flattened."""
    inv = 1.0 / (10000 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.view_as_real(torch.polar(torch.ones_like(ang), ang).to(torch.complex64)).flatten(-2)


def inputs(n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv = (torch.randn(n, 128, generator=g) * torch.rand(n, 1, generator=g) * 3).to(dtype)
    kv[1] = 0  # all-zero key: the 1e-4 amax floor
    w = (1 + 0.3 * torch.randn(128, generator=g)).to(torch.float32)
    return kv, w


def case(mode, n, seed):
    g = torch.Generator().manual_seed(seed + 7)
    if mode == "decode":
        seqs = [int(s) for s in torch.randint(4, 400, (n,), generator=g)]
        seqs[0] = 8
        seqs[2] = 9  # not a multiple of the ratio: skipped
        return make_plan(seqs), torch.randperm(5 * 64, generator=g)[:n].long(), True
    seqs = [int(s) for s in torch.randint(4, 400, (n,), generator=g) // RATIO * RATIO]
    seqs[3] = 2**32 - 1  # invalid plan row: skipped
    ragged = torch.randperm(n, generator=g).tolist()
    return make_plan(seqs, ragged), torch.randperm(5 * 64, generator=g)[:n].long(), False


@pytest.mark.parametrize("key_dtype", ["fp8", "bf16", "bf16-padded"])
@pytest.mark.parametrize("mode", ["decode", "prefill"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["kv-bf16", "kv-fp32"])
def test_store_bitwise_equal_to_reference(key_dtype, mode, dtype):
    """bf16-padded: the plugin's V4 pool, 264 bytes a token (a page is [64 x 132] bf16)."""
    kv, w = inputs(37, dtype)
    plan, loc, is_decode = case(mode, 37, 1)
    freqs = freqs_table()
    stride = {"fp8": 132, "bf16": 256, "bf16-padded": 264}[key_dtype] * 64
    key_dtype = key_dtype.split("-")[0]
    poison = torch.randint(0, 256, (5, stride), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    got, want = poison.clone().to(DEV), poison.clone()
    store_v4_index_keys(kv.to(DEV), plan.to(DEV), is_decode, RATIO, w.to(DEV), EPS, freqs.to(DEV),
                        loc.to(DEV), got, key_dtype, page_stride=stride)
    ref_store_v4_index_keys(kv, plan, is_decode, RATIO, w, EPS, freqs, loc, want, key_dtype)
    assert not torch.equal(want, poison), "the reference wrote nothing"
    assert torch.equal(got.cpu(), want), f"{int((got.cpu() != want).sum())} bytes differ"


def test_skipped_tokens_leave_their_slots_untouched():
    kv, w = inputs(12, torch.bfloat16)
    plan, loc, _ = case("decode", 12, 3)
    valid, _, slot = plan_targets(plan, loc, True, RATIO)
    assert not bool(valid[2]) and bool(valid[0])
    cache = torch.zeros(5, 132 * 64, dtype=torch.uint8, device=DEV)
    store_v4_index_keys(kv.to(DEV), plan.to(DEV), True, RATIO, w.to(DEV), EPS, freqs_table().to(DEV),
                        loc.to(DEV), cache, "fp8")
    page, off = int(slot[2]) // 64, int(slot[2]) % 64
    assert cache[page, off * 128 : off * 128 + 128].eq(0).all()
    page, off = int(slot[0]) // 64, int(slot[0]) % 64
    assert cache[page, off * 128 : off * 128 + 128].ne(0).any()


def hadamard_matrix(n=128):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h / n**0.5


def test_reference_matches_float64_norm_rope_hadamard():
    """RMSNorm, complex RoPE on the rotary half, Sylvester Hadamard matrix, in float64."""
    kv, w = inputs(20, torch.float32, seed=5)
    pos = torch.arange(20) * 3
    freqs = freqs_table()
    got = norm_rope_hadamard(kv, w, EPS, freqs, pos).double()
    x = kv.double()
    x = x / torch.sqrt((x * x).mean(1, keepdim=True) + EPS) * w.double()
    rot = torch.view_as_complex(x[:, 64:].reshape(20, 32, 2).contiguous())
    f = torch.view_as_complex(freqs[pos].double().reshape(20, 32, 2).contiguous())
    x = torch.cat((x[:, :64], torch.view_as_real(rot * f).reshape(20, 64)), 1)
    want = x @ hadamard_matrix().T
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_fp8_rows_dequantise_to_the_float64_keys():
    kv, w = inputs(16, torch.bfloat16, seed=6)
    plan, loc = make_plan([4 * (i + 1) for i in range(16)]), torch.arange(16)
    cache = torch.zeros(1, 132 * 64, dtype=torch.uint8, device=DEV)
    store_v4_index_keys(kv.to(DEV), plan.to(DEV), True, RATIO, w.to(DEV), EPS, freqs_table().to(DEV),
                        loc.to(DEV), cache, "fp8")
    cache = cache.cpu()
    k8 = cache[0, : 16 * 128].view(torch.float8_e4m3fn).view(16, 128).float()
    sf = cache[0, 128 * 64 : 128 * 64 + 64].view(torch.float32)
    x = norm_rope_hadamard(kv, w, EPS, freqs_table(), torch.arange(16) * 4)
    err = (k8 * sf[:, None] - x).abs().max(1).values / x.abs().max(1).values.clamp_min(1e-4)
    assert float(err.max()) <= 2**-4  # e4m3: 3 mantissa bits, half-ulp relative to the row's amax


@pytest.mark.parametrize("bad", ["dim", "plan", "cache", "dtype"])
def test_wrapper_refuses_bad_inputs(bad):
    kv, w = inputs(4, torch.bfloat16)
    plan, loc = make_plan([4, 8, 12, 16]), torch.arange(4)
    cache = torch.zeros(1, 132 * 64, dtype=torch.uint8)
    args = dict(kv=kv, plan_bytes=plan, is_decode=True, compress_ratio=4, norm_weight=w, eps=EPS,
                freqs=freqs_table(), out_loc=loc, kvcache=cache, key_dtype="fp8")
    if bad == "dim":
        args["kv"] = torch.zeros(4, 64, dtype=torch.bfloat16)
    elif bad == "plan":
        args["plan_bytes"] = plan[:, :8].contiguous()
    elif bad == "cache":
        args["key_dtype"] = "bf16"  # a 132-byte-row cache is not a bf16 cache
    else:
        args["key_dtype"] = "fp4"
    with pytest.raises(ValueError, match="store_v4_index_keys"):
        store_v4_index_keys(**args)
