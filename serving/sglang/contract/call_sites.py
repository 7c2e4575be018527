"""Every watched site of SGLang 0.5.23 and what niah does about it: the data of the
contract's call-site check (sites.py scans SGLang's source; tables.py gives each release's).

`SITES` maps each file to its sites, (enclosing function, callee, count, disposition):
"patched" (the call goes through something the plugin replaces or wraps), "refused"
(niah refuses the setting that reaches it, before weights load), "unreachable" (with
the reason), "metadata only" / "sizing only" / "unrelated" (reads no index keys). The
count is how many times that function calls that callee: one more is a break.
"""

from __future__ import annotations

# -- the plugin's own paths (V3.2 DSA and V4 C4) --
PATCHED_STORE = "patched: Indexer._store_index_k_cache"
IN_STORE = ("patched: inside Indexer._store_index_k_cache (replaced with bf16 keys; fp8/niah: SGLang's own, each "
            "call counted)")
IN_STORE_ROCM = ("patched: inside Indexer._store_index_k_cache (replaced with bf16 keys; fp8/niah: SGLang's own, "
                 "counted); its aiter branch runs on ROCm only")
# V3.2's fused path (fusion on: SGLang's default on CUDA for interleaved-RoPE configs), kept in every arm
PATCHED_FUSED_STORE = ("patched: Indexer._fused_k_prepare_and_store (replaced whole with bf16 keys: niah's "
                       "store_v32_index_keys; fp8/niah: SGLang's own, each call counted)")
FUSED_Q = ("patched: the fused path (kept on in every arm, prefill CUDA-graph split op included): its key store is "
           "Indexer._fused_k_prepare_and_store (patched); its fp8 query is SGLang's in every arm")
FUSED_STORE_KERNEL = ("patched: SGLang's fused fp8 key store, called only by Indexer._fused_k_prepare_and_store, "
                      "which niah replaces whole with bf16 keys (niah's store_v32_index_keys keeps its argument "
                      "order); fp8/niah: SGLang's own, counted")
IN_FUSED_STORE = ("patched: inside Indexer._fused_k_prepare_and_store (replaced whole with bf16 keys; niah's "
                  "replacement calls it too, for the buffers to write; fp8/niah: SGLang's own, counted)")
FUSED_FALLBACK = ("patched: the fallback of Indexer._fused_k_prepare_and_store, which niah replaces whole with bf16 "
                  "keys; fp8/niah: SGLang's own, counted")
FUSED_JIT = ("patched: the JIT module of SGLang's fused key kernel, reached only from "
             "Indexer._fused_k_prepare_and_store (replaced whole with bf16 keys; fp8/niah: SGLang's own, counted)")
RESOLVER = "patched: resolver"
IN_RESOLVER = ("patched: inside the resolver, which niah replaces in niah arms (stock: SGLang's DeepGEMM kernel, "
               "counted)")
READ_BUFFER = ("patched: the decode read buffer of Indexer._get_topk_paged (fp8 arms: SGLang's body; bf16: niah's "
               "replacement reads it as bf16 pages); the broadcastable buffer exists only with layer-split pools, "
               "refused at launch")
TOPK_PAGED_READ = ("patched: Indexer._get_topk_paged is replaced for bf16 (its replacement reads the same buffer as "
                   "bf16 pages); fp8 arms hand these fp8 pages to the resolver's kernel")
CHUNKED = ("patched: calls back _get_topk_paged's _chunked_fp8_paged_mqa_logits, i.e. "
           "resolve_fp8_paged_mqa_logits_fn (niah's kernel in niah arms; _get_topk_paged is replaced for bf16)")
GET_K_AND_SCALE = "patched: IndexKeyCache.get_k_and_scale (bf16)"
CREATE_IKC = ("patched: builds the IndexKeyCache whose _buffer_shape, get_k_and_scale, store_quantized and move "
              "niah replaces for bf16")
_FUSED = ("patched: reached only from Indexer._fused_k_prepare_and_store and Indexer._store_index_k_cache, "
          "both replaced with bf16 keys (niah's stores get the buffer); fp8 arms: SGLang's own fp8 store")
_FP8_STORE = ("patched: SGLang's fp8 store kernel, reached only from Indexer._store_index_k_cache (replaced with "
              "bf16 keys; counted in fp8 arms)")
_DELEGATE = "patched: the wrapper pool delegates to DSATokenToKVPool, whose IndexKeyCache niah patches"
V4_PAGE_VIEW = ("patched: the page view goes to the paged function SGLang picks: deep_gemm.fp8_paged_mqa_logits "
                "(routed to niah's kernels in niah arms) or fp8_paged_mqa_logits_torch(_sm120) (replaced); "
                "TileLang/AITER refused")
V4_PAGED_FN = ("patched in niah arms: SGLang's call-time `from deep_gemm import fp8_paged_mqa_logits as fn` reads "
               "the deep_gemm attribute niah replaces with its kernels when the V4 pool is built "
               "(v4.route_deep_gemm); niah arms force no switch; stock: SGLang's DeepGEMM")
V4_COMPRESS = ("patched (bf16): the buffer goes to compressor_v2.compress_norm_rope_store, which niah wraps "
               "(bf16 rows)")
V4_BUFFER = "patched (bf16): returns the buffer niah's DeepSeekV4IndexerPool._create_buffer allocates and views as bf16"
V4_SCALE_GET = ("patched (bf16): delegates to DeepSeekV4IndexerPool.get_index_k_scale_buffer, which niah replaces "
                "by a bf16 gather; fp8 arms: SGLang's own")
V4_SCALE_SET = ("refused with bf16 keys: delegates to DeepSeekV4IndexerPool.set_index_k_scale_buffer, which niah "
                "replaces by a refusal; fp8 arms: SGLang's own")
V4_FUSED_SET = ("refused with bf16 keys: DeepSeekV4IndexerPool.set_index_fused is replaced by a refusal "
                "(v4.refuse_set_index_fused); fp8 arms: SGLang's own")
V4_PAGE = ("metadata only: the key pool's page size (64; niah's bf16 V4 pool refuses any other, "
           "v4.wrap_create_buffer)")
ELIDE = ("sizing only: which (shared top-k) layers get a 0-row key buffer; each row is still sized by "
         "IndexKeyCache._buffer_shape, which niah replaces for bf16")
ELIDE_ACCOUNTING = ("patched (bf16): inside DefaultPoolConfigurator._compute_dsa_indexer_cell_size, which niah "
                    "wraps (bf16 rows); it decides how many layers hold keys")
STORE_QUANTIZED = "patched: IndexKeyCache.store_quantized (bf16: refused and attested as an fp8 store)"
TORCH_FALLBACK = ("patched: only reached through resolve_fp8_paged_mqa_logits_fn (niah's in niah arms; stock: "
                  "SGLang's own)")
REPLACED_NIAH = "patched: replaced in niah arms"
PREFILL_GRAPH = ("patched: Indexer._store_index_k_cache (prefill CUDA graphs stay on; with fusion the split op goes "
                 "through Indexer._fused_q_prepare_and_store -> _fused_k_prepare_and_store, replaced for bf16)")
METADATA = ("metadata only: schedules, SM counts and logits-memory budgets for the logits kernels; reads no keys "
            "(niah's kernels do not need DeepGEMM's schedule)")

# -- what niah refuses before weights load (refusals.py) or in the patched pools --
_KPOOL = "refused: IndexerKPool serves index_kpool > 1, refused at launch for niah's arms"
_V4FP4 = ("refused with bf16 keys: V4.1 low-ratio layers and the V4.1 indexer use fp4 index pools, which "
          "DeepSeekV4IndexerPool._create_buffer refuses (and --enable-deepseek-v4-fp4-indexer is refused at "
          "launch); fp8 arms: SGLang's own fp4 path, no niah kernel")
_V4NONPAGED = ("patched: the non-paged prefill stays on; niah arms route deep_gemm.fp8_mqa_logits to niah's "
               "kernels (v4.route_deep_gemm), and with bf16 keys DeepSeekV4IndexerPool.get_index_k_scale_buffer "
               "gathers bf16 keys")
_V4NONPAGED_PLAN = ("metadata only: row-chunk sizing of the non-paged prefill (kept on; its logits go through "
                    "deep_gemm.fp8_mqa_logits, routed to niah's kernels in niah arms); reads no keys")
V4FP4_OR_ROCM = ("refused with bf16 keys: fp4 index pools (V4.1, --enable-deepseek-v4-fp4-indexer) are refused; "
                 "this branch is aiter's, ROCm only")
CUTEDSL = ("refused: --dsa-paged-mqa-logits-backend cutedsl is refused at launch for niah's arms (refusals.py); "
           "fp8 stock: SGLang's own")
TILELANG = ("refused in niah arms: reached from IndexerKPool (index_kpool > 1, refused) and from V4's C4 indexer "
            "with SGLANG_OPT_USE_TILELANG_INDEXER on (niah forces nothing; the user's switch, or SGLang's SM120 "
            "default for V4, is refused: refusals.py before weights load where it can tell, v4.env_refusal when "
            "the V4 pool is built); stock: SGLang's own")
CP = ("refused: prefill / attention context parallel (--enable-prefill-cp, --attn-cp-size > 1) is refused at "
      "launch for niah's arms")
DISAGG = "refused: PD disaggregation (--disaggregation-mode) is refused at launch for niah's arms; MiniMax pools only"
LAYER_SPLIT = "refused: --enable-dsa-cache-layer-split is refused at launch for niah's arms"
INTERLEAVE = "refused: page-interleave pools (--enable-kv-cache-sharding) are refused at launch"

# -- other hardware, other models, other kernels --
ROCM = ("unreachable: a ROCm (aiter / HIP / FlyDSL) path; niah's kernels run on CUDA (ROCm is refused for them "
        "at launch); stock: SGLang's own")
XPU = "unreachable: the Intel XPU path; niah's arms run on CUDA"
NPU = "unreachable: Ascend NPU"
OTHER_MODEL = "unreachable: another model's sparse attention (MiniMax, Qwen QSA), not DeepSeek's indexer"
GEMM = ("unrelated: a DeepGEMM GEMM (dense, MoE, einsum, mHC) or its weight/scale layout and SM setup; reads "
        "no index keys")
PROBE = "unrelated: a feature probe (does DeepGEMM offer this kernel?); reads no keys"
UNRELATED_NAME = "unrelated: an MoE weight-loader cache whose name matches the pattern; no index keys"

_D = "sglang/srt/layers/attention/dsa/"
_V4 = "sglang/srt/layers/attention/dsv4/"
_MC = "sglang/srt/mem_cache/"

# file -> [(enclosing function ("" at module level), callee, count, disposition)]
SITES: dict[str, list[tuple[str, str, int, str]]] = {
    'sglang/kernels/ops/attention/dsa/paged_mqa_logits.py': [
        ('deepgemm_paged_mqa_logits_native', 'fp8_paged_mqa_logits_fn', 1, CHUNKED),
        ('deepgemm_paged_mqa_logits_split', 'fp8_paged_mqa_logits_fn', 1, CHUNKED),
        ('aiter_paged_mqa_logits', 'deepgemm_fp8_paged_mqa_logits', 1, ROCM),
        ('cutedsl_paged_mqa_logits', 'get_paged_mqa_logits_metadata_fn', 2, CUTEDSL),
    ],
    'sglang/kernels/ops/attention/dsa/indexer_k.py': [
        ('fused_k_indexer_norm_rope', '_jit_k_indexer_norm_rope_module', 1, FUSED_JIT),
        ('fused_k_indexer_norm_rope_store', '_jit_k_indexer_norm_rope_store_module', 1, FUSED_JIT),
    ],
    'sglang/kernels/ops/attention/dsa/tilelang_kernel.py': [
        ('tilelang_fp8_paged_mqa_logits', 'fp8_paged_mqa_logits_kernel', 1, TILELANG),
    ],
    'sglang/kernels/ops/attention/dsv4/candidate_blocks_hip.py': [
        ('topk_within_candidate_blocks_page8', 'rowgroup_paged_mqa_logits', 1, ROCM),
    ],
    'sglang/kernels/ops/attention/dsv4/candidate_table.py': [
        ('build_sparse_indexer_schedule', 'deep_gemm.get_paged_sparse_mqa_logits_metadata', 1, _V4FP4),
    ],
    'sglang/kernels/ops/attention/dsv4/compress.py': [
        ('compress_norm_rope_store', 'aiter_k_indexer_fp4_cache_write', 1, V4FP4_OR_ROCM),
    ],
    'sglang/kernels/ops/attention/dsv4/fp4_indexer_hip.py': [
        ('_rowgroup_decode_logits', 'rowgroup_paged_mqa_logits', 1, ROCM),
        ('rowgroup_paged_mqa_logits', 'index_k_page8_views', 1, ROCM),
        ('rowgroup_paged_mqa_logits', 'flydsl_pa_mqa_logits_fp4', 1, ROCM),
        ('aiter_fp4_paged_mqa_logits', 'flydsl_pa_mqa_logits_fp4', 1, ROCM),
        ('aiter_fp4_paged_mqa_logits', 'flydsl_pa_mqa_logits_fp4_prefill', 1, ROCM),
    ],
    'sglang/kernels/ops/attention/dsv4/fp4_indexer_rope.py': [
        ('index_k_norm_rope_pack_store', 'index_k', 1, _V4FP4),
        ('index_k_norm_rope_pack_store', '_jit_index_k_module', 1, _V4FP4),
    ],
    'sglang/kernels/ops/attention/dsv4/fp4_indexer_rope_hip.py': [
        ('index_k_norm_rope_pack_store_split', 'index_k_split', 1, ROCM),
        ('index_k_norm_rope_pack_store_split', '_jit_index_k_split_module', 1, ROCM),
    ],
    'sglang/kernels/ops/attention/dsv4/index_logits.py': [
        ('flat_index_logits_rows_per_tile', 'mqa_logits_rows_per_chunk', 1, _V4FP4),
        ('flat_index_logits_rows_per_tile', 'mqa_logits_row_bytes', 1, _V4FP4),
        ('flat_index_logits_tiles', 'deep_gemm.fp8_fp4_mqa_logits', 1, _V4FP4),
        ('deep_gemm_fp4_paged_mqa_logits', 'deep_gemm.fp8_fp4_paged_mqa_logits', 1, _V4FP4),
        ('sparse_logits', 'deep_gemm.fp8_fp4_paged_sparse_mqa_logits', 1, _V4FP4),
    ],
    'sglang/kernels/ops/kvcache/dsa_fused_store_index_cache.py': [
        ('fused_store_index_k_cache', 'fused_store_index_k_cache', 1, _FP8_STORE),
    ],
    'sglang/kernels/ops/kvcache/dsa_index_k_cache.py': [
        ('GetKAndS.aiter', 'cp_gather_indexer_k_quant_cache', 1, ROCM),
    ],
    'sglang/kernels/ops/layernorm/mhc.py': [
        ('mhc_fused_post_pre', 'deep_gemm.tf32_hc_prenorm_gemm', 1, GEMM),
    ],
    'sglang/kernels/ops/layernorm/mhc_mega.py': [
        ('mhc_mega_boundary', 'deep_gemm.mega_mhc', 1, GEMM),
    ],
    'sglang/kernels/ops/moe/mega_gate.py': [
        ('bf16_mega_gate', 'deep_gemm.bf16_mega_gate', 1, GEMM),
    ],
    'sglang/kernels/ops/quantization/fp8_kernel.py': [
        ('_per_token_group_quant_8bit_raw', 'deep_gemm.transform_sf_into_required_layout', 1, GEMM),
    ],
    'sglang/srt/batch_invariant_ops/batch_invariant_ops.py': [
        ('_matmul_persistent_deepgemm', 'deep_gemm', 1, GEMM),
        ('_matmul_persistent_deepgemm', 'deep_gemm.use_deterministic_algorithms', 2, GEMM),
        ('_matmul_persistent_deepgemm', 'deep_gemm.bf16_gemm_nn', 1, GEMM),
    ],
    'sglang/srt/disaggregation/utils.py': [
        ('setup_state_kv_args', 'get_index_k_state_buf_infos', 1, DISAGG),
    ],
    'sglang/srt/hardware_backend/npu/dsv4/dsv4_memory_pool.py': [
        ('DSV4NPUTokenToKVPool.get_compress_buffer', 'get_index_k', 1, NPU),
        ('DSV4NPUTokenToKVPool.set_compress_buffer', 'set_index_k_scale', 1, NPU),
        ('DSV4NPUTokenToKVPool.set_compress_buffer', 'set_index_fused', 1, NPU),
        ('DSV4NPUTokenToKVPool.set_compress_buffer', 'set_index_k_scale_buffer', 1, NPU),
        ('DSV4NPUTokenToKVPool.get_compress_dequant_scale_buffer', 'get_index_scale', 1, NPU),
    ],
    'sglang/srt/layers/attention/deepseek_v4_backend.py': [
        ('DeepseekV4AttnBackend.init_forward_metadata_indexer', 'get_index_k_page_size', 1, V4_PAGE),
        ('DeepseekV4AttnBackend._low_ratio_compress_fused', 'low_ratio_index_k_is_split', 1, _V4FP4),
        ('DeepseekV4AttnBackend._low_ratio_compress_fused', 'store_index_k_split', 1, _V4FP4),
        ('DeepseekV4AttnBackend._low_ratio_compress_fused', 'index_k_norm_rope_pack_store', 1, _V4FP4),
        ('DeepseekV4AttnBackend._low_ratio_compress_fused', 'get_index_k_with_scale_buffer', 1, _V4FP4),
        ('DeepseekV4AttnBackend._low_ratio_write_group', 'index_k_rope_pack', 1, _V4FP4),
        ('DeepseekV4AttnBackend._low_ratio_write_group', 'get_index_k_with_scale_buffer', 1, _V4FP4),
        ('DeepseekV4AttnBackend._low_ratio_write_group', 'set_index_k_fp4', 1, _V4FP4),
        ('DeepseekV4AttnBackend._low_ratio_write_group', 'index_keys', 1, _V4FP4),
        ('DeepseekV4AttnBackend._low_ratio_index_topk_captured', 'get_index_k_page_size', 1, _V4FP4),
    ],
    'sglang/srt/layers/attention/deepseek_v4_backend_hip_radix.py': [
        ('DeepseekV4HipRadixBackend.init_forward_metadata_indexer', 'get_index_k_page_size', 2, ROCM),
        ('DeepseekV4HipRadixBackend.init_forward_metadata_in_graph', 'low_ratio_index_k_page8_ratios', 1, ROCM),
        ('DeepseekV4HipRadixBackend._refresh_fp4_prefill_workspace', 'low_ratio_index_k_page8_ratios', 1, ROCM),
    ],
    _D + 'dsa_indexer.py': [
        ('_index_k_write_targets', 'get_index_k_with_scale_buffer', 1, _FUSED),
        ('Indexer._mqa_logits_free_mem_fraction', 'mqa_logits_free_mem_fraction', 1, METADATA),
        ('Indexer._aiter_fused_fp8_prepare_and_store', 'get_index_k_with_scale_buffer', 1, ROCM),
        ('Indexer._gfx950_fused_decode', 'get_index_k_with_scale_buffer', 1, ROCM),
        ('Indexer._gfx950_fused_decode', '_get_index_k_read_buffer', 1, ROCM),
        ('Indexer._get_q_k_bf16', 'materialize_full_indexer_k_cache', 2, CP),
        ('Indexer._fused_k_prepare_and_store', '_index_k_write_targets', 1, IN_FUSED_STORE),
        ('Indexer._fused_k_prepare_and_store', 'fused_k_indexer_norm_rope_store', 1, FUSED_STORE_KERNEL),
        ('Indexer._fused_k_prepare_and_store', 'fused_k_indexer_norm_rope', 1, FUSED_FALLBACK),
        ('Indexer._fused_k_prepare_and_store', '_store_index_k_cache', 1, FUSED_FALLBACK),
        ('Indexer._fused_q_prepare_and_store', '_fused_k_prepare_and_store', 2, PATCHED_FUSED_STORE),
        ('Indexer._get_index_k_read_buffer', 'get_broadcastable_index_k_with_scale_buffer', 1, READ_BUFFER),
        ('Indexer._get_index_k_read_buffer', 'get_index_k_with_scale_buffer', 1, READ_BUFFER),
        ('Indexer._get_topk_paged', '_get_index_k_read_buffer', 1, TOPK_PAGED_READ),
        ('Indexer._get_topk_paged', 'resolve_paged_mqa_logits_metadata_fn', 2, METADATA),
        ('Indexer._get_topk_paged._chunked_fp8_paged_mqa_logits', 'resolve_fp8_paged_mqa_logits_fn', 2, RESOLVER),
        ('Indexer._get_topk_paged._chunked_fp8_paged_mqa_logits',
         'resolve_paged_mqa_logits_metadata_fn', 1, METADATA),
        ('Indexer._get_topk_paged', 'aiter_paged_mqa_logits', 1, ROCM),
        ('Indexer._get_topk_paged', 'sgl_fp8_paged_mqa_logits', 1, XPU),
        ('Indexer._get_topk_paged', 'cutedsl_paged_mqa_logits', 1, CUTEDSL),
        ('Indexer._get_topk_paged', 'deepgemm_paged_mqa_logits_native', 1, CHUNKED),
        ('Indexer._get_topk_paged', 'deepgemm_paged_mqa_logits_split', 1, CHUNKED),
        ('Indexer._get_mqa_logits_budget_bytes', 'mqa_logits_static_budget_bytes', 1, METADATA),
        ('Indexer._get_mqa_logits_budget_bytes', 'mqa_logits_budget_bytes', 1, METADATA),
        ('Indexer._get_topk_ragged', 'get_indexer_kvcache_range', 1, METADATA),
        ('Indexer._get_topk_ragged', 'get_index_k_scale_buffer', 1, GET_K_AND_SCALE),
        ('Indexer._get_topk_ragged', 'mqa_logits_should_chunk', 1, METADATA),
        ('Indexer._get_topk_ragged', '_get_mqa_logits_budget_bytes', 1, METADATA),
        ('Indexer._get_topk_ragged', 'fp8_mqa_logits', 2, ROCM),
        ('Indexer._get_topk_ragged', 'sgl_fp8_mqa_logits', 2, XPU),
        ('Indexer._get_topk_ragged', 'resolve_fp8_mqa_logits_fn', 2, RESOLVER),
        ('Indexer._forward_cuda_k_only', '_fused_k_prepare_and_store', 1, PATCHED_FUSED_STORE),
        ('Indexer._forward_cuda_k_only', '_store_index_k_cache', 2, PATCHED_STORE),
        ('Indexer._store_index_k_cache', '_index_k_write_targets', 1, IN_STORE),
        ('Indexer._store_index_k_cache', 'fused_store_index_k_cache', 1, IN_STORE),
        ('Indexer._store_index_k_cache', 'get_index_k_with_scale_buffer', 1, IN_STORE),
        ('Indexer._store_index_k_cache', 'indexer_k_quant_and_cache', 1, IN_STORE_ROCM),
        ('Indexer._store_index_k_cache', 'set_index_k_scale_buffer', 1, IN_STORE),
        ('Indexer.forward_cuda', '_aiter_fused_fp8_prepare_and_store', 1, ROCM),
        ('Indexer.forward_cuda', '_fused_q_prepare_and_store', 1, FUSED_Q),
        ('Indexer.forward_cuda', '_store_index_k_cache', 3, PATCHED_STORE),
    ],
    _D + 'dsa_indexer_kpool.py': [
        ('_mqa_logits_row_chunks', 'mqa_logits_should_chunk', 1, _KPOOL),
        ('_mqa_logits_row_chunks', 'mqa_logits_budget_bytes', 1, _KPOOL),
        ('_mqa_logits_row_chunks', 'mqa_logits_rows_per_chunk', 1, _KPOOL),
        ('_mqa_logits_row_chunks', 'mqa_logits_row_bytes', 1, _KPOOL),
        ('IndexerKPool.__init__', 'deep_gemm.get_num_sms', 1, _KPOOL),
        ('IndexerKPool._get_index_k_read_buffer', 'get_broadcastable_index_k_with_scale_buffer', 1, _KPOOL),
        ('IndexerKPool._get_index_k_read_buffer', 'get_index_k_with_scale_buffer', 1, _KPOOL),
        ('IndexerKPool._write_compressed_pooled_index_cache', 'get_index_k_with_scale_buffer', 1, _KPOOL),
        ('IndexerKPool._write_returned_compressed_pooled_index_cache', 'set_index_k_scale_buffer', 1, _KPOOL),
        ('IndexerKPool._compress_write_decode', 'kpool_decode_update_index_cache', 1, _KPOOL),
        ('IndexerKPool._compress_write_extend', 'get_index_k_with_scale_buffer', 3, _KPOOL),
        ('IndexerKPool._compress_write_extend', '_write_compressed_pooled_index_cache', 2, _KPOOL),
        ('IndexerKPool._get_kpool_decode_metadata', 'deep_gemm.get_paged_mqa_logits_metadata', 2, _KPOOL),
        ('IndexerKPool._fp8_mqa_logits', 'mqa_logits_rows_per_chunk', 1, _KPOOL),
        ('IndexerKPool._fp8_mqa_logits', 'mqa_logits_row_bytes', 1, _KPOOL),
        ('IndexerKPool._fp8_mqa_logits', 'fp8_mqa_logits', 2, _KPOOL),
        ('IndexerKPool._fp8_mqa_logits', 'deep_gemm.fp8_mqa_logits', 1, _KPOOL),
        ('IndexerKPool._get_topk_paged', '_get_index_k_read_buffer', 1, _KPOOL),
        ('IndexerKPool._get_topk_paged', '_should_use_tilelang_paged_mqa_logits', 1, _KPOOL),
        ('IndexerKPool._get_topk_paged', 'aiter_paged_mqa_logits', 1, _KPOOL),
        ('IndexerKPool._get_topk_paged', 'tilelang_fp8_paged_mqa_logits', 1, _KPOOL),
        ('IndexerKPool._get_topk_paged', 'deep_gemm.fp8_paged_mqa_logits', 1, _KPOOL),
        ('IndexerKPool._kpool_topk_by_row_chunks', '_fp8_mqa_logits', 1, _KPOOL),
        ('IndexerKPool._get_topk_ragged_kpool_plan', 'gather_index_k_scale_prefix_into', 1, _KPOOL),
        ('IndexerKPool._get_topk_ragged_kpool_plan', '_get_index_k_read_buffer', 1, _KPOOL),
        ('IndexerKPool._get_topk_ragged_kpool_plan', '_mqa_logits_row_chunks', 1, _KPOOL),
        ('IndexerKPool._get_topk_ragged_kpool', '_write_returned_compressed_pooled_index_cache', 2, _KPOOL),
        ('IndexerKPool._get_topk_ragged_kpool', 'gather_index_k_scale_prefix_into', 1, _KPOOL),
        ('IndexerKPool._get_topk_ragged_kpool', '_get_index_k_read_buffer', 1, _KPOOL),
        ('IndexerKPool._get_topk_ragged_kpool', 'get_index_k_scale_buffer', 1, _KPOOL),
        ('IndexerKPool._get_topk_ragged_kpool', '_mqa_logits_row_chunks', 1, _KPOOL),
        ('IndexerKPool._forward_cuda_target_verify', 'get_index_k_with_scale_buffer', 1, _KPOOL),
    ],
    _D + 'dsa_npu_indexer.py': [
        ('DSANPUIndexerMixin.forward_npu', 'set_index_k_scale_buffer', 1, NPU),
        ('DSANPUIndexerMixin.forward_npu', 'set_index_k_buffer', 1, NPU),
        ('DSANPUIndexerMixin.forward_npu', 'get_index_k_buffer', 1, NPU),
        ('DSANPUIndexerMixin.forward_npu', 'get_index_k_scale_buffer', 1, NPU),
    ],
    _D + 'dsa_prefill_cuda_graph.py': [
        ('pcg_dsa_indexer_prefill_split', '_aiter_fused_fp8_prepare_and_store', 1, ROCM),
        ('pcg_dsa_indexer_prefill_split', '_fused_q_prepare_and_store', 1, FUSED_Q),
        ('pcg_dsa_indexer_prefill_split', '_store_index_k_cache', 1, PREFILL_GRAPH),
    ],
    _D + 'kpool_plan.py': [
        ('_get_deep_gemm', 'deep_gemm', 1, _KPOOL),
        ('_compute_pool_schedule_metadata', 'get_paged_mqa_logits_metadata', 1, _KPOOL),
    ],
    _D + 'utils.py': [
        ('resolve_num_sms', '_use_torch_mqa_logits', 1, METADATA),
        ('resolve_num_sms', 'deep_gemm.get_num_sms', 1, METADATA),
        ('resolve_paged_mqa_logits_metadata_fn', '_use_torch_mqa_logits', 1, METADATA),
        ('resolve_paged_mqa_logits_metadata_fn', 'deep_gemm.get_paged_mqa_logits_metadata', 1, METADATA),
        ('_fp8_paged_mqa_logits_torch', 'mqa_logits_needs_budget_check', 1, METADATA),
        ('_fp8_paged_mqa_logits_torch', 'mqa_logits_static_budget_bytes', 1, METADATA),
        ('_fp8_paged_mqa_logits_torch', 'fp8_paged_mqa_logits_torch', 2, TORCH_FALLBACK),
        ('resolve_fp8_paged_mqa_logits_fn', '_use_torch_mqa_logits', 1, IN_RESOLVER),
        ('resolve_fp8_paged_mqa_logits_fn', 'deep_gemm.fp8_paged_mqa_logits', 1, IN_RESOLVER),
        ('resolve_fp8_mqa_logits_fn', '_use_torch_mqa_logits', 1, IN_RESOLVER),
        ('resolve_fp8_mqa_logits_fn', 'deep_gemm.fp8_mqa_logits', 1, IN_RESOLVER),
    ],
    'sglang/srt/layers/attention/dsa_backend.py': [
        ('DeepseekSparseAttnBackend._refresh_paged_mqa_schedule_metadata',
         'resolve_paged_mqa_logits_metadata_fn', 1, METADATA),
        ('DeepseekSparseAttnBackend.init_forward_metadata', '_cal_indexer_k_start_end', 1, METADATA),
        ('DeepseekSparseAttnBackend.init_forward_metadata', 'resolve_paged_mqa_logits_metadata_fn', 1, METADATA),
        ('DeepseekSparseAttnBackend._build_forward_metadata_cuda_graph',
         'resolve_paged_mqa_logits_metadata_fn', 1, METADATA),
    ],
    _V4 + 'compressor_v2.py': [
        ('CompressorBackendMixin.forward_unified', 'get_index_k_page_size', 1, V4_PAGE),
        ('CompressorBackendMixin.forward_unified', 'get_index_k_fp4_payload_buffer', 1, ROCM),
        ('CompressorBackendMixin.forward_unified', 'get_index_k_fp4_scale_buffer', 1, ROCM),
        ('CompressorBackendMixin.forward_unified', 'get_index_k_with_scale_buffer', 1, V4_COMPRESS),
        ('CompressorBackendMixin._forward_unified_hip', 'set_index_k_fused', 1, ROCM),
    ],
    _V4 + 'indexer.py': [
        ('_aiter_fp8_paged_mqa_logits', 'deepgemm_fp8_paged_mqa_logits', 1, ROCM),
        ('fp8_paged_mqa_logits_torch_sm120', 'fp8_paged_mqa_logits_torch_sm120', 1, REPLACED_NIAH),
        ('C4IndexerBackendMixin._get_nonpaged_indexer_plan', 'mqa_logits_rows_per_chunk', 1, _V4NONPAGED_PLAN),
        ('C4IndexerBackendMixin._get_nonpaged_indexer_plan', 'mqa_logits_row_bytes', 1, _V4NONPAGED_PLAN),
        ('C4IndexerBackendMixin._gather_nonpaged_index_k', 'get_index_k_scale_buffer', 1, _V4NONPAGED),
        ('C4IndexerBackendMixin._nonpaged_mqa_logits', 'deep_gemm.fp8_mqa_logits', 1, _V4NONPAGED),
        ('C4IndexerBackendMixin.forward_c4_indexer', '_gather_nonpaged_index_k', 1, _V4NONPAGED),
        ('C4IndexerBackendMixin.forward_c4_indexer', '_nonpaged_mqa_logits', 1, _V4NONPAGED),
        ('C4IndexerBackendMixin.forward_c4_indexer', 'get_index_k_fp4_payload_buffer', 1, V4FP4_OR_ROCM),
        ('C4IndexerBackendMixin.forward_c4_indexer', 'get_index_k_fp4_scale_buffer', 1, V4FP4_OR_ROCM),
        ('C4IndexerBackendMixin.forward_c4_indexer.run_fp4_indexer', 'aiter_fp4_paged_mqa_logits', 1, V4FP4_OR_ROCM),
        ('C4IndexerBackendMixin.forward_c4_indexer', 'get_index_k_with_scale_buffer', 1, V4_PAGE_VIEW),
        ('C4IndexerBackendMixin.forward_c4_indexer.run_paged_indexer',
         'deep_gemm.fp8_paged_mqa_logits', 1, V4_PAGED_FN),
    ],
    _V4 + 'low_ratio_backend_hip.py': [
        ('_score_requests_page8', 'rowgroup_paged_mqa_logits', 1, ROCM),
        ('low_ratio_index_topk_hip_decode', 'get_index_k_fp4_payload_buffer', 1, ROCM),
        ('low_ratio_index_topk_hip_decode', 'get_index_k_fp4_scale_buffer', 1, ROCM),
        ('low_ratio_index_topk_hip_decode', 'low_ratio_index_k_page8', 1, ROCM),
        ('low_ratio_index_topk_hip_decode', 'aiter_fp4_paged_mqa_logits', 1, ROCM),
        ('low_ratio_index_topk_hip_extend', 'get_index_k_fp4_payload_buffer', 1, ROCM),
        ('low_ratio_index_topk_hip_extend', 'get_index_k_fp4_scale_buffer', 1, ROCM),
        ('low_ratio_index_topk_hip_extend', 'low_ratio_index_k_page8', 1, ROCM),
        ('low_ratio_index_topk_hip_extend.score_rows', 'aiter_fp4_paged_mqa_logits', 1, ROCM),
        ('store_index_k_split', 'index_k_norm_rope_pack_store_split', 1, ROCM),
        ('store_index_k_split', 'get_index_k_fp4_payload_buffer', 1, ROCM),
        ('store_index_k_split', 'get_index_k_fp4_scale_buffer', 1, ROCM),
        ('store_index_k_split', 'low_ratio_index_k_page8', 1, ROCM),
    ],
    _V4 + 'metadata.py': [
        ('plan_indexer_row_chunks', 'mqa_logits_should_chunk', 1, METADATA),
        ('plan_indexer_row_chunks', 'mqa_logits_rows_per_chunk', 1, METADATA),
        ('plan_indexer_row_chunks', 'mqa_logits_row_bytes', 1, METADATA),
        ('PagedIndexerMetadata.__post_init__', '_mqa_logits_budget', 1, METADATA),
        ('PagedIndexerMetadata.__post_init__', 'deep_gemm.get_paged_mqa_logits_metadata', 2, METADATA),
        ('PagedIndexerMetadata.__post_init__', 'deep_gemm.get_num_sms', 2, METADATA),
        ('PagedIndexerMetadata._mqa_logits_budget', 'mqa_logits_needs_budget_check', 1, METADATA),
        ('PagedIndexerMetadata._mqa_logits_budget', 'mqa_logits_budget_bytes', 1, METADATA),
    ],
    _V4 + 'v41_indexer/__init__.py': [
        ('has_dense_fp4_indexer', 'deep_gemm', 1, _V4FP4),
    ],
    _V4 + 'v41_indexer/dense_blocks.py': [
        ('DenseBlocksBackend._deep_gemm_publish_prefill', 'get_low_ratio_index_k_fp4', 1, _V4FP4),
        ('DenseBlocksBackend._deep_gemm_consume_prefill', 'get_low_ratio_index_k_fp4', 1, _V4FP4),
    ],
    _V4 + 'v41_indexer/full_topk.py': [
        ('FullTopKIndexer._deep_gemm_prefill', 'get_low_ratio_index_k_fp4', 1, _V4FP4),
        ('FullTopKIndexer._deep_gemm_decode', 'deep_gemm_fp4_paged_mqa_logits', 2, _V4FP4),
    ],
    _V4 + 'v41_indexer/scoring.py': [
        ('get_index_k_cache', 'get_index_k_with_scale_buffer', 1, _V4FP4),
        ('get_deep_gemm_decode_data', 'get_index_k_cache', 1, _V4FP4),
        ('prefill_requests', 'get_low_ratio_index_k_dequant', 1, _V4FP4),
        ('decode_scores', 'get_index_k_with_scale_buffer', 1, _V4FP4),
    ],
    _V4 + 'v41_indexer/sparse_table.py': [
        ('SparseTableBackend.publish_prefill', 'get_index_k_page_size', 1, _V4FP4),
        ('SparseTableBackend.publish_prefill', 'get_low_ratio_index_k_fp4', 1, _V4FP4),
        ('SparseTableBackend.consume_prefill', 'get_index_k_cache', 1, _V4FP4),
        ('SparseTableBackend.consume_prefill', 'get_index_k_page_size', 1, _V4FP4),
        ('SparseTableBackend.consume_prefill_captured', 'get_index_k_cache', 1, _V4FP4),
        ('SparseTableBackend.publish_decode', 'deep_gemm_fp4_paged_mqa_logits', 1, _V4FP4),
        ('SparseTableBackend._publish_decode_chunked', 'deep_gemm_fp4_paged_mqa_logits', 1, _V4FP4),
    ],
    'sglang/srt/layers/attention/minimax_sparse_backend.py': [
        ('MiniMaxSparseAttnBackend.forward_extend', 'get_index_k_buffer', 1, OTHER_MODEL),
        ('MiniMaxSparseAttnBackend.forward_extend', 'get_index_kv_buffer', 1, OTHER_MODEL),
        ('MiniMaxSparseAttnBackend.forward_decode', 'get_index_k_buffer', 1, OTHER_MODEL),
        ('MiniMaxSparseAttnBackend.forward_decode', 'get_index_kv_buffer', 1, OTHER_MODEL),
    ],
    'sglang/srt/layers/attention/minimax_sparse_nvfp4_backend.py': [
        ('MiniMaxSparseNvfp4AttnBackend._forward', 'get_index_k_buffer', 1, OTHER_MODEL),
        ('MiniMaxSparseNvfp4AttnBackend._forward', 'get_index_k_scale_buffer', 1, OTHER_MODEL),
        ('MiniMaxSparseNvfp4AttnBackend._forward', 'get_main_k_scale_buffer', 1, OTHER_MODEL),
        ('MiniMaxSparseNvfp4AttnBackend._run_msa_v1_decode_indexer', 'get_index_k_buffer', 1, OTHER_MODEL),
        ('MiniMaxSparseNvfp4AttnBackend._run_msa_v1_decode_indexer', 'get_index_k_scale_buffer', 1, OTHER_MODEL),
        ('MiniMaxSparseNvfp4AttnBackend._run_msa_v1_decode_attention', 'get_main_k_scale_buffer', 1, OTHER_MODEL),
    ],
    'sglang/srt/layers/attention/mqa_logits_utils.py': [
        ('mqa_logits_static_budget_bytes', 'mqa_logits_free_mem_fraction', 1, METADATA),
        ('mqa_logits_budget_bytes', 'mqa_logits_static_budget_bytes', 1, METADATA),
        ('mqa_logits_budget_bytes', 'mqa_logits_free_mem_fraction', 1, METADATA),
        ('mqa_logits_should_chunk', 'mqa_logits_needs_budget_check', 1, METADATA),
    ],
    'sglang/srt/layers/attention/qsa/qsa_indexer.py': [
        ('QSAIndexer._fused_compress_store', 'qsa_index_k_compress_store', 1, OTHER_MODEL),
    ],
    'sglang/srt/layers/deep_gemm_wrapper/compile_utils.py': [
        ('_compile_deep_gemm_one_type_all', 'deep_gemm.get_mk_alignment_for_contiguous_layout', 2, GEMM),
        ('_compile_deep_gemm_one_type_all', 'deep_gemm', 2, GEMM),
        ('_compile_deep_gemm_one_type_all', 'deep_gemm.get_compile_mode', 1, GEMM),
        ('_compile_deep_gemm_one_type_all', 'deep_gemm.set_compile_mode', 2, GEMM),
        ('_NormalWarmupExecutor.execute', 'deep_gemm.fp8_gemm_nt', 1, GEMM),
        ('_GroupedContWarmupExecutor.execute', 'deep_gemm.m_grouped_fp8_gemm_nt_contiguous', 1, GEMM),
        ('_BF16GroupedContWarmupExecutor.execute', 'deep_gemm.m_grouped_bf16_gemm_nt_contiguous', 1, GEMM),
        ('_GroupedMaskedWarmupExecutor.execute', 'deep_gemm.fp8_m_grouped_gemm_nt_masked', 1, GEMM),
        ('_BF16F32WarmupExecutor.execute', 'deep_gemm.bf16_gemm_nt', 1, GEMM),
        ('_BF16GroupedMaskedWarmupExecutor.execute', 'deep_gemm.m_grouped_bf16_gemm_nt_masked', 1, GEMM),
    ],
    'sglang/srt/layers/deep_gemm_wrapper/configurer.py': [
        ('_sm120_deep_gemm_apis_available', 'deep_gemm', 1, PROBE),
        ('_supports_paged_sparse_mqa_logits', 'deep_gemm', 1, PROBE),
        ('', '_supports_paged_sparse_mqa_logits', 1, PROBE),
    ],
    'sglang/srt/layers/deep_gemm_wrapper/entrypoint.py': [
        ('get_mn_major_tma_aligned_tensor', 'deep_gemm.utils.layout.get_mn_major_tma_aligned_tensor', 1, GEMM),
        ('grouped_gemm_nt_f8f8bf16_masked', 'deep_gemm.fp8_m_grouped_gemm_nt_masked', 1, GEMM),
        ('grouped_gemm_nt_bf16_masked', 'deep_gemm.m_grouped_bf16_gemm_nt_masked', 1, GEMM),
        ('grouped_gemm_nt_f8f8bf16_contig', 'deep_gemm.m_grouped_fp8_gemm_nt_contiguous', 1, GEMM),
        ('grouped_gemm_nt_bf16_contig', 'deep_gemm.m_grouped_bf16_gemm_nt_contiguous', 1, GEMM),
        ('get_contiguous_layout_alignment', 'deep_gemm.get_mk_alignment_for_contiguous_layout', 1, GEMM),
        ('get_contiguous_layout_alignment', 'deep_gemm', 1, GEMM),
        ('contiguous_layout_alignment_scope', 'deep_gemm', 2, GEMM),
        ('gemm_nt_f8f8bf16', 'deep_gemm.fp8_gemm_nt', 1, GEMM),
        ('gemm_nt_mxfp8_f8f8bf16', 'deep_gemm.fp8_fp4_gemm_nt', 1, GEMM),
        ('gemm_nt_bf16bf16f32', 'deep_gemm.bf16_gemm_nt', 1, GEMM),
        ('tf32_hc_prenorm_gemm', 'deep_gemm.tf32_hc_prenorm_gemm', 1, GEMM),
        ('update_deep_gemm_config', 'deep_gemm', 1, GEMM),
        ('update_deep_gemm_config', 'deep_gemm.set_pdl', 1, GEMM),
        ('configure_deep_gemm_num_sms', 'deep_gemm.get_num_sms', 1, GEMM),
        ('configure_deep_gemm_num_sms', 'deep_gemm.set_num_sms', 2, GEMM),
    ],
    'sglang/srt/layers/moe/flashinfer_megamoe.py': [
        ('_capture_safe_ue8m0_pack', 'deep_gemm.utils.math.pack_ue8m0_to_int', 1, GEMM),
        ('_capture_safe_ue8m0_pack', 'deep_gemm.utils.math', 2, GEMM),
    ],
    'sglang/srt/layers/moe/fused_moe_triton/layer.py': [
        ('FusedMoE._weight_loader_impl', 'clear_mxfp8_shuffle_index_cache', 1, UNRELATED_NAME),
        ('FusedMoE.weight_loader_fused', 'clear_mxfp8_shuffle_index_cache', 1, UNRELATED_NAME),
    ],
    'sglang/srt/layers/moe/mega_moe.py': [
        ('_get_mega_moe_symm_buffer', 'deep_gemm', 1, GEMM),
        ('_get_mega_moe_symm_buffer', 'deep_gemm.get_num_sms', 1, GEMM),
        ('_get_mega_moe_symm_buffer', 'deep_gemm.get_symm_buffer_for_mega_moe', 1, GEMM),
        ('_get_mega_moe_symm_buffer', 'deep_gemm.SymmBuffer', 1, GEMM),
        ('MegaMoeInput', 'deep_gemm.SymmBuffer', 1, GEMM),
        ('mega_moe_input_target', 'deep_gemm.get_block_m_for_mega_moe', 1, GEMM),
        ('_run_mega_routed', 'deep_gemm', 1, GEMM),
        ('run_mega_routed_experts', 'deep_gemm.mega_moe_pre_dispatch', 2, GEMM),
        ('run_mega_routed_experts', 'deep_gemm.get_block_m_for_mega_moe', 1, GEMM),
        ('run_mega_routed_experts', 'deep_gemm', 1, GEMM),
        ('run_mega_routed_experts', 'deep_gemm.fp8_fp4_mega_moe', 1, GEMM),
        ('build_mega_moe_experts_weights', 'deep_gemm.transform_sf_into_required_layout', 2, GEMM),
        ('build_mega_moe_shared_weights', 'deep_gemm.transform_weights_for_mega_moe', 1, GEMM),
        ('_transform_mega_moe_shared_sf', 'deep_gemm.transform_sf_into_required_layout', 2, GEMM),
    ],
    'sglang/srt/layers/moe/mega_moe_sm90.py': [
        ('is_sm90_fp8_mega_moe_available', 'deep_gemm', 2, GEMM),
        ('run_sm90_mega_routed', 'deep_gemm.SymmBuffer', 1, GEMM),
        ('run_sm90_mega_routed', 'deep_gemm.mega_moe_pre_dispatch_sm90', 1, GEMM),
        ('run_sm90_mega_routed', 'deep_gemm.fp8_mega_moe', 1, GEMM),
    ],
    'sglang/srt/layers/moe/moe_runner/deep_gemm.py': [
        ('DeepGemmRunnerCore._run_masked_gemm',
         'deep_gemm.utils.layout.get_mn_major_tma_aligned_packed_ue8m0_tensor', 1, GEMM),
    ],
    'sglang/srt/layers/muse_spark/muse_spark_megamoe.py': [
        ('_get_symm_buffer', 'deep_gemm.get_symm_buffer_for_mega_moe', 1, GEMM),
        ('_heuristic_block_m', 'deep_gemm.get_block_m_for_mega_moe', 1, GEMM),
        ('forward_megamoe', 'deep_gemm.mega_moe_pre_dispatch', 1, GEMM),
        ('forward_megamoe', 'deep_gemm.nvfp4_mega_moe', 1, GEMM),
        ('forward_megamoe', 'deep_gemm.bf16_mega_moe', 1, GEMM),
    ],
    'sglang/srt/layers/quantization/fp8.py': [
        ('Fp8MoEMethod.process_weights_after_loading_block_quant',
         'deep_gemm.transform_sf_into_required_layout', 1, GEMM),
        ('Fp8MoEMethod._process_mxfp8_moe_weights._pack_moe_scale_for_deepgemm',
         'deep_gemm.utils.layout.get_mn_major_tma_aligned_packed_ue8m0_tensor', 1, GEMM),
    ],
    'sglang/srt/layers/quantization/fp8_utils.py': [
        ('pack_mxfp8_weight_scale_for_deepgemm',
         'deep_gemm.utils.layout.get_mn_major_tma_aligned_packed_ue8m0_tensor', 1, GEMM),
        ('transform_scale_ue8m0', 'deep_gemm.utils.layout.get_mn_major_tma_aligned_packed_ue8m0_tensor', 1, GEMM),
        ('transform_scale_ue8m0', 'deep_gemm.utils.get_tma_aligned_size', 1, GEMM),
        ('_get_mn_major_tma_aligned_packed_ue8m0_tensor_torch_impl', 'deep_gemm.utils.get_tma_aligned_size', 1, GEMM),
        ('_get_mn_major_tma_aligned_packed_ue8m0_tensor_torch_impl', 'deep_gemm.utils.align', 1, GEMM),
    ],
    'sglang/srt/layers/quantization/minimax_m3_nvfp4.py': [
        ('MiniMaxM3Nvfp4MoE.process_weights_after_loading',
         'deep_gemm.utils.math.transform_ue4m3_sf_into_required_layout', 2, GEMM),
        ('MiniMaxM3Nvfp4MoE.process_weights_after_loading', 'deep_gemm.transform_weights_for_mega_moe', 1, GEMM),
    ],
    'sglang/srt/layers/quantization/modelopt_quant.py': [
        ('ModelOptNvFp4FusedMoEMethod._build_mega_moe_weights',
         'deep_gemm.utils.math.transform_ue4m3_sf_into_required_layout', 2, GEMM),
        ('ModelOptNvFp4FusedMoEMethod._build_mega_moe_weights', 'deep_gemm.transform_weights_for_mega_moe', 1, GEMM),
    ],
    'sglang/srt/layers/quantization/mxfp4.py': [
        ('Mxfp4MoEMethod.process_weights_after_loading', 'deep_gemm.transform_sf_into_required_layout', 1, GEMM),
        ('Mxfp4MoEMethod.process_weights_after_loading', 'deep_gemm.transform_weights_for_mega_moe', 1, GEMM),
    ],
    _MC + 'deepseek_v4_memory_pool.py': [
        ('DeepSeekV4IndexerPool.set_index_fp4', 'store_fp4_index_k_cache_split', 1, _V4FP4),
        ('DeepSeekV4IndexerPool.set_index_fp4', 'store_fp4_index_k_cache', 1, _V4FP4),
        ('DeepSeekV4IndexerPool.get_index_k_fp4', 'gather_fp4_index_k', 1, _V4FP4),
        ('DeepSeekV4TokenToKVPool.get_low_ratio_index_k_dequant', 'get_index_k_dequant', 1, _V4FP4),
        ('DeepSeekV4TokenToKVPool.get_low_ratio_index_k_fp4', 'get_index_k_fp4', 1, _V4FP4),
        ('DeepSeekV4TokenToKVPool.get_index_k_with_scale_buffer', 'get_index_k_with_scale_buffer', 1, V4_BUFFER),
        ('DeepSeekV4TokenToKVPool.get_index_k_fp4_payload_buffer', 'get_index_k_fp4_payload_buffer', 1, _V4FP4),
        ('DeepSeekV4TokenToKVPool.get_index_k_fp4_scale_buffer', 'get_index_k_fp4_scale_buffer', 1, _V4FP4),
        ('DeepSeekV4TokenToKVPool.get_index_k_scale_buffer', 'get_index_k_scale_buffer', 1, V4_SCALE_GET),
        ('DeepSeekV4TokenToKVPool.set_index_k_scale_buffer', 'set_index_k_scale_buffer', 1, V4_SCALE_SET),
        ('DeepSeekV4TokenToKVPool.set_index_k_fused', 'set_index_fused', 1, V4_FUSED_SET),
        ('DeepSeekV4TokenToKVPool.set_index_k_fp4', 'set_index_fp4', 1, _V4FP4),
    ],
    _MC + 'dsa_cache_layer_split.py': [
        ('LayerSplitIndexKeyCache.store_quantized', 'store_quantized', 1, LAYER_SPLIT),
    ],
    _MC + 'kv_cache_configurator.py': [
        ('KVCacheConfigurator._build_ascend_mla_kv_pool', '_should_elide_dsa_index_k', 1, NPU),
        ('KVCacheConfigurator._build_dsa_kv_pool', '_should_elide_dsa_index_k', 1, ELIDE),
    ],
    _MC + 'memory_pool.py': [
        ('HybridLinearKVPool.set_index_k_scale_buffer', 'set_index_k_scale_buffer', 1, _DELEGATE),
        ('HybridLinearKVPool.get_index_k_with_scale_buffer', 'get_index_k_with_scale_buffer', 1, _DELEGATE),
        ('HybridLinearKVPool.get_broadcastable_index_k_with_scale_buffer',
         'get_index_k_with_scale_buffer', 1, _DELEGATE),
        ('HybridLinearKVPool.get_index_k_scale_buffer', 'get_index_k_scale_buffer', 1, _DELEGATE),
        ('HybridLinearKVPool.kpool_decode_update_index_cache', 'kpool_decode_update_index_cache', 1, _KPOOL),
        ('DSATokenToKVPool.__init__', '_create_index_key_cache', 1, CREATE_IKC),
        ('DSATokenToKVPool.kpool_decode_update_index_cache', 'get_index_k_with_scale_buffer', 1, _KPOOL),
        ('DSATokenToKVPool.get_index_k_scale_buffer', 'get_k_and_scale', 1, GET_K_AND_SCALE),
        ('DSATokenToKVPool.set_index_k_scale_buffer', 'store_quantized', 1, STORE_QUANTIZED),
        ('MiniMaxSparseKVPool.__init__', 'index_kv_pool_cls', 1, OTHER_MODEL),
        ('MiniMaxSparseKVPool.__init__', 'index_k_pool_cls', 1, OTHER_MODEL),
        ('MiniMaxSparseKVPool.set_fused_kv_index_buffer', 'get_index_k_buffer', 1, OTHER_MODEL),
        ('MiniMaxSparseKVPool.set_fused_kv_index_buffer', 'get_index_kv_buffer', 1, OTHER_MODEL),
        ('MiniMaxSparseKVPool.set_fused_kv_index_buffer', 'set_index_k_buffer', 1, OTHER_MODEL),
        ('MiniMaxSparseKVPool.set_fused_kv_index_buffer', 'set_index_kv_buffer', 1, OTHER_MODEL),
    ],
    _MC + 'minimax_m3_nvfp4_pool.py': [
        ('MiniMaxM3Nvfp4KVPool.get_main_k_scale_buffer', 'get_k_scale_buffer', 1, OTHER_MODEL),
        ('MiniMaxM3Nvfp4KVPool.set_fused_kv_index_buffer', 'set_index_k_buffer', 1, OTHER_MODEL),
    ],
    _MC + 'page_interleave_pool.py': [
        ('_PageInterleaveIndexKeyCache.get_k_and_scale', 'get_k_and_scale', 1, INTERLEAVE),
    ],
    _MC + 'qsa_kv_pool.py': [
        ('QSATokenToKVPool.qsa_bytes_per_token', '_index_k_bytes', 1, OTHER_MODEL),
    ],
    _MC + 'storage/npu_memcache/npu_memcache_store.py': [
        ('NpuMemcacheStore._mla_key_multiplier', '_mla_has_index_k', 1, NPU),
        ('NpuMemcacheStore._get_mla_buffer_meta', '_mla_has_index_k', 1, NPU),
        ('NpuMemcacheStore.batch_exists', '_mla_has_index_k', 1, NPU),
    ],
    _MC + 'swa_memory_pool.py': [
        ('SWAKVPool.get_index_k_with_scale_buffer', 'get_index_k_with_scale_buffer', 1, _DELEGATE),
        ('SWAKVPool.get_index_k_scale_buffer', 'get_index_k_scale_buffer', 1, _DELEGATE),
        ('SWAKVPool.set_index_k_scale_buffer', 'set_index_k_scale_buffer', 1, _DELEGATE),
    ],
    'sglang/srt/model_executor/pool_configurator.py': [
        ('DefaultPoolConfigurator._compute_dsa_indexer_cell_size', '_should_elide_dsa_index_k', 1, ELIDE_ACCOUNTING),
    ],
    'sglang/srt/models/deepseek_v4.py': [
        ('_fp8_wo_a_einsum', 'deep_gemm.fp8_einsum', 1, GEMM),
        ('DeepseekV4DecoderLayerBase.refresh_mhc_norm_weight_cache', 'deep_gemm', 1, GEMM),
        ('DeepseekV4ForCausalLM._setup_fp8_wo_a_scales', 'deep_gemm.transform_sf_into_required_layout', 1, GEMM),
    ],
    'sglang/srt/models/dots3_common/dots_omni_vision.py': [
        ('_per_block_cast_to_fp8_padded', 'deep_gemm.per_block_cast_to_fp8', 2, GEMM),
    ],
    'sglang/srt/models/dots3_common/modeling.py': [
        ('Dots3AttentionMLA._absorbed_bmm', 'deep_gemm.fp8_einsum', 1, GEMM),
    ],
    'sglang/srt/models/kimi_k3.py': [
        ('KimiK3MoE._forward_mega_experts', 'deep_gemm', 1, GEMM),
        ('KimiK3MoE._forward_mega_experts', 'deep_gemm.fp8_fp4_mega_moe', 1, GEMM),
    ],
    'sglang/srt/models/minimax_m3.py': [
        ('MiniMaxM3Attention._index_qk_norm', 'index_k_norm', 1, OTHER_MODEL),
        ('MiniMaxM3Attention._aiter_sparse_qknorm_cache', 'get_index_k_buffer', 1, OTHER_MODEL),
        ('MiniMaxM3Attention._sparse_qk_index_norm_rope_cache', 'get_index_k_buffer', 1, OTHER_MODEL),
    ],
}

