"""Fused indexer + top-k (niah.kernels.fused_indexer) against the float64 reference.

Without a GPU the kernel runs under TRITON_INTERPRET=1 on CPU tensors (tests/kernels/conftest.py);
with one, the same tests run on CUDA. Integer-valued keys and queries with power-of-two weights and
scales make every score exact in fp32, so the selection must equal the float64 reference's exactly,
ties included (the lowest positions win at the k-th score). ReLU-heavy pools (most scores
exactly 0) hold the bracket at 0, where the ties at the bracket must cost the buffer k slots.
"""

import pytest
import torch

from niah.kernels import calc_diff, indexer_logits, indexer_topk, logits_form, topk_indices
from niah.kernels._common import zero_masked
from niah.kernels.fused_indexer.reference import reference_scores, reference_topk
from niah.kernels.fused_indexer.wrapper import LOGITS_FORM, Candidates, brackets, candidates, capacity, select

DEV = "cuda" if torch.cuda.is_available() else "cpu"
PAGE = 64


def make_pool(kind, hkv, dim, n_tokens, gen, integer=True, positive=None):
    """A paged pool of one layer in the server's layout, pages scattered: (pages, block_table, keys fp32).
    positive: a list of positions; every other key is <= 0 in every dim (with the non-negative
    queries of make_relu_query it scores exactly 0), the listed ones are >= 1 in every dim."""
    n_pages_seq = -(-n_tokens // PAGE)
    n_pages = hkv * n_pages_seq + 3
    table = torch.randperm(n_pages, generator=gen)[: hkv * n_pages_seq].reshape(hkv, n_pages_seq).int()
    if positive is not None:
        vals = -torch.randint(0, 4, (n_pages, PAGE, dim), generator=gen).float()
        scale = 2.0 ** torch.randint(-2, 2, (n_pages, PAGE), generator=gen).float()
        for s in (s for s in positive if s < n_tokens):
            for g in range(hkv):
                vals[table[g, s // PAGE], s % PAGE] = torch.randint(1, 4, (dim,), generator=gen).float()
    elif integer:
        vals = torch.randint(-3, 4, (n_pages, PAGE, dim), generator=gen).float()
        scale = 2.0 ** torch.randint(-2, 2, (n_pages, PAGE), generator=gen).float()
    else:
        vals = torch.randn(n_pages, PAGE, dim, generator=gen).clamp(-8, 8)
        scale = torch.rand(n_pages, PAGE, generator=gen) + 0.5
    if kind == "fp8":
        v8 = vals.to(torch.float8_e4m3fn)
        pages = torch.cat([v8.view(torch.uint8).reshape(n_pages, -1),
                           scale.contiguous().view(torch.uint8).reshape(n_pages, -1)], 1)
        deq = v8.float() * scale[..., None]
    else:
        vb = (vals * scale[..., None]).to(torch.bfloat16)
        pages = vb.reshape(n_pages, PAGE * dim)
        deq = vb.float()
    keys = deq[table.long()].reshape(hkv, n_pages_seq * PAGE, dim)[:, :n_tokens]
    return pages, table, keys


def make_query(kind, C, hkv, G, dim, gen, integer=True):
    if integer:
        q = torch.randint(-2, 3, (C, hkv, G, dim), generator=gen).float()
        w = 2.0 ** torch.randint(-3, 0, (C, hkv, G), generator=gen).float()
    else:
        q = torch.randn(C, hkv, G, dim, generator=gen)
        w = torch.rand(C, hkv, G, generator=gen) * 0.1
    q = q.to(torch.float8_e4m3fn if kind == "fp8" else torch.bfloat16)
    return q, w


def make_relu_query(kind, C, hkv, G, dim, gen, dead_every=4):
    """Queries >= 0 (each head's first dim 1, so a positive key scores > 0); every dead_every-th
    row all 0, so it scores 0 everywhere."""
    q = torch.randint(0, 3, (C, hkv, G, dim), generator=gen).float()
    q[..., 0] = 1
    q[dead_every - 1::dead_every] = 0
    w = 2.0 ** torch.randint(-3, 0, (C, hkv, G), generator=gen).float()
    return q.to(torch.float8_e4m3fn if kind == "fp8" else torch.bfloat16), w


def assert_reference(idx, want, p0, k):
    """Each row's kept set is the reference's; a row with every key kept lists them in position order."""
    for i, row in enumerate(idx.cpu().tolist()):
        kept = [s for s in row if s >= 0]
        assert len(kept) == len(set(kept)) == len(want[i]), f"row {i}: {len(kept)} kept, want {len(want[i])}"
        assert set(kept) == want[i], f"row {i}: {sorted(set(kept) ^ want[i])[:8]} differ"
        if p0 + i + 1 <= k:      # every key kept: in position order, then -1
            assert row == list(range(p0 + i + 1)) + [-1] * (len(row) - p0 - i - 1)


CASES = [
    # id, Hkv, G, D, p0, C, k
    ("smollm2-shape-first-chunk", 3, 3, 64, 0, 96, 32),
    ("smollm2-shape-later-chunk", 3, 3, 64, 300, 40, 64),
    ("one-kv-head-many-heads", 1, 8, 32, 130, 40, 16),
    ("k-above-every-row", 2, 3, 32, 0, 50, 64),
]


@pytest.mark.parametrize("kind", ["fp8", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_selection_equals_float64_reference_with_ties(kind, case):
    _, hkv, G, D, p0, C, k = case
    gen = torch.Generator().manual_seed(hash(case[0]) % 1000)
    pages, table, keys = make_pool(kind, hkv, D, p0 + C, gen)
    q, w = make_query(kind, C, hkv, G, D, gen)
    idx, ok = indexer_topk(q.to(DEV), w.to(DEV), pages.to(DEV), table.to(DEV), p0, k, kind)
    assert ok.all(), "the sampled bracket or the buffer failed on an ordinary row"
    want = reference_topk(reference_scores(q.float(), w, keys, p0), k)
    assert idx.shape == (C, min(k, p0 + C))
    assert_reference(idx, want, p0, k)


def test_ties_keep_the_lowest_positions():
    """All keys equal: every score ties (at the bracket too), so each row keeps positions 0..k-1,
    from a 32-slot buffer although all of its 371..400 keys tie at the bracket."""
    gen = torch.Generator().manual_seed(3)
    pages, table, keys = make_pool("bf16", 1, 32, 400, gen)
    pages = torch.ones_like(pages)
    q = torch.ones(30, 1, 4, 32, dtype=torch.bfloat16)
    w = torch.full((30, 1, 4), 0.5)
    idx, ok = indexer_topk(q.to(DEV), w.to(DEV), pages.to(DEV), table.to(DEV), 370, 20, "bf16", cap=32)
    assert ok.all()
    assert all(sorted(r) == list(range(20)) for r in idx.cpu().tolist())


@pytest.mark.parametrize("kind", ["fp8", "bf16"])
def test_real_valued_scores_keep_a_valid_top_k(kind):
    """Random real values: the kept scores (float64) are never below a dropped one by more than fp32 rounding."""
    gen = torch.Generator().manual_seed(11)
    p0, C, k = 600, 48, 100
    pages, table, keys = make_pool(kind, 3, 64, p0 + C, gen, integer=False)
    q, w = make_query(kind, C, 3, 3, 64, gen, integer=False)
    idx, ok = indexer_topk(q.to(DEV), w.to(DEV), pages.to(DEV), table.to(DEV), p0, k, kind)
    assert ok.all()
    ref = reference_scores(q.float(), w, keys, p0)
    for i, row in enumerate(idx.cpu().tolist()):
        kept = torch.tensor(row)
        assert (kept >= 0).sum() == k and kept.unique().numel() == k
        mask = torch.zeros(ref.shape[1], dtype=torch.bool)
        mask[kept] = True
        cand = ~torch.isneginf(ref[i])
        low = ref[i][mask].min()
        high = ref[i][cand & ~mask].max()
        assert low >= high - 1e-5 * abs(float(high)), f"row {i}: kept {float(low)} < dropped {float(high)}"


def test_a_missed_bracket_or_a_full_buffer_is_reported_not_hidden():
    gen = torch.Generator().manual_seed(5)
    p0, C, k = 0, 80, 8
    pages, table, keys = make_pool("bf16", 2, 32, p0 + C, gen)
    q, w = make_query("bf16", C, 2, 3, 32, gen)
    args = (q.to(DEV), w.to(DEV), pages.to(DEV), table.to(DEV), p0, k, "bf16")
    too_high = torch.full((C,), 1e30, device=DEV)
    _, ok = indexer_topk(*args, lo=too_high)
    assert not ok.any(), "a bracket above every score must mark every row"
    every = torch.full((C,), float("-inf"), device=DEV)
    want = reference_topk(reference_scores(q.float(), w, keys, p0), k)
    idx, ok = indexer_topk(*args, lo=every, cap=32)
    assert ok.cpu().tolist() == [p0 + i + 1 <= 32 for i in range(C)], "rows past the buffer must be marked"
    # the rows up to the one whose 32 keys fill the 32 slots exactly are served, and exact
    assert_reference(idx[:32], want[:32], p0, k)
    idx, ok = indexer_topk(*args, lo=every, cap=128)
    assert ok.all()
    assert [set(s for s in r if s >= 0) for r in idx.cpu().tolist()] == want


def test_brackets_lie_below_the_kth_score():
    gen = torch.Generator().manual_seed(9)
    p0, C, k = 1500, 20, 64
    pages, table, keys = make_pool("fp8", 3, 64, p0 + C, gen)
    q, w = make_query("fp8", C, 3, 3, 64, gen)
    lo = brackets(q, w, pages, table, p0, k, "fp8")
    ref = reference_scores(q.float(), w, keys, p0)
    kth = ref.topk(k, dim=1).values[:, -1]
    assert (lo.double() <= kth).all()
    # ... and high enough that the keys at or above it fit the buffer
    above = ((ref >= lo.double()[:, None]) & ~torch.isneginf(ref)).sum(1)
    assert (above >= k).all() and (above <= capacity(k)).all(), above.tolist()
    assert capacity(k) >= 2 * k


POSITIVE = (5, 100, 250, 270, 290, 300)   # the only keys that score above 0 (none on a sampled position)
RELU_CASES = [
    # id, p0, C, k, cap: rows see 3..6 keys above 0, the rest score exactly 0, every 4th row scores 0 only
    ("fewer-than-k-above-zero", 256, 48, 8, 64),
    ("more-than-k-above-zero", 256, 48, 4, 64),
    ("rows-shorter-than-k", 0, 24, 16, None),
]


@pytest.mark.parametrize("kind", ["fp8", "bf16"])
@pytest.mark.parametrize("case", RELU_CASES, ids=[c[0] for c in RELU_CASES])
def test_relu_zeros_at_the_bracket_are_served_exactly(kind, case):
    """The sampled bracket lands on 0 (ReLU), so hundreds of keys tie at it; the first k of
    them are kept, so a 64-slot buffer serves rows of ~300 keys, and the selection is the
    reference's (the lowest positions among the zeros)."""
    _, p0, C, k, cap = case
    gen = torch.Generator().manual_seed(21)
    pages, table, keys = make_pool(kind, 2, 32, p0 + C, gen, positive=POSITIVE)
    q, w = make_relu_query(kind, C, 2, 2, 32, gen)
    args = (q.to(DEV), w.to(DEV), pages.to(DEV), table.to(DEV), p0, k, kind)
    cand = candidates(*args, cap=cap)
    ref = reference_scores(q.float(), w, keys, p0)
    valid = ~torch.isneginf(ref)
    lo = brackets(*args).cpu().double()
    if p0:   # enough samples: the bracket is 0, and the kernel counts the keys above it and the ties
        assert (lo == 0).all()
    assert cand.ngt.cpu().tolist() == ((ref > lo[:, None]) & valid).sum(1).tolist()
    assert cand.neq.cpu().tolist() == ((ref == lo[:, None]) & valid).sum(1).tolist()
    idx, ok = select(cand, p0, k)
    assert ok.all(), f"rows {(~ok).nonzero().flatten().tolist()} fell back"
    assert_reference(idx, reference_topk(ref, k), p0, k)


def test_a_zero_bracket_in_rows_shorter_than_k():
    """lo = 0 given for rows of 1..20 keys, k = 16: the rows up to 16 keys keep them all, in
    position order; the longer ones keep their keys above 0 and then the first zeros."""
    gen = torch.Generator().manual_seed(4)
    p0, C, k = 0, 20, 16
    pages, table, keys = make_pool("bf16", 2, 32, p0 + C, gen, positive=(3, 7, 17))
    q, w = make_relu_query("bf16", C, 2, 2, 32, gen)
    idx, ok = indexer_topk(q.to(DEV), w.to(DEV), pages.to(DEV), table.to(DEV), p0, k, "bf16", cap=32,
                           lo=torch.zeros(C, device=DEV))
    assert ok.all()
    assert_reference(idx, reference_topk(reference_scores(q.float(), w, keys, p0), k), p0, k)


def test_a_slot_never_written_marks_its_row():
    """select's own check on hand-made buffers: a slot below the row's count still holding the
    pre-fill (-1), kept or not, or a stale position, marks the row; a sound row is served."""
    p0, k = 10, 4
    val = torch.tensor([[5.0, 1.0, 7.0, 7.0, 2.0, 0.0, 0.0, 0.0]] * 4)
    pos = torch.tensor([[0, 2, 3, 6, 9, -1, -1, -1],
                        [0, 2, -1, 6, 9, -1, -1, -1],      # slot 2 (kept) never written
                        [0, 2, 3, 3, 9, -1, -1, -1],       # a stale position
                        [0, -1, 3, 6, 9, -1, -1, -1]],     # slot 1 (not kept) never written
                       dtype=torch.int32)
    cand = Candidates(val.to(DEV), pos.to(DEV), torch.full((4,), 5, dtype=torch.int32, device=DEV),
                      torch.zeros(4, dtype=torch.int32, device=DEV))
    idx, ok = select(cand, p0, k)
    assert ok.cpu().tolist() == [True, False, False, False]
    assert sorted(idx[0].cpu().tolist()) == [0, 3, 6, 9]
    assert sorted(idx[3].cpu().tolist()) == [0, 3, 6, 9]   # its output alone looks sound
    # the same buffer counted one slot past what was written: the pre-filled slot is caught
    cand = Candidates(val[:1].to(DEV), pos[:1].to(DEV), torch.full((1,), 6, dtype=torch.int32, device=DEV),
                      torch.zeros(1, dtype=torch.int32, device=DEV))
    _, ok = select(cand, p0, 2)
    assert not ok.any()


@pytest.mark.parametrize("kind", ["fp8", "bf16"])
def test_pages_as_a_strided_view(kind):
    """A pool whose rows are wider than one page (a view into a larger buffer): pages are found
    by the row stride, not the row length."""
    gen = torch.Generator().manual_seed(8)
    p0, C, k = 60, 8, 16
    pages, table, keys = make_pool(kind, 2, 32, p0 + C, gen)
    wide = torch.zeros((pages.shape[0], pages.shape[1] + 64), dtype=pages.dtype)
    wide[:, :pages.shape[1]] = pages
    q, w = make_query(kind, C, 2, 2, 32, gen)
    view = wide.to(DEV)[:, :pages.shape[1]]
    idx, ok = indexer_topk(q.to(DEV), w.to(DEV), view, table.to(DEV), p0, k, kind)
    assert ok.all()
    assert_reference(idx, reference_topk(reference_scores(q.float(), w, keys, p0), k), p0, k)


@pytest.mark.parametrize("bad, match", [
    (dict(kind="fp4"), "index_dtype"),
    (dict(k=0), "k must be"),
    (dict(p0=10_000), "exceed the block table"),
])
def test_bad_arguments_are_one_clear_error(bad, match):
    gen = torch.Generator().manual_seed(1)
    pages, table, _ = make_pool("bf16", 1, 32, 64, gen)
    q, w = make_query("bf16", 4, 1, 2, 32, gen)
    args = dict(kind="bf16", k=4, p0=0) | bad
    with pytest.raises(ValueError, match=match):
        indexer_topk(q, w, pages, table, args["p0"], args["k"], args["kind"])


# -- indexer_logits: the same scores, written ------------------------------------------------

@pytest.mark.parametrize("kind", ["fp8", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_logits_equal_float64_reference_and_select_its_top_k(kind, case):
    """Exact scores: every written score is the reference's, -inf exactly past each row's
    position, in a 1 KiB-aligned row; topk_indices over them keeps the reference's top-k."""
    _, hkv, G, D, p0, C, k = case
    gen = torch.Generator().manual_seed(hash(case[0]) % 1000 + 1)
    pages, table, keys = make_pool(kind, hkv, D, p0 + C, gen)
    q, w = make_query(kind, C, hkv, G, D, gen)
    out = indexer_logits(q.to(DEV), w.to(DEV), pages.to(DEV), table.to(DEV), p0, kind)
    ref = reference_scores(q.float(), w, keys, p0)
    assert out.shape == (C, p0 + C) and out.stride(0) % 256 == 0
    assert torch.equal(out.cpu().double(), ref)
    assert_reference(topk_indices(out, min(k, p0 + C)), reference_topk(ref, k), p0, k)


@pytest.mark.parametrize("kind", ["fp8", "bf16"])
def test_logits_are_the_scores_the_candidates_kernel_compares(kind):
    """Real values (rounding in every sum): each candidate's score is the written logit at its
    position, bit for bit under the interpreter (one tile function, one order of sums). On a
    GPU the two kernels' default launches differ (8 warps and 4), and the compiler splits the
    tile's head sum another way: on the H200 they differed in the last bits, so there a
    candidate's score is held to the logit within a few units of the last place."""
    gen = torch.Generator().manual_seed(5)
    p0, C, k = 200, 40, 24
    pages, table, keys = make_pool(kind, 3, 64, p0 + C, gen, integer=False)
    q, w = make_query(kind, C, 3, 3, 64, gen, integer=False)
    args = (q.to(DEV), w.to(DEV), pages.to(DEV), table.to(DEV), p0)
    out = indexer_logits(*args, kind).cpu()
    cand = candidates(*args, k, kind, lo=torch.full((C,), float("-inf"), device=DEV))
    n = cand.count(k).cpu()
    pos, val = cand.pos.cpu(), cand.val.cpu()
    for i in range(C):
        assert n[i] == p0 + i + 1
        got, want = val[i, :n[i]], out[i, pos[i, :n[i]].long()]
        if DEV == "cpu":
            assert torch.equal(got, want)
        else:
            assert torch.allclose(got, want, rtol=4e-7, atol=1e-6)
    ref = reference_scores(q.float(), w, keys, p0).float()
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref))
    if DEV == "cpu" or kind == "bf16":
        assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4)
    else:
        # the likely cause: Hopper's fp8 tensor-core products add in fewer bits than fp32 (DeepGEMM promotes its
        # fp8 accumulators for that reason): on the H200 scores near 1 were off by ~1e-4, so
        # there fp8 is held to the measure of the other fp8 logits kernels' tests
        assert calc_diff(zero_masked(out), zero_masked(ref)) < 1e-5
        assert torch.allclose(out, ref, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kind", ["fp8", "bf16"])
@pytest.mark.parametrize("case", CASES + [("four-kv-heads", 4, 2, 32, 70, 33, 16)],
                         ids=[c[0] for c in CASES] + ["four-kv-heads"])
@pytest.mark.parametrize("per_program", [16, 2])
def test_the_pages_form_writes_the_tile_forms_scores(kind, case, per_program, monkeypatch):
    """form="pages" (a program walks page positions for its rows; here 16 or 2 a program, so
    programs split a row's pages, some only partly before their rows' ends) writes the tile form's
    scores: bit for bit under the interpreter (the same operations in one order), -inf at the
    same places; on a GPU the two launches may round a head sum another way in the last bits.
    Exact (integer) scores equal the float64 reference's in both."""
    from niah.kernels.fused_indexer import wrapper

    monkeypatch.setattr(wrapper, "PAGES_A_PROGRAM", per_program)
    _, hkv, G, D, p0, C, k = case
    gen = torch.Generator().manual_seed(hash(case[0]) % 1000 + 7)
    pages, table, keys = make_pool(kind, hkv, D, p0 + C, gen, integer=False)
    q, w = make_query(kind, C, hkv, G, D, gen, integer=False)
    args = (q.to(DEV), w.to(DEV), pages.to(DEV), table.to(DEV), p0, kind)
    tile, paged = indexer_logits(*args, form="tile").cpu(), indexer_logits(*args, form="pages").cpu()
    assert paged.shape == tile.shape and paged.stride() == tile.stride()
    assert torch.equal(torch.isneginf(paged), torch.isneginf(tile))
    if DEV == "cpu":
        assert torch.equal(paged.view(torch.int32), tile.view(torch.int32))
    else:
        assert torch.allclose(paged, tile, rtol=4e-7, atol=1e-6)
    pages, table, keys = make_pool(kind, hkv, D, p0 + C, gen)
    q, w = make_query(kind, C, hkv, G, D, gen)
    out = indexer_logits(q.to(DEV), w.to(DEV), pages.to(DEV), table.to(DEV), p0, kind, form="pages")
    ref = reference_scores(q.float(), w, keys, p0)
    assert torch.equal(out.cpu().double(), ref)
    assert_reference(topk_indices(out, min(k, p0 + C)), reference_topk(ref, k), p0, k)


@pytest.mark.parametrize("kind", ["fp8", "bf16"])
def test_a_pages_program_past_its_rows_writes_only_minus_inf(kind, monkeypatch):
    """One page position a program over a first chunk of 96 rows: the first 16 rows see only
    page 0, so their program at page 1 walks no page its rows see (its loop runs zero times) and
    writes that page's -inf alone; every score is still the tile form's."""
    from niah.kernels.fused_indexer import wrapper

    monkeypatch.setattr(wrapper, "PAGES_A_PROGRAM", 1)
    C, p0, block_m = 96, 0, 16
    assert -(-(p0 + block_m) // PAGE) == 1 < -(-(p0 + C) // PAGE) == 2     # rows 0-15 end in page 0 of 2
    gen = torch.Generator().manual_seed(11)
    pages, table, _ = make_pool(kind, 3, 64, p0 + C, gen, integer=False)
    q, w = make_query(kind, C, 3, 3, 64, gen, integer=False)
    args = (q.to(DEV), w.to(DEV), pages.to(DEV), table.to(DEV), p0, kind)
    paged = indexer_logits(*args, form="pages", block_m=block_m).cpu()
    assert torch.isneginf(paged[:block_m, PAGE:]).all()
    assert torch.isfinite(paged[:block_m, :PAGE].diagonal()).all()
    tile = indexer_logits(*args, form="tile").cpu()
    assert torch.equal(torch.isneginf(paged), torch.isneginf(tile))
    if DEV == "cpu":
        assert torch.equal(paged.view(torch.int32), tile.view(torch.int32))
    else:
        assert torch.allclose(paged, tile, rtol=4e-7, atol=1e-6)


def test_the_pages_form_refuses_more_than_four_kv_heads_and_the_default_takes_the_tile_form():
    gen = torch.Generator().manual_seed(3)
    pages, table, _ = make_pool("bf16", 5, 32, 70, gen)
    q, w = make_query("bf16", 6, 5, 2, 32, gen)
    args = (q.to(DEV), w.to(DEV), pages.to(DEV), table.to(DEV), 64, "bf16")
    with pytest.raises(ValueError, match="at most 4 kv heads"):
        indexer_logits(*args, form="pages")
    tile = indexer_logits(*args, form="tile")
    assert tile.shape == (6, 70)
    assert torch.equal(indexer_logits(*args), tile)                  # the default: the tile form for them
    with pytest.raises(ValueError, match="form must be one of"):
        indexer_logits(*args, form="page")
    assert (logits_form(5), logits_form(4), logits_form(4, "tile")) == ("tile", LOGITS_FORM, "tile")  # as attested


def test_logits_refuse_bad_arguments_in_their_own_name():
    gen = torch.Generator().manual_seed(2)
    pages, table, _ = make_pool("bf16", 1, 32, 64, gen)
    q, w = make_query("bf16", 4, 1, 2, 32, gen)
    with pytest.raises(ValueError, match="^indexer_logits: positions 0..3 exceed"):
        indexer_logits(q, w, pages, table[:, :0], 0, "bf16")
    with pytest.raises(ValueError, match="^indexer_logits: q must be"):
        indexer_logits(q.float(), w, pages, table, 0, "bf16")
