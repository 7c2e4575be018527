"""The plugin's contract with SGLang as data: every symbol it replaces, wraps or relies
on (`PatchPoint`), per model family (`FAMILY_POINTS`; adding a family is one more tuple).
contract.py checks them; contract_sites.py holds the callers and layout constants."""

from __future__ import annotations

from dataclasses import dataclass

_DSA = "sglang.srt.layers.attention.dsa"
_DSV4 = "sglang.srt.layers.attention.dsv4"


@dataclass(frozen=True)
class PatchPoint:
    """One symbol the plugin touches.

    module: dotted module path; qualname: `func` or `Class.method`;
    params: the expected parameter names in order (None: only existence is checked);
    references: names (identifiers or attribute names) the body must mention;
    action: what the plugin does with it ("replace", "wrap", "uses");
    when: "always" or "bf16" (only needed with bf16 index keys);
    why: one line for docs and error messages.
    """

    module: str
    qualname: str
    params: tuple[str, ...] | None
    action: str
    when: str
    why: str
    references: tuple[str, ...] = ()

    @property
    def target(self) -> str:
        return f"{self.module}.{self.qualname}"


# Points per model family: adding a family is one more tuple in FAMILY_POINTS.
SERVER_POINTS: tuple[PatchPoint, ...] = (
    # -- plugin loading: SGLang runs entry-point plugins in every process it spawns.
    PatchPoint("sglang.srt.plugins", "load_plugins", (), "uses", "always",
               "SGLang's entry-point plugin loader (group sglang.srt.plugins)",
               ("load_plugins_by_group", "GENERAL_PLUGINS_GROUP")),
    PatchPoint("sglang.srt.managers.scheduler", "run_scheduler_process",
               ("server_args", "port_args", "gpu_id", "tp_rank", "pp_rank", "dp_rank",
                "pipe_writer", "display_tp_rank", "display_dp_rank", "display_moe_ep_rank"),
               "uses", "always", "scheduler (model) processes load plugins before the model",
               ("load_plugins",)),
    # -- attestation: /server_info carries each DP scheduler's internal state.
    PatchPoint("sglang.srt.managers.scheduler_components.internal_state",
               "SchedulerInternalStateController.get_internal_state", ("self", "recv_req"), "wrap", "always",
               "/server_info internal_states: niah adds its attestation (niah_attestation)",
               ("GetInternalStateReqOutput", "msgspec_to_builtins")),
    PatchPoint("sglang.srt.entrypoints.http_server", "server_info", None, "uses", "always",
               "/server_info returns the schedulers' internal states", ("internal_states", "get_internal_state")),
    # -- top-k: SGLang's own in every arm (fused topk_v2 by default), each call counted.
    PatchPoint(f"{_DSA}.dsa_topk_backend", "DSATopKBackend.topk_transform",
               ("self", "logits", "lengths", "topk", "topk_transform_method", "attn_metadata",
                "cu_seqlens_q_topk", "topk_indices_offset", "row_starts", "batch_idx_list", "force_unfused_topk"),
               "wrap", "always", "every DSA top-k goes through it (SGLANG_DSA_FUSE_TOPK: topk_v2); niah counts calls",
               ("SGLANG_DSA_FUSE_TOPK", "topk_func", "should_use_topk_v2")),
)

V32_POINTS: tuple[PatchPoint, ...] = (
    # -- DeepSeek-V3.2 (DSA): kernel resolvers (decode paged logits, prefill ragged logits).
    PatchPoint(f"{_DSA}.utils", "resolve_fp8_paged_mqa_logits_fn", (), "replace", "always",
               "picks DeepGEMM fp8_paged_mqa_logits or the torch fallback; niah returns its kernel "
               "(stock: counted, unchanged)",
               ("_use_torch_mqa_logits", "fp8_paged_mqa_logits")),
    PatchPoint(f"{_DSA}.utils", "resolve_fp8_mqa_logits_fn", (), "replace", "always",
               "picks DeepGEMM fp8_mqa_logits (prefill); niah returns its kernel (stock: counted, unchanged)",
               ("_use_torch_mqa_logits", "fp8_mqa_logits")),
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
                "is_target_verify", "is_draft_extend_v2")),
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer._store_index_k_cache",
               ("self", "forward_batch", "layer_id", "key", "act_quant", "out_cache_loc"),
               "replace", "always", "stores keys SGLang computed (fusion off, CP prefill): fp8 quantise, counted; "
               "bf16: niah stores them unquantised",
               ("get_token_to_kv_pool", "set_index_k_scale_buffer", "_index_k_write_targets")),
    # -- the fused (production) path: K written by fused_k_indexer_norm_rope_store, no rotation.
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer._fused_k_prepare_and_store",
               ("self", "key_raw", "positions", "forward_batch", "layer_id", "act_quant", "out_cache_loc"),
               "replace", "always",
               "LayerNorm + RoPE + fp8 store in one JIT kernel (counted); bf16: niah.kernels.store_v32_index_keys, "
               "same norm and RoPE, a bf16 row",
               ("get_token_to_kv_pool", "_index_k_write_targets", "fused_k_indexer_norm_rope_store", "k_norm",
                "variance_epsilon", "_indexer_cos_sin_cache", "index_page_size", "invalidate_index_buffer_for_layer",
                "_is_layer_owned")),
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
               ("index_head_dim", "quant_block_size")),
    PatchPoint("sglang.srt.mem_cache.index_key_cache", "IndexKeyCache.get_k_and_scale",
               ("self", "layer_id", "seq_len_tensor", "page_indices", "seq_len_sum", "max_seq_len"),
               "replace", "bf16", "gathers fp8 keys + scales for prefill; niah gathers bf16 keys"),
    PatchPoint("sglang.srt.mem_cache.index_key_cache", "IndexKeyCache.store_quantized",
               ("self", "layer_id", "loc", "index_k", "index_k_scale"), "replace", "bf16",
               "fp8 writes into a bf16 cache would corrupt it; niah refuses them"),
    PatchPoint("sglang.srt.mem_cache.index_key_cache", "IndexKeyCache.move",
               ("self", "tgt_loc", "src_loc"), "replace", "bf16",
               "moves keys then scales; niah moves 256-byte bf16 keys"),
    PatchPoint("sglang.srt.mem_cache.index_key_cache", "IndexKeyCache._kernel_view",
               ("self", "buffer"), "uses", "bf16", "the per-page view the kernels get"),
    PatchPoint("sglang.srt.model_executor.pool_configurator",
               "DefaultPoolConfigurator._compute_dsa_indexer_cell_size",
               ("self", "kvc", "num_layers", "allocate_all_layers"), "wrap", "bf16",
               "per-token accounting: (128 + 4) bytes x layers; niah makes it 256 x layers",
               ("quant_block_size", "index_k_with_scale_buffer_dtype")),
)

_POOL = "sglang.srt.mem_cache.deepseek_v4_memory_pool"
_MIX = f"{_DSV4}.compressor_v2.CompressorBackendMixin"
_IDX = f"{_DSV4}.indexer.C4IndexerBackendMixin"


def _v4(target: str, params, action: str, why: str, references=()) -> PatchPoint:
    """A DeepSeek-V4 point needed with bf16 index keys (target split at its class)."""
    for anchor in ("CompressorBackendMixin", "C4IndexerBackendMixin", "DeepSeekV4IndexerPool",
                   "DeepSeekV4TokenToKVPool", "MQALayer"):
        if f".{anchor}" in target:
            head, tail = target.split(f".{anchor}", 1)
            return PatchPoint(head, anchor + tail, params, action, "bf16", why, tuple(references))
    head, _, name = target.rpartition(".")
    return PatchPoint(head, name, params, action, "bf16", why, tuple(references))


# DeepSeek-V4 (C4 indexer). niah arms: the logits functions forward_c4_indexer picks at call
# time (DeepGEMM's, routed by the plugin outside SGLang; the torch fallbacks).
# bf16: every writer and reader of the indexer pool, callers included (contract_sites.py
# lists the call sites): patched, refused (replaced by a function that raises one line and
# attests the fp8 path), or relied on ("uses", with the names its body must still mention).
V4_POINTS: tuple[PatchPoint, ...] = (
    PatchPoint(f"{_DSV4}.indexer", "fp8_paged_mqa_logits_torch",
               ("q_fp8", "kvcache_fp8", "weight", "seq_lens", "page_table",
                "deep_gemm_metadata", "max_seq_len", "clean_logits"),
               "replace", "niah", "V4 paged logits with SGLANG_FP8_PAGED_MQA_LOGITS_TORCH (set by the user) "
               "-> niah's kernels (fp8 or bf16 pages)"),
    PatchPoint(f"{_DSV4}.indexer", "fp8_paged_mqa_logits_torch_sm120",
               ("q_fp8", "kvcache_fp8", "weight", "seq_lens", "page_table",
                "deep_gemm_metadata", "max_seq_len", "clean_logits"),
               "replace", "niah", "the same fallback on SM120"),
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
               "functions to niah's kernels"),
    # -- the write: compressor -> compress_norm_rope_store -> fused_norm_rope_indexer (fp8 only)
    _v4(f"{_DSV4}.compressor_v2.compress_norm_rope_store", None, "wrap",
        "the name _forward_compress_all_in_one calls; indexer rows go to niah's bf16 store"),
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
        "index_head_dim + 4 bytes (132); niah makes it 264 (a bf16 page is [64 x 132] bf16)"),
    _v4("sglang.srt.model_executor.pool_configurator.get_dsv4_indexer_bytes_per_token", None, "uses",
        "imported by name into the pool configurator (rebound with the original)"),
    _v4(f"{_POOL}.DeepSeekV4IndexerPool._create_buffer", ("self",), "wrap",
        "allocates uint8 (pages, page * bytes_per_token); niah views it as bf16",
        ("get_bytes_per_token", "index_k_with_scale_buffer", "index_k_with_scale_buffer_dtype",
        "uses_aiter_fp4_layout")),
    _v4(f"{_POOL}.DeepSeekV4IndexerPool.get_bytes_per_token", ("self",), "uses",
        "per-token bytes come from get_dsv4_indexer_bytes_per_token", ("get_dsv4_indexer_bytes_per_token",)),
    _v4(f"{_POOL}.DeepSeekV4IndexerPool.get_index_k_with_scale_buffer", ("self", "layer_id"), "uses",
        "returns the layer buffer as allocated", ("index_k_with_scale_buffer",)),
    _v4(f"{_POOL}.DeepSeekV4IndexerPool.set_index_k_scale_buffer",
        ("self", "layer_id", "loc", "index_k", "index_k_scale"), "replace", "fp8 key + scale write; niah refuses"),
    _v4(f"{_POOL}.DeepSeekV4IndexerPool.set_index_fused", ("self", "layer_id", "loc", "cache_k"), "replace",
        "fused fp8 indexer store; niah refuses"),
    _v4(f"{_POOL}.DeepSeekV4IndexerPool.set_index_fp4", ("self", "layer_id", "loc", "cache_k"), "replace",
        "fp4 indexer store; niah refuses"),
    _v4(f"{_POOL}.DeepSeekV4IndexerPool.get_index_k_scale_buffer",
        ("self", "layer_id", "seq_len_tensor", "page_indices", "seq_len_sum", "max_seq_len"), "replace",
        "fp8 key + scale gather (GetKAndS); niah gathers bf16 keys", ("index_k_with_scale_buffer",)),
    _v4(f"{_POOL}.DeepSeekV4TokenToKVPool._make_indexer_pool",
        ("self", "size", "page_size", "dtype", "index_head_dim", "layer_num", "device", "enable_memory_saver",
        "force_fp4", "global_page_size", "index_k_page8"), "uses",
        "builds DeepSeekV4IndexerPool (force_fp4 pools are refused by _create_buffer)",
        ("DeepSeekV4IndexerPool", "force_fp4")),
    _v4(f"{_POOL}.DeepSeekV4TokenToKVPool.get_index_k_with_scale_buffer", ("self", "layer_id"), "uses",
        "the accessor forward_unified and forward_c4_indexer call", ("_indexer_pool",)),
)

FAMILY_POINTS = {"server": SERVER_POINTS, "deepseek-v3.2": V32_POINTS, "deepseek-v4": V4_POINTS}
PATCH_POINTS: tuple[PatchPoint, ...] = tuple(p for pts in FAMILY_POINTS.values() for p in pts)


def points_for(index_dtype: str, kernels: str | None = None) -> tuple[PatchPoint, ...]:
    """The patch points needed for one arm: index dtype "fp8" / "bf16", kernels "stock" /
    "niah" (None: both kernels)."""
    wanted = {"always", index_dtype, *((kernels,) if kernels else ("stock", "niah"))}
    return tuple(p for p in PATCH_POINTS if p.when in wanted)
