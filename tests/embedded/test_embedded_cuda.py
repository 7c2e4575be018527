"""The embedded server's GPU path (serving/embedded/cuda): the paged index-key pool in
SGLang's layout, the bundled kernels' scores and selection against the CPU server's
(serving/embedded/dsa.py) on identical inputs, the sparse attention kernel, the naive
bf16 gather arm, a tiny model end to end, YaRN, the CLI's refusal without a GPU, the decode
step of the CUDA graphs against the eager step (every mode; a real capture and replay on a
GPU), the graph's probe statistics, and `--lengths auto` on the GPU matrix's YaRN context.

Without a GPU everything runs on CPU tensors under TRITON_INTERPRET=1 (set below, before
triton is imported), at tiny shapes; with one, the same tests run on CUDA.
"""

import copy
import os
import subprocess
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from niah.kernels.quant import dequantize_fp8, quantize_fp8, store_roundtrip  # noqa: E402
from niah.serving.embedded.cuda.attend import sparse_attention, sparse_attention_reference  # noqa: E402
from niah.serving.embedded.cuda.indexer import CudaDSA  # noqa: E402
from niah.serving.embedded.cuda.memory import SHAPES, gather_bytes  # noqa: E402
from niah.serving.embedded.cuda.paging import PAGE  # noqa: E402
from niah.serving.embedded.dsa import DSA  # noqa: E402
from niah.serving.embedded.model import LayerCache, ModelArgs, Transformer  # noqa: E402
from niah.serving.sglang import attest  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
HKV, G, D = 2, 3, 32      # fp8 tl.dot on a GPU needs K >= 32
H = HKV * G


def make(dtype: str, capacity: int = 200, topk: int = 8, chunk: int = 64, **kw) -> CudaDSA:
    return CudaDSA(1, HKV, D, capacity, dtype, topk, chunk, device=DEV, **kw)


def layer_cache(k: torch.Tensor, capacity: int = 200) -> LayerCache:
    kv = torch.zeros(1, HKV, capacity, D, device=DEV)
    kv[:, :, :k.shape[2]] = k
    return LayerCache(kv, torch.randn(1, HKV, capacity, D, device=DEV), layer_id=0)


def keys_and_query(T: int, seed: int = 0):
    """Positively biased, so that ReLU'd scores rarely tie at 0 (ties may break either way)."""
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(1, HKV, T, D, generator=g) + 0.7).to(DEV)
    q = (torch.randn(1, H, T, D, generator=g) + 0.5).to(DEV)
    return k, q


def query_as_kernel_sees_it(q: torch.Tensor, dtype: str) -> torch.Tensor:
    """The index query after the GPU path's quantisation (fp8 per token and head; bf16), fp32."""
    if dtype == "fp8":
        return dequantize_fp8(*quantize_fp8(q))
    return q.to(torch.bfloat16).float() if dtype == "bf16" else q


@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
def test_pool_layout_is_sglangs_and_paged(dtype):
    T = 150                                         # 3 pages per kv head
    k, _ = keys_and_query(T)
    dsa = make(dtype)
    cache = layer_cache(k)
    dsa.store(cache, k[:, :, :100], 0)              # prefill of 100 tokens, then 50 more
    dsa.store(cache, k[:, :, 100:], 100)
    pool = dsa.pool
    table = pool.block_table[:, :3].cpu()
    assert pool.pages_used == 3 and (table >= 0).all()
    assert len(set(table.flatten().tolist())) == 6  # distinct pages ...
    assert table.flatten().tolist() != sorted(table.flatten().tolist())   # ... scattered through the pool
    buf = pool.layer(0).cpu()
    for g in range(HKV):
        for t in (0, 63, 64, 99, 100, 149):
            page, off = int(table[g, t // PAGE]), t % PAGE
            if dtype == "fp8":
                k8, sf = quantize_fp8(k[0, g, t].cpu())
                assert torch.equal(buf[page, off * D:(off + 1) * D], k8.view(torch.uint8))
                assert torch.equal(buf[page, PAGE * D + 4 * off:PAGE * D + 4 * off + 4],
                                   sf.reshape(1).view(torch.uint8))
            else:
                assert torch.equal(buf[page, off * D:(off + 1) * D], k[0, g, t].cpu().to(torch.bfloat16))
        assert torch.equal(pool.dequantized(0, g, T).cpu(), store_roundtrip(k[0, g].cpu(), dtype))
    assert pool.bytes_per_token == HKV * (D + 4 if dtype == "fp8" else 2 * D)
    dsa.store(cache, k[:, :, :10], 0)               # a new sequence gets fresh pages
    assert pool.pages_used == 1 and int((pool.block_table >= 0).sum()) == HKV


@pytest.mark.parametrize("dtype", ["fp8", "bf16", "fp32"])
def test_scores_and_selection_match_the_cpu_server(dtype):
    """Prefill (ragged kernel) and decode (paged kernel) scores, and the kept keys, equal the
    CPU server's on the same keys and the same (as quantised) query."""
    T, topk = 40, 8
    k, q = keys_and_query(T, seed=1)
    dsa = make(dtype, topk=topk)
    dsa.store(layer_cache(k), k, 0)
    cpu = DSA(dtype, topk, 0, 64, dense_when_short=False)
    qref = query_as_kernel_sees_it(q, dtype).cpu()
    idx_k = store_roundtrip(k[0].cpu(), dtype)                                   # [Hkv, T, D]
    ref = cpu.index_scores(qref, idx_k)                                         # [T, T]
    causal = torch.ones(T, T, dtype=torch.bool).triu_(1)
    got = dsa.prefill_scores(0, q, 0).cpu()
    assert torch.equal(torch.isneginf(got), causal)
    torch.testing.assert_close(got.masked_fill(causal, 0), ref.masked_fill(causal, 0), rtol=1e-4, atol=1e-5)
    dec = dsa.decode_scores(0, q[:, :, -1:], T).cpu()                           # [1, T]
    torch.testing.assert_close(dec[0], ref[-1], rtol=1e-4, atol=1e-5)
    kept_cpu = cpu.select(qref, idx_k, 0)                                       # [T, T] bool
    idx = dsa.select(dsa.prefill_scores(0, q, 0)).cpu()                         # [T, K]
    kept_gpu = torch.zeros(T, T, dtype=torch.bool)
    for r in range(T):
        kept_gpu[r, idx[r][idx[r] >= 0].long()] = True
        assert int((idx[r] >= 0).sum()) == min(topk, r + 1)                    # short rows: -1 pads
    assert torch.equal(kept_gpu, kept_cpu)


def test_topk_torch_option_selects_the_same():
    k, q = keys_and_query(30, seed=2)
    a, b = make("bf16"), make("bf16", topk_impl="torch")
    for d in (a, b):
        d.store(layer_cache(k), k, 0)
    sa, sb = a.select(a.prefill_scores(0, q, 0)).cpu(), b.select(b.prefill_scores(0, q, 0)).cpu()
    for r in range(30):
        assert set(sa[r].tolist()) == set(sb[r].tolist())


@pytest.mark.parametrize("precision", ["tf32x3", "ieee", "broadcast"])
def test_sparse_attention_kernel_matches_masked_sdpa(precision):
    g = torch.Generator().manual_seed(3)
    T, S, K = 12, 40, 8
    q = torch.randn(1, H, T, D, generator=g).to(DEV)
    k = torch.randn(1, HKV, 64, D, generator=g).to(DEV)
    v = torch.randn(1, HKV, 64, D, generator=g).to(DEV)
    idx = torch.stack([torch.randperm(S, generator=g)[:K] for _ in range(T)]).int()
    idx[0, 3:] = -1                                  # a short row
    idx[1, :] = torch.arange(K)                      # column 0 kept
    idx = idx.to(DEV)
    torch.testing.assert_close(sparse_attention(q, k, v, idx, precision=precision),
                               sparse_attention_reference(q, k, v, idx), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="precision"):
        sparse_attention(q, k, v, idx, precision="tf32")


def few_queries(seed: int, T: int, S: int = 300, K: int = 70):
    """q [1, H, T, D], the KV cache k, v [1, HKV, S, D] and each query's own K kept positions
    ([T, K] int32) on DEV: a decode step's few queries for the attention's tests."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, T, D, generator=g).to(DEV)
    k = torch.randn(1, HKV, S, D, generator=g).to(DEV)
    v = torch.randn(1, HKV, S, D, generator=g).to(DEV)
    idx = torch.stack([torch.randperm(S, generator=g)[:K] for _ in range(T)]).int()
    return q, k, v, idx


@pytest.mark.parametrize("precision", ["tf32x3", "broadcast"])
def test_one_program_a_head_attends_as_one_a_kv_head(precision):
    """A program per query head (`one_head`): the same output as the kv-head launch (bitwise on
    a GPU, each head a row of its own tile computed alike; the interpreter's numpy products may
    round a row otherwise, to fp32 rounding), and masked SDPA's."""
    T = 3
    q, k, v, idx = few_queries(8, T)
    idx[2, 50:] = -1                                 # a short row
    idx = idx.to(DEV)
    one = sparse_attention(q, k, v, idx, precision=precision, one_head=True, split_keys=0)
    grouped = sparse_attention(q, k, v, idx, precision=precision, one_head=False, split_keys=0)
    if DEV == "cuda":
        assert torch.equal(one, grouped)
    else:
        torch.testing.assert_close(one, grouped, rtol=0, atol=1e-6)
    torch.testing.assert_close(one, sparse_attention_reference(q, k, v, idx), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("one_head", [True, False])
def test_split_keys_attend_as_one_program_a_row(one_head, monkeypatch):
    """Split-K (each query's kept keys over several programs, their partial softmaxes rescaled
    to a common max and summed by a second launch) gives the one-program output to fp32
    rounding, and masked SDPA's: splits of 16 and 32 keys over 70 (the last split partly past
    K), a short row whose later splits hold no key, a row with no key at all (0 out, as without
    splits); 0 or a split at least K runs unsplit (no combine launch); a negative split is refused."""
    from niah.serving.embedded.cuda import attend
    from niah.serving.embedded.cuda.attend import DECODE_SPLIT_KEYS

    combines = []
    real = attend.launcher_of

    def spy(module, kernel):                         # counts the combine launches, then launches
        launch = real(module, kernel)
        if kernel != "sparse_attention_combine_kernel":
            return launch
        return lambda grid, *args, **meta: (combines.append(grid), launch(grid, *args, **meta))

    monkeypatch.setattr(attend, "launcher_of", spy)
    T, K = 4, 70
    q, k, v, idx = few_queries(9, T, K=K)
    idx[2, 20:] = -1                                 # a short row: the splits past 20 hold no key
    idx[3, :] = -1                                   # no key
    idx = idx.to(DEV)
    whole = sparse_attention(q, k, v, idx, one_head=one_head, split_keys=0)
    assert torch.equal(whole[:, :, 3], torch.zeros_like(whole[:, :, 3])) and combines == []
    ref = sparse_attention_reference(q[:, :, :3], k, v, idx[:3])
    for split in (16, 32):
        got = sparse_attention(q, k, v, idx, one_head=one_head, split_keys=split)
        torch.testing.assert_close(got, whole, rtol=0, atol=2e-6)
        torch.testing.assert_close(got[:, :, :3], ref, rtol=1e-4, atol=1e-5)
        assert torch.equal(got[:, :, 3], whole[:, :, 3])
    assert combines == [(T, H), (T, H)]              # both splits ran split, combined once each
    assert torch.equal(sparse_attention(q, k, v, idx, one_head=one_head, split_keys=K), whole)
    assert len(combines) == 2
    assert 0 < DECODE_SPLIT_KEYS < K                 # a decode step's one query splits by default
    one = sparse_attention(q[:, :, :1], k, v, idx[:1], one_head=one_head)
    assert combines[2:] == [(1, H)]
    torch.testing.assert_close(one, whole[:, :, :1], rtol=0, atol=2e-6)
    with pytest.raises(ValueError, match="split_keys"):
        sparse_attention(q, k, v, idx, split_keys=-1)


def test_a_prefill_chunk_launches_tuned_and_attends_as_the_4_warp_launch():
    """At PREFILL_ROWS queries and more a "tf32x3" launch takes PREFILL_LAUNCH's warps and
    stages (below: 4 warps, Triton's stages; other precisions always; a caller's choice wins),
    and attends as a 4-warp launch and as masked SDPA, to fp32 rounding (on a GPU the warps
    differ; in the interpreter they do not)."""
    from niah.serving.embedded.cuda.attend import PREFILL_LAUNCH, PREFILL_ROWS, launch_options

    assert launch_options("tf32x3", PREFILL_ROWS) == PREFILL_LAUNCH == {"num_warps": 2, "num_stages": 2}
    assert launch_options("tf32x3", PREFILL_ROWS - 1) == {"num_warps": 4}
    assert launch_options("ieee", 4096) == launch_options("broadcast", 4096) == {"num_warps": 4}
    assert launch_options("tf32x3", 4096, num_warps=8, num_stages=3) == {"num_warps": 8, "num_stages": 3}
    assert launch_options("tf32x3", 1, num_stages=1) == {"num_warps": 4, "num_stages": 1}

    g = torch.Generator().manual_seed(5)
    T, S, K = PREFILL_ROWS, 40, 8
    q = torch.randn(1, H, T, D, generator=g).to(DEV)
    k = torch.randn(1, HKV, 64, D, generator=g).to(DEV)
    v = torch.randn(1, HKV, 64, D, generator=g).to(DEV)
    idx = torch.stack([torch.randperm(S, generator=g)[:K] for _ in range(T)]).int().to(DEV)
    tuned = sparse_attention(q, k, v, idx, share=0)
    torch.testing.assert_close(tuned, sparse_attention(q, k, v, idx, num_warps=4, num_stages=3, share=0),
                               rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(tuned, sparse_attention_reference(q, k, v, idx), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["fp8", "bf16", "fp32"])
def test_score_rows_bound_the_scores_and_keep_the_selection(dtype):
    """A score budget smaller than the chunk's [C, S] scores: the fused read scores a few rows
    at a time (never more than the budget's fp32 scores a call) and keeps the same keys and
    attention output as one call over the whole chunk; the gather read takes the whole chunk."""
    T = 90
    k, q = keys_and_query(T, seed=6)
    cache = layer_cache(k)
    whole, rows = make(dtype), make(dtype, score_bytes=4 * 84 * 16)     # 16 rows over the 84 keys below
    for d in (whole, rows):
        d.store(cache, k, 0)
    assert whole.score_rows(84) == 64 and rows.score_rows(84) == 16
    for S in (100, 1000, 22600, 131072):
        assert rows.score_rows(S) * 4 * S <= rows.score_bytes or rows.score_rows(S) == 1
    assert make("bf16", bf16_read="gather", score_bytes=4).score_rows(10**5) == 64
    seen = []
    real = rows._call_scores
    rows._call_scores = lambda *a, **kw: seen.append(real(*a, **kw)) or seen[-1]
    idx_a, last_a = whole._prefill_select(0, q[:, :, 20:84], 20)
    idx_b, last_b = rows._prefill_select(0, q[:, :, 20:84], 20)
    assert [t.shape[0] for t in seen] == [16, 16, 16, 16] and all(t.numel() * 4 <= rows.score_bytes for t in seen)
    assert idx_a.shape == idx_b.shape
    same_scores(last_a, last_b)
    for r in range(64):
        assert set(idx_a[r].tolist()) == set(idx_b[r].tolist())
    torch.testing.assert_close(rows(q[:, :, 20:84], cache, 20), whole(q[:, :, 20:84], cache, 20), rtol=1e-5, atol=1e-6)
    # from position 0 with rows that do not divide the chunk: the first calls keep fewer than K
    # keys a row (-1 pads past them) and the last call is short
    seen.clear()
    rows.score_bytes = 4 * 24 * 7                                               # 7 rows over <= 24 keys
    idx_a, last_a = whole._prefill_select(0, q[:, :, :24], 0)
    idx_b, last_b = rows._prefill_select(0, q[:, :, :24], 0)
    assert [t.shape for t in seen] == [(7, 7), (7, 14), (7, 21), (3, 24)]
    assert idx_a.shape == idx_b.shape == (24, 8)
    same_scores(last_a, last_b)
    assert torch.equal((idx_b[:7] >= 0).sum(1).cpu(), torch.tensor([1, 2, 3, 4, 5, 6, 7]))
    for r in range(24):
        assert set(idx_a[r].tolist()) == set(idx_b[r].tolist())


def same_scores(a: torch.Tensor, b: torch.Tensor) -> None:
    """A row's scores from score calls of different row counts: bitwise equal on a GPU (each
    score's dot products accumulate in the same order whatever the rows beside it); under the
    interpreter tl.dot is numpy's matmul, whose BLAS may sum a product in another order for
    another shape (an ulp, depending on the CPU's BLAS kernels)."""
    if a.is_cuda:
        assert torch.equal(a, b)
    else:
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", ["fp32", "fp8"])
def test_chunked_prefill_equals_one_pass(dtype):
    """generate.prefill with the GPU server's prefill chunk (equal to the indexer's, as the
    server sets it, or smaller; a last chunk of one token, which the indexer scores as a
    decode step): the same last logits, per-layer selection recall and indexer probe as one
    pass over the prompt."""
    from niah.serving.embedded.generate import prefill
    from niah.serving.embedded.probe import STAT_KEYS, ProbeLog

    ids = torch.randint(0, 64, (33,), generator=torch.Generator().manual_seed(2)).tolist()
    m = tiny_model()
    got = []
    for chunk, dsa_chunk in ((None, 64), (16, 16), (16, 64)):           # 33 = 2 x 16 + 1
        m.set_attention(CudaDSA(2, HKV, D, 128, dtype, 8, dsa_chunk, device=DEV))
        m.prefill_chunk = chunk
        probe = ProbeLog((20, 24), 2, 8)
        logits, stats = prefill(m, ids, needle_positions=(10, 14), probe=probe)
        probe.next_step()
        got.append((logits.cpu(), stats["selection_recall"], probe.steps[0]))
    for logits, recall, step in got[1:]:
        torch.testing.assert_close(logits, got[0][0], rtol=1e-4, atol=1e-4)
        assert recall == got[0][1]
        assert step["active"] and step["position"] == got[0][2]["position"] == 32
        for key in STAT_KEYS:  # the probe rounds to 5 places: a last-bit difference may move one unit
            assert step[key] == pytest.approx(got[0][2][key], abs=2e-5), key


def test_rows_before_k_attend_densely_and_only_later_rows_select(monkeypatch):
    """A prompt's rows at positions < K keep every key: the prefill attends them densely, so the
    sparse kernel and the indexer see only the rows from K on, whatever the chunks (K inside a
    chunk, chunks wholly before K, a last chunk of one row), and the logits and the last row's
    selection recall are those of every row through the kernel, to fp32 rounding."""
    from niah.serving.embedded.cuda import indexer as mod

    rows = []
    real = mod.sparse_attention

    def counted(q, *args, **kw):
        rows.append(q.shape[2])
        return real(q, *args, **kw)

    monkeypatch.setattr(mod, "sparse_attention", counted)
    ids = torch.randint(0, 64, (1, 33), generator=torch.Generator().manual_seed(4)).to(DEV)
    m, K = tiny_model(), 8
    got = {}
    for dense_first, chunk in ((False, 64), (True, 64), (True, 4), (True, 6)):
        rows.clear()
        m.set_attention(CudaDSA(2, HKV, D, 128, "fp8", K, chunk, device=DEV, dense_when_short=dense_first))
        stats = {"needle_positions": (10, 14)}
        got[dense_first, chunk] = (m(ids, 0, all_logits=True, stats=stats).cpu(), dict(stats["selection_recall"]),
                                   list(rows))
    assert got[False, 64][2] == [33, 33]                          # 2 layers, every row through the kernel
    assert got[True, 64][2] == [25, 25]                           # rows 8..32
    assert got[True, 4][2] == [4, 4, 4, 4, 4, 4, 1] * 2           # chunks 0-3 and 4-7 dense; 32 alone
    assert got[True, 6][2] == [4, 6, 6, 6, 3] * 2                 # rows 6, 7 of the chunk 6-11 dense
    for key in ((True, 64), (True, 4), (True, 6)):
        torch.testing.assert_close(got[key][0], got[False, 64][0], rtol=1e-4, atol=1e-4)
        assert got[key][1] == got[False, 64][1]


def test_a_prefill_with_prefill_share_attends_by_union_as_gathered(monkeypatch):
    """attend.PREFILL_SHARE > 0: a prefill chunk of at least PREFILL_ROWS selecting rows goes
    through union_attention (the first K rows attend densely, as always); the logits are the
    gather kernel's to fp32 rounding."""
    from niah.serving.embedded.cuda import attend

    calls = []
    real = attend.union_attention
    monkeypatch.setattr(attend, "union_attention", lambda q, k, v, idx, **kw: calls.append(q.shape[2]) or real(
        q, k, v, idx, **kw))
    monkeypatch.setattr(attend, "PREFILL_ROWS", 8)
    ids = torch.randint(0, 64, (1, 33), generator=torch.Generator().manual_seed(6)).to(DEV)
    m, K = tiny_model(), 8
    got = {}
    for share in (0, 4):
        monkeypatch.setattr(attend, "PREFILL_SHARE", share)
        calls.clear()
        m.set_attention(CudaDSA(2, HKV, D, 128, "bf16", K, 64, device=DEV))
        got[share] = (m(ids, 0, all_logits=True).cpu(), list(calls))
    assert got[0][1] == [] and got[4][1] == [25, 25]             # rows 8..32, per layer
    torch.testing.assert_close(got[4][0], got[0][0], rtol=1e-4, atol=1e-4)


def test_gather_arm_reads_the_same_keys_and_spends_queries_x_pages():
    T = 70
    k, q = keys_and_query(T, seed=4)
    fused, gather = make("bf16"), make("bf16", bf16_read="gather")
    for d in (fused, gather):
        d.store(layer_cache(k), k, 0)
    a, b = fused.prefill_scores(0, q, 0), gather.prefill_scores(0, q, 0)
    assert torch.equal(torch.isneginf(a), torch.isneginf(b))
    fin = ~torch.isneginf(a)
    torch.testing.assert_close(b[fin], a[fin], rtol=2e-2, atol=1e-2)        # bf16-rounded products
    pages = gather.pool.gather_per_query(0, 0, 5, T)
    assert pages.shape == (5, 2 * PAGE, D) and pages.dtype == torch.bfloat16
    assert pages.numel() * 2 == gather_bytes(5, T, D)
    assert torch.equal(pages[3, :T], gather.pool.contiguous(0, 0, T))


def test_gather_formula_at_deepseek_v4_shapes():
    v4 = SHAPES["deepseek-v4-indexer"]
    # 4,096 queries x 22,016 tokens, one 128-dim bf16 key per 4 tokens: 86 pages of 64 keys
    assert gather_bytes(4096, 22016, **v4) == 4096 * 86 * 64 * 128 * 2
    # the story's 8.25 GiB: a 6,144-query chunk over 22,528 tokens (88 pages)
    assert gather_bytes(6144, 22528, **v4) == 8.25 * 2**30
    # uncompressed (DeepSeek-V3.2's indexer): the 23.1 GB of the spec
    assert round(gather_bytes(4096, 22016, 128) / 1e9, 1) == 23.1


def test_tiny_model_end_to_end_equals_the_cpu_server():
    """fp32 index keys: the GPU path (kernels + sparse attention) gives the CPU server's logits,
    prefill and decode, with the same per-layer selection recall and indexer probe stats of
    the last prompt row (the GPU path computes every layer's at once after the last layer,
    the CPU server one layer at a time); attestation counted."""
    from niah.serving.embedded.probe import STAT_KEYS, ProbeLog

    torch.manual_seed(0)
    args = ModelArgs(vocab_size=64, n_layer=2, n_head=H, n_local_heads=HKV, dim=H * D, intermediate_size=64,
                     head_dim=D, block_size=128)
    m_cpu = Transformer(args).eval()
    for p in m_cpu.parameters():
        torch.nn.init.normal_(p, std=0.3)
    m_dev = copy.deepcopy(m_cpu).to(DEV)
    m_dev.cos, m_dev.sin = m_dev.cos.to(DEV), m_dev.sin.to(DEV)
    ids = torch.randint(0, 64, (1, 40))
    out = {}
    for name, m, make_att in (("cpu", m_cpu, lambda: DSA("fp32", 8, 0, 64)),
                              ("gpu", m_dev, lambda: CudaDSA(2, HKV, D, 128, "fp32", 8, 64, device=DEV))):
        attest.reset()
        m.set_attention(make_att())
        probe = ProbeLog((11, 15), 2, 8)
        stats = {"needle_positions": (10, 14), "probe": probe}
        out[name] = (m(ids, 0, all_logits=True, stats=stats).cpu(), m(torch.tensor([[5]]), 40).cpu(),
                     {i: float(v) for i, v in stats["selection_recall"].items()})
        probe.next_step()
        out[name] += (probe.steps[0],)
    torch.testing.assert_close(out["gpu"][0], out["cpu"][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["gpu"][1], out["cpu"][1], rtol=1e-4, atol=1e-4)
    assert out["gpu"][2] == out["cpu"][2] and set(out["gpu"][2]) == {0, 1}
    got, want = out["gpu"][3], out["cpu"][3]
    assert got["active"] and want["active"] and (got["position"], got["context"]) == (39, 40)
    for key in STAT_KEYS:
        assert got[key] == pytest.approx(want[key], abs=1e-5), key
    snap = attest.snapshot()
    assert snap["kernels"] == "niah-cuda" and snap["pool_bytes_per_token"] == HKV * 4 * D
    assert snap["kernel_calls"]["topk"] == {"niah.topk_indices": 4}             # 2 layers x (prefill + decode)
    assert snap["facts"]["device"] == DEV and snap["facts"]["query"] == "fp32"
    attest.reset()


def test_fused_topk_prefill_scores_a_chunk_it_cannot_vouch_for_again_unfused():
    """--topk fused through generate.prefill: a chunk holding a row the kernel cannot vouch for
    (here its candidate buffer is too small) is scored again unfused, giving exactly the
    unfused arm's logits, counted in fused_calls and in both kernels' attested calls; vouched
    chunks stay fused."""
    from niah.serving.embedded.generate import prefill

    torch.manual_seed(0)
    args = ModelArgs(vocab_size=64, n_layer=2, n_head=H, n_local_heads=HKV, dim=H * D, intermediate_size=64,
                     head_dim=D, block_size=128)
    base = Transformer(args).eval()
    for p in base.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ids = torch.randint(0, 64, (40,)).tolist()

    def run(topk_impl: str, cap: int | None = None):
        m = copy.deepcopy(base).to(DEV)
        m.cos, m.sin = m.cos.to(DEV), m.sin.to(DEV)
        att = CudaDSA(2, HKV, D, 128, "fp8", 8, 16, topk_impl=topk_impl, device=DEV)   # 3 chunks a layer
        att.fused_cap = cap
        m.set_attention(att)
        attest.reset()
        logits, _ = prefill(m, ids)
        calls = attest.snapshot()["kernel_calls"]
        attest.reset()
        return logits.cpu(), dict(att.fused_calls), calls

    unfused, _, calls = run("niah")
    from niah.kernels import logits_form
    assert set(calls["prefill_logits"]) == {f"niah.indexer_logits.{logits_form(HKV)}"}   # the form attested
    vouched, counts, calls = run("fused")
    assert counts == {"calls": 6, "fallbacks": 0, "fallback_rows": 0}        # 2 layers x 3 chunks
    assert calls["topk"] == {"niah.indexer_topk": 6}
    again, counts, calls = run("fused", cap=16)     # a row seeing more than 16 keys overflows 16 slots:
    assert counts["calls"] == 6 and counts["fallbacks"] == 4 and counts["fallback_rows"] == 2 * (16 + 8)
    # the first chunk (positions 0-15) stays fused, the other two of each layer run again unfused
    torch.testing.assert_close(again, unfused, rtol=1e-3, atol=1e-3)
    assert calls["topk"]["niah.indexer_topk"] == 6 and calls["topk"]["niah.topk_indices"] == 4
    torch.testing.assert_close(vouched, unfused, rtol=1e-3, atol=1e-3)


def test_yarn_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from niah.serving.embedded.model import yarn_inv_freq

    c = LlamaConfig(hidden_size=576, num_attention_heads=9, head_dim=64, max_position_embeddings=32768,
                    rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192,
                                     "rope_theta": 100000.0})
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](c, "cpu")
    mine, mine_factor = yarn_inv_freq(100000.0, 64, 4.0, 8192)
    assert torch.equal(inv.float(), mine) and factor == pytest.approx(mine_factor)
    args = ModelArgs.from_meta({"config": {"block_size": 8192}}, "yarn", 4.0)
    assert args.block_size == 32768 and args.original_block_size == 8192


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_serve_device_cuda_without_a_gpu_is_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "niah", "serve", "--device", "cuda"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0]


def test_probe_tensor_stats_equal_row_stats():
    from niah.serving.embedded.probe import STAT_KEYS, ProbeLog, row_stats, row_stats_tensor

    g = torch.Generator().manual_seed(5)
    for trial in range(20):
        S, k = 50, 8
        scores, exact = torch.randn(S, generator=g), torch.randn(S, generator=g)
        if trial % 3 == 0:
            scores[10:20] = 0.0                      # ties at the ReLU's 0
        kept = torch.zeros(S, dtype=torch.bool)
        kept[scores.topk(k).indices] = True
        span = (12, 15) if trial % 2 else (30, 34)
        want = row_stats(scores, kept, exact, k, span)
        log = ProbeLog(span, 1, k)
        log.record(0, S - 1, S, row_stats_tensor(scores, kept, exact, k, span))
        log.next_step()
        got = log.steps[0]
        for key in STAT_KEYS:
            if want[key] is None:
                assert got[key][0] is None
            else:
                assert got[key][0] == pytest.approx(round(want[key], 5), abs=1e-5), key


def tiny_model(block_size: int = 128) -> Transformer:
    torch.manual_seed(0)
    args = ModelArgs(vocab_size=64, n_layer=2, n_head=H, n_local_heads=HKV, dim=H * D, intermediate_size=64,
                     head_dim=D, block_size=block_size)
    m = Transformer(args).eval()
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.3)
    m = m.to(DEV)
    m.cos, m.sin = m.cos.to(DEV), m.sin.to(DEV)
    return m


@pytest.mark.parametrize("arm", ["dense", "fp8", "bf16", "bf16-gather", "fp32", "fp8-short"])
def test_graph_decode_step_equals_the_eager_step(arm):
    """The decode step of the CUDA graphs (static position, width W > S, padded scores) gives
    the eager step's logits and the same indexer probe stats; on CUDA through a real capture
    and replay (twice: the second replay reuses the graph), on CPU the same static step eagerly.
    On CUDA the graph's one counting node (attest.graph_tally) counts its whole tally each
    replay: the top-k of 2 layers x 2 replays; a graph step hands back host logits."""
    from niah.serving.embedded.cuda.graphs import DecodeGraphs
    from niah.serving.embedded.generate import decode_one
    from niah.serving.embedded.probe import STAT_KEYS, ProbeLog

    m = tiny_model()
    dtype = arm.split("-")[0]
    topk = 64 if arm.endswith("short") else 8
    att = None if arm == "dense" else CudaDSA(2, HKV, D, 128, dtype, topk, 64, device=DEV,
                                               bf16_read="gather" if "gather" in arm else "fused")
    m.set_attention(att)
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(1))
    span = (10, 14)
    got = {}
    for name, graphs in (("eager", None), ("graph", DecodeGraphs(m, att, width_step=64, capture=DEV == "cuda"))):
        m.decode_graphs = graphs
        attest.reset()
        m(ids, 0)
        rows = []
        for pos, tok in ((40, 5), (41, 9)):
            probe = None if arm == "dense" else ProbeLog(span, 2, topk)
            logits = decode_one(m, tok, pos, probe)
            assert logits.device.type == ("cpu" if name == "graph" else DEV)   # a graph step: host logits
            logits = logits.cpu()
            if probe is not None:
                probe.next_step()
            rows.append((logits, probe.steps[0] if probe is not None else None))
        got[name] = rows
    if DEV == "cuda" and arm not in ("dense", "fp8-short"):
        topk = attest.snapshot()["calls"]["topk"]["fp32"]
        assert [c["replayed"] for c in topk.values()] == [2 * 2] and graphs.replays == 2
    for (le, pe), (lg, pg) in zip(got["eager"], got["graph"]):
        torch.testing.assert_close(lg, le, rtol=1e-4, atol=1e-4)
        if pe is not None:
            assert pg["active"] == pe["active"] and pg["position"] == pe["position"]
            for key in STAT_KEYS if pe["active"] else ():
                assert pg[key] == pytest.approx(pe[key], abs=1e-4), key


def test_row_stats_at_equals_row_stats_tensor_on_padded_rows():
    """rows_stats_at on one row at a time and on all rows in one batch (what a decode step's
    probe computes after its last layer) gives row_stats_tensor's numbers, also
    where the exact scores tie at their k-th (ReLU zeros: the fidelity counts the tied keys
    the selection kept while the exact top-k has room, not whichever ones topk returned)."""
    from niah.serving.embedded.cuda.probe_rows import rows_stats_at
    from niah.serving.embedded.probe import row_stats_tensor

    g = torch.Generator().manual_seed(6)
    S, W, k = 50, 64, 8
    for span in ((12, 15), (30, 34)):
        wants, padded = [], []
        for trial in range(12):
            scores, exact = torch.randn(S, generator=g), torch.randn(S, generator=g)
            if trial % 3 == 0:
                scores[10:20] = 0.0                                     # ties at the ReLU's 0
            if trial % 3 == 1:
                exact = exact.clamp_min(1.5) - 1.5      # fewer than k above 0: the exact k-th a tie at 0
            kept = torch.zeros(S, dtype=torch.bool)
            kept[scores.topk(k).indices] = True
            if trial % 4 == 1:
                kept[span[0]:span[1]] = False                           # no value token kept: margin NaN
            want = row_stats_tensor(scores, kept, exact, k, span)
            pad = torch.full((W - S,), float("-inf"))
            row = (torch.cat([scores, pad]), torch.cat([kept, torch.zeros(W - S, dtype=torch.bool)]),
                   torch.cat([exact, pad]))
            one = rows_stats_at(*(t[None] for t in row), k, torch.tensor(span))[0]
            torch.testing.assert_close(one, want, equal_nan=True)
            wants.append(want)
            padded.append(row)
        batch = rows_stats_at(*(torch.stack(t) for t in zip(*padded)), k, torch.tensor(span))
        torch.testing.assert_close(batch, torch.stack(wants), equal_nan=True)
    # an unpadded row no wider than k (a prompt of <= k tokens probed through the indexer):
    # every key is the top-k, as row_stats_tensor's min(k, S)
    scores, exact = torch.randn(6, generator=g), torch.randn(6, generator=g)
    kept = torch.ones(6, dtype=torch.bool)
    want = row_stats_tensor(scores, kept, exact, k, (2, 4))
    torch.testing.assert_close(rows_stats_at(scores[None], kept[None], exact[None], k, torch.tensor((2, 4)))[0],
                               want, equal_nan=True)


def test_lengths_auto_reads_the_yarn_context_of_the_gpu_matrix():
    from pathlib import Path

    from niah.serving.matrix import matrix_topks

    root = Path(__file__).resolve().parents[2]
    topks, context = matrix_topks(root / "serving/examples/gpu-seed.toml", context_too=True)
    assert context == 32768 and topks["dense"] is None and topks["fp8-k512"] == 512


def test_a_prefills_results_reach_the_host_as_they_were():
    """prefill_to_host (one copy for a GPU prefill's last logits, per-layer selection recall
    and probe stats): host tensors of their own dtypes and shapes, equal to the device values,
    put back where generate reads them."""
    from niah.serving.embedded.generate import prefill, prefill_to_host
    from niah.serving.embedded.probe import ProbeLog

    m = tiny_model()
    m.set_attention(CudaDSA(2, HKV, D, 128, "fp8", 8, 64, device=DEV))
    ids = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(8)).tolist()
    probe = ProbeLog((11, 15), 2, 8)
    logits, stats = prefill(m, ids, (10, 14), probe)
    recall, rows = stats["selection_recall"], probe.current
    want = (logits.clone(), {i: v.clone() for i, v in recall.items()}, {i: v.clone() for i, v in rows.items()})
    assert all(isinstance(v, torch.Tensor) for v in [*want[1].values(), *want[2].values()]) and len(want[2]) == 2
    host = prefill_to_host(logits, stats, probe)
    for got, ref in [(host, want[0]), *((recall[i], v) for i, v in want[1].items()),
                     *((rows[i], v) for i, v in want[2].items())]:
        assert got.device.type == "cpu" and got.dtype == ref.dtype and got.shape == ref.shape
        torch.testing.assert_close(got, ref.cpu(), rtol=0, atol=0, equal_nan=True)   # bitwise (a NaN stat too)
