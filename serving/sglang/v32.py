"""DeepSeek-V3.2 (DSA indexer) inside SGLang 0.5.23's default CUDA paths: what the plugin
puts in `Indexer`'s place for bf16 index keys, and what it only counts for fp8.

SGLang picks the indexer path from the model config: `use_dsa_indexer_fusion` needs CUDA and
interleaved RoPE (`is_neox_style = not config.indexer_rope_interleave`, default False), so a
DeepSeek-V3.2 config without that field runs the UNFUSED path (its own `wk`, LayerNorm, NeoX
RoPE, Hadamard rotation of q and k, `act_quant` fp8 query, keys through
`_store_index_k_cache` -> `fused_store_index_k_cache`); interleaved-RoPE configs (e.g.
GLM-5) run the fused one. Both are covered. The fused path writes keys with
`Indexer._fused_k_prepare_and_store` -> `fused_k_indexer_norm_rope_store` (JIT CUDA:
LayerNorm + bias, RoPE, fp8 quantisation, store; no Hadamard rotation) from the merged bf16
`wk_weights_proj`. It is reached from `_fused_q_prepare_and_store` (eager decode and
extend, its dual-stream variant, and the prefill CUDA-graph split op
`pcg/bcg_dsa_indexer_prefill_split`) and from `_forward_cuda_k_only` (sequences no longer
than top-k, eager or in the split op). Keys SGLang computes itself (fusion off: neox-style
RoPE or SGLANG_DISABLE_DSA_INDEXER_FUSION; context-parallel prefill) go through
`_store_index_k_cache`, already rotated. Decode reads pages in `_get_topk_paged`; prefill
gathers keys (`IndexKeyCache.get_k_and_scale`) in `_get_topk_ragged`, SGLang's own.

With bf16 keys:
- `_fused_k_prepare_and_store` -> niah.kernels.store_v32_index_keys: the same norm and RoPE,
  no rotation, a bf16 row (256 B a token) instead of fp8 + scale;
- `_store_index_k_cache` -> the key SGLang computed (rotated on the unfused path), stored
  unquantised by niah.kernels.store_index_keys (torch on CPU);
- `_get_topk_paged` -> SGLang's own decode body for its default configuration (DeepGEMM
  backend, decode/idle rows: page table, context lengths, `deepgemm_paged_mqa_logits_split`,
  masking, `metadata.topk_transform`, padding) with niah's bf16 paged logits as the kernel;
  its other branches are refused (the cutedsl/aiter backends, target-verify/draft-extend).
SGLang's fp8 query (`act_quant` unfused, `fused_q_indexer_rope_first_quant` fused) is kept
in every arm: the bf16 kernels get it upcast to bf16, exactly. Each replacement is built from
the original and
reaches SGLang's helpers through the original's module globals (`original.__globals__`),
so it calls what the original calls.

SGLang 0.5.16 (its own rows in patches/deepseek_v32.py): the same Indexer methods, but pools
without `index_page_size` (their `page_size`), no `_index_k_write_targets` (the layer's
buffer is the one target) and no logits resolvers: `route_deep_gemm_at_init` routes the
indexer module's `deep_gemm.fp8_paged_mqa_logits` / `fp8_mqa_logits` to niah's kernels
when an Indexer is built (niah arms).
"""

from __future__ import annotations

import torch

from niah.serving.sglang import attest, bf16_cache
from niah.serving.sglang.kernels_api import kernel
from niah.serving.sglang.patching import apply_at
from niah.serving.sglang.replacements import mqa_logits, paged_mqa_logits, store_bf16_keys

STORE_KERNEL = "store_v32_index_keys"


def _owned_plain_pool(g, layer_id: int):
    """SGLang's pool via the indexer module's accessor, after the checks every store makes;
    None when this rank does not own the layer (layer-split pools)."""
    pool = g["get_token_to_kv_pool"]()
    if hasattr(pool, "invalidate_index_buffer_for_layer"):
        pool.invalidate_index_buffer_for_layer(layer_id)
    if hasattr(pool, "_is_layer_owned") and not pool._is_layer_owned(layer_id):
        return None
    cache = getattr(pool, "index_key_cache", None)
    if cache is not None and type(cache).__name__ != "IndexKeyCache":
        raise NotImplementedError(
            f"niah bf16 index keys: key cache {type(cache).__name__} (sharded/pooled) is not supported")
    return pool


def index_page_size(pool) -> int:
    """Tokens per index-key page: `index_page_size` (0.5.23), else the pool's `page_size` (0.5.16)."""
    return getattr(pool, "index_page_size", None) or pool.page_size


def write_targets(g, pool, layer_id: int, loc):
    """(buffer, slots, rows) to write: SGLang's `_index_k_write_targets` where it has one
    (0.5.23), else the layer's own buffer (0.5.16)."""
    targets = g.get("_index_k_write_targets")
    if targets is not None:
        return targets(pool, layer_id, loc)
    return [(pool.get_index_k_with_scale_buffer(layer_id=layer_id), loc, None)]


DEEP_GEMM_ROUTES = {"fp8_paged_mqa_logits": paged_mqa_logits, "fp8_mqa_logits": mqa_logits}


def route_deep_gemm_at_init(original):
    """Indexer.__init__ (0.5.16, niah arms): SGLang's, then the indexer module's
    deep_gemm.fp8_paged_mqa_logits / fp8_mqa_logits (read at call time by _get_topk_paged
    and _get_topk_ragged) become niah's kernels; refuses when that module has no DeepGEMM."""
    g = original.__globals__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        module = g.get("deep_gemm")
        if module is None or isinstance(module, BaseException):
            raise RuntimeError(f"niah: SGLang's DSA indexer has no DeepGEMM ({module!r}); its logits calls "
                               "cannot be routed to niah's kernels")
        for name, fn in DEEP_GEMM_ROUTES.items():
            if getattr(module, name, None) is not fn:
                apply_at(module.__name__, name, lambda _original, fn=fn: fn)
        attest.set_facts(deep_gemm="routed")

    __init__.__wrapped__ = original
    return __init__


def topk_fact(indexer) -> dict:
    """The fact `index_topk` of SGLang's Indexer (the k its top-k keeps), so a label's
    index_topk is proven; none when the object has no integer index_topk (then a label
    stating it stays unattested)."""
    k = getattr(indexer, "index_topk", None)
    return {"index_topk": k} if isinstance(k, int) and not isinstance(k, bool) else {}


def fused_k_store_bf16(original):
    """Indexer._fused_k_prepare_and_store with bf16 keys: niah's V3.2 store kernel (SGLang's
    fused_k_indexer_norm_rope_store argument order) writes bf16 rows."""
    g = original.__globals__

    def _fused_k_prepare_and_store(self, key_raw, positions, forward_batch, layer_id, act_quant,
                                   out_cache_loc=None):
        if out_cache_loc is None:
            out_cache_loc = forward_batch.out_cache_loc
        pool = _owned_plain_pool(g, layer_id)
        if pool is None:
            return
        store = kernel(STORE_KERNEL)
        norm = self.k_norm
        for buf, loc, rows in write_targets(g, pool, layer_id, out_cache_loc):
            store(key_raw if rows is None else key_raw.index_select(0, rows), buf, loc.contiguous(),
                  norm.weight, norm.bias, norm.variance_epsilon, self._indexer_cos_sin_cache,
                  positions if rows is None else positions.index_select(0, rows), index_page_size(pool),
                  index_dtype="bf16")
        attest.record("store", "bf16", f"niah.{STORE_KERNEL}")
        attest.set_facts(rotation="none", store=f"niah.{STORE_KERNEL}", **topk_fact(self))

    _fused_k_prepare_and_store.__wrapped__ = original
    return _fused_k_prepare_and_store


def store_index_k_cache_bf16(original):
    """Indexer._store_index_k_cache with bf16 keys: the key SGLang computed, unquantised."""
    g = original.__globals__

    def _store_index_k_cache(self, forward_batch, layer_id, key, *, act_quant=None, out_cache_loc=None):
        if out_cache_loc is None:
            out_cache_loc = forward_batch.out_cache_loc
        pool = _owned_plain_pool(g, layer_id)
        if pool is None:
            return
        # fusion on: SGLang's unfused key path skips the Hadamard rotation (_maybe_rotate)
        attest.set_facts(rotation="none" if self.use_dsa_indexer_fusion else "hadamard", **topk_fact(self))
        store_bf16_keys(pool.get_index_k_with_scale_buffer(layer_id=layer_id), out_cache_loc, key,
                        index_page_size(pool))

    _store_index_k_cache.__wrapped__ = original
    return _store_index_k_cache


def counting_fp8_store(kernel_name: str):
    """fp8 arms: SGLang's own store, each call counted (with the rotation it implies)."""

    def factory(original):
        def counted(*args, **kwargs):  # (self, ...): SGLang's arguments, handed on unchanged
            attest.record("store", "fp8", kernel_name)
            attest.set_facts(rotation="none" if args[0].use_dsa_indexer_fusion else "hadamard", **topk_fact(args[0]))
            return original(*args, **kwargs)

        counted.__wrapped__ = original
        return counted

    return factory


def _ctx_lens_2d(metadata, seqlens_32: torch.Tensor) -> torch.Tensor:
    """Per-row context lengths [rows, 1], as SGLang's _get_topk_paged builds them for decode."""
    ctx_2d = getattr(metadata, "paged_mqa_ctx_lens_2d", None)
    if ctx_2d is not None:
        return ctx_2d if ctx_2d.size(1) == 1 else ctx_2d.reshape(-1).contiguous().view(-1, 1)
    if seqlens_32.dim() == 2:
        return seqlens_32.contiguous() if seqlens_32.size(1) == 1 else seqlens_32.reshape(-1).contiguous().view(-1, 1)
    return seqlens_32.contiguous().view(-1, 1)


def topk_paged_bf16(original):
    """Indexer._get_topk_paged with bf16 keys: SGLang's decode body, niah's bf16 paged logits."""
    g = original.__globals__

    def _get_topk_paged(self, forward_batch, layer_id, q_fp8, weights, metadata):
        mode = forward_batch.forward_mode
        if mode.is_target_verify() or mode.is_draft_extend_v2():
            raise NotImplementedError("niah bf16 index keys: speculative decoding is not supported")
        backend = self.paged_mqa_logits_backend
        if not backend.is_deepgemm():
            raise NotImplementedError(f"niah bf16 index keys: --dsa-paged-mqa-logits-backend {backend.value} "
                                      "reads the fp8 page layout; use the default (deepgemm)")
        pool = g["get_token_to_kv_pool"]()
        page_size = index_page_size(pool)
        if page_size != 64:
            raise NotImplementedError(f"niah bf16 index keys need 64-token pages, got {page_size}")
        block_tables = metadata.get_page_table_64()  # [B, pages]
        max_seq_len = block_tables.shape[1] * page_size
        kv = bf16_cache.pages_view(self._get_index_k_read_buffer(pool, layer_id), page_size,
                                   q_fp8.shape[-1])  # bf16 [P, 64, 1, 128]
        seqlens_32 = metadata.get_seqlens_int32()
        schedule = getattr(metadata, "paged_mqa_schedule_metadata", None)  # DeepGEMM's; niah's kernel needs none
        q_offset = sum(metadata.get_dsa_extend_len_cpu())  # real (unpadded) rows
        logits = g["deepgemm_paged_mqa_logits_split"](
            paged_mqa_logits, q_fp8, kv, weights.squeeze(2), _ctx_lens_2d(metadata, seqlens_32), block_tables,
            schedule, max_seq_len, q_offset=q_offset)  # [q_offset, max_seq_len] fp32
        self._mask_init_and_local_tokens(logits, seqlens_32)
        topk = metadata.topk_transform(logits, self.index_topk)
        if q_offset < q_fp8.shape[0]:
            pad = torch.full((q_fp8.shape[0] - q_offset, topk.shape[1]), -1, dtype=topk.dtype, device=topk.device)
            topk = torch.cat([topk, pad], dim=0)
        return topk

    _get_topk_paged.__wrapped__ = original
    return _get_topk_paged
