"""V3.2's production indexer key store (SGLang's fused path: LayerNorm, RoPE, no rotation):
the kernel against the torch reference of indexer_k.cuh, and that reference against SGLang's
own non-fused torch code (LayerNorm.forward_native, RotaryEmbedding.forward_native with its
cos_sin_cache, lifted from the wheel) in float64.
Metric: bf16 rows equal the reference's bf16 rounding; fp8 value bytes equal or one e4m3 step,
scales equal; every byte outside the written rows untouched.
TRITON_INTERPRET=1 without a GPU (tests/kernels/conftest.py)."""

import types

import pytest
import torch
from sglang_source import load_function, sglang_wheel

from niah.kernels import store_v32_index_keys
from niah.kernels.v32_store.reference import norm_rope, ref_store_v32_index_keys

DEV = "cuda" if torch.cuda.is_available() else "cpu"
EPS, MAX_POS = 1e-6, 512
ROW = {"bf16": 256, "fp8": 132}


def cos_sin_cache(max_pos=MAX_POS):
    """[max_pos, 64] fp32 = cos x 32 | sin x 32 of position * 10000^(-2j/64): SGLang's rotary
    cos_sin_cache for V3.2's indexer (the SGLang test below checks it equals the wheel's own)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 64, 2, dtype=torch.float) / 64))
    freqs = torch.einsum("i,j -> ij", torch.arange(max_pos, dtype=torch.float), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def _sglang_rope(max_pos):
    """RotaryEmbedding's cos_sin_cache, lifted from the wheel, and a rope object for forward_native."""
    wheel, ns = sglang_wheel(), {"torch": torch, "Union": object}
    mod = "sglang.srt.layers.rotary_embedding.base"
    inv_freq = load_function(wheel, mod, "RotaryEmbedding._compute_inv_freq", ns)
    compute = load_function(wheel, mod, "RotaryEmbedding._compute_cos_sin_cache", ns)
    rope = types.SimpleNamespace(rotary_dim=64, head_size=64, base=10000, max_position_embeddings=max_pos,
                                 position_start=0, _force_native=False, is_neox_style=False)
    rope._compute_inv_freq = lambda base: inv_freq(rope, base)
    rope.cos_sin_cache = compute(rope)
    return rope, wheel


def inputs(n, seed=0, stride=192):
    """key_raw as SGLang passes it: the wk slice of a merged GEMM output (row stride > 128)."""
    g = torch.Generator().manual_seed(seed)
    full = torch.randn(n, stride, generator=g) * torch.rand(n, 1, generator=g) * 4
    full[:, 5] += 6  # an outlier channel, like a real model's keys
    key = full.bfloat16()[:, :128]
    weight = 1 + 0.3 * torch.randn(128, generator=g)
    bias = 0.2 * torch.randn(128, generator=g)
    positions = torch.randint(0, MAX_POS, (n,), generator=g)
    return key, weight, bias, positions


def e4m3_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in e4m3 steps between two byte tensors of e4m3 values (sign-magnitude order)."""
    def order(x):
        x = x.long()
        return torch.where(x >= 128, -(x - 128), x)
    return (order(a) - order(b)).abs()


def assert_rows_match(got, want, index_dtype, page_size):
    """The explicit metric (see the module docstring)."""
    got = got.cpu()
    if index_dtype == "bf16":
        assert torch.equal(got, want), f"{int((got != want).sum())} bytes differ"
        return
    vals = slice(0, 128 * page_size)
    steps = e4m3_steps(got[:, vals], want[:, vals])
    assert int(steps.max()) <= 1, f"{int((steps > 1).sum())} fp8 bytes differ by more than one e4m3 step"
    assert torch.equal(got[:, 128 * page_size:], want[:, 128 * page_size:]), "scales differ"


@pytest.mark.parametrize("page_size", [64, 16])
@pytest.mark.parametrize("int_dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
@pytest.mark.parametrize("index_dtype", ["bf16", "fp8"])
def test_store_matches_reference(index_dtype, int_dtype, page_size):
    n, pages = 37, 5 * 64 // page_size
    key, weight, bias, positions = inputs(n)
    key[1] = 0  # all-zero key: LayerNorm gives the bias alone
    loc = torch.randperm(pages * page_size, generator=torch.Generator().manual_seed(1))[:n]
    loc[7] = -1  # padding token: skipped
    loc, positions = loc.to(int_dtype), positions.to(int_dtype)
    poison = torch.randint(0, 256, (pages, ROW[index_dtype] * page_size), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(2))
    got, want = poison.clone().to(DEV), poison.clone()
    args = (weight, bias, EPS, cos_sin_cache(), positions)
    store_v32_index_keys(key.to(DEV), got, loc.to(DEV), *(a.to(DEV) if torch.is_tensor(a) else a for a in args),
                         page_size=page_size, index_dtype=index_dtype)
    ref_store_v32_index_keys(key, want, loc, *args, page_size=page_size, index_dtype=index_dtype)
    assert int((want != poison).sum()) > 36 * 100, "the reference wrote too little"
    assert_rows_match(got, want, index_dtype, page_size)


def test_padding_slots_leave_the_cache_untouched():
    key, weight, bias, positions = inputs(12, seed=3)
    loc = torch.full((12,), -1, dtype=torch.int64)
    loc[4] = 70
    cache = torch.zeros(2, 132 * 64, dtype=torch.uint8, device=DEV)
    store_v32_index_keys(key.to(DEV), cache, loc.to(DEV), weight.to(DEV), bias.to(DEV), EPS,
                         cos_sin_cache().to(DEV), positions.to(DEV), index_dtype="fp8")
    cache = cache.cpu()
    written = torch.zeros_like(cache, dtype=torch.bool)
    written[1, 6 * 128: 7 * 128] = True
    written[1, 128 * 64 + 6 * 4: 128 * 64 + 7 * 4] = True
    assert cache[~written].eq(0).all()
    assert cache[written].ne(0).any()


def test_reference_matches_sglang_non_fused_path_in_float64():
    """SGLang's own torch code for the same math: LayerNorm.forward_native, then
    RotaryEmbedding.forward_native (is_neox_style=False, the fused path's condition) on the
    first 64 dims, in float64 from the same bf16 keys."""
    rope, wheel = _sglang_rope(MAX_POS)
    assert torch.equal(rope.cos_sin_cache, cos_sin_cache())
    key, weight, bias, positions = inputs(20, seed=5)
    ns_ln = {"torch": torch, "F": torch.nn.functional}
    layer_norm = load_function(wheel, "sglang.srt.layers.layernorm", "LayerNorm.forward_native", ns_ln)
    ln = types.SimpleNamespace(weight=weight.double(), bias=bias.double(), elementwise_affine=True, use_bias=True,
                               dtype=torch.float64, hidden_size=128, variance_epsilon=EPS)
    x = layer_norm(ln, key.double())
    rope._apply_rotary_emb_wrapped = load_function(wheel, "sglang.srt.layers.rotary_embedding.utils",
                                                   "apply_rotary_emb", {"torch": torch})
    forward = load_function(wheel, "sglang.srt.layers.rotary_embedding.base", "RotaryEmbedding.forward_native",
                            {"torch": torch, "Optional": object, "Tuple": object, "FusedSetKVBufferArg": object})
    k_rope = x[:, :64].clone()
    _, k_rope = forward(rope, positions, k_rope.clone(), k_rope)
    want = torch.cat((k_rope.reshape(20, 64), x[:, 64:]), dim=1)
    got = norm_rope(key, weight, bias, EPS, rope.cos_sin_cache, positions).double()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), float((got - want).abs().max())


def test_fp8_rows_dequantise_to_the_bf16_rows():
    key, weight, bias, positions = inputs(16, seed=6)
    loc = torch.arange(16)
    args = (weight.to(DEV), bias.to(DEV), EPS, cos_sin_cache().to(DEV), positions.to(DEV))
    c8 = torch.zeros(1, 132 * 64, dtype=torch.uint8, device=DEV)
    c16 = torch.zeros(1, 256 * 64, dtype=torch.uint8, device=DEV)
    store_v32_index_keys(key.to(DEV), c8, loc.to(DEV), *args, index_dtype="fp8")
    store_v32_index_keys(key.to(DEV), c16, loc.to(DEV), *args, index_dtype="bf16")
    c8, c16 = c8.cpu(), c16.cpu()
    k8 = c8[0, : 16 * 128].view(torch.float8_e4m3fn).view(16, 128).float()
    sf = c8[0, 128 * 64: 128 * 64 + 64].view(torch.float32)[:16]
    x = c16[0, : 16 * 256].view(torch.bfloat16).view(16, 128).float()
    err = (k8 * sf[:, None] - x).abs().max(1).values / x.abs().max(1).values
    assert float(err.max()) <= 2**-4  # e4m3: 3 mantissa bits, half a step relative to the row's amax


@pytest.mark.parametrize("bad", ["dtype", "key", "cache", "loc", "weight", "rope", "page"])
def test_wrapper_refuses_bad_inputs(bad):
    key, weight, bias, positions = inputs(4)
    args = dict(key_raw=key, kv_cache=torch.zeros(1, 132 * 64, dtype=torch.uint8), loc=torch.arange(4),
                weight=weight, bias=bias, eps=EPS, cos_sin_cache=cos_sin_cache(), positions=positions,
                index_dtype="fp8")
    if bad == "dtype":
        args["index_dtype"] = "fp4"
    elif bad == "key":
        args["key_raw"] = key.float()
    elif bad == "cache":
        args["index_dtype"] = "bf16"  # a 132-byte-row cache is not a bf16 cache
    elif bad == "loc":
        args["loc"] = torch.arange(3)
    elif bad == "weight":
        args["weight"] = weight.bfloat16()
    elif bad == "rope":
        args["cos_sin_cache"] = cos_sin_cache()[:, :32].contiguous()
    else:
        args["page_size"] = 48
    with pytest.raises(ValueError, match="store_v32_index_keys"):
        store_v32_index_keys(**args)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("index_dtype", ["bf16", "fp8"])
def test_gpu_store_matches_reference_at_size(index_dtype):
    """4,096 tokens over 80 pages of 64 (a prefill chunk), slots shuffled, some padding."""
    n, pages = 4096, 80
    key, weight, bias, positions = inputs(n, seed=9)
    loc = torch.randperm(pages * 64, generator=torch.Generator().manual_seed(4))[:n]
    loc[::97] = -1
    poison = torch.randint(0, 256, (pages, ROW[index_dtype] * 64), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(5))
    got, want = poison.clone().cuda(), poison.clone()
    args = (weight, bias, EPS, cos_sin_cache(), positions)
    store_v32_index_keys(key.cuda(), got, loc.cuda(), *(a.cuda() if torch.is_tensor(a) else a for a in args),
                         index_dtype=index_dtype)
    torch.cuda.synchronize()
    ref_store_v32_index_keys(key, want, loc, *args, index_dtype=index_dtype)
    assert_rows_match(got, want, index_dtype, 64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("index_dtype", ["bf16", "fp8"])
def test_gpu_bound_store_equals_triton_launcher_with_new_pointers_and_in_a_graph(index_dtype):
    """The store's second call with the same shapes goes through its bound plan (only the
    pointers new): the same bytes as Triton's launcher into fresh copies of the pool, eager
    and replayed from a CUDA graph."""
    from niah.kernels._launch import via_triton
    from niah.kernels.v32_store import wrapper as sw

    n, pages = 512, 12
    key, weight, bias, positions = (t.cuda() for t in inputs(n, seed=21))
    key = torch.empty(n, 192, dtype=key.dtype, device=key.device)[:, :128].copy_(key)  # SGLang's wk slice
    loc = torch.randperm(pages * 64, generator=torch.Generator().manual_seed(6))[:n].cuda()
    csc = cos_sin_cache().cuda()
    pool = torch.randint(0, 256, (pages, ROW[index_dtype] * 64), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(7)).cuda()
    want = pool.clone()
    with via_triton():
        store_v32_index_keys(key, want, loc, weight, bias, EPS, csc, positions, index_dtype=index_dtype)
    first = pool.clone()
    store_v32_index_keys(key, first, loc, weight, bias, EPS, csc, positions, index_dtype=index_dtype)
    plan_key = sw._plan_key(key, first, loc, weight, bias, EPS, csc, positions, 64, index_dtype)
    assert sw._PLANS.get(plan_key) is not None
    fresh = [t.clone() for t in (key, pool, loc, weight, bias, csc, positions)]
    fresh[0] = torch.empty(n, 192, dtype=key.dtype, device=key.device)[:, :128].copy_(key)  # new memory
    assert sw._plan_key(fresh[0], *fresh[1:5], EPS, *fresh[5:], 64, index_dtype) == plan_key
    store_v32_index_keys(fresh[0], fresh[1], fresh[2], fresh[3], fresh[4], EPS, fresh[5], fresh[6],
                         index_dtype=index_dtype)
    torch.cuda.synchronize()
    assert torch.equal(first, want) and torch.equal(fresh[1], want)
    graphed = pool.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        store_v32_index_keys(key, graphed, loc, weight, bias, EPS, csc, positions, index_dtype=index_dtype)
    torch.cuda.current_stream().wait_stream(stream)
    graphed.copy_(pool)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        store_v32_index_keys(key, graphed, loc, weight, bias, EPS, csc, positions, index_dtype=index_dtype)
    graphed.copy_(pool)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(graphed, want)
