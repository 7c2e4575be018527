"""DeepSeek-V3.2 in SGLang 0.5.23's default (fused) paths, on CPU: SGLang's own indexer code
lifted from the wheel (tests/sglang_v32_lift.py) with the plugin's patches applied as the
plugin applies them, niah's Triton kernels under TRITON_INTERPRET=1.

- the fused key store (`_fused_k_prepare_and_store`, reached from `_forward_cuda_k_only`
  and `_fused_q_prepare_and_store`) writes niah's bf16 rows: SGLang's LayerNorm + RoPE, no
  rotation, equal to the reference bit for bit; the fp8 arm keeps SGLang's store (counted);
- decode (`_get_topk_paged`): niah's bf16 replacement next to SGLang's own body over fp8
  pages (the fp8/niah arm), same output contract, the bf16 selection equal to float64's;
- prefill (SGLang's own `_get_topk_ragged`) over the bf16 gather;
- top-k is SGLang's (its torch backend here), counted under the backend's name.
"""

from __future__ import annotations

import os
import types

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import sglang_v32_lift as L  # noqa: E402
from niah.serving.sglang import attest, bf16_cache  # noqa: E402

HEADS, HIDDEN, TOPK, PAGES = 4, 64, 16, 6


class Mode:
    """ForwardMode's predicates the indexer asks."""

    def __init__(self, name: str):
        self.name = name

    def is_extend_without_speculative(self): return self.name == "extend"
    def is_decode_or_idle(self): return self.name == "decode"
    def is_target_verify(self): return self.name == "verify"
    def is_draft_extend_v2(self): return False


def world(arm: str, seed: int = 0):
    ns = L.base_ns(arm)
    backend = L.topk_backend(ns)
    pool = L.key_pool(ns, arm, PAGES)
    idx = L.make_indexer(L.indexer_class(ns, arm), HEADS, HIDDEN, TOPK, seed=seed)
    return ns, backend, pool, idx


def metadata(ns, backend, method: str, **attn):
    """SGLang's DSAIndexerMetadata (lifted) on the torch top-k backend (unfused: the v2 kernels are JIT CUDA)."""
    base = dict(indexer_logical_page_table=None, page_table_1=None, cu_seqlens_q=None, topk_indices_offset=None)
    return ns["DSAIndexerMetadata"](attn_metadata=types.SimpleNamespace(**{**base, **attn}),
                                    topk_transform_method=getattr(ns["TopkTransformMethod"], method),
                                    topk_backend=backend.TORCH)


def reference_rows(idx, key_raw, positions):
    """niah's torch reference of SGLang's fused store arithmetic (kernels/v32_store): bf16 rows."""
    from niah.kernels.v32_store.reference import norm_rope

    return norm_rope(key_raw, idx.k_norm.weight, idx.k_norm.bias, idx.k_norm.variance_epsilon,
                     idx.rotary_emb.cos_sin_cache, positions).to(torch.bfloat16)


def prefill_keys(ns, backend, pool, idx, n: int, table: torch.Tensor, seed: int = 1):
    """One request's first n tokens through SGLang's `_forward_cuda_k_only` (the k-only
    extend path: context <= top-k is where SGLang takes it; here every length, return_indices=False)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, HIDDEN, generator=g).bfloat16()
    positions = torch.arange(n)
    loc = (table.long()[torch.arange(n) // L.PAGE] * L.PAGE + torch.arange(n) % L.PAGE).contiguous()
    fb = types.SimpleNamespace(forward_mode=Mode("extend"), out_cache_loc=loc)
    idx._forward_cuda_k_only(x, positions, fb, 0, None, None, return_indices=False)
    key_raw = idx._fused_k_weights(x)[0]
    return x, positions, loc, key_raw


def test_fused_store_writes_bf16_rows_with_sglangs_norm_and_rope_no_rotation():
    ns, backend, pool, idx = world("bf16")
    before = attest.snapshot()
    table = torch.tensor([4, 1, 3], dtype=torch.int32)
    x, positions, loc, key_raw = prefill_keys(ns, backend, pool, idx, 150, table)
    buf = pool.get_index_k_with_scale_buffer(0)
    assert buf.dtype == torch.uint8 and buf.shape[1] == 64 * 256  # 256 bytes a token
    pages = bf16_cache.pages_view(buf)
    got = pages[loc // 64, loc % 64, 0]
    assert torch.equal(got, reference_rows(idx, key_raw, positions))  # bit for bit
    written = torch.zeros(pages.shape[0] * 64, dtype=torch.bool)
    written[loc] = True
    assert torch.count_nonzero(pages.reshape(-1, 128)[~written]) == 0
    after = attest.snapshot()
    assert after["counts"].get("store.bf16", 0) == before["counts"].get("store.bf16", 0) + 1
    assert after["kernel_calls"]["store"].get("niah.store_v32_index_keys", 0) >= 1
    assert after["facts"]["rotation"] == "none" and after["facts"]["store"] == "niah.store_v32_index_keys"
    assert after["facts"]["index_topk"] == idx.index_topk  # the label's index_topk is proven, not unattested


def test_fp8_arm_keeps_sglangs_fused_store_and_counts_it():
    """Same inputs, fp8 arm: SGLang's own _fused_k_prepare_and_store (its JIT store stood in by
    niah's fp8 variant of the same kernel): 132-byte rows whose values are the bf16 arm's before
    the fp8 cast (one store, two precisions: nothing else differs)."""
    _, _, p16, i16 = world("bf16")
    ns, backend, p8, i8 = world("fp8")
    table = torch.tensor([4, 1, 3], dtype=torch.int32)
    before = attest.snapshot()["kernel_calls"].get("store", {}).get("sglang.fused_k_indexer_norm_rope_store", 0)
    _, _, loc, _ = prefill_keys(None, None, p16, i16, 150, table)
    prefill_keys(ns, backend, p8, i8, 150, table)
    assert attest.snapshot()["kernel_calls"]["store"]["sglang.fused_k_indexer_norm_rope_store"] == before + 1
    b8 = p8.get_index_k_with_scale_buffer(0)
    assert b8.shape[1] == 64 * 132
    vals = b8[:, : 64 * 128].view(-1, 64, 128)[loc // 64, loc % 64].view(torch.float8_e4m3fn).float()
    scales = b8[:, 64 * 128:].contiguous().view(torch.float32).view(-1, 64)[loc // 64, loc % 64]
    rows16 = bf16_cache.pages_view(p16.get_index_k_with_scale_buffer(0))[loc // 64, loc % 64, 0].float()
    err = ((vals * scales[:, None]) - rows16).abs().amax(1) / rows16.abs().amax(1)
    assert 0 < float(err.max()) <= 2**-4


def decode_inputs(seed: int, rows: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, HEADS, 128, generator=g)
    qs = q.abs().amax(-1, keepdim=True) / 448
    return (q / qs).to(torch.float8_e4m3fn), (torch.rand(rows, HEADS, 1, generator=g) + 0.1) * qs


def run_decode(arm: str, q8, w, lens, tables, padded_rows: int):
    """Context through the k-only path, one new token per request through SGLang's
    `_fused_q_prepare_and_store` (single stream), then `_get_topk_paged`."""
    ns, backend, pool, idx = world(arm)
    for b, (n, t) in enumerate(zip(lens, tables)):
        prefill_keys(ns, backend, pool, idx, n, t, seed=10 + b)
    b_rows = len(lens)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(b_rows, HIDDEN, generator=g).bfloat16()
    positions = torch.tensor(lens)
    loc = torch.stack([t.long()[n // 64] * 64 + n % 64 for n, t in zip(lens, tables)])
    idx.wq_b = L.Linear(torch.randn(HEADS * 128, 8, generator=g).bfloat16())
    ns["fused_q_indexer_rope_first_quant"] = lambda q, weights_raw, gate, cos_sin, pos: (q8[:b_rows], w[:b_rows])
    fb = types.SimpleNamespace(forward_mode=Mode("decode"), out_cache_loc=loc)
    q_fp8, weights = idx._fused_q_prepare_and_store(x, torch.randn(b_rows, 8, generator=g).bfloat16(), positions,
                                                    fb, 0, None)
    q_fp8 = torch.cat([q_fp8, q8[b_rows:padded_rows]])  # padding rows past the real batch, as attn-TP pads
    weights = torch.cat([weights, w[b_rows:padded_rows]])
    seqlens = torch.tensor([n + 1 for n in lens], dtype=torch.int32)
    table = torch.stack(tables).int()
    meta = metadata(ns, backend, "PAGED", cache_seqlens_int32=seqlens, real_page_table=table,
                    dsa_seqlens_expanded=seqlens, dsa_extend_seq_lens_list=[1] * b_rows)
    topk = idx._get_topk_paged(fb, 0, q_fp8, weights, meta)
    return topk, pool, idx


def float64_topk(rows16_by_req, q8, w, k):
    out = []
    for b, rows in enumerate(rows16_by_req):
        score = (torch.relu(q8[b].double() @ rows.double().T) * w[b].double()).sum(0)
        out.append(set(score.topk(min(k, rows.shape[0])).indices.tolist()))
    return out


def test_decode_bf16_replacement_against_sglangs_own_body_over_fp8_pages():
    lens = [150, 90]
    tables = [torch.tensor([4, 1, 3]), torch.tensor([0, 5, 2])]
    q8, w = decode_inputs(3, rows=3)
    before = attest.snapshot()["counts"]
    got16, p16, i16 = run_decode("bf16", q8, w, lens, tables, padded_rows=3)
    got8, _, _ = run_decode("fp8", q8, w, lens, tables, padded_rows=3)
    after = attest.snapshot()["counts"]
    assert after.get("decode_logits.bf16", 0) == before.get("decode_logits.bf16", 0) + 1
    assert after.get("decode_logits.fp8", 0) == before.get("decode_logits.fp8", 0) + 1
    assert after.get("topk.fp32", 0) >= before.get("topk.fp32", 0) + 2  # SGLang's top-k, counted
    assert attest.snapshot()["kernel_calls"]["topk"].get("sglang.topk_torch", 0) >= 2
    # SGLang's output contract: int32 [rows, topk], the padding row all -1
    assert got16.shape == got8.shape == (3, TOPK) and got16.dtype == got8.dtype == torch.int32
    assert (got16[2] == -1).all() and (got8[2] == -1).all()
    pages = bf16_cache.pages_view(p16.get_index_k_with_scale_buffer(0))
    rows16 = [pages[t.long()].reshape(-1, 128)[: n + 1, ] for n, t in zip(lens, tables)]
    want = float64_topk(rows16, q8, w, TOPK)
    assert [set(r.tolist()) for r in got16[:2]] == want  # bf16 keys: the float64 selection
    overlap = [len(set(a.tolist()) & s) / TOPK for a, s in zip(got8[:2], want)]
    assert min(overlap) >= 0.75  # fp8 keys: SGLang's own decode body, niah's fp8 kernel


def test_decode_refuses_the_branches_it_does_not_reproduce():
    ns, backend, pool, idx = world("bf16")
    idx.paged_mqa_logits_backend = L.Backend("cutedsl")
    with pytest.raises(NotImplementedError, match="dsa-paged-mqa-logits-backend cutedsl"):
        idx._get_topk_paged(types.SimpleNamespace(forward_mode=Mode("decode")), 0, None, None, None)
    with pytest.raises(NotImplementedError, match="speculative"):
        idx._get_topk_paged(types.SimpleNamespace(forward_mode=Mode("verify")), 0, None, None, None)


def test_prefill_as_the_cuda_graph_split_op_runs_it_over_the_bf16_gather():
    """One request of n tokens, padded to a captured size, in the calls and arguments of
    pcg_dsa_indexer_prefill_split (prefill CUDA graphs on): `_fused_q_prepare_and_store(...,
    num_tokens=n, enable_dual_stream=False)` stores the n real keys through niah's fused store,
    then SGLang's own `_get_topk_ragged(False, ..., topk_result)` (lifted) -> IndexKeyCache.
    get_k_and_scale (bf16) -> niah's bf16 prefill logits (heads padded to 32 as for DeepGEMM)
    -> SGLang's top-k, into the padded static buffer."""
    ns, backend, pool, idx = world("bf16")
    n, pad, table = 120, 8, torch.tensor([2, 5], dtype=torch.int32)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(n + pad, HIDDEN, generator=g).bfloat16()
    positions = torch.arange(n + pad)
    loc = torch.cat([table.long()[torch.arange(n) // 64] * 64 + torch.arange(n) % 64,
                     torch.zeros(pad, dtype=torch.long)])  # padded rows: slot 0, must not be written
    q8, w = decode_inputs(5, rows=n)
    idx.wq_b = L.Linear(torch.randn(HEADS * 128, 8, generator=g).bfloat16())
    ns["fused_q_indexer_rope_first_quant"] = lambda q, weights_raw, gate, cos_sin, pos: (q8[: q.shape[0]],
                                                                                         w[: q.shape[0]])
    fb = types.SimpleNamespace(forward_mode=Mode("extend"), out_cache_loc=loc, seq_lens_cpu=torch.tensor([n]),
                               extend_seq_lens_cpu=[n], extend_num_tokens=n)
    q_fp8, weights = idx._fused_q_prepare_and_store(x, torch.randn(n + pad, 8, generator=g).bfloat16(), positions,
                                                    fb, 0, None, num_tokens=n, enable_dual_stream=False)
    pages = bf16_cache.pages_view(pool.get_index_k_with_scale_buffer(0))
    key_raw = idx._fused_k_weights(x)[0][:n]
    rows = reference_rows(idx, key_raw, positions[:n])
    assert torch.equal(pages[loc[:n] // 64, loc[:n] % 64, 0], rows)
    assert torch.count_nonzero(pages[0]) == 0  # the padded rows' slot stayed untouched
    ks = torch.zeros(n, dtype=torch.int32)
    ke = torch.arange(1, n + 1, dtype=torch.int32)
    meta = metadata(ns, backend, "RAGGED", real_page_table=table[None], indexer_k_start_end=(ks, ke),
                    indexer_seq_lens_cpu=torch.tensor([n]), indexer_seq_lens=torch.tensor([n], dtype=torch.int32),
                    dsa_seqlens_expanded=ke, token_to_batch_idx=torch.zeros(n, dtype=torch.int32),
                    topk_indices_offset=torch.zeros(n, dtype=torch.int32), cache_seqlens_int32=ke)
    topk_result = torch.full((n + pad, TOPK), -1, dtype=torch.int32)  # the split op's static buffer
    before = attest.snapshot()["counts"].get("prefill_logits.bf16", 0)
    got = idx._get_topk_ragged(False, fb, 0, q_fp8, weights, meta, topk_result)
    assert got is topk_result and (topk_result[n:] == -1).all()
    assert attest.snapshot()["counts"]["prefill_logits.bf16"] == before + 1
    for i in (5, 40, n - 1):  # causal rows: token i sees keys 0..i
        score = (torch.relu(q8[i].double() @ rows[: i + 1].double().T) * w[i].double()).sum(0)
        want = set(score.topk(min(TOPK, i + 1)).indices.tolist())
        assert {int(v) for v in got[i] if v >= 0} == want, i


def test_unfused_neox_path_deepseek_v32_stores_sglangs_rotated_key_as_bf16():
    """DeepSeek-V3.2's config has no indexer_rope_interleave: SGLang builds a NeoX-RoPE indexer,
    fusion is off (`not is_neox_style`), and `_forward_cuda_k_only` -> `_get_k_bf16` (wk,
    LayerNorm, NeoX RoPE, Hadamard) -> `_store_index_k_cache`, which niah's bf16 arm replaces:
    the key SGLang computed, stored unquantised, rotation attested."""
    ns, backend, pool, idx = world("bf16")
    L.unfused(ns, idx)
    n, table = 100, torch.tensor([3, 0], dtype=torch.int32)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n, HIDDEN, generator=g).bfloat16()
    positions = torch.arange(n)
    loc = table.long()[torch.arange(n) // 64] * 64 + torch.arange(n) % 64
    before = attest.snapshot()["counts"].get("store.bf16", 0)
    idx._forward_cuda_k_only(x, positions, types.SimpleNamespace(forward_mode=Mode("extend"), out_cache_loc=loc),
                             0, None, None, return_indices=False)
    want = idx._get_k_bf16(x, positions)  # SGLang's own key, Hadamard-rotated
    pages = bf16_cache.pages_view(pool.get_index_k_with_scale_buffer(0))
    assert torch.equal(pages[loc // 64, loc % 64, 0], want.to(torch.bfloat16))
    unrotated = idx._get_k_bf16(x, positions, apply_hadamard=False)
    assert not torch.allclose(want.float(), unrotated.float(), atol=1e-2)  # the rotation is there
    snap = attest.snapshot()
    assert snap["counts"]["store.bf16"] == before + 1 and snap["facts"]["rotation"] == "hadamard"
