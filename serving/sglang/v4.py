"""DeepSeek-V4 (C4 indexer) in SGLang 0.5.23's default paths: what the plugin puts in its place.

The C4 indexer's keys are written by the compressor (`forward_unified`, bound to
`forward_indexer_compressor` when the class is built) through `compress_norm_rope_store`,
and read by `forward_c4_indexer`: as `.view(pages, 64, 1, 132)` pages by the paged-logits
function it picks at call time (`from deep_gemm import fp8_paged_mqa_logits as fn` by
default; SGLang's torch fallback with SGLANG_FP8_PAGED_MQA_LOGITS_TORCH; TileLang/AITER
kernels with their switches), or, for one eager request of >= 8,192 query rows, through the
non-paged DeepGEMM prefill (`_gather_nonpaged_index_k` -> `deep_gemm.fp8_mqa_logits`).

niah's arms (fp8/niah, bf16/niah) force none of those switches. Where the V4 pool is built
(`DeepSeekV4TokenToKVPool.__init__`, in each scheduler process, before any forward) the
plugin replaces `deep_gemm.fp8_paged_mqa_logits` and `deep_gemm.fp8_mqa_logits` with niah's
kernels (DeepGEMM's argument order): SGLang's call-time import then picks niah's, on the
paths SGLang chooses itself, non-paged prefill included. The torch fallbacks are replaced
too (a user who sets SGLANG_FP8_PAGED_MQA_LOGITS_TORCH in every arm). The TileLang and
AITER indexers (SGLang's default on SM120 / ROCm) read the fp8 layout: refused there.

With bf16 keys:
- sizing: 264 bytes a token (`get_dsv4_indexer_bytes_per_token`, imported by name into
  the pool configurator): a 256-byte bf16 row plus 8 bytes of page padding, so a page is
  exactly [64 x 132] bf16 elements and SGLang's own `.view(pages, 64, 1, 132)` applies;
  inside a page, token t's 128 bf16 values are at t*128 (the last 512 bytes are unused);
- write: the module-level `compress_norm_rope_store` that `_forward_compress_all_in_one`
  calls is replaced in compressor_v2; indexer rows (head dim 128) go through
  niah.kernels.store_v4_index_keys (V4's RMSNorm, RoPE, Hadamard, then a bf16 row);
  FlashMLA rows (head dim 512) stay SGLang's;
- read: paged pages -> niah's bf16 paged logits; the non-paged prefill gathers bf16 keys
  (`DeepSeekV4IndexerPool.get_index_k_scale_buffer`, packed through SGLang's fp8 plumbing)
  for niah's bf16 prefill logits (the fp8 query is upcast to bf16, exact; its scale is
  already in the weights);
- refused in the process (one line, the fp8 path attested): every other writer of the
  indexer pool, fp4 / V4.1 low-ratio pools, ROCm, the TileLang/AITER indexers. HiCache,
  HiSparse, fp4 index keys and speculative decoding (MTP) are refused at launch
  (refusals.py).
Their table (each symbol with what the plugin installs there) is patches/deepseek_v4.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from importlib.metadata import version as dist_version
from typing import Callable

import torch

from niah.serving.sglang import attest, bf16_cache, replacements
from niah.serving.sglang.arms import PAGED_LOGITS_TORCH, env_on
from niah.serving.sglang.kernels_api import kernel
from niah.serving.sglang.patching import apply_at, installed_arm
from niah.serving.sglang.refusals import indexer_env_refusal, platform_refusal

HEAD_DIM = 128
INDEX_PAGE = 64
FP8_TOKEN_BYTES = HEAD_DIM + 4
BF16_TOKEN_BYTES = 2 * FP8_TOKEN_BYTES  # 256 B row + 8 B padding: a page is [64 x 132] bf16
PREFIX = "niah bf16 index keys on DeepSeek-V4"


class V4Refused(RuntimeError):
    """An SGLang path that cannot run with bf16 index keys on V4 was reached."""


def env_refusal(env=os.environ) -> str | None:
    """niah's arms need the paged-logits function the plugin routes (DeepGEMM's, or SGLang's
    torch fallback): the TileLang and AITER indexers (SM120's and ROCm's defaults) read fp8
    pages. The launch entry refuses them before weights load where it can tell the model
    (refusals.py); here, where the V4 pool is built, SGLang's own defaults are in the
    environment too."""
    return indexer_env_refusal(None, env)


# DeepGEMM functions SGLang's V4 indexer imports at call time, and niah's replacements.
DEEP_GEMM = "deep_gemm"
DEEP_GEMM_ROUTES = ("fp8_paged_mqa_logits", "fp8_mqa_logits")


def route_deep_gemm(env=os.environ) -> str:
    """Replace deep_gemm.fp8_paged_mqa_logits / fp8_mqa_logits with niah's kernels (niah arms,
    V4 pool construction). Returns what was done ("routed", or why not); refuses when the
    default path needs DeepGEMM and it is not installed."""
    if importlib.util.find_spec(DEEP_GEMM) is None:
        if not env_on(env, PAGED_LOGITS_TORCH):
            refuse("DeepGEMM is not installed, and SGLang's C4 indexer imports deep_gemm.fp8_paged_mqa_logits "
                   "at call time (the stock arm fails the same way); install it, or set "
                   "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1 in the configuration's env (every arm)")
        return "deep_gemm absent (SGLANG_FP8_PAGED_MQA_LOGITS_TORCH set by the user)"
    module = importlib.import_module(DEEP_GEMM)
    missing = [name for name in DEEP_GEMM_ROUTES if not callable(getattr(module, name, None))]
    if missing:
        refuse(f"the installed DeepGEMM has no {', '.join(missing)}, which SGLang's C4 indexer calls")
    for name in DEEP_GEMM_ROUTES:
        apply_at(DEEP_GEMM, name, _const(DEEP_GEMM_KERNELS[name]))
    return "routed"


def refuse(problem: str, path: str | None = None) -> None:
    if path:
        attest.record(path, "fp8", "sglang.v4_fp8_path_refused")
    raise V4Refused(f"{PREFIX}: {problem}")


# ---------------------------------------------------------------------------------------
# Pool: sizing and allocation


def wrap_pool_init(original: Callable) -> Callable:
    """DeepSeekV4TokenToKVPool.__init__ (niah arms): refuse what niah's kernels cannot serve,
    then route DeepGEMM's indexer functions to niah's, before allocating."""

    def __init__(self, *args, **kwargs):
        problem = platform_refusal("niah") or env_refusal()
        if problem:
            refuse(problem)
        attest.set_facts(deep_gemm=route_deep_gemm())
        original(self, *args, **kwargs)

    __init__.__wrapped__ = original
    return __init__


def refuse_release(self, *args, **kwargs):
    """DeepSeekV4TokenToKVPool.__init__ on an SGLang release niah's V4 path is not proven on
    (0.5.16): niah arms refuse DeepSeek-V4 there, before the pool allocates."""
    raise V4Refused(f"{PREFIX}: niah's DeepSeek-V4 path is proven on SGLang 0.5.23 only, not on the installed "
                    f"{dist_version('sglang')}; serve DeepSeek-V4 with fp8/stock, or use SGLang 0.5.23")


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
    cache = page_bytes(kvcache)  # uint8 [pages, 64 * 264]: rows at off * 256, 512 B padding at the end
    freqs = torch.view_as_real(freq_cis).flatten(-2) if freq_cis.is_complex() else freq_cis
    kernel("store_v4_index_keys")(kv, plan[1], bool(plan.is_decode), int(plan.compress_ratio),
                                  norm_weight, float(norm_eps), freqs.float(), out_loc, cache, "bf16",
                                  page_size, page_stride=INDEX_PAGE * BF16_TOKEN_BYTES)
    attest.record("store", "bf16", "niah.store_v4_index_keys")
    attest.set_facts(rotation="hadamard", store="niah.store_v4_index_keys")


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
# Read: the paged-logits function forward_c4_indexer picks, and the non-paged prefill


def paged_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata,
                 max_seq_len, clean_logits=False):
    """DeepGEMM's `fp8_paged_mqa_logits` order (SGLang's torch fallbacks share it). bf16 pages
    -> niah's bf16 kernel; fp8 pages -> niah's fp8 kernel, unless bf16 keys are configured
    (then an fp8 read is refused)."""
    if kvcache_fp8.dtype == torch.bfloat16:  # attested by replacements.paged_mqa_logits
        return replacements.paged_mqa_logits(q_fp8, bf16_pages(kvcache_fp8), weight, seq_lens, page_table,
                                             deep_gemm_metadata, max_seq_len, clean_logits=clean_logits)
    if configured_dtype() == "bf16":
        refuse("the C4 indexer read fp8 index pages", "decode_logits")
    return replacements.v4_paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table,
                                            deep_gemm_metadata, max_seq_len, clean_logits)


def mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0):
    """DeepGEMM's `fp8_mqa_logits` (the non-paged prefill): bf16 keys gathered by
    gather_bf16_index_k -> niah's bf16 kernel; fp8 keys -> niah's fp8 kernel, refused with bf16."""
    if configured_dtype() == "bf16" and bf16_cache.unsmuggle_bf16(kv[0], q.shape[-1]) is None:
        refuse("the non-paged prefill read fp8 index keys", "prefill_logits")
    return replacements.mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                                   clean_logits=clean_logits, max_seqlen_k=max_seqlen_k)


DEEP_GEMM_KERNELS = {"fp8_paged_mqa_logits": paged_logits, "fp8_mqa_logits": mqa_logits}


def _const(fn):
    return lambda original: fn


def gather_bf16_index_k(self, layer_id, seq_len_tensor, page_indices, seq_len_sum, max_seq_len):
    """DeepSeekV4IndexerPool.get_index_k_scale_buffer with bf16 keys: the keys of each request's
    first seq_len tokens (its C4 page table), requests concatenated, packed as SGLang's
    (k uint8 [S, 256], scale uint8 [S, 4]) pair; niah's mqa_logits reads them back as bf16."""
    buf = self.index_k_with_scale_buffer[layer_id]  # bf16 [pages, 64 * 132] (264 B a token)
    pages = bf16_pages(buf.view(buf.shape[0], INDEX_PAGE, 1, FP8_TOKEN_BYTES))
    keys = bf16_cache.gather_pages(pages, page_indices, seq_len_tensor, seq_len_sum)
    return bf16_cache.smuggle_as_fp8(keys)


def configured_dtype() -> str | None:
    arm = installed_arm()
    return arm[0] if arm else None


# ---------------------------------------------------------------------------------------
# Refused paths


def refuse_set_index_k_scale_buffer(self, layer_id, loc, index_k, index_k_scale):
    refuse("an fp8 key + scale write to the V4 indexer pool is not supported", "store")


def refuse_set_index_fused(self, layer_id, loc, cache_k):
    refuse("the fused fp8 indexer store is not supported", "store")


def refuse_set_index_fp4(self, layer_id, loc, cache_k):
    refuse("the fp4 indexer store is not supported", "store")
