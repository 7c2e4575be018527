"""DeepSeek-V4 (C4 indexer): niah arms read pages through niah's kernels on the path SGLang
picks (DeepGEMM's functions are routed to niah's where the V4 pool is built, see
v4.route_deep_gemm); bf16 keys are stored by niah's V4 store kernel into bf16-sized pools
and gathered as bf16 for the non-paged prefill; every other fp8 path is refused. One row per
symbol, with what the plugin installs there per arm.

The rows are SGLang 0.5.23's. 0.5.16 has a DeepSeek-V4 path too, but most of these symbols
differ there (no compress_norm_rope_store or get_dsv4_indexer_bytes_per_token, other
signatures of the compressor, the C4 indexer and the pool); niah has not been proven on it,
so on 0.5.16 the niah arms refuse V4 with one line where its pool is built
(v4.refuse_release)."""

from __future__ import annotations

from niah.serving.sglang.patches.point import PatchPoint, for_releases, put, wrap

_DSV4 = "sglang.srt.layers.attention.dsv4"
_POOL = "sglang.srt.mem_cache.deepseek_v4_memory_pool"
_MIX = f"{_DSV4}.compressor_v2.CompressorBackendMixin"
_IDX = f"{_DSV4}.indexer.C4IndexerBackendMixin"


def _v4(target: str, params, action: str, why: str, references=(), replacements=()) -> PatchPoint:
    """A DeepSeek-V4 point needed with bf16 index keys (target split at its class)."""
    for anchor in ("CompressorBackendMixin", "C4IndexerBackendMixin", "DeepSeekV4IndexerPool",
                   "DeepSeekV4TokenToKVPool", "MQALayer"):
        if f".{anchor}" in target:
            head, tail = target.split(f".{anchor}", 1)
            return PatchPoint(head, anchor + tail, params, action, "bf16", why, tuple(references),
                              tuple(replacements))
    head, _, name = target.rpartition(".")
    return PatchPoint(head, name, params, action, "bf16", why, tuple(references), tuple(replacements))


# DeepSeek-V4 (C4 indexer). niah arms: the logits functions forward_c4_indexer picks at call
# time (DeepGEMM's, routed by the plugin outside SGLang; the torch fallbacks).
# bf16: every writer and reader of the indexer pool, callers included (contract_sites.py
# lists the call sites): patched, refused (replaced by a function that raises one line and
# attests the fp8 path), or relied on ("uses", with the names its body must still mention).
_V0523: tuple[PatchPoint, ...] = (
    PatchPoint(f"{_DSV4}.indexer", "fp8_paged_mqa_logits_torch",
               ("q_fp8", "kvcache_fp8", "weight", "seq_lens", "page_table",
                "deep_gemm_metadata", "max_seq_len", "clean_logits"),
               "replace", "niah", "V4 paged logits with SGLANG_FP8_PAGED_MQA_LOGITS_TORCH (set by the user) "
               "-> niah's kernels (fp8 or bf16 pages)",
               replacements=(put("niah", "v4.paged_logits"),)),
    PatchPoint(f"{_DSV4}.indexer", "fp8_paged_mqa_logits_torch_sm120",
               ("q_fp8", "kvcache_fp8", "weight", "seq_lens", "page_table",
                "deep_gemm_metadata", "max_seq_len", "clean_logits"),
               "replace", "niah", "the same fallback on SM120",
               replacements=(put("niah", "v4.paged_logits"),)),
    PatchPoint(f"{_DSV4}.indexer", "C4IndexerBackendMixin.forward_c4_indexer",
               ("self", "x", "q_lora", "c4_indexer", "forward_batch", "alt_streams",
                "enable_multi_stream", "q_lora_ready", "skip_compressor", "q_lora_quant"),
               "uses", "niah",
               "views the layer buffer as (pages, 64, 1, 132); by default imports deep_gemm.fp8_paged_mqa_logits "
               "at call time (niah routes it to its kernels), the torch fallbacks with "
               "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH; the non-paged prefill for long single requests",
               ("get_index_k_with_scale_buffer", "view", "132", "deep_gemm", "fp8_paged_mqa_logits",
                "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "SGLANG_OPT_USE_TILELANG_INDEXER", "SGLANG_OPT_USE_AITER_INDEXER",
                "fp8_paged_mqa_logits_torch", "fp8_paged_mqa_logits_torch_sm120", "_get_nonpaged_indexer_plan",
                "_gather_nonpaged_index_k", "_nonpaged_mqa_logits")),
    PatchPoint(f"{_DSV4}.indexer", "C4IndexerBackendMixin._nonpaged_mqa_logits",
               ("q_indexer", "weights", "kv", "plan", "rows"), "uses", "niah",
               "the non-paged prefill calls deep_gemm.fp8_mqa_logits at call time (niah routes it to its kernels)",
               ("deep_gemm", "fp8_mqa_logits", "max_seqlen_k")),
    PatchPoint(f"{_DSV4}.indexer", "C4IndexerBackendMixin._can_use_nonpaged_indexer",
               ("self", "c4_indexer", "forward_batch", "indexer_metadata"), "uses", "niah",
               "SGLang decides the non-paged prefill (kept on in niah's arms)",
               ("SGLANG_OPT_DSV4_NONPAGED_INDEXER", "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH")),
    PatchPoint(_POOL, "DeepSeekV4TokenToKVPool.__init__", None, "wrap", "niah",
               "refuses, before allocating, ROCm and the TileLang/AITER indexers; routes DeepGEMM's indexer "
               "functions to niah's kernels",
               replacements=(wrap("niah", "v4.wrap_pool_init"),)),
    # -- the write: compressor -> compress_norm_rope_store -> fused_norm_rope_indexer (fp8 only)
    _v4(f"{_DSV4}.compressor_v2.compress_norm_rope_store", None, "wrap",
        "the name _forward_compress_all_in_one calls; indexer rows go to niah's bf16 store",
        replacements=(wrap("bf16", "v4.wrap_compress_norm_rope_store"),)),
    _v4("sglang.kernels.ops.attention.dsv4.compress.compress_norm_rope_store",
        ("kv", "plan", "norm_weight", "norm_eps", "freq_cis", "out_loc", "kvcache", "page_size", "use_fp4",
        "bf16_store", "kvcache_scale", "rope_cache", "fp4_k_write_metadata", "layout", "fp8_2buff",
        "kvcache_rope"), "uses",
        "SGLang's store: complex freqs as view_as_real, plan rows plan[1], is_decode, compress_ratio",
        ("view_as_real", "is_decode", "compress_ratio", "_jit_compress_norm_rope_module")),
    _v4(f"{_MIX}._forward_compress_all_in_one",
        ("self", "kv_score_buffer", "kv_score_input", "ape", "head_dim", "norm", "freqs_cis_cache", "kv_cache",
        "is_indexer", "rotate", "compress_ratio", "page_size", "out_loc", "use_fp4_indexer", "bf16_store",
        "kv_scale_cache", "rope_cache", "kv_layout", "fp8_2buff", "kv_cache_rope"), "uses",
        "compress_forward, then the store by its module-level name",
        ("compress_forward", "compress_norm_rope_store", "variance_epsilon", "weight")),
    _v4(f"{_MIX}.forward_unified", ("self", "x", "forward_batch", "layer_id", "compressor"), "uses",
        "picks the indexer buffer and page size, passes it as uint8 bytes",
        ("get_index_k_with_scale_buffer", "get_index_k_page_size", "_forward_compress_all_in_one",
        "is_in_indexer", "uint8")),
    _v4(f"{_MIX}.forward_indexer_compressor", None, "uses",
        "bound to forward_unified when the class is built (an alias, not a lookup)", ("forward_unified",)),
    _v4(f"{_IDX}._forward_prepare_multi_stream",
        ("self", "x", "q_lora", "c4_indexer", "positions", "forward_batch", "alt_streams", "q_lora_ready"),
        "uses", "caller of the indexer compressor", ("forward_indexer_compressor",)),
    _v4(f"{_IDX}._forward_prepare_normal",
        ("self", "x", "q_lora", "c4_indexer", "positions", "forward_batch", "skip_compressor", "q_lora_quant"),
        "uses", "caller of the indexer compressor", ("forward_indexer_compressor",)),
    _v4("sglang.srt.models.deepseek_v4.MQALayer._forward_prepare",
        ("self", "x", "positions", "forward_batch", "attn_backend", "q_out", "x_quant", "q_rope_out",
        "k_nope_out", "k_rope_out"), "uses", "caller of the indexer compressor",
        ("forward_indexer_compressor",)),
    # -- the read (bf16): the non-paged prefill gathers bf16 keys
    _v4(f"{_IDX}._gather_nonpaged_index_k", ("c4_indexer", "token_to_kv_pool", "plan"), "uses",
        "gathers keys + scales for the non-paged path through the pool (niah gathers bf16 keys)",
        ("get_index_k_scale_buffer", "FP8_DTYPE", "float32")),
    _v4(f"{_POOL}.DeepSeekV4TokenToKVPool.get_index_k_scale_buffer",
        ("self", "layer_id", "seq_len_tensor", "page_indices", "seq_len_sum", "max_seq_len"), "uses",
        "delegates to the layer's indexer pool", ("_indexer_pool", "get_index_k_scale_buffer")),
    # -- the pool: sizing, allocation, every other reader/writer
    _v4(f"{_POOL}.get_dsv4_indexer_bytes_per_token", ("index_head_dim", "use_fp4_indexer"), "wrap",
        "index_head_dim + 4 bytes (132); niah makes it 264 (a bf16 page is [64 x 132] bf16)",
        replacements=(wrap("bf16", "v4.wrap_bytes_per_token"),)),
    _v4("sglang.srt.model_executor.pool_configurator.get_dsv4_indexer_bytes_per_token", None, "uses",
        "imported by name into the pool configurator (rebound with the original)"),
    _v4(f"{_POOL}.DeepSeekV4IndexerPool._create_buffer", ("self",), "wrap",
        "allocates uint8 (pages, page * bytes_per_token); niah views it as bf16",
        ("get_bytes_per_token", "index_k_with_scale_buffer", "index_k_with_scale_buffer_dtype",
        "uses_aiter_fp4_layout"),
        replacements=(wrap("bf16", "v4.wrap_create_buffer"),)),
    _v4(f"{_POOL}.DeepSeekV4IndexerPool.get_bytes_per_token", ("self",), "uses",
        "per-token bytes come from get_dsv4_indexer_bytes_per_token", ("get_dsv4_indexer_bytes_per_token",)),
    _v4(f"{_POOL}.DeepSeekV4IndexerPool.get_index_k_with_scale_buffer", ("self", "layer_id"), "uses",
        "returns the layer buffer as allocated", ("index_k_with_scale_buffer",)),
    _v4(f"{_POOL}.DeepSeekV4IndexerPool.set_index_k_scale_buffer",
        ("self", "layer_id", "loc", "index_k", "index_k_scale"), "replace", "fp8 key + scale write; niah refuses",
        replacements=(put("bf16", "v4.refuse_set_index_k_scale_buffer"),)),
    _v4(f"{_POOL}.DeepSeekV4IndexerPool.set_index_fused", ("self", "layer_id", "loc", "cache_k"), "replace",
        "fused fp8 indexer store; niah refuses",
        replacements=(put("bf16", "v4.refuse_set_index_fused"),)),
    _v4(f"{_POOL}.DeepSeekV4IndexerPool.set_index_fp4", ("self", "layer_id", "loc", "cache_k"), "replace",
        "fp4 indexer store; niah refuses",
        replacements=(put("bf16", "v4.refuse_set_index_fp4"),)),
    _v4(f"{_POOL}.DeepSeekV4IndexerPool.get_index_k_scale_buffer",
        ("self", "layer_id", "seq_len_tensor", "page_indices", "seq_len_sum", "max_seq_len"), "replace",
        "fp8 key + scale gather (GetKAndS); niah gathers bf16 keys", ("index_k_with_scale_buffer",),
        replacements=(put("bf16", "v4.gather_bf16_index_k"),)),
    _v4(f"{_POOL}.DeepSeekV4TokenToKVPool._make_indexer_pool",
        ("self", "size", "page_size", "dtype", "index_head_dim", "layer_num", "device", "enable_memory_saver",
        "force_fp4", "global_page_size", "index_k_page8"), "uses",
        "builds DeepSeekV4IndexerPool (force_fp4 pools are refused by _create_buffer)",
        ("DeepSeekV4IndexerPool", "force_fp4")),
    _v4(f"{_POOL}.DeepSeekV4TokenToKVPool.get_index_k_with_scale_buffer", ("self", "layer_id"), "uses",
        "the accessor forward_unified and forward_c4_indexer call", ("_indexer_pool",)),
)

_POOL_INIT = next(p for p in _V0523 if p.qualname == "DeepSeekV4TokenToKVPool.__init__")
V4_POINTS: tuple[PatchPoint, ...] = (
    *(for_releases(("0.5.23",), p) for p in _V0523),
    for_releases(("0.5.16",), _POOL_INIT, params=None, action="replace", references=(),
                 why="the V4 pool: niah arms refuse DeepSeek-V4 on this release with one line (not proven on it)",
                 replacements=(put("niah", "v4.refuse_release"),)),
)
