"""Paged index logits (decode): the Triton kernels against the fp64 torch reference.

Without a GPU the kernels run under TRITON_INTERPRET=1 on CPU tensors
(tests/kernels/conftest.py sets it before triton is imported); with one, the same tests run on CUDA.
"""

import pytest
import torch

from niah.kernels import (
    bf16_paged_mqa_logits,
    fp8_paged_mqa_logits,
    get_paged_mqa_logits_metadata,
)
from niah.kernels._common import compare_logits
from niah.kernels.paged_logits.reference import ref_paged_mqa_logits, visible_lengths
from niah.kernels.quant import quantize_fp8

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK_KV = 64


def make_case(kind, batch, next_n, heads, dim, lens, max_context_len, seed=0, ctx_2d=False):
    g = torch.Generator().manual_seed(seed)
    max_pages = (max_context_len + BLOCK_KV - 1) // BLOCK_KV
    n_pages = batch * max_pages + 3
    # pages scattered at random through the pool: the kernel must follow the block table
    block_table = torch.randperm(n_pages, generator=g)[: batch * max_pages].reshape(batch, max_pages).int()
    k = torch.randn(n_pages, BLOCK_KV, dim, generator=g)
    q = torch.randn(batch, next_n, heads, dim, generator=g)
    w = torch.randn(batch * next_n, heads, generator=g)
    if kind == "fp8":
        k8, sf = quantize_fp8(k)
        kv = torch.cat([k8.view(torch.uint8).reshape(n_pages, -1), sf.view(torch.uint8).reshape(n_pages, -1)], 1)
        kv = kv.reshape(n_pages, BLOCK_KV, 1, dim + 4)
        q = quantize_fp8(q)[0]
    else:
        kv = k.to(torch.bfloat16).reshape(n_pages, BLOCK_KV, 1, dim)
        q = q.to(torch.bfloat16)
    ctx = torch.tensor(lens, dtype=torch.int32)
    if ctx_2d:  # [B, next_n]: row j sees ctx[b] - next_n + j + 1 tokens, spelled out
        ctx = visible_lengths(ctx, batch, next_n).reshape(batch, next_n).int()
    return [t.to(DEV) for t in (q, kv, w, ctx, block_table)]


CASES = [
    # id, batch, next_n, heads, lens, max_context_len
    ("b2-n1-h16", 2, 1, 16, [300, 70], 320),
    ("b3-n2-h16", 3, 2, 16, [129, 64, 2], 200),
    ("b1-n1-h64-exact-pages", 1, 1, 64, [256], 256),
    ("b2-n1-h24-padded-heads", 2, 1, 24, [190, 1], 192),
    # ragged batch: empty, one token, page and split edges (splits of 4 pages = 256 tokens on CPU)
    ("b6-n1-h16-ragged", 6, 1, 16, [1, 0, 513, 64, 65, 256], 600),
    ("b3-n2-h16-ragged", 3, 2, 16, [1, 300, 2], 320),
]


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "noclean"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_paged_logits_match_reference(kind, clean, case):
    _, batch, next_n, heads, lens, max_len = case
    q, kv, w, ctx, bt = make_case(kind, batch, next_n, heads, 128, lens, max_len)
    fn = fp8_paged_mqa_logits if kind == "fp8" else bf16_paged_mqa_logits
    meta = get_paged_mqa_logits_metadata(ctx, BLOCK_KV, 4)
    out = fn(q, kv, w, ctx, bt, meta, max_len, clean_logits=clean)
    ref = ref_paged_mqa_logits(q, kv, w, ctx, bt, max_len)
    assert out.shape == (batch * next_n, max_len) and out.dtype == torch.float32
    valid = ~torch.isneginf(ref)
    diff, masks_equal = compare_logits(out, ref)
    if clean:
        assert masks_equal, "masks differ"
    else:
        assert torch.isfinite(out[valid]).all()
    assert diff < 1e-5, f"calc_diff {diff:.3e}"
    again = fn(q, kv, w, ctx, bt, meta, max_len, clean_logits=clean)
    assert torch.equal(out[valid], again[valid]), "reruns differ"


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_next_n_2d_context_lens_match_1d(kind):
    q, kv, w, ctx1, bt = make_case(kind, 2, 2, 16, 128, [150, 65], 192, seed=3)
    _, _, _, ctx2, _ = make_case(kind, 2, 2, 16, 128, [150, 65], 192, seed=3, ctx_2d=True)
    fn = fp8_paged_mqa_logits if kind == "fp8" else bf16_paged_mqa_logits
    a = fn(q, kv, w, ctx1, bt, None, 192, clean_logits=True)
    b = fn(q, kv, w, ctx2, bt, None, 192, clean_logits=True)
    assert torch.equal(a, b)
    # causal next_n rows: row j of request 0 sees 150 - 2 + j + 1 tokens
    assert torch.isneginf(a[0, 149:]).all() and torch.isfinite(a[0, :149]).all()
    assert torch.isfinite(a[1, :150]).all() and torch.isneginf(a[1, 150:]).all()


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_padded_page_stride(kind):
    """Pages inside a larger per-page allocation (a page stride past the page): read in place."""
    q, kv, w, ctx, bt = make_case(kind, 2, 1, 16, 128, [200, 90], 256, seed=7)
    pages, per_token = kv.shape[0], kv.shape[3]
    pad = 16 if kind == "fp8" else 8
    pool = torch.zeros(pages, 64 * per_token + pad, dtype=kv.dtype, device=kv.device)
    pool[:, : 64 * per_token] = kv.reshape(pages, -1)
    strided = pool[:, : 64 * per_token].view(pages, 64, 1, per_token)
    assert not strided.is_contiguous()
    fn = fp8_paged_mqa_logits if kind == "fp8" else bf16_paged_mqa_logits
    a = fn(q, strided, w, ctx, bt, None, 256, clean_logits=True)
    b = fn(q, kv, w, ctx, bt, None, 256, clean_logits=True)
    assert torch.equal(a, b)


def _schedule_loop(lens, num_sms, split=256):
    segs = [(max(x, 0) + split - 1) // split for x in lens]
    prefix, acc = [], 0
    for s in segs:
        acc += s
        prefix.append(acc)
    total = acc
    rows = []
    for sm in range(num_sms + 1):
        start = sm * (total // num_sms) + min(sm, total % num_sms)
        qi = 0
        while qi < len(lens) and prefix[qi] <= start:
            qi += 1
        rows.append([qi, start - (prefix[qi - 1] if qi > 0 else 0)])
    return rows


@pytest.mark.parametrize("lens", [[300, 130], [65536] * 3, [1, 0, 5000, 257]], ids=["two", "equal", "ragged"])
def test_schedule_metadata_matches_deepgemm_rule(lens):
    ctx = torch.tensor(lens, dtype=torch.int32, device=DEV)
    meta = get_paged_mqa_logits_metadata(ctx, 64, 8)
    assert meta.shape == (9, 2) and meta.dtype == torch.int32
    assert meta.cpu().tolist() == _schedule_loop(lens, 8)


def test_bad_shapes_raise_clear_errors():
    q, kv, w, ctx, bt = make_case("bf16", 2, 1, 16, 128, [100, 50], 128)
    with pytest.raises(ValueError, match="q must be"):
        bf16_paged_mqa_logits(q[0], kv, w, ctx, bt, None, 128)
    with pytest.raises(ValueError, match="weights must be"):
        bf16_paged_mqa_logits(q, kv, w[:1], ctx, bt, None, 128)
    with pytest.raises(ValueError, match="context_lens must be int32"):
        bf16_paged_mqa_logits(q, kv, w, ctx.long(), bt, None, 128)
    with pytest.raises(ValueError, match="kv_cache must be uint8"):
        fp8_paged_mqa_logits(q.to(torch.float8_e4m3fn), kv, w, ctx, bt, None, 128)
    with pytest.raises(ValueError, match="block_table must be"):
        bf16_paged_mqa_logits(q, kv, w, ctx, bt[:1], None, 128)
    with pytest.raises(ValueError, match="pages must be dense"):
        bf16_paged_mqa_logits(q, kv.transpose(1, 3).contiguous().transpose(1, 3), w, ctx, bt, None, 128)
