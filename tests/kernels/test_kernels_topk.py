"""Top-k over logits rows: checked by value (every selected score >= every unselected one),
with -1 padding and 0..L-1 for short rows. TRITON_INTERPRET=1 without a GPU (tests/kernels/conftest.py)."""

import pytest
import torch

from niah.kernels import topk_indices
from niah.kernels.topk.wrapper import fit_radix
from niah.kernels.topk.reference import check_topk, ref_topk_indices

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def logits(rows, width, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=g) * 3
    x[0] = torch.round(x[0])  # many ties around the threshold
    x[1] = -x[1].abs()  # all negative: sign handling of the keys
    return x


METHODS = ["search", "sample"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("k", [512, 1024, 2048])
def test_topk_with_lengths(k, method):
    width = 2 * k + 300
    x = logits(5, width).to(DEV)
    lens = torch.tensor([width, width - 7, k, k - 1, 3], dtype=torch.int32, device=DEV)
    idx = topk_indices(x, k, lens, method=method)
    assert idx.shape == (5, k) and idx.dtype == torch.int32
    problem = check_topk(x.cpu(), idx.cpu(), k, lens.cpu())
    assert problem is None, problem
    assert torch.equal(idx[3, : k - 1].cpu(), torch.arange(k - 1, dtype=torch.int32))
    assert (idx[3, k - 1 :] == -1).all() and (idx[4, 3:] == -1).all()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("k", [512, 2048])
def test_topk_with_neg_inf_masks(k, method):
    width = k + 777
    x = logits(3, width, seed=1)
    x[2, 100:] = float("-inf")  # 100 candidates: 0..99 then -1
    x[1, ::3] = float("-inf")
    x = x.to(DEV)
    idx = topk_indices(x, k, method=method)
    problem = check_topk(x.cpu(), idx.cpu(), k)
    assert problem is None, problem
    assert torch.equal(idx[2].cpu(), ref_topk_indices(x[2:].cpu(), k)[0])


def test_few_rows_at_k_2048_take_wide_chunks_and_select_as_narrow_ones():
    """Few rows (decode) where next_pow2(k) >= 2,048 default to 16,384-wide chunks (timed on a GPU:
    kernels/topk/wrapper.py), k 512 and 1,024 keep 4,096, many rows 8,192, and a chunk always holds
    2 * next_pow2(k); the wide chunks select the same keys in the same order as narrow ones."""
    from niah.kernels.topk.wrapper import default_block

    assert [default_block(False, k) for k in (512, 1024, 2048, 4096, 8192, 16384)] == [
        4096, 4096, 16384, 16384, 16384, 32768]
    assert [default_block(True, k) for k in (512, 2048, 8192)] == [8192, 8192, 16384]
    x = logits(2, 20000, seed=4).to(DEV)
    lens = torch.tensor([20000, 9000], dtype=torch.int32, device=DEV)
    wide = topk_indices(x, 2048, lens)
    assert torch.equal(wide, topk_indices(x, 2048, lens, block=16384))
    assert torch.equal(wide, topk_indices(x, 2048, lens, block=4096))
    assert check_topk(x.cpu(), wide.cpu(), 2048, lens.cpu()) is None


@pytest.mark.parametrize("split", [False, True], ids=["fused", "search-then-select"])
@pytest.mark.parametrize("rows_per_program", [1, 2], ids=["1seg", "2seg"])
@pytest.mark.parametrize("k,block", [(512, 1024), (2048, 4096)], ids=["k512-3rounds", "k2048-2rounds"])
def test_long_rows_in_rounds(k, block, rows_per_program, split):
    """Rows longer than one block: chunk-wise top-k, then top-k of the survivors."""
    width = 5 * block + 123
    x = logits(2, width, seed=2).to(DEV)
    lens = torch.tensor([width, 3 * block + 5], dtype=torch.int32, device=DEV)
    idx = topk_indices(x, k, lens, block=block, final_block=block, rows_per_program=rows_per_program, split=split)
    problem = check_topk(x.cpu(), idx.cpu(), k, lens.cpu())
    assert problem is None, problem


SPECIAL_VARIANTS = {
    "fused-one-program": {"split": False},
    "fused-rounds": {"split": False, "block": 256, "final_block": 256},
    "split-one-program": {"split": True},
    "split-rounds": {"split": True, "block": 256, "final_block": 256},
    "sample": {"method": "sample", "sample_stride": 8},  # the random rows take the bracketed path
    "sample-fallback": {"method": "sample", "sample_stride": 8, "cap": 16},  # every row falls back
    "segmented": {"method": "segmented", "sample_stride": 8, "tile": 128},  # 5 programs a row's pass
    "segmented-fallback": {"method": "segmented", "sample_stride": 8, "cap": 16},
}


@pytest.mark.parametrize("variant", list(SPECIAL_VARIANTS))
def test_special_rows_match_torch_topk(variant):
    """-inf rows, all-equal rows, rows shorter than k (lengths 0, 1, k-1, k, k+1), with and
    without lengths, one program per row and in rounds: exact agreement with the reference
    (torch.topk by value; candidates in index order for short rows; lowest-index ties)."""
    k, width = 64, 600
    x = logits(8, width, seed=4)
    x[2] = float("-inf")  # no candidate without lengths; all candidates with them
    x[3] = 1.5  # one value everywhere: the first k positions
    x[4, : width // 2] = float("-inf")
    x[5] = torch.where(torch.arange(width) % 7 == 0, 2.0, -2.0)  # 86 ties at the top, k = 64 of them
    x[6, 40:] = float("-inf")  # 40 candidates < k
    x = x.to(DEV)
    lens = torch.tensor([0, 1, width, width, k, k + 1, width, k - 1], dtype=torch.int32, device=DEV)
    for ln in (None, lens):
        idx = topk_indices(x, k, ln, **SPECIAL_VARIANTS[variant])
        lc = None if ln is None else ln.cpu()
        problem = check_topk(x.cpu(), idx.cpu(), k, lc)
        assert problem is None, problem
        ref = ref_topk_indices(x.cpu(), k, lc)
        short = (ref == -1).any(1)
        assert torch.equal(idx.cpu()[short], ref[short]), "short rows: candidates in index order, then -1"
        for r in (3, 5):  # exact ties: the lowest indices (a stable descending sort keeps index order)
            cand = torch.arange(width) < (width if ln is None else int(lens[r]))
            order = torch.sort(x[r].cpu().masked_fill(~cand, float("-inf")), descending=True, stable=True).indices
            want = order[: min(k, int(cand.sum()))].int().sort().values
            got = idx[r].cpu()
            assert torch.equal(got[got >= 0].sort().values, want)


def test_large_k_grows_the_chunk():
    """k > 2048: the default chunk grows to 2 * next_pow2(k) keys; rows shorter than k pad with -1."""
    k = 3000
    x = logits(2, 9000, seed=6).to(DEV)
    lens = torch.tensor([9000, 2500], dtype=torch.int32, device=DEV)
    idx = topk_indices(x, k, lens)
    problem = check_topk(x.cpu(), idx.cpu(), k, lens.cpu())
    assert problem is None, problem


def test_bad_arguments_raise_clear_errors():
    x = logits(2, 100).to(DEV)
    with pytest.raises(ValueError, match="logits must be float32"):
        topk_indices(x.double(), 4)
    with pytest.raises(ValueError, match="k must be >= 1"):
        topk_indices(x, 0)
    with pytest.raises(ValueError, match="k must be <= 16384"):
        topk_indices(x, 16385)
    with pytest.raises(ValueError, match="lengths must be int32"):
        topk_indices(x, 4, torch.tensor([1, 2], device=DEV))



@pytest.mark.parametrize("method", METHODS)
def test_heavy_ties_keep_lowest_indices(method):
    """Thousands of exact ties at the threshold: the lowest indices among them are kept
    (for the sample select: more candidates than its scratch holds, so the rows fall back)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, 4, (3, 3000), generator=g).float()
    idx = topk_indices(x.to(DEV), 512, method=method).cpu()
    problem = check_topk(x, idx, 512)
    assert problem is None, problem
    for r in range(3):
        thr = x[r, idx[r].long()].min()
        above = int((x[r] > thr).sum())
        want = torch.cat([(x[r] > thr).nonzero().flatten(), (x[r] == thr).nonzero().flatten()[: 512 - above]])
        assert torch.equal(idx[r].sort().values.long(), want.sort().values)


def adversarial_rows(width, stride):
    pos = torch.arange(width).float()
    return torch.stack([
        pos,  # ascending: the top k at the end
        -pos,  # descending: the top k at the start
        torch.where(pos % stride == 3, 10.0 + pos, -pos),  # the largest values never sampled
        torch.where(pos % stride == 0, pos, float("-inf")),  # 125 candidates, all sampled
        torch.where(pos < 300, 1.0, torch.where(pos < 900, 0.5, 0.25)),  # 300 ties at the top
        torch.randn(width, generator=torch.Generator().manual_seed(7)),
    ])


@pytest.mark.parametrize("cap", [None, 16], ids=["bracketed", "forced-fallback"])
def test_sample_select_adversarial_rows(cap):
    """The sample select against the exact rule (lowest-index ties) on rows built to defeat a
    sample: ascending and descending rows, the top values all off the sample's stride, the
    candidates every 8th position (-inf elsewhere), a run of ties straddling the bracket."""
    k, width, stride = 100, 1000, 8
    x = adversarial_rows(width, stride)
    idx = topk_indices(x.to(DEV), k, method="sample", sample_stride=stride, cap=cap).cpu()
    problem = check_topk(x, idx, k)
    assert problem is None, problem
    for r in range(x.shape[0]):  # exact: a stable descending sort keeps the lowest-index ties
        cand = ~torch.isneginf(x[r])
        order = torch.sort(x[r].masked_fill(~cand, float("-inf")), descending=True, stable=True).indices
        want = order[: min(k, int(cand.sum()))].int().sort().values
        got = idx[r]
        assert torch.equal(got[got >= 0].sort().values, want), f"row {r}"


@pytest.mark.parametrize("method", METHODS)
def test_searches_alike_at_every_radix(method):
    """The threshold searches (topk/_search.kth_threshold: the search kernel's, the sample select's bracket and
    scratch searches) find the unique largest threshold with k keys at or above it, whatever
    bits a step they take: the same output, in the same order, at 1 (a binary search), 2 and 4
    bits a step, on rows whose brackets land on ties, on the rows built to defeat a
    sample, and on rows with fewer than k keys."""
    g = torch.Generator().manual_seed(3)
    relu = torch.where(torch.rand(4, 1000, generator=g) < 0.05, torch.rand(4, 1000, generator=g), 0.0)
    short = torch.where(torch.arange(1000) < 60, torch.randn(2, 1000, generator=g), float("-inf"))
    x = torch.cat([adversarial_rows(1000, 8), relu, short, -relu]).to(DEV)
    for k in ((40, 100) if method == "sample" else (100,)):
        opts = {"sample_stride": 8} if method == "sample" else {"block": 256}     # search: rounds of 256
        widths = (1, 2, 4)
        runs = {b: topk_indices(x, k, method=method, radix_bits=b, **opts).cpu() for b in widths}
        assert check_topk(x.cpu(), runs[1], k) is None
        for b in widths[1:]:
            assert torch.equal(runs[b], runs[1]), (k, b)
    with pytest.raises(ValueError, match="radix_bits must be one of"):
        topk_indices(x, 4, method=method, radix_bits=8)


def test_a_wide_search_takes_fewer_bits_a_step_within_tritons_largest_tensor():
    """[searches x 2^bits x keys] comparisons a step must stay <= 2^20 elements (Triton's
    largest tensor): wider programs take fewer bits, down to the binary search, which
    compares [keys] alone."""
    assert fit_radix(4, 1 << 16) == 4                 # 2^20
    assert fit_radix(4, 1 << 17) == 2                 # 16 rows x 8,192 keys a program
    assert fit_radix(2, 32768) == 2
    assert fit_radix(2, 16 * 32768) == 1              # rows_per_program 16 at the widest block


def test_sample_select_rejects_bad_tile():
    x = logits(2, 100).to(DEV)
    with pytest.raises(ValueError, match="tile must be a power of two"):
        topk_indices(x, 4, method="sample", tile=1000)
    with pytest.raises(ValueError, match="method must be"):
        topk_indices(x, 4, method="radix")


@pytest.mark.parametrize("positives,k,cap", [(30, 64, 256), (200, 256, 512), (400, 256, 512), (0, 64, 256)],
                         ids=["few-above-zero", "hi-bracket-and-zeros", "kth-above-zero", "all-zero"])
def test_sample_select_keeps_the_first_relu_zeros(positives, k, cap):
    """An indexer's rows after ReLU: a few hundred keys above 0 and thousands of exact zeros, so
    the k-th score is 0 (or just above it) and the zeros outnumber the scratch: the select keeps
    the keys above 0 and then the lowest-position zeros, the exact rule, with a scratch of a few
    hundred slots (the ties are counted, not stored: only the first k positions are)."""
    width, stride = 4000, 8
    g = torch.Generator().manual_seed(positives + k)
    rows = []
    for r in range(4):
        x = torch.zeros(width)
        where = torch.randperm(width, generator=g)[:positives]
        x[where] = torch.rand(positives, generator=g) + 0.01
        if r == 3:
            x[3500:] = float("-inf")                       # a causal row: keys past its position
        rows.append(x)
    x = torch.stack(rows)
    idx = topk_indices(x.to(DEV), k, method="sample", sample_stride=stride, cap=cap).cpu()
    assert check_topk(x, idx, k) is None
    for r in range(x.shape[0]):
        order = torch.sort(x[r], descending=True, stable=True).indices
        want = order[:k].int().sort().values
        got = idx[r]
        assert (got >= 0).all() and torch.equal(got.sort().values, want), f"row {r}"


def test_sample_select_reads_its_scratch_in_pieces_alike():
    """A program of few warps cannot hold the scratch's keys in registers: scratch_tile reads
    them in pieces (a binary search over the pieces, then the selection piece by piece). The
    same output in the same order as the search in registers, at 1 and 4 bits a step, on rows
    whose k-th key is among the candidates (random, rounded to ties, the rows built to defeat a
    sample), pieces smaller and larger than the candidates; and the rule that picks it: in
    registers up to SCRATCH_KEYS_A_THREAD keys a thread, in pieces past it (num_warps=1)."""
    from niah.kernels.topk import wrapper

    g = torch.Generator().manual_seed(11)
    x = torch.cat([torch.randn(3, 1000, generator=g), torch.round(torch.randn(2, 1000, generator=g) * 4),
                   adversarial_rows(1000, 8)]).to(DEV)
    for k, runs in ((40, ((64, 1), (1024, 4))), (333, ((16, 1),))):
        want = wrapper.sample_topk(x, k, None, stride=8, cap=512, scratch_tile=0).cpu()
        assert check_topk(x.cpu(), want, k) is None
        for piece, bits in runs:
            got = wrapper.sample_topk(x, k, None, stride=8, cap=512, scratch_tile=piece, radix_bits=bits).cpu()
            assert torch.equal(got, want), (k, piece, bits)
    calls = []
    real = wrapper.launcher_of

    def spy(*name):
        launch = real(*name)
        return lambda grid, *a, **kw: calls.append(kw["SCRATCH_TILE"]) or launch(grid, *a, **kw)
    wrapper.launcher_of = spy
    try:
        wrapper.sample_topk(x, 40, None, stride=8, cap=4096, tile=256)               # 8 warps: 16 keys a thread
        wrapper.sample_topk(x, 40, None, stride=8, cap=4096, tile=256, num_warps=1)  # 128 keys a thread
    finally:
        wrapper.launcher_of = real
    assert calls == [0, 256]
    with pytest.raises(ValueError, match="scratch_tile must be"):
        wrapper.sample_topk(x, 40, None, scratch_tile=100)


def test_segmented_select_lists_what_the_sample_select_lists():
    """The sample select with its pass over the row split over programs ("segmented": each
    program one segment, its offsets the counts of the segments before it) lists the same
    keys in the same order as the one-program select, on every path of its finish: random
    rows, rows rounded to ties, the rows built to defeat a sample, ReLU rows whose k-th key
    is a run of zeros, lengths and -inf masks, a scratch too small (the fallback); segments
    narrower than the row (down to 64 keys) and wider; and it is exact against the reference."""
    from niah.kernels.topk import wrapper

    width, stride = 1000, 8
    g = torch.Generator().manual_seed(12)
    relu = torch.zeros(2, width)
    relu[0, torch.randperm(width, generator=g)[:30]] = torch.rand(30, generator=g) + 0.01
    relu[1, :700] = torch.rand(700, generator=g).round()
    x = torch.cat([torch.randn(2, width, generator=g), torch.round(torch.randn(2, width, generator=g) * 4),
                   adversarial_rows(width, stride), relu])
    x[1, ::3] = float("-inf")
    x = x.to(DEV)
    lens = torch.tensor([width, 999, 512, 40, 1, 0, 700, 333, 901, width, 64, 128], dtype=torch.int32, device=DEV)
    for k, ln, cap, segments in ((40, None, None, (64, 2048)), (100, lens, None, (128,)),
                                 (64, None, 16, (256,)), (333, lens, None, (512,))):
        want = wrapper.sample_topk(x, k, ln, stride=stride, cap=cap).cpu()
        assert check_topk(x.cpu(), want, k, None if ln is None else ln.cpu()) is None
        for seg in segments:
            got = wrapper.segment_topk(x, k, ln, segment=seg, stride=stride, cap=cap).cpu()
            assert torch.equal(got, want), (k, cap, seg)
    with pytest.raises(ValueError, match="tile must be a power of two"):
        topk_indices(x, 4, method="segmented", tile=1000)


def test_the_scratch_searched_over_the_bracket_alone_selects_alike():
    """narrow: the candidates' k-th key found by a binary search over the bracket (lo, hi]
    only, not over all 32 bits: the same output in the same order, from registers and in
    pieces, in the one-program and the segmented select, on random rows, rows rounded to ties
    and the rows built to defeat a sample (one whose upper bracket is missing: top k)."""
    from niah.kernels.topk import wrapper

    g = torch.Generator().manual_seed(13)
    x = torch.cat([torch.randn(2, 1000, generator=g), torch.round(torch.randn(2, 1000, generator=g) * 4),
                   adversarial_rows(1000, 8)]).to(DEV)
    for k in (5, 40, 333):
        want = wrapper.sample_topk(x, k, None, stride=8, cap=512, narrow=False).cpu()
        assert check_topk(x.cpu(), want, k) is None
        for piece in (0, 64):
            got = wrapper.sample_topk(x, k, None, stride=8, cap=512, scratch_tile=piece, narrow=True).cpu()
            assert torch.equal(got, want), (k, piece)
        got = wrapper.segment_topk(x, k, None, segment=256, stride=8, cap=512, narrow=True).cpu()
        assert torch.equal(got, want), (k, "segmented")


def test_the_sample_select_launches_by_rows_where_it_is_compiled(monkeypatch):
    """On a GPU (here: the launcher spied on, the interpreter's own launch set aside) fewer than
    SAMPLE_MANY_ROWS rows take 8 warps, tiles of 2,048 and the scratch in registers; from 512 rows
    on (the prefill's score calls) one warp, tiles of 256 and the scratch read in pieces of 256."""
    from niah.kernels.topk import wrapper

    seen = []
    monkeypatch.setattr(wrapper, "launcher_of", lambda *name: lambda grid, *a, **kw: seen.append((grid, kw)))
    monkeypatch.setattr(wrapper, "interpreting", lambda: False)
    for rows in (64, 511, 512, 742):
        wrapper.sample_topk(torch.zeros(rows, 4096, device=DEV), 512, None)
    got = [(grid[0], kw["num_warps"], kw["TILE"], kw["SCRATCH_TILE"]) for grid, kw in seen]
    assert got == [(64, 8, 2048, 0), (511, 8, 2048, 0), (512, 1, 256, 256), (742, 1, 256, 256)]
    seen.clear()
    wrapper.sample_topk(torch.zeros(742, 4096, device=DEV), 512, None, num_warps=8, tile=2048)   # named: kept
    assert (seen[0][1]["num_warps"], seen[0][1]["TILE"], seen[0][1]["SCRATCH_TILE"]) == (8, 2048, 0)
