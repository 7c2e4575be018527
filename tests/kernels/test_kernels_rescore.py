"""Two-stage selection: the bf16 re-score kernel and the whole fp8 -> bf16 (and fp4 -> bf16) selection, against
the float64 torch references (kernels/rescore/reference.py) and the exact float64 top-k.

Without a GPU the kernels run under TRITON_INTERPRET=1 on CPU tensors (tests/kernels/conftest.py).
"""

import pytest
import torch

from niah.kernels import bf16_paged_rescore, fp4_bf16_two_stage_topk, fp8_bf16_two_stage_topk
from niah.kernels._common import calc_diff, zero_masked
from niah.kernels.fp4_paged_logits.reference import ref_fp4_paged_mqa_logits
from niah.kernels.fp4_store.reference import ref_store_fp4_index_keys
from niah.kernels.paged_logits.reference import ref_paged_mqa_logits
from niah.kernels.quant import quantize_fp4, quantize_fp8
from niah.kernels.rescore.reference import ref_paged_rescore, ref_two_stage_topk

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK_KV = 64


def make_pools(batch, heads, dim, lens, seed=0, outliers=0):
    """Keys in both forms (fp8 pages with scales, bf16 pages) under one shuffled block table,
    an fp32 query and weights, and the unquantised keys [B, L, D] for the exact reference."""
    g = torch.Generator().manual_seed(seed)
    max_pages = -(-max(lens) // BLOCK_KV)
    n_pages = batch * max_pages + 2
    block_table = torch.randperm(n_pages, generator=g)[: batch * max_pages].reshape(batch, max_pages).int()
    k = torch.randn(n_pages, BLOCK_KV, dim, generator=g)
    if outliers:
        k[..., :outliers] += 8 * torch.sign(torch.randn(outliers, generator=g))
    q = torch.randn(batch, heads, dim, generator=g)
    w = torch.rand(batch, heads, generator=g) + 0.1
    k8, sf = quantize_fp8(k)
    fp8 = torch.cat([k8.view(torch.uint8).reshape(n_pages, -1), sf.view(torch.uint8).reshape(n_pages, -1)], 1)
    fp8 = fp8.reshape(n_pages, BLOCK_KV, 1, dim + 4)
    bf16 = k.to(torch.bfloat16).reshape(n_pages, BLOCK_KV, 1, dim)
    q8, qs = quantize_fp8(q)                                       # SGLang's fp8 query: its scale into w
    ctx = torch.tensor(lens, dtype=torch.int32)
    exact = k[block_table.long()].reshape(batch, -1, dim)          # [B, max_pages*64, D] in token order
    return dict(q8=q8, w8=w * qs, qb=q.to(torch.bfloat16), w=w, fp8=fp8, bf16=bf16, ctx=ctx, bt=block_table,
                q=q, exact=exact)


def dev(*ts):
    return [t.to(DEV) for t in ts]


@pytest.mark.parametrize("lens,n", [([300, 70, 1], 40), ([129, 64], 130)], ids=["ragged", "all-keys"])
def test_rescore_matches_float64_reference(lens, n):
    p = make_pools(len(lens), 16, 64, lens, seed=1)
    g = torch.Generator().manual_seed(2)
    cand = torch.stack([torch.randint(0, max(L, 1), (n,), generator=g) for L in lens]).int()
    cand[:, ::7] = -1                                              # padding slots
    cand[-1, -1] = -5
    got = bf16_paged_rescore(*dev(p["qb"], p["bf16"], p["w"], p["bt"], cand)).cpu()
    ref = ref_paged_rescore(p["qb"], p["bf16"], p["w"], p["bt"], cand)
    assert torch.equal(torch.isneginf(got), cand < 0)
    assert calc_diff(zero_masked(got), zero_masked(ref)) < 1e-9     # bf16 inputs exact, fp32 accumulate


def test_rescore_refuses_bad_arguments():
    p = make_pools(2, 16, 64, [100, 100])
    cand = torch.zeros(2, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="q must be bf16"):
        bf16_paged_rescore(p["q"], p["bf16"], p["w"], p["bt"], cand)
    with pytest.raises(ValueError, match="candidates must be int32"):
        bf16_paged_rescore(p["qb"], p["bf16"], p["w"], p["bt"], cand.long())


def _sets(idx):
    return [set(r.tolist()) - {-1} for r in idx]


def test_two_stage_matches_its_reference_and_is_bf16s_selection_when_every_key_is_a_candidate():
    lens, k = [600, 90, 40], 16
    p = make_pools(len(lens), 16, 64, lens, seed=3)
    args = dev(p["q8"], p["fp8"], p["w8"], p["qb"], p["bf16"], p["w"], p["ctx"], p["bt"])
    got = _sets(fp8_bf16_two_stage_topk(*args, 640, k, factor=4).cpu())
    ref = _sets(ref_two_stage_topk(p["q8"], p["fp8"], p["w8"], p["qb"], p["bf16"], p["w"], p["ctx"], p["bt"], 640,
                                   k, factor=4))
    assert [len(s) for s in got] == [16, 16, 16]
    assert sum(len(a & b) for a, b in zip(got, ref)) >= 47         # fp32 vs fp64 logits: at most a near-tie apart
    # factor * k >= every length: every key is a candidate, the selection is bf16's own top-k
    whole = _sets(fp8_bf16_two_stage_topk(*args, 640, k, factor=40).cpu())
    bf16 = ref_paged_mqa_logits(p["qb"][:, None], p["bf16"], p["w"], p["ctx"], p["bt"], 640)
    assert whole == _sets(bf16.topk(k, -1).indices)
    # the final top-k either way (topk_indices, or torch.topk as the first version): the same sets
    assert _sets(fp8_bf16_two_stage_topk(*args, 640, k, factor=4, final_topk="torch").cpu()) == got
    with pytest.raises(ValueError, match="final_topk must be one of"):
        fp8_bf16_two_stage_topk(*args, 640, k, final_topk="radix")


def test_two_stage_keeps_bf16s_share_of_the_exact_top_k():
    """float64 exact top-k of the unquantised keys (4 outlier channels, where fp8 loses the
    most): the two-stage selection (c = 4) keeps about what bf16 keeps, more than fp8."""
    lens, k = [2000, 1500], 32
    p = make_pools(len(lens), 16, 64, lens, seed=4, outliers=4)
    exact = [(torch.relu(p["exact"][b, :L].double() @ p["q"][b].double().T) @ p["w"][b].double())
             for b, L in enumerate(lens)]                                 # [L] float64, unquantised keys and query
    want = [set(e.topk(k).indices.tolist()) for e in exact]
    fp8 = _sets(ref_paged_mqa_logits(p["q8"][:, None], p["fp8"], p["w8"], p["ctx"], p["bt"], 2048).topk(k, -1).indices)
    bf16 = _sets(ref_paged_mqa_logits(p["qb"][:, None], p["bf16"], p["w"], p["ctx"], p["bt"], 2048).topk(k, -1).indices)
    args = dev(p["q8"], p["fp8"], p["w8"], p["qb"], p["bf16"], p["w"], p["ctx"], p["bt"])
    two = _sets(fp8_bf16_two_stage_topk(*args, 2048, k, factor=4).cpu())

    def share(sel):
        return sum(len(a & b) for a, b in zip(sel, want)) / (k * len(lens))

    assert share(two) >= share(bf16) - 0.02
    assert share(two) > share(fp8)


@pytest.mark.parametrize("q_kind", ["bf16", "fp4"])
def test_fp4_two_stage_matches_its_reference_and_is_bf16s_selection_when_every_key_is_a_candidate(q_kind):
    """fp4 keys (SGLang's MXFP4 pages) as the coarse stage: the selection against the float64
    chain (fp4 logits, candidates, bf16 re-scores, top-k); with factor * k >= every length it is
    bf16's own top-k."""
    lens, k, dim = [300, 90], 16, 64
    p = make_pools(len(lens), 16, dim, lens, seed=6)
    n_pages = p["bf16"].shape[0]
    keys = p["bf16"].float().reshape(n_pages * BLOCK_KV, dim)
    fp4 = ref_store_fp4_index_keys(keys, torch.zeros(n_pages, BLOCK_KV * (dim // 2 + dim // 32), dtype=torch.uint8),
                                   torch.arange(n_pages * BLOCK_KV))
    q4 = quantize_fp4(p["q"]) if q_kind == "fp4" else p["qb"]
    q4_dev = tuple(dev(*q4)) if q_kind == "fp4" else dev(q4)[0]
    args = dev(fp4, p["w"], p["qb"], p["bf16"], p["w"], p["ctx"], p["bt"])
    got = _sets(fp4_bf16_two_stage_topk(q4_dev, *args, 320, k, factor=4).cpu())
    q4_ref = tuple(t[:, None] for t in q4) if q_kind == "fp4" else q4[:, None]
    coarse = ref_fp4_paged_mqa_logits(q4_ref, fp4, p["w"], p["ctx"], p["bt"], 320)
    cvals, cand = coarse.topk(4 * k, dim=-1)
    cand = torch.where(torch.isneginf(cvals), -1, cand).int()
    resc = ref_paged_rescore(p["qb"], p["bf16"], p["w"], p["bt"], cand)
    ref = _sets(cand.long().gather(1, resc.topk(k, dim=-1).indices))
    assert [len(s) for s in got] == [16, 16]
    assert sum(len(a & b) for a, b in zip(got, ref)) >= 31          # fp32 vs fp64 logits: at most a near-tie apart
    whole = _sets(fp4_bf16_two_stage_topk(q4_dev, *args, 320, k, factor=20).cpu())
    bf16 = ref_paged_mqa_logits(p["qb"][:, None], p["bf16"], p["w"], p["ctx"], p["bt"], 320)
    assert whole == _sets(bf16.topk(k, -1).indices)
    with pytest.raises(ValueError, match="must be \\[B, H, D\\]"):
        fp4_bf16_two_stage_topk(q4_dev[:, None] if q_kind == "bf16" else tuple(t[:, None] for t in q4_dev), *args,
                                320, k)
