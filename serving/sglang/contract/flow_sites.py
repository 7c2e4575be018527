"""Every flow of the index keys in SGLang 0.5.23 (flows.py finds them): the data of the
contract's flow check.

`FLOWS` maps each file to its flows, (function, callee, branch conditions, count): the
calls that read keys through a pool accessor and the calls that receive them (or a view
of them), with the `if` / `elif` conditions on the way ("" when none). What niah does
about each is the disposition of the same function's call sites (call_sites.py: patched,
refused, unreachable with the reason, or unrelated); this table pins which platform,
switch and backend branch each call sits under, so that moving a call to another branch
(say, CUDA sent down the XPU kernel) or a new callee of the keys is a break.
"""

from __future__ import annotations

FLOWS: dict[str, list[tuple[str, str, str, int]]] = {
    'sglang/kernels/ops/attention/dsv4/fp4_indexer_hip.py': [
        ('rowgroup_paged_mqa_logits', 'index_k_page8_views', 'page8', 1),
        ('rowgroup_paged_mqa_logits', 'flydsl_pa_mqa_logits_fp4', '', 1),
    ],
    'sglang/srt/hardware_backend/npu/dsv4/dsv4_memory_pool.py': [
        ('DSV4NPUTokenToKVPool.get_compress_buffer', 'indexer_pool.get_index_k', 'from_indexer', 1),
    ],
    'sglang/srt/layers/attention/deepseek_v4_backend.py': [
        ('DeepseekV4AttnBackend._low_ratio_compress_fused', 'index_k_norm_rope_pack_store',
         '(indexer is not None and indexer.owns_k)', 1),
        ('DeepseekV4AttnBackend._low_ratio_compress_fused', 'pool.get_index_k_with_scale_buffer',
         '(indexer is not None and indexer.owns_k)', 1),
        ('DeepseekV4AttnBackend._low_ratio_write_group', 'index_k_rope_pack',
         '(layer.indexer is not None and layer.indexer.owns_k) and (fuse_index_store and latent.is_cuda and '
         '(torch.version.cuda is not None) and (latent.dtype == torch.bfloat16) and (layer.indexer.index_head_dim '
         '== 128))', 1),
        ('DeepseekV4AttnBackend._low_ratio_write_group', 'pool.get_index_k_with_scale_buffer',
         '(layer.indexer is not None and layer.indexer.owns_k) and (fuse_index_store and latent.is_cuda and '
         '(torch.version.cuda is not None) and (latent.dtype == torch.bfloat16) and (layer.indexer.index_head_dim '
         '== 128))', 1),
    ],
    'sglang/srt/layers/attention/dsa/dsa_indexer.py': [
        ('_index_k_write_targets', 'pool.get_index_k_with_scale_buffer', 'shard_pool is None', 1),
        ('Indexer._aiter_fused_fp8_prepare_and_store', 'pool.get_index_k_with_scale_buffer', '', 1),
        ('Indexer._aiter_fused_fp8_prepare_and_store', 'aiter_fused_fp8_qk_write', '', 1),
        ('Indexer._gfx950_fused_decode', 'pool.get_index_k_with_scale_buffer', '', 1),
        ('Indexer._gfx950_fused_decode', 'self._get_index_k_read_buffer', '', 1),
        ('Indexer._gfx950_fused_decode', 'state.run', '', 1),
        ('Indexer._get_q_k_bf16', 'self.k_norm', 'enable_dual_stream', 1),
        ('Indexer._get_q_k_bf16', 'torch.split', 'enable_dual_stream', 1),
        ('Indexer._get_q_k_bf16', 'self.k_norm', 'not (enable_dual_stream)', 1),
        ('Indexer._get_q_k_bf16', 'torch.split', 'not (enable_dual_stream)', 1),
        ('Indexer._get_q_k_bf16', 'self._update_rope_guarded', '', 1),
        ('Indexer._get_q_k_bf16', 'self._maybe_rotate', 'enable_dual_stream', 1),
        ('Indexer._get_q_k_bf16', 'self._maybe_rotate',
         'not (enable_dual_stream) and (self.alt_stream is not None and is_cp_active(forward_batch))', 1),
        ('Indexer._get_q_k_bf16', 'get_cp_strategy().materialize_full_indexer_k_cache',
         'not (enable_dual_stream) and (self.alt_stream is not None and is_cp_active(forward_batch))', 1),
        ('Indexer._get_q_k_bf16', 'self._maybe_rotate',
         'not (enable_dual_stream) and not ((self.alt_stream is not None and is_cp_active(forward_batch)))', 1),
        ('Indexer._get_q_k_bf16', 'get_cp_strategy().materialize_full_indexer_k_cache',
         'is_cp_active(forward_batch)', 1),
        ('Indexer._get_index_k_read_buffer', 'pool.get_index_k_with_scale_buffer', '', 1),
        ('Indexer._get_topk_paged', 'self._get_index_k_read_buffer', '', 1),
        ('Indexer._get_topk_paged', 'aiter_paged_mqa_logits', 'self.paged_mqa_logits_backend.is_aiter()', 1),
        ('Indexer._get_topk_paged', 'sgl_fp8_paged_mqa_logits',
         'not (self.paged_mqa_logits_backend.is_aiter()) and _is_xpu', 1),
        ('Indexer._get_topk_paged', 'cutedsl_paged_mqa_logits',
         'not (self.paged_mqa_logits_backend.is_aiter()) and not (_is_xpu) and use_cute_dsl', 1),
        ('Indexer._get_topk_paged', 'deepgemm_paged_mqa_logits_native',
         'not (self.paged_mqa_logits_backend.is_aiter()) and not (_is_xpu) and not (use_cute_dsl) and '
         'use_dg_native', 1),
        ('Indexer._get_topk_paged', 'deepgemm_paged_mqa_logits_split',
         'not (self.paged_mqa_logits_backend.is_aiter()) and not (_is_xpu) and not (use_cute_dsl) and not '
         '(use_dg_native)', 1),
        ('Indexer._get_topk_ragged', 'get_token_to_kv_pool().get_index_k_scale_buffer', '', 1),
        ('Indexer._get_topk_ragged', 'fp8_mqa_logits', 'not need_chunk and _is_hip', 1),
        ('Indexer._get_topk_ragged', 'sgl_fp8_mqa_logits', 'not need_chunk and not (_is_hip) and _is_xpu', 1),
        ('Indexer._get_topk_ragged', 'resolve_fp8_mqa_logits_fn()',
         'not need_chunk and not (_is_hip) and not (_is_xpu)', 1),
        ('Indexer._get_topk_ragged', 'fp8_mqa_logits', '_is_hip', 1),
        ('Indexer._get_topk_ragged', 'sgl_fp8_mqa_logits', 'not (_is_hip) and _is_xpu', 1),
        ('Indexer._get_topk_ragged', 'resolve_fp8_mqa_logits_fn()', 'not (_is_hip) and not (_is_xpu)', 1),
        ('Indexer._store_index_k_cache', 'fused_store_index_k_cache',
         '(_is_cuda and (not _is_fp8_fnuz) and can_use_dsa_fused_store(key.dtype, out_cache_loc.dtype, '
         'pool.index_page_size))', 1),
        ('Indexer._store_index_k_cache', 'pool.get_index_k_with_scale_buffer', '_use_aiter', 1),
        ('Indexer._store_index_k_cache', 'indexer_k_quant_and_cache', '_use_aiter', 1),
    ],
    'sglang/srt/layers/attention/dsa/dsa_indexer_kpool.py': [
        ('IndexerKPool._get_index_k_read_buffer', 'pool.get_index_k_with_scale_buffer', '', 1),
        ('IndexerKPool._write_compressed_pooled_index_cache', 'pool.get_index_k_with_scale_buffer', '', 1),
        ('IndexerKPool._write_compressed_pooled_index_cache', 'kpool_softmax_rotate_write_cache', '', 1),
        ('IndexerKPool._compress_write_extend', 'pool.get_index_k_with_scale_buffer',
         "plan is not None and os.environ.get('SGLANG_DSA_KPOOL_DEBUG_BOUNDS') == '1' and not writes.is_empty and "
         'bool(active.any().item())', 1),
        ('IndexerKPool._compress_write_extend', 'pool.get_index_k_with_scale_buffer',
         "plan is not None and os.environ.get('SGLANG_DSA_KPOOL_DEBUG_BOUNDS') == '1' and not writes.is_empty and "
         'bool(active.any().item()) and (min_chunk < 0 or max_chunk >= key.shape[0] or max_chunk >= '
         'gate_score.shape[0] or (min_req < 0) or (max_req >= tail_k_buf.shape[0]) or (min_loc < 0) or (max_page >='
         ' pool.get_index_k_with_scale_buffer(layer_id=layer_id).shape[0]))', 1),
        ('IndexerKPool._compress_write_extend', 'pool.get_index_k_with_scale_buffer',
         'plan is not None and not writes.is_empty', 1),
        ('IndexerKPool._compress_write_extend', 'kpool_assemble_softmax_rotate_write_cache',
         'plan is not None and not writes.is_empty', 1),
        ('IndexerKPool._get_topk_paged', 'self._get_index_k_read_buffer', '', 1),
        ('IndexerKPool._get_topk_paged', 'aiter_paged_mqa_logits', 'use_aiter_paged_mqa', 1),
        ('IndexerKPool._get_topk_paged', 'tilelang_fp8_paged_mqa_logits',
         'not (use_aiter_paged_mqa) and use_tilelang_paged_mqa', 1),
        ('IndexerKPool._get_topk_paged', 'deep_gemm.fp8_paged_mqa_logits',
         'not (use_aiter_paged_mqa) and not (use_tilelang_paged_mqa)', 1),
        ('IndexerKPool._get_topk_ragged_kpool_plan', 'gather_index_k_scale_prefix_into', 'total_k_rows > 0', 1),
        ('IndexerKPool._get_topk_ragged_kpool_plan', 'self._get_index_k_read_buffer', 'total_k_rows > 0', 1),
        ('IndexerKPool._get_topk_ragged_kpool', 'gather_index_k_scale_prefix_into',
         'pool_seq_len > 0 and not ((cached_current is not None and curr_pool_start == 0 and (curr_pool_len == '
         'pool_seq_len))) and (cached_current is not None and curr_pool_start >= 0 and (curr_pool_start + '
         'curr_pool_len == pool_seq_len)) and curr_pool_start > 0', 1),
        ('IndexerKPool._get_topk_ragged_kpool', 'self._get_index_k_read_buffer',
         'pool_seq_len > 0 and not ((cached_current is not None and curr_pool_start == 0 and (curr_pool_len == '
         'pool_seq_len))) and (cached_current is not None and curr_pool_start >= 0 and (curr_pool_start + '
         'curr_pool_len == pool_seq_len)) and curr_pool_start > 0', 1),
        ('IndexerKPool._get_topk_ragged_kpool', 'get_token_to_kv_pool().get_index_k_scale_buffer',
         'pool_seq_len > 0 and not ((cached_current is not None and curr_pool_start == 0 and (curr_pool_len == '
         'pool_seq_len))) and not ((cached_current is not None and curr_pool_start >= 0 and (curr_pool_start + '
         'curr_pool_len == pool_seq_len)))', 1),
        ('IndexerKPool._get_topk_ragged_kpool', 'self._kpool_topk_by_row_chunks', '', 1),
        ('IndexerKPool._forward_cuda_target_verify', 'pool.get_index_k_with_scale_buffer', '', 1),
        ('IndexerKPool._forward_cuda_target_verify._compress_write', 'kpool_write_tail_and_maybe_compress', '', 1),
    ],
    'sglang/srt/layers/attention/dsa/dsa_npu_indexer.py': [
        ('DSANPUIndexerMixin.forward_npu', 'get_token_to_kv_pool().get_index_k_buffer', '', 1),
        ('DSANPUIndexerMixin.forward_npu', 'self.do_npu_cp_balance_indexer',
         '(is_prefill and self.dsa_enable_prefill_cp and (forward_batch.attn_cp_metadata is not None))', 1),
        ('DSANPUIndexerMixin.forward_npu', 'torch_npu.npu_quant_lightning_indexer',
         'not ((is_prefill and self.dsa_enable_prefill_cp and (forward_batch.attn_cp_metadata is not None))) and '
         'use_quant_indexer', 1),
        ('DSANPUIndexerMixin.forward_npu', 'pool.get_index_k_scale_buffer',
         'not ((is_prefill and self.dsa_enable_prefill_cp and (forward_batch.attn_cp_metadata is not None))) and '
         'use_quant_indexer', 1),
        ('DSANPUIndexerMixin.forward_npu', 'torch_npu.npu_lightning_indexer',
         'not ((is_prefill and self.dsa_enable_prefill_cp and (forward_batch.attn_cp_metadata is not None)))', 1),
    ],
    'sglang/srt/layers/attention/dsv4/compressor_v2.py': [
        ('CompressorBackendMixin.forward_unified', 'token_to_kv_pool.get_index_k_fp4_payload_buffer',
         'compressor.is_in_indexer and use_hip_fp4', 1),
        ('CompressorBackendMixin.forward_unified', 'token_to_kv_pool.get_index_k_fp4_scale_buffer',
         'compressor.is_in_indexer and use_hip_fp4', 1),
        ('CompressorBackendMixin.forward_unified', 'token_to_kv_pool.get_index_k_with_scale_buffer',
         'compressor.is_in_indexer and not (use_hip_fp4)', 1),
        ('CompressorBackendMixin.forward_unified', 'self._forward_compress_all_in_one', '', 1),
    ],
    'sglang/srt/layers/attention/dsv4/indexer.py': [
        ('C4IndexerBackendMixin._gather_nonpaged_index_k', 'token_to_kv_pool.get_index_k_scale_buffer', '', 1),
        ('C4IndexerBackendMixin.forward_c4_indexer', 'self._gather_nonpaged_index_k', 'nonpaged_plan is not None', 1),
        ('C4IndexerBackendMixin.forward_c4_indexer', 'self._nonpaged_mqa_logits', 'nonpaged_plan is not None', 1),
        ('C4IndexerBackendMixin.forward_c4_indexer', 'token_to_kv_pool.get_index_k_fp4_payload_buffer',
         'not (nonpaged_plan is not None) and use_aiter_fp4', 1),
        ('C4IndexerBackendMixin.forward_c4_indexer', 'token_to_kv_pool.get_index_k_fp4_scale_buffer',
         'not (nonpaged_plan is not None) and use_aiter_fp4', 1),
        ('C4IndexerBackendMixin.forward_c4_indexer.run_fp4_indexer', 'aiter_fp4_paged_mqa_logits', '', 1),
        ('C4IndexerBackendMixin.forward_c4_indexer', 'token_to_kv_pool.get_index_k_with_scale_buffer',
         'not (nonpaged_plan is not None) and not (use_aiter_fp4)', 1),
        ('C4IndexerBackendMixin.forward_c4_indexer.run_paged_indexer', 'fn', '', 1),
    ],
    'sglang/srt/layers/attention/dsv4/low_ratio_backend_hip.py': [
        ('low_ratio_index_topk_hip_decode', 'pool.get_index_k_fp4_payload_buffer', '', 1),
        ('low_ratio_index_topk_hip_decode', 'pool.get_index_k_fp4_scale_buffer', '', 1),
        ('low_ratio_index_topk_hip_decode', 'pool.low_ratio_index_k_page8', '', 1),
        ('low_ratio_index_topk_hip_decode', 'topk_within_candidate_blocks_page8',
         '(two_level and indexer.uses_candidates) and page8', 1),
        ('low_ratio_index_topk_hip_decode', 'aiter_fp4_paged_mqa_logits', '', 1),
        ('low_ratio_index_topk_hip_extend', 'pool.get_index_k_fp4_payload_buffer', '', 1),
        ('low_ratio_index_topk_hip_extend', 'pool.get_index_k_fp4_scale_buffer', '', 1),
        ('low_ratio_index_topk_hip_extend', 'pool.low_ratio_index_k_page8', '', 1),
        ('low_ratio_index_topk_hip_extend.score_rows', '_score_requests_page8', 'page8', 1),
        ('low_ratio_index_topk_hip_extend.score_rows', 'aiter_fp4_paged_mqa_logits', '', 1),
        ('low_ratio_index_topk_hip_extend.select_rows_page8_consumer.within', 'topk_within_candidate_blocks_page8',
         '', 1),
        ('store_index_k_split', 'index_k_norm_rope_pack_store_split', '', 1),
        ('store_index_k_split', 'pool.get_index_k_fp4_payload_buffer', '', 1),
        ('store_index_k_split', 'pool.get_index_k_fp4_scale_buffer', '', 1),
        ('store_index_k_split', 'pool.low_ratio_index_k_page8', '', 1),
    ],
    'sglang/srt/layers/attention/dsv4/v41_indexer/dense_blocks.py': [
        ('DenseBlocksBackend._deep_gemm_publish_prefill', '_publish_prefill_blocks', '', 1),
        ('DenseBlocksBackend._deep_gemm_publish_prefill', 'self.token_to_kv_pool.get_low_ratio_index_k_fp4', '', 1),
        ('DenseBlocksBackend._deep_gemm_consume_prefill', '_consume_prefill_blocks', '', 1),
        ('DenseBlocksBackend._deep_gemm_consume_prefill', 'self.token_to_kv_pool.get_low_ratio_index_k_fp4', '', 1),
    ],
    'sglang/srt/layers/attention/dsv4/v41_indexer/full_topk.py': [
        ('FullTopKIndexer._deep_gemm_prefill', 'self.token_to_kv_pool.get_low_ratio_index_k_fp4', '', 1),
        ('FullTopKIndexer._deep_gemm_prefill', 'dense_prefill_topk', '', 1),
    ],
    'sglang/srt/layers/attention/dsv4/v41_indexer/scoring.py': [
        ('get_index_k_cache', 'token_to_kv_pool.get_index_k_with_scale_buffer', '', 1),
        ('get_deep_gemm_decode_data', 'get_index_k_cache', '', 1),
        ('get_deep_gemm_decode_data', 'DeepGEMMDecodeData', '', 1),
        ('prefill_requests', 'pool.get_low_ratio_index_k_dequant', '', 1),
        ('prefill_requests', 'torch.nn.functional.pad',
         '(index_k.is_cuda and index_k.dtype == torch.bfloat16 and (lc >= 1024)) and score_width != lc', 1),
        ('prefill_requests', '_score_chunks', '', 1),
        ('decode_scores', 'pool.get_index_k_with_scale_buffer', '', 1),
        ('decode_scores', 'fp4_index_logits_paged', 'paged', 1),
        ('decode_scores', 'fp4_index_logits_decode', '', 1),
    ],
    'sglang/srt/layers/attention/dsv4/v41_indexer/sparse_table.py': [
        ('SparseTableBackend.publish_prefill', 'publish_prefill_table', '', 1),
        ('SparseTableBackend.publish_prefill', 'self.token_to_kv_pool.get_low_ratio_index_k_fp4', '', 1),
        ('SparseTableBackend.consume_prefill', 'select_prefill_table', '', 1),
        ('SparseTableBackend.consume_prefill', 'get_index_k_cache', '', 1),
        ('SparseTableBackend.consume_prefill_captured', 'get_index_k_cache', '', 1),
        ('SparseTableBackend.consume_prefill_captured', '_prefill_table_logits', '', 1),
    ],
    'sglang/srt/layers/attention/minimax_sparse_backend.py': [
        ('MiniMaxSparseAttnBackend.forward_extend', 'self.kv_pool.get_index_k_buffer', 'disable_value', 1),
        ('MiniMaxSparseAttnBackend.forward_extend', 'self.kv_pool.get_index_kv_buffer', 'not (disable_value)', 1),
        ('MiniMaxSparseAttnBackend.forward_extend', 'self._forward_npu_triton_verify',
         'self.is_npu and forward_batch.forward_mode.is_target_verify()', 1),
        ('MiniMaxSparseAttnBackend.forward_extend', 'self._forward_npu_triton_prefill',
         'self.is_npu and not (forward_batch.forward_mode.is_target_verify())', 1),
        ('MiniMaxSparseAttnBackend.forward_extend', 'minimax_sparse_prefill', 'not (self.is_npu)', 1),
        ('MiniMaxSparseAttnBackend.forward_decode', 'self.kv_pool.get_index_k_buffer', 'disable_value', 1),
        ('MiniMaxSparseAttnBackend.forward_decode', 'self.kv_pool.get_index_kv_buffer', 'not (disable_value)', 1),
        ('MiniMaxSparseAttnBackend.forward_decode', 'self._forward_npu_triton_decode', 'self.is_npu', 1),
        ('MiniMaxSparseAttnBackend.forward_decode', 'minimax_sparse_decode', 'not (self.is_npu)', 1),
    ],
    'sglang/srt/layers/attention/minimax_sparse_nvfp4_backend.py': [
        ('MiniMaxSparseNvfp4AttnBackend._forward', 'plan.run_indexer',
         'not (meta.msa_v1_decode_plan is not None)', 1),
        ('MiniMaxSparseNvfp4AttnBackend._forward', 'self.kv_pool.get_index_k_buffer',
         'not (meta.msa_v1_decode_plan is not None)', 1),
        ('MiniMaxSparseNvfp4AttnBackend._forward', 'self.kv_pool.get_index_k_scale_buffer',
         'not (meta.msa_v1_decode_plan is not None)', 1),
        ('MiniMaxSparseNvfp4AttnBackend._run_msa_v1_decode_indexer', 'plan.run', '', 1),
        ('MiniMaxSparseNvfp4AttnBackend._run_msa_v1_decode_indexer', 'self.kv_pool.get_index_k_buffer', '', 1),
        ('MiniMaxSparseNvfp4AttnBackend._run_msa_v1_decode_indexer', 'self.kv_pool.get_index_k_scale_buffer', '', 1),
    ],
    'sglang/srt/mem_cache/deepseek_v4_memory_pool.py': [
        ('DeepSeekV4TokenToKVPool.get_index_k_with_scale_buffer',
         'self._indexer_pool(compress_ratio).get_index_k_with_scale_buffer', '', 1),
        ('DeepSeekV4TokenToKVPool.get_index_k_fp4_payload_buffer',
         'self._indexer_pool(compress_ratio).get_index_k_fp4_payload_buffer', '', 1),
        ('DeepSeekV4TokenToKVPool.get_index_k_fp4_scale_buffer',
         'self._indexer_pool(compress_ratio).get_index_k_fp4_scale_buffer', '', 1),
        ('DeepSeekV4TokenToKVPool.get_index_k_scale_buffer',
         'self._indexer_pool(compress_ratio).get_index_k_scale_buffer', '', 1),
    ],
    'sglang/srt/mem_cache/memory_pool.py': [
        ('HybridLinearKVPool.get_index_k_with_scale_buffer', 'self.full_kv_pool.get_index_k_with_scale_buffer',
         '', 1),
        ('HybridLinearKVPool.get_broadcastable_index_k_with_scale_buffer',
         'self.full_kv_pool.get_index_k_with_scale_buffer', '', 1),
        ('HybridLinearKVPool.get_index_k_scale_buffer', 'self.full_kv_pool.get_index_k_scale_buffer', '', 1),
        ('DSATokenToKVPool.kpool_decode_update_index_cache', 'self.get_index_k_with_scale_buffer', '', 1),
        ('DSATokenToKVPool.kpool_decode_update_index_cache', 'kpool_decode_update_and_maybe_write_cache', '', 1),
        ('DSATokenToKVPool.get_index_k_scale_buffer', 'self.index_key_cache.get_k_and_scale', '', 1),
        ('MiniMaxSparseKVPool.set_fused_kv_index_buffer', 'self.get_index_k_buffer',
         '(index_pool is not None and (not self._enable_hisparse) and self._can_fuse_kv_index_store(index_pool, '
         'cache_k, cache_idx_k, unit_scales)) and disable_value', 1),
        ('MiniMaxSparseKVPool.set_fused_kv_index_buffer', 'self.get_index_kv_buffer',
         '(index_pool is not None and (not self._enable_hisparse) and self._can_fuse_kv_index_store(index_pool, '
         'cache_k, cache_idx_k, unit_scales)) and not (disable_value)', 1),
        ('MiniMaxSparseKVPool.set_fused_kv_index_buffer', 'store_kv_index',
         '(index_pool is not None and (not self._enable_hisparse) and self._can_fuse_kv_index_store(index_pool, '
         'cache_k, cache_idx_k, unit_scales))', 1),
    ],
    'sglang/srt/mem_cache/page_interleave_pool.py': [
        ('_PageInterleaveIndexKeyCache.get_k_and_scale', 'super().get_k_and_scale', '', 1),
    ],
    'sglang/srt/mem_cache/swa_memory_pool.py': [
        ('SWAKVPool.get_index_k_with_scale_buffer', 'self.full_kv_pool.get_index_k_with_scale_buffer', '', 1),
        ('SWAKVPool.get_index_k_scale_buffer', 'self.full_kv_pool.get_index_k_scale_buffer', '', 1),
    ],
    'sglang/srt/models/minimax_m3.py': [
        ('MiniMaxM3Attention._aiter_sparse_qknorm_cache', 'kv_pool.get_index_k_buffer', '', 1),
        ('MiniMaxM3Attention._aiter_sparse_qknorm_cache', '_aiter.fused_qknorm_idxrqknorm', '', 1),
        ('MiniMaxM3Attention._sparse_qk_index_norm_rope_cache', 'kv_pool.get_index_k_buffer',
         '(can_use_cache_fusion and kv_pool is not None)', 1),
        ('MiniMaxM3Attention._sparse_qk_index_norm_rope_cache', 'sparse_qk_index_gemma_rmsnorm_rope_cache',
         '(can_use_cache_fusion and kv_pool is not None)', 1),
    ],
}
