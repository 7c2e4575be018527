"""The plugin's DeepSeek-V4 patch points (bf16 index keys), callers included.

Registered into contract.PATCH_POINTS. Every writer and reader of the C4 indexer pool in
SGLang 0.5.23 is here: patched ("replace"/"wrap"; a refused path is replaced by a function
that raises with one line, "niah refuses" in its reason), or relied on ("uses", with the names its body must still mention, so a new
call or a changed row layout fails `niah doctor`). Paths not listed and why they cannot run:
- deepseek_v4_backend `_low_ratio_compress_fused` / `_low_ratio_write_group` (V4.1 low-ratio
  layers) write fp4 indexer pools, which `_make_indexer_pool(force_fp4=True)` refuses;
- the HIP/aiter fp4 indexer (`MQALayer._forward_prepare_multi_stream_hip`, aiter reads):
  ROCm is refused at launch and in the pool;
- `compressor_trtllm.forward_compress_uniform_fp8`: only for non-indexer compressors.
"""

from __future__ import annotations

from niah.serving.sglang.contract import PatchPoint

_DSV4 = "sglang.srt.layers.attention.dsv4"
_POOL = "sglang.srt.mem_cache.deepseek_v4_memory_pool"
_MIX = f"{_DSV4}.compressor_v2.CompressorBackendMixin"
_IDX = f"{_DSV4}.indexer.C4IndexerBackendMixin"


def _p(target: str, params, action: str, why: str, references=()) -> PatchPoint:
    module, qualname = _split(target)
    return PatchPoint(module, qualname, params, action, "bf16", why, tuple(references))


def _split(target: str) -> tuple[str, str]:
    for anchor in ("CompressorBackendMixin", "C4IndexerBackendMixin", "DeepSeekV4IndexerPool",
                   "DeepSeekV4TokenToKVPool", "MQALayer", "DefaultPoolConfigurator"):
        if f".{anchor}" in target:
            head, tail = target.split(f".{anchor}", 1)
            return head, anchor + tail
    head, _, name = target.rpartition(".")
    return head, name


V4_PATCH_POINTS: tuple[PatchPoint, ...] = (
    # -- the write: compressor -> compress_norm_rope_store -> fused_norm_rope_indexer (fp8 only)
    _p(f"{_DSV4}.compressor_v2.compress_norm_rope_store", None, "wrap",
       "the name _forward_compress_all_in_one calls; indexer rows go to niah's bf16 store"),
    _p("sglang.kernels.ops.attention.dsv4.compress.compress_norm_rope_store",
       ("kv", "plan", "norm_weight", "norm_eps", "freq_cis", "out_loc", "kvcache", "page_size", "use_fp4",
        "bf16_store", "kvcache_scale", "rope_cache", "fp4_k_write_metadata", "layout", "fp8_2buff",
        "kvcache_rope"), "uses",
       "SGLang's store: complex freqs as view_as_real, plan rows plan[1], is_decode, compress_ratio",
       ("view_as_real", "is_decode", "compress_ratio", "_jit_compress_norm_rope_module")),
    _p(f"{_MIX}._forward_compress_all_in_one",
       ("self", "kv_score_buffer", "kv_score_input", "ape", "head_dim", "norm", "freqs_cis_cache", "kv_cache",
        "is_indexer", "rotate", "compress_ratio", "page_size", "out_loc", "use_fp4_indexer", "bf16_store",
        "kv_scale_cache", "rope_cache", "kv_layout", "fp8_2buff", "kv_cache_rope"), "uses",
       "compress_forward, then the store by its module-level name",
       ("compress_forward", "compress_norm_rope_store", "variance_epsilon", "weight")),
    _p(f"{_MIX}.forward_unified", ("self", "x", "forward_batch", "layer_id", "compressor"), "uses",
       "picks the indexer buffer and page size, passes it as uint8 bytes",
       ("get_index_k_with_scale_buffer", "get_index_k_page_size", "_forward_compress_all_in_one",
        "is_in_indexer", "uint8")),
    _p(f"{_MIX}.forward_indexer_compressor", None, "uses",
       "bound to forward_unified when the class is built (an alias, not a lookup)", ("forward_unified",)),
    _p(f"{_IDX}._forward_prepare_multi_stream",
       ("self", "x", "q_lora", "c4_indexer", "positions", "forward_batch", "alt_streams", "q_lora_ready"),
       "uses", "caller of the indexer compressor", ("forward_indexer_compressor",)),
    _p(f"{_IDX}._forward_prepare_normal",
       ("self", "x", "q_lora", "c4_indexer", "positions", "forward_batch", "skip_compressor", "q_lora_quant"),
       "uses", "caller of the indexer compressor", ("forward_indexer_compressor",)),
    _p("sglang.srt.models.deepseek_v4.MQALayer._forward_prepare",
       ("self", "x", "positions", "forward_batch", "attn_backend", "q_out", "x_quant", "q_rope_out",
        "k_nope_out", "k_rope_out"), "uses", "caller of the indexer compressor",
       ("forward_indexer_compressor",)),
    # -- the read: forward_c4_indexer's paged view and kernel choice
    _p(f"{_IDX}.forward_c4_indexer",
       ("self", "x", "q_lora", "c4_indexer", "forward_batch", "alt_streams", "enable_multi_stream",
        "q_lora_ready", "skip_compressor", "q_lora_quant"), "uses",
       "views the layer buffer as (pages, 64, 1, 132) and calls the paged function niah replaces",
       ("get_index_k_with_scale_buffer", "view", "132", "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH",
        "SGLANG_OPT_USE_TILELANG_INDEXER", "SGLANG_OPT_USE_AITER_INDEXER", "fp8_paged_mqa_logits_torch",
        "_get_nonpaged_indexer_plan", "_gather_nonpaged_index_k", "_nonpaged_mqa_logits")),
    _p(f"{_IDX}._can_use_nonpaged_indexer", ("self", "c4_indexer", "forward_batch", "indexer_metadata"),
       "replace", "routes prefill to DeepGEMM fp8_mqa_logits; niah answers False"),
    _p(f"{_IDX}._nonpaged_mqa_logits", ("q_indexer", "weights", "kv", "plan", "rows"), "replace",
       "DeepGEMM fp8_mqa_logits called directly, around the resolvers; niah refuses", ("deep_gemm", "fp8_mqa_logits")),
    _p(f"{_IDX}._gather_nonpaged_index_k", ("c4_indexer", "token_to_kv_pool", "plan"), "replace",
       "gathers fp8 keys + scales for the non-paged path; niah refuses", ("get_index_k_scale_buffer",)),
    # -- the pool: sizing, allocation, every other reader/writer
    _p(f"{_POOL}.get_dsv4_indexer_bytes_per_token", ("index_head_dim", "use_fp4_indexer"), "wrap",
       "index_head_dim + 4 bytes (132); niah makes it 264 (a bf16 page is [64 x 132] bf16)"),
    _p("sglang.srt.model_executor.pool_configurator.get_dsv4_indexer_bytes_per_token", None, "uses",
       "imported by name into the pool configurator (rebound with the original)"),
    _p(f"{_POOL}.DeepSeekV4IndexerPool._create_buffer", ("self",), "wrap",
       "allocates uint8 (pages, page * bytes_per_token); niah views it as bf16",
       ("get_bytes_per_token", "index_k_with_scale_buffer", "index_k_with_scale_buffer_dtype",
        "uses_aiter_fp4_layout")),
    _p(f"{_POOL}.DeepSeekV4IndexerPool.get_bytes_per_token", ("self",), "uses",
       "per-token bytes come from get_dsv4_indexer_bytes_per_token", ("get_dsv4_indexer_bytes_per_token",)),
    _p(f"{_POOL}.DeepSeekV4IndexerPool.get_index_k_with_scale_buffer", ("self", "layer_id"), "uses",
       "returns the layer buffer as allocated", ("index_k_with_scale_buffer",)),
    _p(f"{_POOL}.DeepSeekV4IndexerPool.set_index_k_scale_buffer",
       ("self", "layer_id", "loc", "index_k", "index_k_scale"), "replace", "fp8 key + scale write; niah refuses"),
    _p(f"{_POOL}.DeepSeekV4IndexerPool.set_index_fused", ("self", "layer_id", "loc", "cache_k"), "replace",
       "fused fp8 indexer store; niah refuses"),
    _p(f"{_POOL}.DeepSeekV4IndexerPool.set_index_fp4", ("self", "layer_id", "loc", "cache_k"), "replace",
       "fp4 indexer store; niah refuses"),
    _p(f"{_POOL}.DeepSeekV4IndexerPool.get_index_k_scale_buffer",
       ("self", "layer_id", "seq_len_tensor", "page_indices", "seq_len_sum", "max_seq_len"), "replace",
       "fp8 key + scale gather; niah refuses"),
    _p(f"{_POOL}.DeepSeekV4TokenToKVPool._make_indexer_pool",
       ("self", "size", "page_size", "dtype", "index_head_dim", "layer_num", "device", "enable_memory_saver",
        "force_fp4", "global_page_size", "index_k_page8"), "uses",
       "builds DeepSeekV4IndexerPool (force_fp4 pools are refused by _create_buffer)",
       ("DeepSeekV4IndexerPool", "force_fp4")),
    _p(f"{_POOL}.DeepSeekV4TokenToKVPool.get_index_k_with_scale_buffer", ("self", "layer_id"), "uses",
       "the accessor forward_unified and forward_c4_indexer call", ("_indexer_pool",)),
    _p("sglang.srt.runtime_context.get_server_args", (), "uses",
       "the pool checks HiCache, HiSparse, MTP and the fp4 indexer from the server arguments"),
)
