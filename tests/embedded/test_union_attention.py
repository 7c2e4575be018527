"""union_attention (serving/embedded/cuda/union_kernel.py): tiles of queries over the union of
their kept keys give the gather kernel's output (to fp32 rounding: sums in position order)
and masked SDPA's; `tile_union` (and `tile_union_bitmap`, its build without a sort) builds
exactly each tile's union and who keeps what; a prefill chunk takes this path where
attend.PREFILL_SHARE > 0 (4 by default), a decode step never.

Without a GPU these run on CPU tensors under TRITON_INTERPRET=1 (set below, before triton is
imported), at tiny shapes; with one, the same tests run on CUDA.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from niah.serving.embedded.cuda import attend  # noqa: E402
from niah.serving.embedded.cuda.attend import (  # noqa: E402
    sparse_attention, sparse_attention_reference, tile_union, tile_union_bitmap, tile_union_reference, union_attention)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
HKV, G, D = 2, 3, 32
H = HKV * G


def inputs(T: int, S: int, K: int, seed: int, cap: int = 96):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, T, D, generator=g).to(DEV)
    k = torch.randn(1, HKV, cap, D, generator=g).to(DEV)
    v = torch.randn(1, HKV, cap, D, generator=g).to(DEV)
    idx = torch.stack([torch.randperm(S, generator=g)[:K] for _ in range(T)]).int()
    return q, k, v, idx


@pytest.mark.parametrize("form", [tile_union, tile_union_bitmap, tile_union_reference])
@pytest.mark.parametrize("block_q", [4, 8])
def test_tile_union_holds_each_tiles_union_and_who_keeps_it(form, block_q):
    """Every form (the sort kernel, the bitmap kernel, the torch reference), per tile: the distinct kept positions
    ascending, each with the bits of exactly the rows keeping it (a position every row keeps:
    all bits); -1 pads and the padded last tile's rows add nothing; a tile keeping nothing has
    count 0; K not a power of 2."""
    _, _, _, idx = inputs(21, 40, 6, seed=3)
    idx[2, 3:] = -1
    idx[8:16] = -1                                           # tile 1 (block_q 8; tiles 2-3 at 4) keeps nothing
    idx[16:, 0] = 39                                         # every row of the last tile keeps 39
    idx[16:, 1:] = torch.stack([torch.randperm(39)[:5] for _ in range(5)]).int()
    pos, who, count = form(idx.to(DEV), block_q, 40)
    n_tiles = -(-21 // block_q)
    assert pos.shape == who.shape == (n_tiles, block_q * 6) and count.shape == (n_tiles,)
    pos, who, count = pos.cpu(), who.cpu(), count.cpu()
    for tile in range(n_tiles):
        rows = idx[tile * block_q:tile * block_q + block_q]
        want = sorted({int(x) for x in rows.flatten() if x >= 0})
        n = int(count[tile])
        assert pos[tile, :n].tolist() == want, tile
        for j, p in enumerate(want):
            bits = {i for i in range(rows.shape[0]) if p in rows[i].tolist()}
            assert {i for i in range(block_q) if (int(who[tile, j]) >> i) & 1} == bits
    assert int(count[8 // block_q]) == 0
    with pytest.raises(ValueError, match="overflow"):
        form(idx, 16, 2 ** 28)


def test_the_bitmap_build_scans_many_words_and_every_bit_of_a_word():
    """tile_union_bitmap past one scan step of 256 words (positions to 8,999): the same entries
    as the torch reference, with positions at a word's sign bit (31, 63) and either side of a
    step (8,191, 8,192); a scratch of words beyond the tile's highest position left unread."""
    g = torch.Generator().manual_seed(7)
    idx = torch.stack([torch.randperm(9000, generator=g)[:7] for _ in range(10)]).int()
    idx[0, :4] = torch.tensor([31, 63, 8191, 8192], dtype=torch.int32)
    idx[1, :3] = torch.tensor([31, 8192, 8999], dtype=torch.int32)
    idx[8:, :] = torch.tensor([0, 1, 2, 3, 32, 33, -1], dtype=torch.int32)  # the last tile: the first 34 only
    pos, who, count = tile_union_bitmap(idx.to(DEV), 4, 9000)
    rpos, rwho, rcount = tile_union_reference(idx, 4, 9000)
    assert torch.equal(count.cpu(), rcount)
    for tile in range(3):
        n = int(rcount[tile])
        assert torch.equal(pos[tile, :n].cpu(), rpos[tile, :n]) and torch.equal(who[tile, :n].cpu(), rwho[tile, :n])
    assert int(count[2]) == 6 and int(who[2, 0]) == 0b11
    # a scratch sized by a smaller bound (union_attention's `end`; whole words: 34 -> 2 words, 64
    # positions): the tile below it is whole, a position past the scratch is dropped, never written
    pos, who, count = tile_union_bitmap(idx.to(DEV), 4, 34)
    assert int(count[2]) == 6 and torch.equal(pos[2, :6].cpu(), rpos[2, :6])
    assert int(count[0]) == 2 and torch.equal(pos[0, :2].cpu(), torch.tensor([31, 63], dtype=torch.int32))


@pytest.mark.parametrize("block_q", [4, 8])
def test_union_attention_attends_as_the_gather_kernel(block_q):
    """Random kept sets (little overlap), rows sharing most keys (a real indexer's neighbours),
    a short row, a row keeping nothing (0 out), T not a multiple of the tile: the gather
    kernel's output to fp32 rounding and masked SDPA's; bad arguments refused."""
    T, S, K = 11, 75, 20
    q, k, v, idx = inputs(T, S, K, seed=12)
    idx[3, 7:] = -1
    idx[5, :] = -1
    g = torch.Generator().manual_seed(13)
    common = torch.randperm(40, generator=g)[:16].int()     # every row keeps these 16, and 4 of its own
    shared = torch.stack([torch.cat([common, 40 + torch.randperm(35, generator=g)[:4].int()]) for _ in range(T)])
    shared[3, 7:] = -1
    shared[5, :] = -1
    for ix in (idx, shared):
        ix = ix.to(DEV)
        out = union_attention(q, k, v, ix, block_q=block_q, block_n=16)
        torch.testing.assert_close(out, sparse_attention(q, k, v, ix, share=0), rtol=0, atol=2e-6)
        assert torch.equal(union_attention(q, k, v, ix, block_q=block_q, block_n=16, build="bitmap"), out)
        keep = [t for t in range(T) if bool((ix[t] >= 0).any())]
        torch.testing.assert_close(out[:, :, keep], sparse_attention_reference(q[:, :, keep], k, v, ix[keep]),
                                   rtol=1e-4, atol=1e-5)
    assert torch.equal(out[:, :, 5], torch.zeros_like(out[:, :, 5]))
    # a bound below the capacity (a causal chunk's end: positions < 40, two words of bitmap where
    # the capacity, 96, would take three): the same output as without it, through sparse_attention too
    low = torch.stack([torch.randperm(40, generator=g)[:K] for _ in range(T)]).int().to(DEV)
    whole = union_attention(q, k, v, low, block_q=block_q, block_n=16, build="bitmap")
    assert torch.equal(union_attention(q, k, v, low, block_q=block_q, block_n=16, build="bitmap", end=40), whole)
    torch.testing.assert_close(sparse_attention(q, k, v, low, share=block_q, end=40), whole, rtol=0, atol=2e-6)
    for bad in ({"block_q": 2}, {"block_q": 3}, {"block_n": 24}, {"precision": "broadcast"}, {"build": "radix"},
                {"end": 0}, {"end": k.shape[2] + 1}):
        with pytest.raises(ValueError, match="union_attention"):
            union_attention(q, k, v, idx.to(DEV), **bad)
    with pytest.raises(ValueError, match="sparse_attention: end must be in 1..96"):
        sparse_attention(q, k, v, idx.to(DEV), share=0, end=97)


def test_a_prefill_chunk_takes_the_union_path_and_a_decode_step_the_gather(monkeypatch):
    """sparse_attention with PREFILL_SHARE set: PREFILL_ROWS queries and more go through
    union_attention (PREFILL_SHARE queries a tile), fewer (a decode step), a split and share=0
    through the gather kernel; both give the same output."""
    monkeypatch.setattr(attend, "PREFILL_SHARE", 4)
    seen = []
    real = attend.union_attention
    monkeypatch.setattr(attend, "union_attention", lambda *a, **kw: seen.append(kw["block_q"]) or real(*a, **kw))
    T = attend.PREFILL_ROWS
    q, k, v, idx = inputs(T, 40, 8, seed=5, cap=64)
    idx = idx.to(DEV)
    out = attend.sparse_attention(q, k, v, idx)
    assert seen == [attend.PREFILL_SHARE]
    torch.testing.assert_close(out, attend.sparse_attention(q, k, v, idx, share=0), rtol=0, atol=2e-6)
    attend.sparse_attention(q[:, :, :3], k, v, idx[:3])
    attend.sparse_attention(q, k, v, idx, split_keys=16)
    attend.sparse_attention(q, k, v, idx, precision="broadcast")
    assert seen == [attend.PREFILL_SHARE]
    # an explicit share is the union kernel's: the gather kernel's options beside it, or a
    # precision it does not have, are refused, not dropped
    for bad in ({"split_keys": 16}, {"one_head": True}, {"num_warps": 8}, {"block_n": 32}):
        with pytest.raises(ValueError, match="share"):
            attend.sparse_attention(q, k, v, idx, share=4, **bad)
    with pytest.raises(ValueError, match="union_attention"):
        attend.sparse_attention(q, k, v, idx, share=4, precision="broadcast")
    assert union_attention(q, k, v, idx).shape == out.shape          # its own default tile


def test_a_union_arm_of_the_gpu_benchmarks_sets_the_share_for_that_arm_only():
    """cuda/bench.py's and gpu_profile.py's arms: "<dtype>-union-k<K>" is the arm's server with
    PREFILL_SHARE 4 while it runs (restored after, an error included), "-union8-" 8, "-union0-"
    the gather kernel, "-union3-" refused, "-bitmap-" / "-sort-" the build; an arm naming
    neither keeps the defaults (tiles of 4, the bitmap build)."""
    from niah.serving.embedded.cuda.bench import arm_config, arm_kernels

    default = attend.PREFILL_SHARE, attend.UNION_BUILD
    assert default == (4, "bitmap")
    cfg = arm_config("fp8-union-k1024", "cpu")
    assert (cfg.index_dtype, cfg.index_topk, cfg.bf16_read, cfg.topk_impl) == ("fp8", 1024, "fused", "niah")
    with arm_kernels("fp8-union0-k1024"):                             # the gather kernel, named
        assert attend.PREFILL_SHARE == 0
    assert (attend.PREFILL_SHARE, attend.UNION_BUILD) == default
    with pytest.raises(RuntimeError), arm_kernels("bf16-union0-k512"):
        raise RuntimeError("the arm failed")
    assert (attend.PREFILL_SHARE, attend.UNION_BUILD) == default
    with arm_kernels("fp8-k1024"):
        assert (attend.PREFILL_SHARE, attend.UNION_BUILD) == default
    cfg = arm_config("bf16-union-sort-k512", "cpu")
    assert (cfg.index_dtype, cfg.index_topk, cfg.bf16_read, cfg.topk_impl) == ("bf16", 512, "fused", "niah")
    with arm_kernels("bf16-union-sort-k512"):
        assert attend.PREFILL_SHARE == attend.UNION_BLOCK_Q == 4 and attend.UNION_BUILD == "sort"
    assert (attend.PREFILL_SHARE, attend.UNION_BUILD) == default
    with arm_kernels("fp8-union8-bitmap-k1024"):                     # a wider tile, named
        assert attend.PREFILL_SHARE == 8 and attend.UNION_BUILD == "bitmap"
    assert (attend.PREFILL_SHARE, attend.UNION_BUILD) == default
    with pytest.raises(ValueError, match="union tile of 4, 8 or 16"), arm_kernels("fp8-union3-k1024"):
        pass
    assert (attend.PREFILL_SHARE, attend.UNION_BUILD) == default


def test_a_sample_arm_of_the_gpu_benchmarks_sets_the_select_launch_for_that_arm_only():
    """"-sampleN-" runs the sample select at N warps and 256 N keys a step, at every row count,
    while the arm runs (restored after, an error included); N other than 1, 2, 4, 8 is refused; the union
    settings are untouched. "-segmented-" sets the few-rows top-k's method alone, "-wide-" the
    scratch's search over all 32 bits (the bracket alone by default), "-tile-" the score calls'
    first form (the page-walking one by default); opposite words in one arm are refused."""
    from niah.kernels.topk import wrapper
    from niah.serving.embedded.cuda.bench import arm_kernels

    default = wrapper.SAMPLE_WARPS, wrapper.SAMPLE_TILE
    assert default == (8, 2048) and (wrapper.SAMPLE_MANY_WARPS, wrapper.SAMPLE_MANY_TILE) == (1, 256)
    assert wrapper.sample_launch(511) == default and wrapper.sample_launch(742) == (1, 256)   # decode, prefill
    with arm_kernels("fp8-sample8-k1024"):                           # 8 warps at every row count
        assert wrapper.sample_launch(742) == wrapper.sample_launch(64) == (8, 2048)
    with arm_kernels("fp8-sample1-k1024"):
        assert (wrapper.SAMPLE_WARPS, wrapper.SAMPLE_TILE) == (1, 256) == wrapper.sample_launch(64)
        assert (attend.PREFILL_SHARE, attend.UNION_BUILD) == (4, "bitmap")
    assert (wrapper.SAMPLE_WARPS, wrapper.SAMPLE_TILE) == default and wrapper.sample_launch(742) == (1, 256)
    with pytest.raises(RuntimeError), arm_kernels("bf16-union0-sample4-k512"):
        assert (wrapper.SAMPLE_WARPS, wrapper.SAMPLE_TILE, attend.PREFILL_SHARE) == (4, 1024, 0)
        raise RuntimeError("the arm failed")
    assert (wrapper.SAMPLE_WARPS, wrapper.SAMPLE_TILE, attend.PREFILL_SHARE) == (*default, 4)
    with pytest.raises(ValueError, match="1, 2, 4 or 8 warps"), arm_kernels("fp8-sample3-k1024"):
        pass
    assert (wrapper.SAMPLE_WARPS, wrapper.SAMPLE_TILE) == default
    assert (wrapper.FEW_ROWS_METHOD, wrapper.SCRATCH_NARROW) == ("search", True)
    with arm_kernels("bf16-segmented-k512"):                         # the decode step's top-k
        assert wrapper.FEW_ROWS_METHOD == "segmented" and (wrapper.SAMPLE_WARPS, wrapper.SAMPLE_TILE) == default
        assert wrapper.SCRATCH_NARROW
    with arm_kernels("fp8-sample1-wide-k1024"):                      # the scratch's search over all 32 bits
        assert not wrapper.SCRATCH_NARROW and wrapper.SAMPLE_WARPS == 1 and wrapper.FEW_ROWS_METHOD == "search"
    assert (wrapper.FEW_ROWS_METHOD, wrapper.SCRATCH_NARROW) == ("search", True)
    from niah.kernels.fused_indexer import wrapper as logits
    assert logits.LOGITS_FORM == "pages"
    with arm_kernels("fp8-tile-k1024"):                              # the score calls' first, tile form
        assert logits.LOGITS_FORM == "tile" and wrapper.SCRATCH_NARROW and wrapper.SAMPLE_WARPS == 8
    with arm_kernels("fp8-pages-narrow-k1024"):                      # the defaults, named
        assert logits.LOGITS_FORM == "pages" and wrapper.SCRATCH_NARROW
    for arm in ("fp8-pages-tile-k1024", "bf16-narrow-wide-k512"):    # opposites: refused, nothing set
        with pytest.raises(ValueError, match="opposites"), arm_kernels(arm):
            pass
    assert (logits.LOGITS_FORM, wrapper.SCRATCH_NARROW) == ("pages", True)


def test_a_misspelt_gpu_benchmark_arm_is_refused_before_any_weights_load(capsys):
    """An arm word the benchmarks do not know (a typo of -sample1-, a stray word, a bad dtype or
    top-k) would otherwise run the defaults under that arm's name: check_arms exits 2 with the
    word named, before the weights load; the known words pass."""
    from niah.serving.embedded.cuda.bench import arm_config, check_arms

    check_arms(["dense", "fp8-k1024", "bf16-gather-k512", "fp8-union0-sample1-narrow-segmented-k1024",
                "bf16-fused-k512", "fp8-union8-sort-k512", "bf16-pages-k1024", "fp8-tile-wide-k512"], "cpu")
    for arm, word in (("fp8-sampel1-k1024", "sampel1"), ("fp8-segmentd-k1024", "segmentd"),
                      ("fp16-k512", None), ("fp8-1024", None), ("fp8-union3-k512", "union tile")):
        with pytest.raises(SystemExit) as e:
            check_arms(["dense", arm], "cpu")
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: arm ") and arm in err and (word is None or word in err), err
    with pytest.raises(ValueError, match="unknown: sampel1"):
        arm_config("fp8-sampel1-k1024", "cpu")
