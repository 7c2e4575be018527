"""DeepSeek-V3.2 (DSA indexer) in SGLang's default (fused) paths: every symbol the plugin
replaces, wraps or relies on, and what it installs there per arm (one row per symbol and
release).

The rows are 0.5.23's; `_V0516` holds 0.5.16's where it differs (its rows replace the
0.5.23 ones named in `_NOT_IN_0516` for 0.5.16). What differs in 0.5.16: no logits
resolvers (`_get_topk_paged` / `_get_topk_ragged` call `deep_gemm.fp8_paged_mqa_logits` /
`fp8_mqa_logits` through the module's `deep_gemm`: niah arms route those two to niah's
kernels when an `Indexer` is built); no `IndexKeyCache` (`DSATokenToKVPool` holds the
per-layer buffers itself: `_index_buffer_shape`, `get_index_k_scale_buffer` via
`index_buf_accessor.GetKAndS`, `set_index_k_scale_buffer` via `SetKAndS`, row-wise
`move_kv_cache`); no `index_page_size` (`page_size`) and no `_index_k_write_targets`;
the fused key store and `deepgemm_paged_mqa_logits_split` live under `sglang.jit_kernel`;
the prefill split op is in `dsa_indexer`; the indexer's bytes per token are added inside
`DefaultPoolConfigurator._compute_cell_size`."""

from __future__ import annotations

from niah.serving.sglang.patches.point import PatchPoint, for_releases, put, wrap

_DSA = "sglang.srt.layers.attention.dsa"

_V0523: tuple[PatchPoint, ...] = (
    # -- DeepSeek-V3.2 (DSA): kernel resolvers (decode paged logits, prefill ragged logits).
    PatchPoint(f"{_DSA}.utils", "resolve_fp8_paged_mqa_logits_fn", (), "replace", "always",
               "picks DeepGEMM fp8_paged_mqa_logits or the torch fallback; niah returns its kernel "
               "(stock: counted, unchanged)",
               ("_use_torch_mqa_logits", "fp8_paged_mqa_logits"),
               replacements=(put("niah", "replacements.resolve_fp8_paged_mqa_logits_fn"),)),
    PatchPoint(f"{_DSA}.utils", "resolve_fp8_mqa_logits_fn", (), "replace", "always",
               "picks DeepGEMM fp8_mqa_logits (prefill); niah returns its kernel (stock: counted, unchanged)",
               ("_use_torch_mqa_logits", "fp8_mqa_logits"),
               replacements=(put("niah", "replacements.resolve_fp8_mqa_logits_fn"),)),
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer._get_topk_ragged",
               ("self", "enable_dual_stream", "forward_batch", "layer_id", "q_fp8", "weights",
                "metadata", "topk_result"),
               "uses", "always", "prefill reads keys via get_index_k_scale_buffer, then the resolver",
               ("get_index_k_scale_buffer", "resolve_fp8_mqa_logits_fn", "topk_transform")),
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer._get_topk_paged",
               ("self", "forward_batch", "layer_id", "q_fp8", "weights", "metadata"),
               "replace", "bf16",
               "decode: views the key cache as 132-byte fp8 rows; niah runs the same body (default backend) "
               "over bf16 pages and refuses its other branches",
               ("resolve_fp8_paged_mqa_logits_fn", "get_page_table_64", "get_seqlens_int32",
                "get_dsa_extend_len_cpu", "_mask_init_and_local_tokens", "topk_transform",
                "index_page_size", "paged_mqa_ctx_lens_2d", "deepgemm_paged_mqa_logits_split",
                "_get_index_k_read_buffer", "paged_mqa_logits_backend", "is_cutedsl", "is_aiter",
                "is_target_verify", "is_draft_extend_v2"),
               replacements=(wrap("bf16", "v32.topk_paged_bf16"),)),
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer._store_index_k_cache",
               ("self", "forward_batch", "layer_id", "key", "act_quant", "out_cache_loc"),
               "replace", "always", "stores keys SGLang computed (fusion off, CP prefill): fp8 quantise, counted; "
               "bf16: niah stores them unquantised",
               ("get_token_to_kv_pool", "set_index_k_scale_buffer", "_index_k_write_targets"),
               replacements=(wrap("bf16", "v32.store_index_k_cache_bf16"),
                            wrap("fp8", "v32.counting_fp8_store", "sglang.Indexer._store_index_k_cache"),)),
    # -- the fused (production) path: K written by fused_k_indexer_norm_rope_store, no rotation.
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer._fused_k_prepare_and_store",
               ("self", "key_raw", "positions", "forward_batch", "layer_id", "act_quant", "out_cache_loc"),
               "replace", "always",
               "LayerNorm + RoPE + fp8 store in one JIT kernel (counted); bf16: niah.kernels.store_v32_index_keys, "
               "same norm and RoPE, a bf16 row",
               ("get_token_to_kv_pool", "_index_k_write_targets", "fused_k_indexer_norm_rope_store", "k_norm",
                "variance_epsilon", "_indexer_cos_sin_cache", "index_page_size", "invalidate_index_buffer_for_layer",
                "_is_layer_owned"),
               replacements=(wrap("bf16", "v32.fused_k_store_bf16"),
                            wrap("fp8", "v32.counting_fp8_store", "sglang.fused_k_indexer_norm_rope_store"),)),
    PatchPoint("sglang.kernels.ops.attention.dsa.indexer_k", "fused_k_indexer_norm_rope_store",
               ("k_input", "cache", "out_cache_loc", "weight", "bias", "eps", "cos_sin_cache", "positions",
                "page_size"), "uses", "bf16",
               "SGLang's fused key store; niah's store_v32_index_keys keeps its argument order"),
    PatchPoint(f"{_DSA}.dsa_indexer", "_index_k_write_targets", ("pool", "layer_id", "loc"), "uses", "bf16",
               "(buffer, slots, rows) to write; plain pools: the layer's buffer", ("get_index_k_with_scale_buffer",)),
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer._fused_q_prepare_and_store",
               ("self", "x", "q_lora", "positions", "forward_batch", "layer_id", "act_quant", "num_tokens",
                "enable_dual_stream"), "uses", "always",
               "the fused path: K store (both streams) and SGLang's fp8 query, kept in every arm",
               ("_fused_k_prepare_and_store", "fused_q_indexer_rope_first_quant", "wk_weights_proj")),
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer._forward_cuda_k_only",
               ("self", "x", "positions", "forward_batch", "layer_id", "act_quant", "metadata", "return_indices",
                "num_tokens", "topk_result"), "uses", "always",
               "short sequences: K store only (fused or not), then SGLang's top-k",
               ("_fused_k_prepare_and_store", "_store_index_k_cache", "use_dsa_indexer_fusion")),
    PatchPoint(f"{_DSA}.dsa_prefill_cuda_graph", "pcg_dsa_indexer_prefill_split",
               ("layer_id", "x", "q_lora", "positions", "topk_result", "x_s", "x_bf16"), "uses", "always",
               "prefill CUDA graphs run the indexer as an eager split op through the same Indexer methods",
               ("_forward_cuda_k_only", "_fused_q_prepare_and_store", "_get_topk_ragged", "_store_index_k_cache")),
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer.forward_cuda", None, "uses", "always",
               "dispatches to the fused, k-only, split-op, paged and ragged paths niah covers",
               ("_fused_q_prepare_and_store", "_forward_cuda_k_only", "pcg_dsa_indexer_prefill_split",
                "bcg_dsa_indexer_prefill_split", "_get_topk_paged", "_get_topk_ragged")),
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer._maybe_rotate", ("self", "x"), "uses", "always",
               "no Hadamard rotation when fusion is on (the attested rotation fact)",
               ("use_dsa_indexer_fusion", "rotate_activation")),
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer._get_index_k_read_buffer", ("pool", "layer_id"), "uses", "bf16",
               "the decode read buffer niah's bf16 decode reads", ("get_index_k_with_scale_buffer",)),
    PatchPoint("sglang.kernels.ops.attention.dsa.paged_mqa_logits", "deepgemm_paged_mqa_logits_split",
               ("fp8_paged_mqa_logits_fn", "q_fp8", "kv_cache_fp8", "weights", "ctx_lens_2d", "block_tables",
                "schedule_metadata", "max_seq_len", "q_offset"), "uses", "bf16",
               "SGLang's decode logits call, run by niah's bf16 decode with niah's kernel", ("_restore_row_stride",)),
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer._mask_init_and_local_tokens",
               ("self", "logits", "lengths", "row_starts"), "uses", "bf16",
               "called by niah's bf16 decode path, as by the original"),
    PatchPoint(f"{_DSA}.dsa_indexer", "get_token_to_kv_pool", None, "uses", "bf16",
               "the pool accessor the indexer module imports"),
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer.__init__", None, "uses", "always",
               "fusion (use_dsa_indexer_fusion) on by default on CUDA; the paged-logits backend niah's decode checks",
               ("use_dsa_indexer_fusion", "SGLANG_DISABLE_DSA_INDEXER_FUSION", "wk_weights_proj",
                "paged_mqa_logits_backend")),
    # -- DeepSeek-V3.2 index-key pool: buffer shape, read/write, move, memory accounting.
    PatchPoint("sglang.srt.mem_cache.memory_pool", "DSATokenToKVPool.get_index_k_with_scale_buffer",
               ("self", "layer_id"), "uses", "bf16", "per-layer key buffer (uint8 [pages, bytes])",
               ("index_key_cache",)),
    PatchPoint("sglang.srt.mem_cache.memory_pool", "DSATokenToKVPool.get_index_k_scale_buffer",
               ("self", "layer_id", "seq_len_tensor", "page_indices", "seq_len_sum", "max_seq_len"),
               "uses", "bf16", "prefill gather goes through IndexKeyCache.get_k_and_scale",
               ("get_k_and_scale",)),
    PatchPoint("sglang.srt.mem_cache.memory_pool", "DSATokenToKVPool._create_index_key_cache",
               ("self",), "uses", "bf16", "the default pool builds the IndexKeyCache niah patches",
               ("IndexKeyCache",)),
    PatchPoint("sglang.srt.model_executor.pool_configurator", "DefaultPoolConfigurator._compute_cell_size",
               ("self", "kvc", "num_layers"), "uses", "bf16",
               "adds the indexer's per-token bytes to the KV cell size",
               ("_compute_dsa_indexer_cell_size", "is_deepseek_dsa")),
    PatchPoint("sglang.srt.mem_cache.index_key_cache", "IndexKeyCache._buffer_shape",
               ("self", "num_pages"), "replace", "always",
               "allocates (pages, 64 x 132) bytes (attested); bf16: niah allocates (pages, 64 x 256)",
               ("index_head_dim", "quant_block_size"),
               replacements=(put("bf16", "replacements.index_key_cache_buffer_shape"),
                            wrap("fp8", "replacements.wrap_buffer_shape"),)),
    PatchPoint("sglang.srt.mem_cache.index_key_cache", "IndexKeyCache.get_k_and_scale",
               ("self", "layer_id", "seq_len_tensor", "page_indices", "seq_len_sum", "max_seq_len"),
               "replace", "bf16", "gathers fp8 keys + scales for prefill; niah gathers bf16 keys",
               replacements=(put("bf16", "replacements.index_key_cache_get_k_and_scale"),)),
    PatchPoint("sglang.srt.mem_cache.index_key_cache", "IndexKeyCache.store_quantized",
               ("self", "layer_id", "loc", "index_k", "index_k_scale"), "replace", "bf16",
               "fp8 writes into a bf16 cache would corrupt it; niah refuses them",
               replacements=(put("bf16", "replacements.index_key_cache_store_quantized"),)),
    PatchPoint("sglang.srt.mem_cache.index_key_cache", "IndexKeyCache.move",
               ("self", "tgt_loc", "src_loc"), "replace", "bf16",
               "moves keys then scales; niah moves 256-byte bf16 keys",
               replacements=(put("bf16", "replacements.index_key_cache_move"),)),
    PatchPoint("sglang.srt.mem_cache.index_key_cache", "IndexKeyCache._kernel_view",
               ("self", "buffer"), "uses", "bf16", "the per-page view the kernels get"),
    PatchPoint("sglang.srt.model_executor.pool_configurator",
               "DefaultPoolConfigurator._compute_dsa_indexer_cell_size",
               ("self", "kvc", "num_layers", "allocate_all_layers"), "wrap", "bf16",
               "per-token accounting: (128 + 4) bytes x layers; niah makes it 256 x layers",
               ("quant_block_size", "index_k_with_scale_buffer_dtype"),
               replacements=(wrap("bf16", "replacements.wrap_indexer_cell_size"),)),
)

_MP = "sglang.srt.mem_cache.memory_pool.DSATokenToKVPool"
_NOT_IN_0516 = frozenset({
    "resolve_fp8_paged_mqa_logits_fn", "resolve_fp8_mqa_logits_fn", "_index_k_write_targets",
    "pcg_dsa_indexer_prefill_split", "DSATokenToKVPool._create_index_key_cache",
    "DefaultPoolConfigurator._compute_dsa_indexer_cell_size", "DefaultPoolConfigurator._compute_cell_size",
    "DSATokenToKVPool.get_index_k_with_scale_buffer", "DSATokenToKVPool.get_index_k_scale_buffer",
    "fused_k_indexer_norm_rope_store", "deepgemm_paged_mqa_logits_split", "Indexer.__init__",
    "Indexer._get_topk_ragged", "Indexer._get_topk_paged", "Indexer._store_index_k_cache",
    "Indexer._fused_k_prepare_and_store", "Indexer._forward_cuda_k_only", "Indexer.forward_cuda",
    "IndexKeyCache._buffer_shape", "IndexKeyCache.get_k_and_scale", "IndexKeyCache.store_quantized",
    "IndexKeyCache.move", "IndexKeyCache._kernel_view",
})
_BY_NAME = {p.qualname: p for p in _V0523}
_OLD = ("0.5.16",)


def _old(qualname: str, **changes) -> PatchPoint:
    """0.5.16's row for a symbol 0.5.23's table has, with what differs."""
    return for_releases(_OLD, _BY_NAME[qualname], **changes)


_V0516: tuple[PatchPoint, ...] = (
    _old("Indexer.__init__", action="wrap", when="niah",
         why="fusion on by default on CUDA; the module's deep_gemm, whose paged and ragged logits niah arms route "
             "to niah's kernels when an Indexer is built (0.5.16 has no resolvers)",
         references=(*_BY_NAME["Indexer.__init__"].references, "deep_gemm", "get_num_sms"),
         replacements=(wrap("niah", "v32.route_deep_gemm_at_init"),)),
    _old("Indexer._get_topk_ragged",
         why="prefill reads keys via get_index_k_scale_buffer, then deep_gemm.fp8_mqa_logits (routed to niah's "
             "kernel in niah arms)",
         references=("get_index_k_scale_buffer", "deep_gemm", "fp8_mqa_logits", "topk_transform")),
    _old("Indexer._get_topk_paged",
         references=("deep_gemm", "fp8_paged_mqa_logits", "get_page_table_64", "get_seqlens_int32",
                     "get_dsa_extend_len_cpu", "_mask_init_and_local_tokens", "topk_transform", "page_size",
                     "paged_mqa_ctx_lens_2d", "deepgemm_paged_mqa_logits_split", "_get_index_k_read_buffer",
                     "paged_mqa_logits_backend", "is_cutedsl", "is_aiter", "is_target_verify", "is_draft_extend_v2")),
    _old("Indexer._store_index_k_cache",
         references=("get_token_to_kv_pool", "set_index_k_scale_buffer", "get_index_k_with_scale_buffer",
                     "fused_store_index_k_cache")),
    _old("Indexer._fused_k_prepare_and_store",
         references=("get_token_to_kv_pool", "get_index_k_with_scale_buffer", "fused_k_indexer_norm_rope_store",
                     "k_norm", "variance_epsilon", "_indexer_cos_sin_cache", "page_size",
                     "invalidate_index_buffer_for_layer", "_is_layer_owned")),
    _old("fused_k_indexer_norm_rope_store", module="sglang.jit_kernel.dsv32.elementwise"),
    _old("Indexer._forward_cuda_k_only",
         params=("self", "x", "positions", "forward_batch", "layer_id", "act_quant", "enable_dual_stream", "metadata",
                 "return_indices", "num_tokens", "topk_result")),
    _old("pcg_dsa_indexer_prefill_split", module=f"{_DSA}.dsa_indexer",
         params=("layer_id", "x", "q_lora", "positions", "topk_result")),
    _old("Indexer.forward_cuda", references=(*_BY_NAME["Indexer.forward_cuda"].references, "forward_indexer"),
         why="dispatches to the fused, k-only, split-op, paged and ragged paths niah covers; forward_indexer is "
             "its non-CUDA branch"),
    _old("deepgemm_paged_mqa_logits_split", module="sglang.jit_kernel.dsa.paged_mqa_logits", references=()),
    # -- 0.5.16's pool holds the per-layer key buffers itself (no IndexKeyCache).
    _old("DSATokenToKVPool.get_index_k_with_scale_buffer", references=("index_k_with_scale_buffer",)),
    _old("DSATokenToKVPool.get_index_k_scale_buffer", action="replace",
         why="gathers fp8 keys + scales for prefill (index_buf_accessor.GetKAndS); niah gathers bf16 keys",
         references=("index_k_with_scale_buffer", "GetKAndS"),
         replacements=(put("bf16", "replacements.pool_get_index_k_scale_buffer"),)),
    for_releases(_OLD, PatchPoint(
        "sglang.srt.mem_cache.memory_pool", "DSATokenToKVPool._index_buffer_shape", ("self", "num_pages"),
        "replace", "always", "allocates (pages, 64 x 132) bytes (attested); bf16: niah allocates (pages, 64 x 256)",
        ("index_head_dim", "quant_block_size", "page_size"),
        replacements=(put("bf16", "replacements.pool_index_buffer_shape"),
                      wrap("fp8", "replacements.wrap_pool_index_buffer_shape")))),
    for_releases(_OLD, PatchPoint(
        "sglang.srt.mem_cache.memory_pool", "DSATokenToKVPool._create_index_buffers", ("self",), "uses", "bf16",
        "one uint8 buffer per layer of the shape _index_buffer_shape gives",
        ("_index_buffer_shape", "index_k_with_scale_buffer_dtype", "index_k_with_scale_buffer"))),
    for_releases(_OLD, PatchPoint(
        "sglang.srt.mem_cache.memory_pool", "DSATokenToKVPool.set_index_k_scale_buffer",
        ("self", "layer_id", "loc", "index_k", "index_k_scale"), "replace", "bf16",
        "fp8 writes (index_buf_accessor.SetKAndS) into a bf16 cache would corrupt it; niah refuses them",
        ("SetKAndS",), replacements=(put("bf16", "replacements.pool_set_index_k_scale_buffer"),))),
    for_releases(_OLD, PatchPoint(
        "sglang.srt.mem_cache.memory_pool", "DSATokenToKVPool.move_kv_cache", ("self", "tgt_loc", "src_loc"),
        "uses", "bf16", "moves whole buffer rows (index_k[tgt] = index_k[src]), whatever their width",
        ("index_k_with_scale_buffer", "move_kv_cache"))),
    for_releases(_OLD, PatchPoint(
        "sglang.srt.model_executor.pool_configurator", "DefaultPoolConfigurator._compute_cell_size",
        ("self", "kvc", "num_layers"), "wrap", "bf16",
        "adds (128 + 4) bytes x layers a token for the indexer (MLA + DSA); niah makes it 256 x layers",
        ("is_deepseek_dsa", "get_dsa_index_head_dim", "quant_block_size", "index_k_with_scale_buffer_dtype",
         "get_glm_dsa_layer_split_effective_num_layers", "use_mla_backend"),
        replacements=(wrap("bf16", "replacements.wrap_cell_size_with_indexer"),))),
)

V32_POINTS: tuple[PatchPoint, ...] = (
    *(for_releases(("0.5.23",), p) if p.qualname in _NOT_IN_0516 else p for p in _V0523), *_V0516)
