"""Paged index logits (decode) over fp4 key pages: the Triton kernel against the float64 torch
reference over the dequantised keys (and query), with bf16 and MXFP4 queries; pages written by
niah's fp4 store (byte-equal to SGLang's: test_kernels_fp4_store.py).
Metric: DeepGEMM's calc_diff < 1e-9 against the float64 reference (the unpack path's values are
exact; only the fp32 accumulation rounds), masks identical with clean_logits, reruns bitwise.
TRITON_INTERPRET=1 without a GPU (tests/kernels/conftest.py): tiny shapes."""

import pytest
import torch
import triton
import triton.language as tl

from niah.kernels import fp4_paged_mqa_logits, store_fp4_index_keys
from niah.kernels._fp4 import (SHIFT_MAX, fp4_e4m3_halves, fp4_e4m3_packed, fp4_halves, fp4_halves_f16,
                               fp4_halves_packed)
from niah.kernels._common import compare_logits, has_fp8_conversion
from niah.kernels.fp4_paged_logits.reference import ref_fp4_paged_mqa_logits
from niah.kernels.fp4_paged_logits.wrapper import has_fp4_mma, has_fp8_mma
from niah.kernels.fp4_store.reference import ref_store_fp4_index_keys
from niah.kernels.quant import dequantize_fp4, fp4_sglang_layout, quantize_fp4

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def make_case(q_kind, batch, next_n, heads, lens, max_len, seed=0, dim=128):
    g = torch.Generator().manual_seed(seed)
    max_pages = (max_len + 63) // 64
    n_pages = batch * max_pages + 1
    table = torch.randperm(n_pages, generator=g)[: batch * max_pages].reshape(batch, max_pages).int()
    keys = torch.randn(n_pages * 64, dim, generator=g) * (1 + 3 * torch.rand(n_pages * 64, 1, generator=g))
    cache = _stored(keys, n_pages, dim)
    q = torch.randn(batch, next_n, heads, dim, generator=g)
    if q_kind == "fp4":
        codes, exps = quantize_fp4(q)
        q = fp4_sglang_layout(codes.reshape(-1, dim // 2), exps.reshape(-1, dim // 32)) if dim == 128 else (codes, exps)
        if dim == 128:
            q = (q[0].reshape(batch, next_n, heads, dim // 2), q[1].reshape(batch, next_n, heads))
    else:
        q = q.bfloat16()
    w = torch.rand(batch * next_n, heads, generator=g)
    return q, cache, w, torch.tensor(lens, dtype=torch.int32), table


def _stored(keys, n_pages, dim):
    """The pages by the torch reference store (equal to the kernel's, test_kernels_fp4_store.py; the
    interpreter would spend seconds on it); on a GPU by the kernel itself."""
    cache = torch.zeros(n_pages, 64 * (dim // 2 + dim // 32), dtype=torch.uint8, device=DEV)
    if DEV == "cuda":
        return store_fp4_index_keys(keys.to(DEV), cache, torch.arange(n_pages * 64, device=DEV))
    return ref_store_fp4_index_keys(keys, cache, torch.arange(n_pages * 64))


def _dev(q):
    return tuple(t.to(DEV) for t in q) if isinstance(q, tuple) else q.to(DEV)


CASES = [  # id, batch, next_n, heads, lens, max_len, query, clean_logits
    ("b2-n1-h16-ragged-bf16q-clean", 2, 1, 16, [100, 1], 128, "bf16", True),
    ("b2-n2-h24-fp4q-noclean", 2, 2, 24, [70, 128], 128, "fp4", False),
    ("b1-n1-h16-fp4q-clean", 1, 1, 16, [65], 128, "fp4", True),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fp4_paged_logits_match_float64_reference(case):
    _, batch, next_n, heads, lens, max_len, q_kind, clean = case
    q, cache, w, ctx, table = make_case(q_kind, batch, next_n, heads, lens, max_len)
    out = fp4_paged_mqa_logits(_dev(q), cache, w.to(DEV), ctx.to(DEV), table.to(DEV), None, max_len,
                               clean_logits=clean, mma="unpack")
    ref = ref_fp4_paged_mqa_logits(q, cache.cpu(), w, ctx, table, max_len)
    valid = ~torch.isneginf(ref)
    diff, masks_equal = compare_logits(out.cpu(), ref)
    assert diff < 1e-9, f"calc_diff {diff:.3e}"
    if clean:
        assert masks_equal
    again = fp4_paged_mqa_logits(_dev(q), cache, w.to(DEV), ctx.to(DEV), table.to(DEV), None, max_len,
                                 clean_logits=clean, mma="unpack")
    assert torch.equal(out.cpu()[valid], again.cpu()[valid])


@pytest.mark.parametrize("launch", [dict(pages_per_split=1, num_warps=8, num_stages=3),
                                    dict(pages_per_split=16, num_stages=1, max_registers=80)],
                         ids=["pages-warps", "regs"])
def test_a_launch_of_other_pages_warps_and_stages_gives_the_same_logits(launch):
    """The launch the benchmarks sweep (pages a program, warps, stages, registers capped at
    80 with spills on a GPU) splits the pages otherwise, not the sums: the default launch's
    logits, -inf masks included."""
    q, cache, w, ctx, table = make_case("fp4", 2, 1, 16, [190, 30], 192, seed=3)
    args = (_dev(q), cache, w.to(DEV), ctx.to(DEV), table.to(DEV), None, 192)
    want = fp4_paged_mqa_logits(*args, clean_logits=True, mma="unpack")
    got = fp4_paged_mqa_logits(*args, clean_logits=True, mma="unpack", **launch)
    assert torch.equal(torch.isneginf(got), torch.isneginf(want))
    assert compare_logits(got.cpu(), want.cpu())[0] < 1e-12


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_packed_decoding_gives_the_first_decodings_logits_bit_for_bit(case):
    """packed (the default where the GPU converts fp8): the keys, and an fp4 query, decoded
    x 2^-6 with the 2^6 folded into the head weights: a power of two, so every fp32 rounding is
    the one the first decoding makes, and the logits are equal bit for bit, -inf included."""
    if not has_fp8_conversion(torch.device(DEV)):
        pytest.skip("this GPU has no fp8 conversion (compute capability < 8.9): packed is not used there")
    _, batch, next_n, heads, lens, max_len, q_kind, clean = case
    q, cache, w, ctx, table = make_case(q_kind, batch, next_n, heads, lens, max_len, seed=5)
    args = (_dev(q), cache, w.to(DEV), ctx.to(DEV), table.to(DEV), None, max_len)
    got = fp4_paged_mqa_logits(*args, clean_logits=clean, mma="unpack", packed=True, f16=False)
    want = fp4_paged_mqa_logits(*args, clean_logits=clean, mma="unpack", packed=False)
    valid = torch.ones_like(want, dtype=torch.bool) if clean else ~torch.isneginf(
        ref_fp4_paged_mqa_logits(q, cache.cpu(), w, ctx, table, max_len)).to(DEV)
    assert torch.equal(got[valid], want[valid]) and (got[valid] != 0).any()


def test_every_code_byte_decodes_to_its_value_over_64_packed():
    """fp4_halves_packed: every byte's two values (both signs, the subnormal 0.5) x 2^-6, bit for
    bit against dequantize_fp4, at exponents 8 (the least it is exact at) to 254; on a GPU four
    code bytes a register by inline PTX."""
    if not has_fp8_conversion(torch.device(DEV)):
        pytest.skip("this GPU has no fp8 conversion (compute capability < 8.9): packed is not used there")
    codes = torch.arange(256, dtype=torch.uint8).repeat(4)
    exps = torch.tensor([8, 100, 127, 254], dtype=torch.uint8).repeat_interleave(256)
    even, odd = (torch.empty(1024, device=DEV) for _ in range(2))
    _decode[(1,)](codes.to(DEV), exps.to(DEV), even, odd, N=1024, FP8_CVT=True, PACKED=True, ASM=DEV == "cuda")
    want = dequantize_fp4(codes.view(64, 16), (exps.view(64, 16)[:, :1] - 6)).view(1024, 2)
    assert torch.equal(even.cpu(), want[:, 0]) and torch.equal(odd.cpu(), want[:, 1])


def test_head_dim_64_and_the_4d_page_view():
    q, cache, w, ctx, table = make_case("fp4", 1, 1, 16, [100], 128, seed=2, dim=64)
    view = cache.view(cache.shape[0], 64, 1, 34)
    out = fp4_paged_mqa_logits(_dev(q), view, w.to(DEV), ctx.to(DEV), table.to(DEV), None, 128, clean_logits=True)
    ref = ref_fp4_paged_mqa_logits(q, cache.cpu(), w, ctx, table, 128)
    assert compare_logits(out.cpu(), ref)[0] < 1e-9


def test_bad_inputs_raise_clear_errors():
    q, cache, w, ctx, table = make_case("fp4", 1, 1, 16, [100], 128)
    with pytest.raises(ValueError, match="MXFP4 pair"):
        fp4_paged_mqa_logits(q[0], cache, w, ctx, table, None, 128)
    with pytest.raises(ValueError, match="exponents must be uint8"):
        fp4_paged_mqa_logits((q[0], q[1][..., :2]), cache, w, ctx, table, None, 128)
    with pytest.raises(ValueError, match="weights must be float32"):
        fp4_paged_mqa_logits(q, cache, w.double(), ctx, table, None, 128)
    with pytest.raises(ValueError, match="mma must be one of"):
        fp4_paged_mqa_logits(q, cache, w, ctx, table, None, 128, mma="fast")
    for regs in (32, 256, 96.0, True):   # below what ptxas compiles the tensor-core product in, past 255, not an int
        with pytest.raises(ValueError, match=r"max_registers must be an int in \[64, 255\]"):
            fp4_paged_mqa_logits(q, cache, w, ctx, table, None, 128, max_registers=regs)
    if not has_fp4_mma(cache):
        with pytest.raises(ValueError, match="needs a GPU with fp4 MMA"):
            fp4_paged_mqa_logits(_dev(q), cache, w.to(DEV), ctx.to(DEV), table.to(DEV), None, 128, mma="scaled")


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and has_fp4_mma(torch.zeros(1, device="cuda"))),
                    reason="needs a GPU with fp4 MMA (compute capability 10.x / 12.x)")
def test_scaled_path_equals_unpack_path_on_fp4_mma_gpus():
    q, cache, w, ctx, table = make_case("fp4", 2, 1, 64, [300, 77], 320, seed=5)
    args = (_dev(q), cache, w.to(DEV), ctx.to(DEV), table.to(DEV), None, 320, True)
    a = fp4_paged_mqa_logits(*args, mma="scaled")
    b = fp4_paged_mqa_logits(*args, mma="unpack")
    assert compare_logits(a, b)[0] < 1e-6


# "large" under the interpreter: its constant loop bound also visits pages past a row's length, whose
# masked exponent bytes (127) lie 10 binades above these keys' (inf x 0 there); those logits are never stored
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply")
@pytest.mark.parametrize("case", ["none", "page", "query", "tail", "large"])
def test_the_f16_product_gives_the_same_logits_on_every_route(case):
    """f16 (the default with an fp4 query): values exact in f16 once each query head's and each
    program's pages' largest power of two is taken out. Keys whose group exponents spread past
    F16_SPREAD binades ("page": one key with a group x 2^28, past even f16's subnormals) or a query
    head past it ("query": x 2^28) send the program to the packed path; a key past the row's
    length is not looked at ("tail": such a key x 2^28 in the last page, a page a program so the
    rows take several programs); factors past 2^63 do too ("large": a query head x 2^126 of weight 16
against keys x 2^-10, whose logits are finite only if the two factors meet). Every
    route's logits equal the packed path's (bit for bit under the interpreter; on a GPU the f16
    and bf16 tensor cores may sum in another order) and the float64 reference's."""
    if not has_fp8_conversion(torch.device(DEV)):
        pytest.skip("this GPU has no fp8 conversion (compute capability < 8.9): f16 is not used there")
    g = torch.Generator().manual_seed(11)
    batch, heads, max_len = 2, 16, 192
    n_pages = 7
    table = torch.randperm(n_pages, generator=g)[:6].reshape(batch, 3).int()
    keys = torch.randn(n_pages * 64, 128, generator=g)
    ctx = torch.tensor([190, 150], dtype=torch.int32)
    if case == "page":
        keys[int(table[0, 1]) * 64 + 5, 32:64] *= 2.0 ** 28
    if case == "tail":
        keys[int(table[1, 2]) * 64 + 30, 32:64] *= 2.0 ** 28     # position 158 of row 1, whose length is 150
    q = torch.randn(batch, 1, heads, 128, generator=g)
    if case == "query":
        q[1, 0, 3, 96:] *= 2.0 ** 28
    if case == "large":   # a head's factor 2^127 on products whose keys carry 2^-10: finite only together
        q[1, 0, 3] *= 2.0 ** 126
        keys *= 2.0 ** -10
    q4 = quantize_fp4(q)
    cache = _stored(keys, n_pages, 128)
    w = torch.rand(batch, heads, generator=g)
    if case == "large":
        w[1, 3] = 16.0
    args = (_dev(q4), cache, w.to(DEV), ctx.to(DEV), table.to(DEV), None, max_len)
    launch = {"pages_per_split": 1} if case == "tail" else {}
    got = fp4_paged_mqa_logits(*args, clean_logits=True, mma="unpack", f16=True, **launch)
    want = fp4_paged_mqa_logits(*args, clean_logits=True, mma="unpack", f16=False, **launch)
    if DEV == "cpu":
        assert torch.equal(got, want)
    else:   # the f16 and bf16 tensor cores sum the same exact products; whether in one order is the GPU's
        assert torch.equal(torch.isneginf(got), torch.isneginf(want)) and compare_logits(got, want)[0] < 1e-12
    assert torch.isfinite(got[~torch.isneginf(got)]).all()
    if case != "large":   # "large": logits near 2^118, past what the reference's comparison squares
        assert compare_logits(got.cpu(), ref_fp4_paged_mqa_logits(q4, cache.cpu(), w, ctx, table, max_len))[0] < 1e-9


def test_every_code_byte_and_shift_becomes_its_f16_value():
    """fp4_halves_f16: every byte's two values (both signs, the subnormal 0.5) at every shift
    -13..0 are e2m1 x 2^shift, bit for bit against dequantize_fp4; on a GPU as f16 through the
    inline PTX, the fp8 conversion and f16 multiplies."""
    if not has_fp8_conversion(torch.device(DEV)):
        pytest.skip("this GPU has no fp8 conversion (compute capability < 8.9): f16 is not used there")
    codes = torch.arange(256, dtype=torch.uint8).repeat(16)
    shifts = torch.arange(-15, 1, dtype=torch.int32).clamp(min=-13).repeat_interleave(256)   # -13 thrice: 16 rows
    even, odd = (torch.empty(256 * 16, device=DEV) for _ in range(2))
    _decode_f16[(1,)](codes.to(DEV), shifts.to(DEV), even, odd, N=256 * 16, ASM=DEV == "cuda")
    want = dequantize_fp4(codes.view(-1, 16), (127 + shifts.view(-1, 16)[:, :1]).to(torch.uint8)).view(-1, 2)
    assert torch.equal(even.cpu(), want[:, 0]) and torch.equal(odd.cpu(), want[:, 1])
    assert (want[:, 0] == 2.0 ** -14).any()    # the least value, 0.5 x 2^-13, is f16's least normal


@triton.jit
def _decode_f16(c_ptr, s_ptr, even_ptr, odd_ptr, N: tl.constexpr, ASM: tl.constexpr):
    offs = tl.arange(0, N)
    even, odd = fp4_halves_f16(tl.load(c_ptr + offs), tl.load(s_ptr + offs), tl.float16, ASM)
    tl.store(even_ptr + offs, even.to(tl.float32))
    tl.store(odd_ptr + offs, odd.to(tl.float32))


@triton.jit
def _decode(c_ptr, e_ptr, even_ptr, odd_ptr, N: tl.constexpr, FP8_CVT: tl.constexpr, PACKED: tl.constexpr = False,
            ASM: tl.constexpr = False):
    offs = tl.arange(0, N)
    if PACKED:
        even, odd = fp4_halves_packed(tl.load(c_ptr + offs), tl.load(e_ptr + offs), tl.float32, ASM)
    else:
        even, odd = fp4_halves(tl.load(c_ptr + offs), tl.load(e_ptr + offs), tl.float32, FP8_CVT)
    tl.store(even_ptr + offs, even)
    tl.store(odd_ptr + offs, odd)


@pytest.mark.filterwarnings("ignore:overflow encountered in multiply")   # 6 x 2^127 is inf, as it should be
@pytest.mark.parametrize("fp8_cvt", [True, False], ids=["fp8-conversion", "integer-bits"])
def test_every_code_byte_decodes_exactly(fp8_cvt):
    """The kernels' decoding (kernels/_fp4.py: the code through the fp8 conversion, or, on GPUs
    without one, its fp32 bits built with integer operations) against
    niah.kernels.quant.dequantize_fp4 on every byte (both nibbles, both signs, the subnormal
    0.5) at exponents from 1 to 254, bit for bit in fp32."""
    codes = torch.arange(256, dtype=torch.uint8).repeat(4)                  # every byte, 4 times
    exps = torch.tensor([1, 100, 127, 254], dtype=torch.uint8).repeat_interleave(256)
    even, odd = (torch.empty(1024, device=DEV) for _ in range(2))
    if fp8_cvt and not has_fp8_conversion(torch.device(DEV)):
        pytest.skip("this GPU has no fp8 conversion (compute capability < 8.9): its kernels decode with integers")
    _decode[(1,)](codes.to(DEV), exps.to(DEV), even, odd, N=1024, FP8_CVT=fp8_cvt)
    # rows of 16 bytes (one group of 32 values), one exponent a row
    want = dequantize_fp4(codes.view(64, 16), exps.view(64, 16)[:, :1]).view(1024, 2)
    assert torch.equal(even.cpu(), want[:, 0]) and torch.equal(odd.cpu(), want[:, 1])
    assert torch.isinf(want[-1, 1]) and (want[:, 0] == 0.5).any()       # the edges are in it: inf, subnormal 0.5


@triton.jit
def _decode_e4m3(c_ptr, s_ptr, even_ptr, odd_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    even, odd = fp4_e4m3_halves(tl.load(c_ptr + offs), tl.load(s_ptr + offs), tl.float8e4nv)
    tl.store(even_ptr + offs, even.to(tl.float32))
    tl.store(odd_ptr + offs, odd.to(tl.float32))


def test_every_code_byte_and_shift_becomes_the_exact_e4m3_number():
    """The fp8 path's decoding (kernels/_fp4.py fp4_e4m3_halves) on every byte at every shift
    0..SHIFT_MAX: e2m1 x 2^(shift - 6) as an e4m3 number, bit for bit (the shifted subnormal
    0.5 and the largest value, 6 x 2^6, included)."""
    if not has_fp8_mma(torch.zeros(1, device=DEV)):
        pytest.skip("this GPU has no fp8 MMA (compute capability < 8.9): the fp8 path is refused there")
    shifts = torch.arange(16, dtype=torch.int32).clamp(max=SHIFT_MAX.value).repeat_interleave(256)   # a power of 2
    codes = torch.arange(256, dtype=torch.uint8).repeat(16)
    n = codes.numel()
    even, odd = (torch.empty(n, device=DEV) for _ in range(2))
    _decode_e4m3[(1,)](codes.to(DEV), shifts.to(DEV), even, odd, N=n)
    base = dequantize_fp4(codes.view(-1, 16), torch.full((n // 16, 1), 127, dtype=torch.uint8)).view(n, 2)
    want = base * torch.exp2(shifts.float() - 6)[:, None]
    assert torch.equal(even.cpu(), want[:, 0]) and torch.equal(odd.cpu(), want[:, 1])
    assert want.abs().max() == 384 and (want == 2.0 ** -7).any()


@pytest.mark.parametrize("spread", [False, True], ids=["query-fits", "query-head-spread"])
def test_fp8_path_matches_float64_reference_and_its_selection(spread):
    """mma="fp8" (an MXFP4 query; fp8 tensor cores on a GPU, fp32 under the interpreter) against
    the float64 reference: calc_diff, masks, and the top-k of every row equal to the reference's
    (ties by position: topk over the logits then the index order); keys whose groups lie 20
    binades apart (a group's factor is applied to its own product: exact); a query head whose
    groups spread past SHIFT_MAX binades sends its program to the unpack path, exactly."""
    if not has_fp8_mma(torch.zeros(1, device=DEV)):
        pytest.skip("this GPU has no fp8 MMA (compute capability < 8.9): the fp8 path is refused there")
    q, cache, w, ctx, table = make_case("fp4", 2, 1, 32, [190, 129], 192, seed=7)
    keys = torch.randn(64, 128, generator=torch.Generator().manual_seed(3))
    keys[5, :32] *= 2.0 ** -20                                      # one key's first group, 20 binades down
    page = ref_store_fp4_index_keys(keys, torch.zeros(1, 64 * 68, dtype=torch.uint8), torch.arange(64))
    cache[int(table[0, 1])] = page[0].to(cache.device)
    if spread:                                                      # request 1, head 3: group 0's exponent - 20
        q = (q[0], q[1].clone())
        q[1][1, 0, 3] -= 20
    out = fp4_paged_mqa_logits(_dev(q), cache, w.to(DEV), ctx.to(DEV), table.to(DEV), None, 192,
                               clean_logits=True, mma="fp8")
    ref = ref_fp4_paged_mqa_logits(q, cache.cpu(), w, ctx, table, 192)
    diff, masks_equal = compare_logits(out.cpu(), ref)
    assert diff < 1e-9 and masks_equal, f"calc_diff {diff:.3e}"
    unpack = fp4_paged_mqa_logits(_dev(q), cache, w.to(DEV), ctx.to(DEV), table.to(DEV), None, 192,
                                  clean_logits=True, mma="unpack")
    assert compare_logits(out.cpu(), unpack.cpu())[0] < 1e-9
    for row, n in enumerate(ctx.tolist()):
        k = min(32, n)
        got = torch.topk(out[row, :n].cpu().double(), k).indices.sort().values
        want = torch.topk(ref[row, :n].double(), k).indices.sort().values
        assert torch.equal(got, want)


@triton.jit
def _decode_packed(c_ptr, even_ptr, odd_ptr, N: tl.constexpr, ASM: tl.constexpr):
    offs = tl.arange(0, N)
    even, odd = fp4_e4m3_packed(tl.load(c_ptr + offs), ASM)
    tl.store(even_ptr + offs, even.to(tl.float32))
    tl.store(odd_ptr + offs, odd.to(tl.float32))


def test_every_code_byte_becomes_its_e4m3_number_four_a_register():
    """The fp8 path's key decoding (kernels/_fp4.py fp4_e4m3_packed): every byte's two codes as
    e4m3 numbers e2m1 x 2^-6, bit for bit; on a GPU by its inline PTX (four bytes a register),
    under the interpreter by the same bits in uint8 operations."""
    if not has_fp8_mma(torch.zeros(1, device=DEV)):
        pytest.skip("this GPU has no fp8 MMA (compute capability < 8.9): the fp8 path is refused there")
    codes = torch.arange(256, dtype=torch.uint8).repeat(4)
    even, odd = (torch.empty(1024, device=DEV) for _ in range(2))
    _decode_packed[(1,)](codes.to(DEV), even, odd, N=1024, ASM=DEV == "cuda")
    want = dequantize_fp4(codes.view(-1, 16), torch.full((64, 1), 127 - 6, dtype=torch.uint8)).view(1024, 2)
    assert torch.equal(even.cpu(), want[:, 0]) and torch.equal(odd.cpu(), want[:, 1])


def test_fp8_path_refuses_what_it_cannot_do():
    """mma="fp8": a bf16 query and head dim 64 refused with one ValueError each (and a GPU
    without fp8 MMA, where there is one: compute capability below 8.9)."""
    q, cache, w, ctx, table = make_case("bf16", 1, 1, 16, [64], 64)
    with pytest.raises(ValueError, match="needs an MXFP4 query"):
        fp4_paged_mqa_logits(_dev(q), cache, w.to(DEV), ctx.to(DEV), table.to(DEV), None, 64, mma="fp8")
    q, cache, w, ctx, table = make_case("fp4", 1, 1, 16, [64], 64, dim=64)
    with pytest.raises(ValueError, match="of head dim 128"):
        fp4_paged_mqa_logits(_dev(q), cache, w.to(DEV), ctx.to(DEV), table.to(DEV), None, 64, mma="fp8")
    if not has_fp8_mma(torch.zeros(1, device=DEV)):
        q, cache, w, ctx, table = make_case("fp4", 1, 1, 16, [64], 64)
        with pytest.raises(ValueError, match="needs a GPU with fp8 MMA"):
            fp4_paged_mqa_logits(_dev(q), cache, w.to(DEV), ctx.to(DEV), table.to(DEV), None, 64, mma="fp8")
