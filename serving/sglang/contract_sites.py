"""The contract's second half: callers and layout constants, checked in SGLang's source.

- `CALL_SITES`: every place in SGLang 0.5.23 that reads or writes the index-key pool or
  calls a DeepGEMM/torch indexer kernel (the callees in `WATCHED`), keyed by file,
  enclosing function and callee, with what niah does about it: "patched" (the call goes
  through something the plugin replaces or wraps), "refused" (niah refuses the setting
  that reaches it, before weights load) or "unreachable" (with the reason). A new call
  site, e.g. a direct `deep_gemm.fp8_paged_mqa_logits` next to a resolver call, is a
  break naming its file and line.
- `LAYOUT`: the constants the plugin relies on (132-byte fp8 rows = 128 values + one
  4-byte scale, quant block 128, 64-token pages, uint8 container), as the source text
  that must still say them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

WATCHED = frozenset({
    # indexer logits kernels (DeepGEMM, SGLang's torch fallbacks) and their resolvers
    "fp8_paged_mqa_logits", "fp8_mqa_logits", "fp8_paged_mqa_logits_torch", "fp8_paged_mqa_logits_torch_sm120",
    "_fp8_paged_mqa_logits_torch", "_fp8_mqa_logits_torch", "resolve_fp8_paged_mqa_logits_fn",
    "resolve_fp8_mqa_logits_fn",
    # index-key pool reads and writes
    "get_index_k_with_scale_buffer", "get_index_k_scale_buffer", "set_index_k_scale_buffer", "get_k_and_scale",
    "store_quantized", "fused_store_index_k_cache", "_store_index_k_cache",
})

_D = "sglang/srt/layers/attention/dsa/"
_V4FP4 = ("refused with bf16 keys: V4.1 low-ratio layers and the V4.1 indexer use fp4 index pools, which "
          "DeepSeekV4IndexerPool._create_buffer refuses (and --enable-deepseek-v4-fp4-indexer is refused at "
          "launch); fp8 arms: SGLang's own fp4 path, no niah kernel")
_V4POOL = "sglang/srt/mem_cache/deepseek_v4_memory_pool.py"
_V4IDX = "sglang/srt/layers/attention/dsv4/indexer.py"
_V4NONPAGED = ("patched: the non-paged prefill stays on; niah arms route deep_gemm.fp8_mqa_logits to niah's "
               "kernels (v4.route_deep_gemm), and with bf16 keys DeepSeekV4IndexerPool.get_index_k_scale_buffer "
               "gathers bf16 keys")
_KPOOL = "refused: IndexerKPool serves index_kpool > 1, refused at launch for niah's arms"
_FUSED = ("patched: reached only from Indexer._fused_k_prepare_and_store and Indexer._store_index_k_cache, "
          "both replaced with bf16 keys (niah's stores get the buffer); fp8 arms: SGLang's own fp8 store")
_FP8_STORE = ("patched: SGLang's fp8 store kernel, reached only from Indexer._store_index_k_cache (replaced with "
              "bf16 keys; counted in fp8 arms)")
_DELEGATE = "patched: the wrapper pool delegates to DSATokenToKVPool, whose IndexKeyCache niah patches"

# (file, enclosing qualname, callee) -> disposition
CALL_SITES: dict[tuple[str, str, str], str] = {
    ("sglang/kernels/ops/kvcache/dsa_fused_store_index_cache.py", "fused_store_index_k_cache",
     "fused_store_index_k_cache"): _FP8_STORE,
    (_D + "dsa_indexer.py", "Indexer._aiter_fused_fp8_prepare_and_store", "get_index_k_with_scale_buffer"):
        "unreachable: ROCm aiter path; niah's arms run on CUDA",
    (_D + "dsa_indexer.py", "Indexer._forward_cuda_k_only", "_store_index_k_cache"): "patched: Indexer._store_index_k_cache",
    (_D + "dsa_indexer.py", "Indexer._fused_k_prepare_and_store", "_store_index_k_cache"):
        "patched: the fallback of Indexer._fused_k_prepare_and_store, which niah replaces whole with bf16 keys",
    (_D + "dsa_indexer.py", "Indexer._get_index_k_read_buffer", "get_index_k_with_scale_buffer"):
        "patched: read by Indexer._get_topk_paged, replaced for bf16",
    (_D + "dsa_indexer.py", "Indexer._get_topk_paged._chunked_fp8_paged_mqa_logits", "resolve_fp8_paged_mqa_logits_fn"):
        "patched: resolver",
    (_D + "dsa_indexer.py", "Indexer._get_topk_ragged", "fp8_mqa_logits"):
        "unreachable: the aiter (ROCm) branch of _get_topk_ragged; CUDA uses the resolver",
    (_D + "dsa_indexer.py", "Indexer._get_topk_ragged", "get_index_k_scale_buffer"):
        "patched: IndexKeyCache.get_k_and_scale (bf16)",
    (_D + "dsa_indexer.py", "Indexer._get_topk_ragged", "resolve_fp8_mqa_logits_fn"): "patched: resolver",
    (_D + "dsa_indexer.py", "Indexer._gfx950_fused_decode", "get_index_k_with_scale_buffer"): "unreachable: ROCm gfx950",
    (_D + "dsa_indexer.py", "Indexer._store_index_k_cache", "fused_store_index_k_cache"):
        "patched: inside Indexer._store_index_k_cache (replaced for bf16)",
    (_D + "dsa_indexer.py", "Indexer._store_index_k_cache", "get_index_k_with_scale_buffer"):
        "patched: inside Indexer._store_index_k_cache (replaced for bf16)",
    (_D + "dsa_indexer.py", "Indexer._store_index_k_cache", "set_index_k_scale_buffer"):
        "patched: inside Indexer._store_index_k_cache (replaced for bf16)",
    (_D + "dsa_indexer.py", "Indexer.forward_cuda", "_store_index_k_cache"): "patched: Indexer._store_index_k_cache",
    (_D + "dsa_indexer.py", "_index_k_write_targets", "get_index_k_with_scale_buffer"): _FUSED,
    (_D + "dsa_indexer_kpool.py", "IndexerKPool._compress_write_extend", "get_index_k_with_scale_buffer"): _KPOOL,
    (_D + "dsa_indexer_kpool.py", "IndexerKPool._forward_cuda_target_verify", "get_index_k_with_scale_buffer"): _KPOOL,
    (_D + "dsa_indexer_kpool.py", "IndexerKPool._fp8_mqa_logits", "fp8_mqa_logits"): _KPOOL,
    (_D + "dsa_indexer_kpool.py", "IndexerKPool._get_index_k_read_buffer", "get_index_k_with_scale_buffer"): _KPOOL,
    (_D + "dsa_indexer_kpool.py", "IndexerKPool._get_topk_paged", "fp8_paged_mqa_logits"): _KPOOL,
    (_D + "dsa_indexer_kpool.py", "IndexerKPool._get_topk_ragged_kpool", "get_index_k_scale_buffer"): _KPOOL,
    (_D + "dsa_indexer_kpool.py", "IndexerKPool._write_compressed_pooled_index_cache",
     "get_index_k_with_scale_buffer"): _KPOOL,
    (_D + "dsa_indexer_kpool.py", "IndexerKPool._write_returned_compressed_pooled_index_cache",
     "set_index_k_scale_buffer"): _KPOOL,
    (_D + "dsa_npu_indexer.py", "DSANPUIndexerMixin.forward_npu", "get_index_k_scale_buffer"): "unreachable: Ascend NPU",
    (_D + "dsa_npu_indexer.py", "DSANPUIndexerMixin.forward_npu", "set_index_k_scale_buffer"): "unreachable: Ascend NPU",
    (_D + "dsa_prefill_cuda_graph.py", "pcg_dsa_indexer_prefill_split", "_store_index_k_cache"):
        "patched: Indexer._store_index_k_cache (prefill CUDA graphs stay on; with fusion the split op goes "
        "through Indexer._fused_q_prepare_and_store -> _fused_k_prepare_and_store, replaced for bf16)",
    (_D + "utils.py", "_fp8_paged_mqa_logits_torch", "fp8_paged_mqa_logits_torch"):
        "patched: only reached through resolve_fp8_paged_mqa_logits_fn (niah's in niah arms; stock: SGLang's own)",
    ("sglang/srt/hardware_backend/npu/dsv4/dsv4_memory_pool.py", "DSV4NPUTokenToKVPool.set_compress_buffer",
     "set_index_k_scale_buffer"): "unreachable: Ascend NPU",
    ("sglang/srt/layers/attention/deepseek_v4_backend.py", "DeepseekV4AttnBackend._low_ratio_compress_fused",
     "get_index_k_with_scale_buffer"): _V4FP4,
    ("sglang/srt/layers/attention/deepseek_v4_backend.py", "DeepseekV4AttnBackend._low_ratio_write_group",
     "get_index_k_with_scale_buffer"): _V4FP4,
    ("sglang/srt/layers/attention/dsv4/compressor_v2.py", "CompressorBackendMixin.forward_unified",
     "get_index_k_with_scale_buffer"):
        "patched (bf16): the buffer goes to compressor_v2.compress_norm_rope_store, which niah wraps (bf16 rows)",
    (_V4IDX, "C4IndexerBackendMixin._gather_nonpaged_index_k", "get_index_k_scale_buffer"): _V4NONPAGED,
    (_V4IDX, "C4IndexerBackendMixin._nonpaged_mqa_logits", "fp8_mqa_logits"): _V4NONPAGED,
    (_V4IDX, "C4IndexerBackendMixin.forward_c4_indexer", "get_index_k_with_scale_buffer"):
        "patched: the page view goes to the paged function SGLang picks: deep_gemm.fp8_paged_mqa_logits (routed "
        "to niah's kernels in niah arms) or fp8_paged_mqa_logits_torch(_sm120) (replaced); TileLang/AITER refused",
    (_V4IDX, "fp8_paged_mqa_logits_torch_sm120", "fp8_paged_mqa_logits_torch_sm120"): "patched: replaced in niah arms",
    ("sglang/srt/layers/attention/dsv4/v41_indexer/scoring.py", "decode_scores", "get_index_k_with_scale_buffer"):
        _V4FP4,
    ("sglang/srt/layers/attention/dsv4/v41_indexer/scoring.py", "get_index_k_cache", "get_index_k_with_scale_buffer"):
        _V4FP4,
    ("sglang/srt/layers/attention/minimax_sparse_nvfp4_backend.py", "MiniMaxSparseNvfp4AttnBackend._forward",
     "get_index_k_scale_buffer"): "unreachable: MiniMax sparse attention, not a DeepSeek model",
    ("sglang/srt/layers/attention/minimax_sparse_nvfp4_backend.py",
     "MiniMaxSparseNvfp4AttnBackend._run_msa_v1_decode_indexer", "get_index_k_scale_buffer"):
        "unreachable: MiniMax sparse attention, not a DeepSeek model",
    (_V4POOL, "DeepSeekV4TokenToKVPool.get_index_k_scale_buffer", "get_index_k_scale_buffer"):
        "patched (bf16): delegates to DeepSeekV4IndexerPool.get_index_k_scale_buffer, which niah replaces by a "
        "bf16 gather; fp8 arms: SGLang's own",
    (_V4POOL, "DeepSeekV4TokenToKVPool.get_index_k_with_scale_buffer", "get_index_k_with_scale_buffer"):
        "patched (bf16): returns the buffer niah's DeepSeekV4IndexerPool._create_buffer allocates and views as bf16",
    (_V4POOL, "DeepSeekV4TokenToKVPool.set_index_k_scale_buffer", "set_index_k_scale_buffer"):
        "refused with bf16 keys: delegates to DeepSeekV4IndexerPool.set_index_k_scale_buffer, which niah replaces "
        "by a refusal; fp8 arms: SGLang's own",
    ("sglang/srt/mem_cache/dsa_cache_layer_split.py", "LayerSplitIndexKeyCache.store_quantized", "store_quantized"):
        "refused: --enable-dsa-cache-layer-split is refused at launch for niah's arms",
    ("sglang/srt/mem_cache/memory_pool.py", "DSATokenToKVPool.get_index_k_scale_buffer", "get_k_and_scale"):
        "patched: IndexKeyCache.get_k_and_scale (bf16)",
    ("sglang/srt/mem_cache/memory_pool.py", "DSATokenToKVPool.kpool_decode_update_index_cache",
     "get_index_k_with_scale_buffer"): _KPOOL,
    ("sglang/srt/mem_cache/memory_pool.py", "DSATokenToKVPool.set_index_k_scale_buffer", "store_quantized"):
        "patched: IndexKeyCache.store_quantized (bf16: refused and attested as an fp8 store)",
    ("sglang/srt/mem_cache/memory_pool.py", "HybridLinearKVPool.get_broadcastable_index_k_with_scale_buffer",
     "get_index_k_with_scale_buffer"): _DELEGATE,
    ("sglang/srt/mem_cache/memory_pool.py", "HybridLinearKVPool.get_index_k_scale_buffer",
     "get_index_k_scale_buffer"): _DELEGATE,
    ("sglang/srt/mem_cache/memory_pool.py", "HybridLinearKVPool.get_index_k_with_scale_buffer",
     "get_index_k_with_scale_buffer"): _DELEGATE,
    ("sglang/srt/mem_cache/memory_pool.py", "HybridLinearKVPool.set_index_k_scale_buffer",
     "set_index_k_scale_buffer"): _DELEGATE,
    ("sglang/srt/mem_cache/page_interleave_pool.py", "_PageInterleaveIndexKeyCache.get_k_and_scale",
     "get_k_and_scale"): "refused: page-interleave pools (--enable-kv-cache-sharding) are refused at launch",
    ("sglang/srt/mem_cache/swa_memory_pool.py", "SWAKVPool.get_index_k_scale_buffer", "get_index_k_scale_buffer"):
        _DELEGATE,
    ("sglang/srt/mem_cache/swa_memory_pool.py", "SWAKVPool.get_index_k_with_scale_buffer",
     "get_index_k_with_scale_buffer"): _DELEGATE,
    ("sglang/srt/mem_cache/swa_memory_pool.py", "SWAKVPool.set_index_k_scale_buffer", "set_index_k_scale_buffer"):
        _DELEGATE,
}


@dataclass(frozen=True)
class LayoutConstant:
    """Source text (normalised by ast.unparse) that `module.qualname` must contain."""

    module: str
    qualname: str
    expect: str
    why: str


_MP = "sglang.srt.mem_cache.memory_pool"
LAYOUT: tuple[LayoutConstant, ...] = (
    LayoutConstant(_MP, "DSATokenToKVPool.quant_block_size", "quant_block_size = 128",
                   "quant block: one fp32 scale per 128-value key"),
    LayoutConstant(_MP, "DSATokenToKVPool.index_k_with_scale_buffer_dtype",
                   "index_k_with_scale_buffer_dtype = torch.uint8", "the key cache is a uint8 byte container"),
    LayoutConstant(_MP, "DSATokenToKVPool.__init__", "self.index_page_size = self.page_size // index_kpool",
                   "index pages hold page_size // index_kpool tokens (64 with index_kpool 1)"),
    LayoutConstant(_MP, "DSATokenToKVPool.__init__", "assert index_head_dim == 128", "128-dim index keys"),
    LayoutConstant("sglang.srt.mem_cache.index_key_cache", "IndexKeyCache._buffer_shape",
                   "pool.page_size // pool.index_kpool * (pool.index_head_dim + "
                   "pool.index_head_dim // pool.quant_block_size * 4)",
                   "fp8 row bytes: 64 x (128 values + 4 scale bytes) = 8,448"),
    LayoutConstant("sglang.srt.model_executor.pool_configurator",
                   "DefaultPoolConfigurator._compute_dsa_indexer_cell_size",
                   "index_head_dim + index_head_dim // DSATokenToKVPool.quant_block_size * 4",
                   "memory accounting: 132 bytes a token, which niah turns into 256"),
    LayoutConstant("sglang.srt.layers.attention.dsa.dsa_indexer", "Indexer._get_topk_paged",
                   "get_page_table_64()", "decode reads 64-token pages"),
)


def scan_calls(rel: str, text: str) -> list[tuple[str, int, str, str]]:
    """(file, line, enclosing qualname, callee) of every call of a WATCHED name in one file."""
    if not any(w in text for w in WATCHED):
        return []
    out: list[tuple[str, int, str, str]] = []
    stack: list[str] = []

    def visit(node: ast.AST) -> None:
        scoped = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        if scoped:
            stack.append(node.name)
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
            if name in WATCHED:
                out.append((rel, node.lineno, ".".join(stack), name))
        for child in ast.iter_child_nodes(node):
            visit(child)
        if scoped:
            stack.pop()

    visit(ast.parse(text))
    return out


def check_call_sites(files: dict[str, str]) -> list[str]:
    """A problem "file:line: ..." for every call site not in CALL_SITES."""
    problems = []
    for rel in sorted(files):
        for path, line, where, callee in scan_calls(rel, files[rel]):
            if (path, where, callee) not in CALL_SITES:
                problems.append(f"{path}:{line}: new call site: {where or '<module>'} calls {callee}, which "
                                "niah neither patches, refuses nor lists as unreachable")
    return problems


def _normal(text: str) -> str:
    return " ".join(text.split())


def check_layout(source) -> list[str]:
    """A problem "file:line: ..." for every layout constant the source no longer states."""
    problems = []
    for c in LAYOUT:
        sym = source.lookup(c.module, c.qualname)
        if sym is None:
            problems.append(f"{c.module}.{c.qualname}: missing (layout constant: {c.why})")
        elif _normal(c.expect) not in _normal(sym.text):
            problems.append(f"{sym.where or c.module}: layout changed: {c.module}.{c.qualname} no longer says "
                            f"`{c.expect}` ({c.why})")
    return problems
