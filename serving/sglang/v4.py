"""DeepSeek-V4 (C4 indexer) with bf16 index keys: what the plugin puts in SGLang 0.5.23's place.

The C4 indexer's keys are written by the compressor (`forward_unified`, bound to
`forward_indexer_compressor` when the class is built) through `compress_norm_rope_store`,
and read by `forward_c4_indexer` as `.view(pages, 64, 1, 132)` of the layer's buffer.
With bf16 keys:
- sizing: 264 bytes a token (`get_dsv4_indexer_bytes_per_token`, imported by name into
  the pool configurator): a 256-byte bf16 row plus 8 bytes of page padding, so a page is
  exactly [64 x 132] bf16 elements and SGLang's own `.view(pages, 64, 1, 132)` applies;
  inside a page, token t's 128 bf16 values are at t*128 (the last 512 bytes are unused);
- write: the module-level `compress_norm_rope_store` that `_forward_compress_all_in_one`
  calls is replaced in compressor_v2 (where both the method and its bound alias look it
  up); indexer rows (head dim 128) go through niah.kernels.store_v4_index_keys (V4's
  RMSNorm, RoPE, Hadamard, then a bf16 row); FlashMLA rows (head dim 512) stay SGLang's;
- read: the paged logits function `forward_c4_indexer` calls gets the bf16 page view and
  runs niah.kernels.bf16_paged_mqa_logits (the fp8 query is cast to bf16, exact; its
  scale is already in the weights);
- refused in the process (one line, the fp8 path attested): the non-paged DeepGEMM path,
  every other writer/reader of the indexer pool, fp4 / V4.1 low-ratio indexer pools, ROCm,
  and any indexer kernel other than the paged function niah replaces. HiCache, HiSparse,
  fp4 index keys and speculative decoding (MTP) are refused at launch (command.refusal).
The plugin installs these as plugin._v4_patches; their contract is patch_points.V4_POINTS.
"""

from __future__ import annotations

import os
from typing import Callable

import torch

from niah.serving.sglang import attest

HEAD_DIM = 128
INDEX_PAGE = 64
FP8_TOKEN_BYTES = HEAD_DIM + 4
BF16_TOKEN_BYTES = 2 * FP8_TOKEN_BYTES  # 256 B row + 8 B padding: a page is [64 x 132] bf16
PREFIX = "niah bf16 index keys on DeepSeek-V4"

TRUE = ("1", "true", "yes", "on")


class V4Refused(RuntimeError):
    """An SGLang path that cannot run with bf16 index keys on V4 was reached."""


def _env_on(env, name: str) -> bool:
    return str(env.get(name, "")).strip().lower() in TRUE


def env_refusal(env=os.environ) -> str | None:
    """The indexer kernel `forward_c4_indexer` picks is the paged function niah replaces."""
    if not _env_on(env, "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"):
        return ("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1 is required (otherwise the C4 indexer calls "
                "DeepGEMM's fp8 kernel on the bf16 pages)")
    for name in ("SGLANG_OPT_USE_TILELANG_INDEXER", "SGLANG_OPT_USE_AITER_INDEXER"):
        if _env_on(env, name):
            return f"{name} must be off (that fp8 indexer kernel comes first in SGLang's choice)"
    return None


def refuse(problem: str, path: str | None = None) -> None:
    if path:
        attest.record(path, "fp8", "sglang.v4_fp8_path_refused")
    raise V4Refused(f"{PREFIX}: {problem}")


# ---------------------------------------------------------------------------------------
# Pool: sizing and allocation


def wrap_pool_init(original: Callable) -> Callable:
    """DeepSeekV4TokenToKVPool.__init__: refuse what bf16 keys cannot serve, before allocating."""

    def __init__(self, *args, **kwargs):
        from niah.serving.sglang.command import platform_refusal

        problem = platform_refusal("niah") or env_refusal()
        if problem:
            refuse(problem)
        original(self, *args, **kwargs)

    __init__.__wrapped__ = original
    return __init__


def wrap_bytes_per_token(original: Callable) -> Callable:
    """get_dsv4_indexer_bytes_per_token: twice the fp8 row (264 B for head dim 128)."""

    def get_dsv4_indexer_bytes_per_token(index_head_dim: int, use_fp4_indexer: bool) -> int:
        n = original(index_head_dim, use_fp4_indexer)
        return n if use_fp4_indexer else 2 * n

    get_dsv4_indexer_bytes_per_token.__wrapped__ = original
    return get_dsv4_indexer_bytes_per_token


def wrap_create_buffer(original: Callable) -> Callable:
    """DeepSeekV4IndexerPool._create_buffer: SGLang allocates (264-byte tokens), niah views bf16."""

    def _create_buffer(self):
        if self.use_fp4_indexer or getattr(self, "uses_aiter_fp4_layout", False):
            refuse("fp4 indexer pools (V4.1 low-ratio layers, --enable-deepseek-v4-fp4-indexer) "
                   "are not supported")
        if self.index_head_dim != HEAD_DIM or self.page_size != INDEX_PAGE:
            refuse(f"index head dim {self.index_head_dim} / page {self.page_size}: only 128 / 64 is supported")
        original(self)
        bufs = self.index_k_with_scale_buffer
        want = INDEX_PAGE * BF16_TOKEN_BYTES
        for b in bufs:
            if b.dtype != torch.uint8 or b.dim() != 2 or b.shape[1] != want:
                refuse(f"SGLang allocated {b.dtype} {tuple(b.shape)}, expected uint8 [pages, {want}]")
        self.index_k_with_scale_buffer = [b.view(torch.bfloat16) for b in bufs]
        attest.set_pool_bytes(BF16_TOKEN_BYTES)

    _create_buffer.__wrapped__ = original
    return _create_buffer


def bf16_pages(kvcache: torch.Tensor) -> torch.Tensor:
    """SGLang's bf16 [pages, 64, 1, 132] view of a layer -> [pages, 64, 1, 128], page stride 64*132."""
    pages = kvcache.shape[0]
    if kvcache.dtype != torch.bfloat16 or tuple(kvcache.shape[1:]) != (INDEX_PAGE, 1, FP8_TOKEN_BYTES) \
            or not kvcache.is_contiguous():
        refuse(f"unexpected index page view {kvcache.dtype} {tuple(kvcache.shape)}")
    return kvcache.as_strided((pages, INDEX_PAGE, 1, HEAD_DIM),
                              (INDEX_PAGE * FP8_TOKEN_BYTES, HEAD_DIM, HEAD_DIM, 1),
                              kvcache.storage_offset())


def page_bytes(kvcache_u8: torch.Tensor) -> torch.Tensor:
    """The store's view: uint8 [pages, 64 * 264] (what compressor_v2 hands over) -> itself, checked."""
    if kvcache_u8.dtype != torch.uint8 or kvcache_u8.dim() != 2 \
            or kvcache_u8.shape[1] != INDEX_PAGE * BF16_TOKEN_BYTES:
        refuse(f"an fp8 index-key write reached a {kvcache_u8.dtype} {tuple(kvcache_u8.shape)} cache", "store")
    return kvcache_u8


# ---------------------------------------------------------------------------------------
# Write: compressor_v2.compress_norm_rope_store


def store_bf16_rows(kv, plan, norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size):
    """V4's norm + RoPE + Hadamard of the compressed keys, stored as bf16 rows."""
    from niah.serving.sglang.kernels_api import kernel

    cache = page_bytes(kvcache)  # uint8 [pages, 64 * 264]: rows at off * 256, 512 B padding at the end
    freqs = torch.view_as_real(freq_cis).flatten(-2) if freq_cis.is_complex() else freq_cis
    kernel("store_v4_index_keys")(kv, plan[1], bool(plan.is_decode), int(plan.compress_ratio),
                                  norm_weight, float(norm_eps), freqs.float(), out_loc, cache, "bf16",
                                  page_size, page_stride=INDEX_PAGE * BF16_TOKEN_BYTES)
    attest.record("store", "bf16", "niah.store_v4_index_keys")


def wrap_compress_norm_rope_store(original: Callable) -> Callable:
    """Indexer rows (head dim 128) -> niah's bf16 store; FlashMLA rows -> SGLang's own store."""

    def compress_norm_rope_store(kv, plan, **kw):
        if kv.shape[-1] != HEAD_DIM:
            return original(kv, plan, **kw)
        if kw.get("use_fp4") or kw.get("fp8_2buff") or kw.get("bf16_store"):
            refuse("an fp4/fp8 indexer store variant was requested", "store")
        if kw.get("kvcache_scale") is not None or kw.get("rope_cache") is not None:
            refuse("the split-scale (HIP fp4) indexer store was requested", "store")
        return store_bf16_rows(kv, plan, kw["norm_weight"], kw["norm_eps"], kw["freq_cis"],
                               kw["out_loc"], kw["kvcache"], kw["page_size"])

    compress_norm_rope_store.__wrapped__ = original
    return compress_norm_rope_store


# ---------------------------------------------------------------------------------------
# Read: the paged logits function forward_c4_indexer calls (SGLANG_FP8_PAGED_MQA_LOGITS_TORCH)


def paged_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata,
                 max_seq_len, clean_logits=True):
    """`fp8_paged_mqa_logits_torch`'s signature. bf16 pages -> niah's bf16 kernel; fp8 pages
    -> niah's fp8 kernel, unless bf16 keys are configured (then an fp8 read is refused)."""
    from niah.serving.sglang import replacements

    if kvcache_fp8.dtype == torch.bfloat16:  # attested by replacements.paged_mqa_logits
        return replacements.paged_mqa_logits(q_fp8, bf16_pages(kvcache_fp8), weight, seq_lens, page_table,
                                             deep_gemm_metadata, max_seq_len, clean_logits=clean_logits)
    if configured_dtype() == "bf16":
        refuse("the C4 indexer read fp8 index pages", "decode_logits")
    return replacements.v4_paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table,
                                            deep_gemm_metadata, max_seq_len, clean_logits)


def configured_dtype() -> str | None:
    from niah.serving.sglang import plugin

    arm = plugin.installed_arm()
    return arm[0] if arm else None


# ---------------------------------------------------------------------------------------
# Refused paths


def refuse_set_index_k_scale_buffer(self, layer_id, loc, index_k, index_k_scale):
    refuse("an fp8 key + scale write to the V4 indexer pool is not supported", "store")


def refuse_set_index_fused(self, layer_id, loc, cache_k):
    refuse("the fused fp8 indexer store is not supported", "store")


def refuse_set_index_fp4(self, layer_id, loc, cache_k):
    refuse("the fp4 indexer store is not supported", "store")


def refuse_get_index_k_scale_buffer(self, layer_id, seq_len_tensor, page_indices, seq_len_sum, max_seq_len):
    refuse("the fp8 key + scale gather is not supported", "prefill_logits")


def refuse_nonpaged_mqa_logits(*, q_indexer, weights, kv, plan, rows):
    refuse("the non-paged DeepGEMM fp8_mqa_logits path is not supported", "prefill_logits")


def refuse_gather_nonpaged_index_k(*, c4_indexer, token_to_kv_pool, plan):
    refuse("the non-paged fp8 key gather is not supported", "prefill_logits")


def never_nonpaged(original: Callable) -> Callable:
    """C4IndexerBackendMixin._can_use_nonpaged_indexer -> False: keys go through the paged read."""

    def _can_use_nonpaged_indexer(self, *, c4_indexer, forward_batch, indexer_metadata):
        return False

    _can_use_nonpaged_indexer.__wrapped__ = original
    return _can_use_nonpaged_indexer
