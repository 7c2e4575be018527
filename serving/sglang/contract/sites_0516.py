"""SGLang 0.5.16's call sites and key flows where they differ from 0.5.23's (call_sites.py,
flow_sites.py): the contract's caller checks on 0.5.16 use 0.5.23's tables with these
rows in place of every 0.5.23 row for the same (file, function, callee) (tables.py).

What differs: the fused key store and the paged-logits helpers live under
`sglang.jit_kernel`; `_get_topk_paged` / `_get_topk_ragged` call `deep_gemm`'s logits
directly (no resolvers: niah arms route those two names to niah's kernels when an Indexer
is built); the prefill split op is in `dsa_indexer`; the CP prefill and the non-CUDA
`forward_indexer` read keys through `get_index_k_continuous`; DeepSeek-V4's sites are
0.5.16's own, refused in niah's arms on this release (v4.refuse_release).
"""

from __future__ import annotations

from niah.serving.sglang.contract.call_sites import (
    _FP8_STORE, CP, CUTEDSL, FUSED_JIT, FUSED_Q, GEMM, IN_FUSED_STORE, IN_STORE_ROCM, METADATA, NPU, PATCHED_STORE,
    PREFILL_GRAPH, ROCM)

ROUTED = ("patched in niah arms: deep_gemm.fp8_paged_mqa_logits / fp8_mqa_logits, which niah routes to its kernels "
          "when an Indexer is built (v32.route_deep_gemm_at_init; bf16 decode: Indexer._get_topk_paged replaced)")
NON_CUDA = ("unreachable: Indexer.forward_indexer, forward_cuda's branch for neither CUDA nor ROCm (TileLang "
            "fp8_index); niah's arms run on CUDA")
V4_REFUSED = ("refused: DeepSeek-V4 on SGLang 0.5.16 (niah arms refuse it where its pool is built, "
              "v4.refuse_release); fp8/stock: SGLang's own")

# file -> [(enclosing function, callee, count, disposition)]
SITES_0516: dict[str, list[tuple[str, str, int, str]]] = {
    'sglang/jit_kernel/dsa/paged_mqa_logits.py': [
        ('deepgemm_paged_mqa_logits_native', 'fp8_paged_mqa_logits_fn', 1, ROUTED),
        ('deepgemm_paged_mqa_logits_split', 'fp8_paged_mqa_logits_fn', 1, ROUTED),
        ('aiter_paged_mqa_logits', 'deepgemm_fp8_paged_mqa_logits', 1, ROCM),
        ('cutedsl_paged_mqa_logits', 'get_paged_mqa_logits_metadata_fn', 2, CUTEDSL),
    ],
    'sglang/jit_kernel/dsv32/elementwise.py': [
        ('fused_k_indexer_norm_rope', '_jit_k_indexer_norm_rope_module', 1, FUSED_JIT),
        ('fused_k_indexer_norm_rope_store', '_jit_k_indexer_norm_rope_store_module', 1, FUSED_JIT),
    ],
    'sglang/jit_kernel/fused_store_index_cache.py': [
        ('fused_store_index_k_cache', 'fused_store_index_k_cache', 1, _FP8_STORE),
    ],
    'sglang/kernels/ops/attention/dsa/index_buf_accessor.py': [
        ('GetKAndS.aiter', 'cp_gather_indexer_k_quant_cache', 1, ROCM),
    ],
    'sglang/kernels/ops/attention/dsa/tilelang_kernel.py': [
        ('fp8_index', 'fp8_index_kernel', 2, NON_CUDA),
    ],
    'sglang/kernels/ops/attention/dsv4/tilelang_kernel.py': [
        ('tilelang_fp8_paged_mqa_logits', 'fp8_paged_mqa_logits_kernel', 1, V4_REFUSED),
    ],
    'sglang/kernels/ops/quantization/fp8_kernel.py': [
        ('_per_token_group_quant_8bit_fuse_silu_and_mul', 'deep_gemm.transform_sf_into_required_layout', 1, GEMM),
    ],
    'sglang/srt/layers/attention/dsa/dsa_indexer.py': [
        ('Indexer.__init__', 'deep_gemm.get_num_sms', 1, METADATA),
        ('Indexer._fused_k_prepare_and_store', 'get_index_k_with_scale_buffer', 1, IN_FUSED_STORE),
        ('Indexer._get_topk_paged', 'deep_gemm.get_paged_mqa_logits_metadata', 2, METADATA),
        ('Indexer._get_topk_paged', 'deep_gemm.fp8_paged_mqa_logits', 2, ROUTED),
        ('Indexer._get_mqa_logits_budget_bytes', '_mqa_logits_free_mem_fraction', 1, METADATA),
        ('Indexer._should_chunk_mqa_logits', '_get_mqa_logits_budget_bytes', 1, METADATA),
        ('Indexer._get_topk_ragged', '_should_chunk_mqa_logits', 1, METADATA),
        ('Indexer._get_topk_ragged', 'deep_gemm.fp8_mqa_logits', 2, ROUTED),
        ('Indexer._forward_cuda_k_only', '_store_index_k_cache', 1, PATCHED_STORE),
        ('Indexer._get_topk_ragged_with_cp', 'get_index_k_continuous', 2, CP),
        ('Indexer._get_topk_ragged_with_cp', 'get_index_k_scale_continuous', 2, CP),
        ('Indexer._get_topk_ragged_with_cp', 'deep_gemm.fp8_mqa_logits', 2, CP),
        ('Indexer.forward_indexer', 'get_index_k_continuous', 1, NON_CUDA),
        ('Indexer.forward_indexer', 'get_index_k_scale_continuous', 1, NON_CUDA),
        ('Indexer._store_index_k_cache', 'get_index_k_with_scale_buffer', 2, IN_STORE_ROCM),
        ('Indexer.forward_npu', 'set_index_k_buffer', 1, NPU),
        ('Indexer.forward_npu', 'get_index_k_buffer', 1, NPU),
        ('pcg_dsa_indexer_prefill_split', '_fused_q_prepare_and_store', 1, FUSED_Q),
        ('pcg_dsa_indexer_prefill_split', '_store_index_k_cache', 1, PREFILL_GRAPH),
    ],
    'sglang/srt/layers/attention/dsa_backend.py': [
        ('DeepseekSparseAttnBackend._refresh_paged_mqa_schedule_metadata',
         'deep_gemm.get_paged_mqa_logits_metadata', 1, METADATA),
        ('DeepseekSparseAttnBackend._refresh_paged_mqa_schedule_metadata', 'deep_gemm.get_num_sms', 1, METADATA),
        ('DeepseekSparseAttnBackend.init_forward_metadata', 'deep_gemm.get_paged_mqa_logits_metadata', 1, METADATA),
        ('DeepseekSparseAttnBackend.init_forward_metadata', 'deep_gemm.get_num_sms', 1, METADATA),
        ('DeepseekSparseAttnBackend._build_forward_metadata_cuda_graph',
         'deep_gemm.get_paged_mqa_logits_metadata', 1, METADATA),
        ('DeepseekSparseAttnBackend._build_forward_metadata_cuda_graph', 'deep_gemm.get_num_sms', 1, METADATA),
    ],
    'sglang/srt/layers/attention/dsv4/compressor.py': [
        ('CompressorBackendMixin.forward_indexer_compressor', 'set_index_k_fp4', 1, V4_REFUSED),
        ('CompressorBackendMixin.forward_indexer_compressor', 'set_index_k_fused', 1, V4_REFUSED),
        ('CompressorBackendMixin.forward_indexer_compressor', 'set_index_k_scale_buffer', 1, V4_REFUSED),
    ],
    'sglang/srt/layers/attention/dsv4/compressor_v2.py': [
        ('CompressorBackendMixin._forward_unified_hip', 'set_index_k_scale_buffer', 1, V4_REFUSED),
    ],
    'sglang/srt/layers/attention/dsv4/indexer.py': [
        ('C4IndexerBackendMixin._forward_nonpaged_indexer', 'get_index_k_scale_buffer', 1, V4_REFUSED),
        ('C4IndexerBackendMixin._forward_nonpaged_indexer', 'deep_gemm.fp8_mqa_logits', 1, V4_REFUSED),
        ('C4IndexerBackendMixin.forward_c4_indexer', 'deep_gemm.fp8_paged_mqa_logits', 1, V4_REFUSED),
    ],
    'sglang/srt/layers/attention/dsv4/metadata.py': [
        ('PagedIndexerMetadata.__post_init__', 'deep_gemm.get_paged_mqa_logits_metadata', 1, V4_REFUSED),
        ('PagedIndexerMetadata.__post_init__', 'deep_gemm.get_num_sms', 1, V4_REFUSED),
    ],
    'sglang/srt/layers/moe/mega_moe.py': [
        ('_run_mega_routed', 'deep_gemm.mega_moe_pre_dispatch', 1, GEMM),
        ('_run_mega_routed', 'deep_gemm.fp8_fp4_mega_moe', 1, GEMM),
        ('build_mega_moe_experts_weights', 'deep_gemm.transform_weights_for_mega_moe', 1, GEMM),
    ],
    'sglang/srt/layers/quantization/fp8.py': [
        ('Fp8LinearMethod._process_mxfp8_linear_weight_scale',
         'deep_gemm.utils.layout.get_mn_major_tma_aligned_packed_ue8m0_tensor', 1, GEMM),
    ],
    'sglang/srt/models/deepseek_v4.py': [
        ('MQALayer.forward', 'deep_gemm.fp8_einsum', 1, GEMM),
    ],
}

# file -> [(function, callee, branch conditions, count)]
FLOWS_0516: dict[str, list[tuple[str, str, str, int]]] = {
    'sglang/srt/hardware_backend/npu/dsv4/dsv4_memory_pool.py': [
        ('DSV4NPUTokenToKVPool.get_compress_buffer', 'self.c4_indexer_kv_pool.get_index_k',
         'item.compress_ratio == 4 and from_indexer', 1),
    ],
    'sglang/srt/layers/attention/dsa/dsa_indexer.py': [
        ('Indexer._fused_k_prepare_and_store', 'fused_k_indexer_norm_rope_store',
         '(not _is_fp8_fnuz and out_cache_loc is not None and can_use_dsa_fused_store(torch.bfloat16, '
         'out_cache_loc.dtype, page_size))', 1),
        ('Indexer._fused_k_prepare_and_store', 'pool.get_index_k_with_scale_buffer',
         '(not _is_fp8_fnuz and out_cache_loc is not None and can_use_dsa_fused_store(torch.bfloat16, '
         'out_cache_loc.dtype, page_size))', 1),
        ('Indexer._get_topk_paged', 'cutedsl_paged_mqa_logits',
         'not (self.paged_mqa_logits_backend.is_aiter()) and use_cute_dsl', 1),
        ('Indexer._get_topk_paged', 'deepgemm_paged_mqa_logits_native',
         'not (self.paged_mqa_logits_backend.is_aiter()) and not (use_cute_dsl) and use_dg_native', 1),
        ('Indexer._get_topk_paged', 'deepgemm_paged_mqa_logits_split',
         'not (self.paged_mqa_logits_backend.is_aiter()) and not (use_cute_dsl) and not (use_dg_native)', 1),
        ('Indexer._get_topk_ragged', 'deep_gemm.fp8_mqa_logits',
         'not need_chunk and not (_is_hip)', 1),
        ('Indexer._get_topk_ragged', 'deep_gemm.fp8_mqa_logits',
         'not (_is_hip)', 1),
        ('Indexer._store_index_k_cache', 'pool.get_index_k_with_scale_buffer',
         '(_is_cuda and (not _is_fp8_fnuz) and can_use_dsa_fused_store(key.dtype, out_cache_loc.dtype, '
         'pool.page_size))', 1),
        ('Indexer._store_index_k_cache', 'pool.get_index_k_with_scale_buffer',
         '_use_aiter', 1),
        ('Indexer._store_index_k_cache', 'fused_store_index_k_cache',
         '(_is_cuda and (not _is_fp8_fnuz) and can_use_dsa_fused_store(key.dtype, out_cache_loc.dtype, '
         'pool.page_size))', 1),
        ('Indexer.forward_npu', 'get_token_to_kv_pool().get_index_k_buffer',
         '', 1),
        ('Indexer.forward_npu', 'self.do_npu_cp_balance_indexer',
         '(is_prefill and self.dsa_enable_prefill_cp and (forward_batch.attn_cp_metadata is not None))', 1),
        ('Indexer.forward_npu', 'torch_npu.npu_lightning_indexer',
         'not ((is_prefill and self.dsa_enable_prefill_cp and (forward_batch.attn_cp_metadata is not None)))', 1),
    ],
    'sglang/srt/layers/attention/dsv4/compressor_v2.py': [
        ('CompressorBackendMixin.forward_unified', 'token_to_kv_pool.get_index_k_with_scale_buffer',
         'not ((_is_hip and (not envs.SGLANG_OPT_USE_JIT_NORM.get()))) and compressor.is_in_indexer', 1),
        ('CompressorBackendMixin.forward_unified', 'self._forward_compress_all_in_one',
         'not ((_is_hip and (not envs.SGLANG_OPT_USE_JIT_NORM.get())))', 1),
    ],
    'sglang/srt/layers/attention/dsv4/indexer.py': [
        ('C4IndexerBackendMixin._forward_nonpaged_indexer', 'token_to_kv_pool.get_index_k_scale_buffer',
         '', 1),
        ('C4IndexerBackendMixin._forward_nonpaged_indexer', 'deep_gemm.fp8_mqa_logits',
         '', 1),
        ('C4IndexerBackendMixin.forward_c4_indexer', 'token_to_kv_pool.get_index_k_with_scale_buffer',
         'not (nonpaged_plan is not None)', 1),
        ('C4IndexerBackendMixin.forward_c4_indexer', 'fn',
         'not (nonpaged_plan is not None)', 1),
    ],
    'sglang/srt/layers/attention/minimax_sparse_backend.py': [
        ('MiniMaxSparseAttnBackend.forward_extend', 'minimax_sparse_prefill',
         '', 1),
        ('MiniMaxSparseAttnBackend.forward_decode', 'minimax_sparse_decode',
         '', 1),
    ],
    'sglang/srt/mem_cache/deepseek_v4_memory_pool.py': [
        ('DeepSeekV4TokenToKVPool.get_index_k_with_scale_buffer',
         'self.c4_indexer_kv_pool.get_index_k_with_scale_buffer',
         '', 1),
        ('DeepSeekV4TokenToKVPool.get_index_k_scale_buffer', 'self.c4_indexer_kv_pool.get_index_k_scale_buffer',
         '', 1),
    ],
    'sglang/srt/mem_cache/memory_pool.py': [
        ('MiniMaxSparseKVPool.set_fused_kv_index_buffer', 'self.get_index_k_buffer',
         '(index_pool is not None and self._can_fuse_kv_index_store(index_pool, cache_k, cache_idx_k)) and '
         'disable_value', 1),
        ('MiniMaxSparseKVPool.set_fused_kv_index_buffer', 'self.get_index_kv_buffer',
         '(index_pool is not None and self._can_fuse_kv_index_store(index_pool, cache_k, cache_idx_k)) and '
         'not (disable_value)', 1),
        ('MiniMaxSparseKVPool.set_fused_kv_index_buffer', 'store_kv_index',
         '(index_pool is not None and self._can_fuse_kv_index_store(index_pool, cache_k, cache_idx_k))', 1),
    ],
}
