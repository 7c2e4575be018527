"""The functions the plugin puts in SGLang's place. Pure torch around niah.kernels.

Each one keeps the signature of the SGLang symbol it replaces (see contract.py), so it
can be exercised on CPU tensors without SGLang. Those that need SGLang objects (the
pool, the forward batch, the indexer metadata) only touch them through the calls the
original made, which the contract checks are still there.
"""

from __future__ import annotations

import torch

from niah.serving.sglang import attest, bf16_cache
from niah.serving.sglang.kernels_api import kernel, store_kernel


def _flat_context_lens(context_lens: torch.Tensor) -> torch.Tensor:
    """DeepGEMM takes [B] or [B, next_n]; with next_n == 1 niah's kernels get [B]."""
    if context_lens.dim() == 2 and context_lens.shape[1] == 1:
        return context_lens[:, 0]
    return context_lens


# ---------------------------------------------------------------------------------------
# Logits kernels in DeepGEMM's argument order (what SGLang's resolvers hand out).


def paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                     max_context_len, clean_logits=False, indices=None):
    """Decode logits. fp8 keys: kv_cache uint8 [pages, 64, 1, 132] -> niah fp8 kernel;
    bf16 keys: kv_cache bf16 [pages, 64, 1, 128] -> niah bf16 kernel (q cast to bf16:
    exact, the fp8 query's scale is already folded into `weights`)."""
    if indices is not None:
        raise NotImplementedError("niah paged logits: an index tensor is not supported")
    context_lens = _flat_context_lens(context_lens)
    rows = q.shape[0]  # SGLang may pass tables with padding rows past the real batch
    context_lens, block_table = context_lens[:rows], block_table[:rows]
    if kv_cache.dtype == torch.bfloat16:
        attest.record("decode_logits", "bf16", "niah.bf16_paged_mqa_logits")
        return kernel("bf16_paged_mqa_logits")(
            q.to(torch.bfloat16), kv_cache, weights, context_lens, block_table,
            schedule_meta, max_context_len, clean_logits=clean_logits)
    attest.record("decode_logits", "fp8", "niah.fp8_paged_mqa_logits")
    return kernel("fp8_paged_mqa_logits")(
        q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
        clean_logits=clean_logits)


def v4_paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata,
                        max_seq_len, clean_logits=True):
    """DeepSeek-V4's `fp8_paged_mqa_logits_torch` signature (C4 indexer, decode and
    prefill, both through paged logits)."""
    return paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata,
                            max_seq_len, clean_logits=clean_logits)


def mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True,
               max_seqlen_k=0):
    """Prefill (ragged) logits. kv = (keys, scales). bf16 keys arrive packed as a
    2D-wide fp8 tensor by niah's gather (bf16_cache.smuggle_as_fp8)."""
    keys, scales = kv
    if weights.dim() == 3 and weights.shape[-1] == 1:
        weights = weights.squeeze(-1)
    k16 = bf16_cache.unsmuggle_bf16(keys, q.shape[-1])
    if k16 is not None:
        attest.record("prefill_logits", "bf16", "niah.bf16_mqa_logits")
        return kernel("bf16_mqa_logits")(
            q.to(torch.bfloat16), k16, weights, cu_seq_len_k_start, cu_seq_len_k_end,
            clean_logits=clean_logits, max_seqlen_k=max_seqlen_k)
    attest.record("prefill_logits", "fp8", "niah.fp8_mqa_logits")
    return kernel("fp8_mqa_logits")(
        q, (keys, scales), weights, cu_seq_len_k_start, cu_seq_len_k_end,
        clean_logits=clean_logits, max_seqlen_k=max_seqlen_k)


def resolve_fp8_paged_mqa_logits_fn():
    """Replaces sglang ...dsa.utils.resolve_fp8_paged_mqa_logits_fn."""
    return paged_mqa_logits


def resolve_fp8_mqa_logits_fn():
    """Replaces sglang ...dsa.utils.resolve_fp8_mqa_logits_fn."""
    return mqa_logits


# ---------------------------------------------------------------------------------------
# bf16 key store


def store_bf16_keys(buf: torch.Tensor, loc: torch.Tensor, key: torch.Tensor, page_size: int = 64,
                    use_kernel: bool | None = None) -> None:
    """Write keys unquantised into the bf16 cache through the bundled store kernel
    (`store_index_keys(k [N, D], kv_cache bf16 [pages, 64, 1, D], slot_mapping [N])`),
    on CUDA by default (KernelMissing if niah.kernels lacks it: no silent torch fallback);
    torch index-put otherwise. Negative slots are padding, skipped."""
    if use_kernel is None:
        use_kernel = key.is_cuda
    fn = store_kernel() if use_kernel else None
    attest.record("store", "bf16", "niah.store_index_keys" if fn is not None else "niah.store_keys_torch")
    if fn is None:
        bf16_cache.store_keys_torch(buf, loc, key, page_size)
        return
    pages = bf16_cache.pages_view(buf, page_size, key.shape[-1])
    fn(key.reshape(-1, key.shape[-1]), pages, loc.reshape(-1).contiguous())


# ---------------------------------------------------------------------------------------
# IndexKeyCache methods (sglang.srt.mem_cache.index_key_cache), bf16 mode


def _require_plain_pool(pool) -> None:
    if getattr(pool, "index_kpool", 1) != 1:
        raise NotImplementedError(
            f"niah bf16 index keys need index_kpool == 1 (got {pool.index_kpool}); "
            "serve this model with fp8 index keys")


def index_key_cache_buffer_shape(self, num_pages: int) -> tuple[int, int]:
    """IndexKeyCache._buffer_shape: (pages, 64 x 256) bytes instead of (pages, 64 x 132)."""
    pool = self.pool
    _require_plain_pool(pool)
    attest.set_pool_bytes(bf16_cache.BF16_BYTES_PER_TOKEN)
    return (num_pages, bf16_cache.bf16_row_bytes(pool.page_size, pool.index_head_dim, pool.index_kpool))


def wrap_buffer_shape(original):
    """IndexKeyCache._buffer_shape (fp8): SGLang's own shape, its bytes/token attested."""

    def _buffer_shape(self, num_pages):
        shape = original(self, num_pages)
        pool = self.pool
        attest.set_pool_bytes(shape[1] // max(1, pool.page_size // pool.index_kpool))
        return shape

    _buffer_shape.__wrapped__ = original
    return _buffer_shape


def index_key_cache_get_k_and_scale(self, layer_id, seq_len_tensor, page_indices, seq_len_sum, max_seq_len):
    """IndexKeyCache.get_k_and_scale: gather bf16 keys (packed for SGLang's fp8 plumbing)."""
    buf = self.get_buffer(layer_id)
    keys = bf16_cache.gather_keys_torch(buf, page_indices, seq_len_tensor, seq_len_sum,
                                        self.pool.index_page_size, self.pool.index_head_dim)
    return bf16_cache.smuggle_as_fp8(keys)


def _refuse_fp8_store(site: str):
    """An fp8 write into the bf16 cache is a bug: attested, then refused (`site`: SGLang's method)."""
    attest.record("store", "fp8", f"sglang.{site}")
    raise RuntimeError(
        f"niah bf16 index keys: an SGLang code path tried to store fp8-quantised index keys ({site}) into "
        "the bf16 cache; that path is not supported with --niah-index-dtype bf16")


def index_key_cache_store_quantized(self, layer_id, loc, index_k, index_k_scale):
    """IndexKeyCache.store_quantized: an fp8 write into the bf16 cache is a bug; refuse."""
    _refuse_fp8_store("IndexKeyCache.store_quantized")


def index_key_cache_move(self, tgt_loc, src_loc):
    """IndexKeyCache.move for the bf16 layout."""
    if tgt_loc.numel() == 0:
        return
    _require_plain_pool(self.pool)
    for buf in self.buffer:
        if buf.shape[0] == 0:
            continue
        bf16_cache.move_keys_torch(self._kernel_view(buf), tgt_loc, src_loc,
                                   self.pool.index_page_size, self.pool.index_head_dim)


def wrap_indexer_cell_size(original):
    """Wrap DefaultPoolConfigurator._compute_dsa_indexer_cell_size: 256 B/token/layer."""

    def _compute_dsa_indexer_cell_size(self, *, kvc, num_layers, allocate_all_layers=False):
        fp8 = original(self, kvc=kvc, num_layers=num_layers, allocate_all_layers=allocate_all_layers)
        return bf16_cache.bf16_cell_bytes(fp8)

    _compute_dsa_indexer_cell_size.__wrapped__ = original
    return _compute_dsa_indexer_cell_size


# ---------------------------------------------------------------------------------------
# DSATokenToKVPool methods of SGLang 0.5.16 (no IndexKeyCache: the pool holds the buffers)


def pool_index_buffer_shape(self, num_pages: int) -> tuple[int, int]:
    """DSATokenToKVPool._index_buffer_shape (0.5.16): (pages, 64 x 256) bytes, not 64 x 132."""
    attest.set_pool_bytes(bf16_cache.BF16_BYTES_PER_TOKEN)
    return (num_pages, bf16_cache.bf16_row_bytes(self.page_size, self.index_head_dim))


def wrap_pool_index_buffer_shape(original):
    """DSATokenToKVPool._index_buffer_shape (0.5.16, fp8): SGLang's own shape, bytes/token attested."""

    def _index_buffer_shape(self, num_pages):
        shape = original(self, num_pages)
        attest.set_pool_bytes(shape[1] // max(1, self.page_size))
        return shape

    _index_buffer_shape.__wrapped__ = original
    return _index_buffer_shape


def pool_get_index_k_scale_buffer(self, layer_id, seq_len_tensor, page_indices, seq_len_sum, max_seq_len):
    """DSATokenToKVPool.get_index_k_scale_buffer (0.5.16): gather bf16 keys (packed for
    SGLang's fp8 plumbing), after the same layer-transfer wait as SGLang's."""
    if self.layer_transfer_counter is not None:
        self.layer_transfer_counter.wait_until(layer_id - self.start_layer)
    buf = self.index_k_with_scale_buffer[layer_id - self.start_layer]
    keys = bf16_cache.gather_keys_torch(buf, page_indices, seq_len_tensor, seq_len_sum, self.page_size,
                                        self.index_head_dim)
    return bf16_cache.smuggle_as_fp8(keys)


def pool_set_index_k_scale_buffer(self, layer_id, loc, index_k, index_k_scale):
    """DSATokenToKVPool.set_index_k_scale_buffer (0.5.16): an fp8 write into the bf16 cache; refuse."""
    _refuse_fp8_store("DSATokenToKVPool.set_index_k_scale_buffer")


def wrap_cell_size_with_indexer(original):
    """DefaultPoolConfigurator._compute_cell_size (0.5.16, bf16): SGLang adds (128 + 4) bytes
    x layers a token for a DSA model's indexer inside it; niah adds the bf16 row's extra
    (256 - 132) x the same layers, computed with SGLang's own helpers."""
    g = original.__globals__

    def _compute_cell_size(self, kvc, num_layers):
        cell = original(self, kvc, num_layers)
        hf_config = kvc.model_config.hf_config
        if not (kvc.use_mla_backend and g["is_deepseek_dsa"](hf_config)):
            return cell
        from sglang.srt.layers.cp.utils import get_glm_dsa_layer_split_effective_num_layers  # noqa: PLC0415

        head_dim = g["get_dsa_index_head_dim"](hf_config)
        fp8_row = head_dim + head_dim // g["DSATokenToKVPool"].quant_block_size * 4
        layers = get_glm_dsa_layer_split_effective_num_layers(kvc, num_layers)
        return cell + (head_dim * 2 - fp8_row) * layers

    _compute_cell_size.__wrapped__ = original
    return _compute_cell_size


# ---------------------------------------------------------------------------------------
# Attestation and top-k (every arm)


def counting(path: str, dtype: str, kernel: str):
    """factory(original) -> a pass-through wrapper that records one `path`/`dtype` call
    (the stock arm's resolvers, whose callers call them once per logits call, and the fp8
    key store)."""

    def factory(original):
        def counted(*args, **kwargs):
            attest.record(path, dtype, kernel)
            return original(*args, **kwargs)

        counted.__wrapped__ = original
        if hasattr(original, "cache_clear"):  # SGLang's resolvers are lru_cache'd
            counted.cache_clear = original.cache_clear
        return counted

    return factory


def wrap_internal_state(original):
    """SchedulerInternalStateController.get_internal_state: add the attestation, so
    `/server_info` -> internal_states[i]["niah_attestation"] reports what ran."""

    def get_internal_state(self, recv_req):
        out = original(self, recv_req)
        out.internal_state[attest.FIELD] = attest.snapshot()
        return out

    get_internal_state.__wrapped__ = original
    return get_internal_state


def niah_topk(score: torch.Tensor, lengths: torch.Tensor, topk: int,
              row_starts: torch.Tensor | None = None) -> torch.Tensor:
    """Not patched into SGLang (every arm runs SGLang's own top-k); the GPU evidence compares
    it with SGLang's. SGLang's unfused top-k contract (`_topk_unfused`) on niah.kernels.topk_indices:
    int32 [rows, topk], positions relative to row_starts, -1 for what is not selected
    (positions outside [row_start, row_start + length) and -inf logits)."""
    rows, width = score.shape
    if rows == 0 or topk == 0 or width == 0:
        return torch.full((rows, topk), -1, dtype=torch.int32, device=score.device)
    starts = (torch.zeros(rows, dtype=torch.int32, device=score.device) if row_starts is None
              else row_starts.reshape(-1).to(torch.int32))
    col = torch.arange(width, dtype=torch.int32, device=score.device)[None]
    ends = starts + lengths.reshape(-1).to(torch.int32)
    masked = score.float().masked_fill((col < starts[:, None]) | (col >= ends[:, None]), float("-inf"))
    idx = kernel("topk_indices")(masked, topk)
    return torch.where(idx >= 0, idx - starts[:, None], idx)


def wrap_topk_transform(original):
    """DSATopKBackend.topk_transform: SGLang's own top-k in every arm (fused topk_v2 by
    default), each call counted under the backend's name."""

    def topk_transform(*args, **kwargs):  # (self, ...): handed on unchanged
        attest.record("topk", "fp32", f"sglang.topk_{args[0].value}")
        return original(*args, **kwargs)

    topk_transform.__wrapped__ = original
    return topk_transform
