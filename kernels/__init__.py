"""niah.kernels: the DeepSeek indexer kernels (Triton), with a torch reference beside each.

Public functions (DeepGEMM's argument order where DeepGEMM has one):
    fp8_paged_mqa_logits, bf16_paged_mqa_logits, get_paged_mqa_logits_metadata   (decode)
    fp8_mqa_logits, bf16_mqa_logits                                             (prefill)
    store_index_keys                                                            (key store)
    quantize_query                        (the index query: fp8 with its scales in the weights, or bf16)
    store_fp4_index_keys                              (MXFP4 key store, SGLang's DeepSeek-V4 fp4 page)
    fp4_paged_mqa_logits                                               (decode, fp4 keys)
    fp4_mqa_logits                                                     (prefill, fp4 keys)
    store_v4_index_keys                                          (DeepSeek-V4 C4 indexer key store)
    store_v32_index_keys                           (DeepSeek-V3.2 indexer key store, SGLang's fused path)
    topk_indices                                                                (top-k)
    indexer_topk                       (prefill: fused index logits + top-k from the paged pool, no logits)
    indexer_logits                     (prefill: the same index logits, every kv head in one pass, written)
    bf16_paged_rescore, fp8_bf16_two_stage_topk                  (two-stage selection: bf16 re-score)
    fp4_bf16_two_stage_topk                                      (two-stage selection from fp4 keys)
They are resolved lazily: importing this package imports neither triton nor CUDA.
On CPU tensors the kernels run under TRITON_INTERPRET=1 (set it before triton is imported).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "fp8_paged_mqa_logits": "niah.kernels.paged_logits.wrapper",
    "bf16_paged_mqa_logits": "niah.kernels.paged_logits.wrapper",
    "get_paged_mqa_logits_metadata": "niah.kernels.paged_logits.wrapper",
    "fp8_mqa_logits": "niah.kernels.mqa_logits.wrapper",
    "bf16_mqa_logits": "niah.kernels.mqa_logits.wrapper",
    "store_index_keys": "niah.kernels.store.wrapper",
    "quantize_query": "niah.kernels.query_quant.wrapper",
    "store_fp4_index_keys": "niah.kernels.fp4_store.wrapper",
    "fp4_paged_mqa_logits": "niah.kernels.fp4_paged_logits.wrapper",
    "fp4_mqa_logits": "niah.kernels.fp4_mqa_logits.wrapper",
    "store_v4_index_keys": "niah.kernels.v4_store.wrapper",
    "store_v32_index_keys": "niah.kernels.v32_store.wrapper",
    "topk_indices": "niah.kernels.topk.wrapper",
    "indexer_topk": "niah.kernels.fused_indexer.wrapper",
    "indexer_logits": "niah.kernels.fused_indexer.wrapper",
    "logits_form": "niah.kernels.fused_indexer.wrapper",
    "bf16_paged_rescore": "niah.kernels.rescore.wrapper",
    "fp8_bf16_two_stage_topk": "niah.kernels.rescore.wrapper",
    "fp4_bf16_two_stage_topk": "niah.kernels.rescore.wrapper",
    "calc_diff": "niah.kernels._common",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'niah.kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
