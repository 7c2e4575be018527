"""SGLang 0.5.23's DeepSeek-V3.2 indexer code, lifted from the wheel into one namespace and
wired to niah's plugin the way the plugin patches the live modules (each Patch's factory
applied to the lifted original). Used by tests/sglang/test_sglang_v32.py.

Lifted and run as SGLang wrote them: `Indexer`'s `_forward_cuda_k_only`, `_fused_k_weights`,
`_fused_q_prepare_and_store`, `_fused_k_prepare_and_store` (the fp8 arm's original; the bf16
arm's replacement is built from it), `_store_index_k_cache`, `_get_topk_paged`,
`_get_topk_ragged`, `_mask_init_and_local_tokens`, `_pad_heads_for_deep_gemm`,
`_get_index_k_read_buffer`, `_indexer_cos_sin_cache`, `_with_real_sm_count`,
`_aiter_fused_fp8_active`; `_index_k_write_targets`, `get_kv_shard_pool`;
`IndexKeyCache` and `DSATokenToKVPool`'s key accessors; `DSAIndexerMetadata`,
`DSATopKBackend` (its torch backend: `_topk_unfused`; SGLANG_DSA_FUSE_TOPK's v2 kernels are
JIT CUDA); `deepgemm_paged_mqa_logits_split` and `_restore_row_stride`; the MQA-logits budget
helpers. `_get_topk_ragged` is compiled with its asserts removed (it asserts a CUDA device
index, which CPU tensors lack). Not SGLang's (JIT CUDA, cannot run without its build):
`fused_q_indexer_rope_first_quant` returns the query and weights the test gives;
`fused_k_indexer_norm_rope_store` (fp8 arm) is niah's fp8 V3.2 store, byte-equal or one
e4m3 step from the .cuh (kernels/v32_store).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import enum
import textwrap
import types
import typing
from abc import ABC, abstractmethod

import torch

from niah.serving.sglang import replacements
from niah.serving.sglang.plugin import all_patches
from sglang_source import module_source, sglang_wheel

DSA = "sglang.srt.layers.attention.dsa"
IDX = f"{DSA}.dsa_indexer.Indexer"
IKC = "sglang.srt.mem_cache.index_key_cache.IndexKeyCache"
PAGE, HEAD_DIM, ROPE = 64, 128, 64


class Envs:
    """SGLang's `envs` registry as the lifted code reads it (name -> .get())."""

    def __init__(self, **values):
        self._values = values

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        value = self._values.get(name)
        return types.SimpleNamespace(get=lambda: value, is_set=lambda: value is not None)


def lift(module: str, qualname: str, ns: dict, optimize: int = 0):
    """Compile `qualname` ('f', 'Class', 'Class.f') from the wheel into ns; function
    decorators are dropped (the caller re-applies staticmethod/property/contextmanager)."""
    text = module_source(sglang_wheel(), module)
    body, node = ast.parse(text).body, None
    for part in qualname.split("."):
        node = next(n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
        body = getattr(node, "body", [])
    if isinstance(node, ast.FunctionDef):
        node.decorator_list = []
    code = compile(textwrap.dedent(ast.unparse(node)), f"<sglang {module}.{qualname}>", "exec",
                   flags=__import__("__future__").annotations.compiler_flag, dont_inherit=True, optimize=optimize)
    exec(code, ns)
    return ns[node.name]


def _patched(target: str, arm: str, original):
    """original with the plugin's patch for `target` in this arm applied (as plugin.apply_at does)."""
    for p in all_patches():
        if p.target == target and p.when == arm:
            return p.factory(original)
    return original


def fp8_store_stand_in(k_input, cache, out_cache_loc, weight, bias, eps, cos_sin_cache, positions, page_size):
    """SGLang's fused_k_indexer_norm_rope_store (JIT CUDA) -> niah's fp8 V3.2 store, same arguments."""
    from niah.kernels import store_v32_index_keys

    store_v32_index_keys(k_input, cache, out_cache_loc, weight, bias, eps, cos_sin_cache, positions, page_size,
                         index_dtype="fp8")


def base_ns(arm: str) -> dict:
    ns = {"torch": torch, "typing": typing, "Optional": typing.Optional, "List": typing.List,
          "Tuple": typing.Tuple, "Dict": typing.Dict, "Callable": typing.Callable, "Union": typing.Union,
          "Any": typing.Any, "TYPE_CHECKING": False, "dataclass": dataclasses.dataclass, "Enum": enum.Enum,
          "IntEnum": enum.IntEnum, "auto": enum.auto, "ABC": ABC, "abstractmethod": abstractmethod,
          "contextlib": contextlib, "nullcontext": contextlib.nullcontext,
          "envs": Envs(SGLANG_DSA_FUSE_TOPK=False, SGLANG_OPT_USE_TOPK_V2=True),
          "_is_hip": False, "_is_xpu": False, "_is_cuda": False, "_is_fp8_fnuz": False, "_use_aiter": False,
          "_use_aiter_preshuffle": False, "fp8_dtype": torch.float8_e4m3fn, "get_is_capture_mode": lambda: False,
          "GPU_MEMORY_TYPE_KV_CACHE": "kv_cache", "dsa_index_k_cache": None, "INDEXER_K_CACHE_PRESHUFFLE_TILE": 16,
          "PageInterleaveKVPoolMixin": type("PageInterleaveKVPoolMixin", (), {}),
          "can_use_dsa_fused_store": lambda *a: True, "fused_k_indexer_norm_rope_store": fp8_store_stand_in,
          "resolve_fp8_paged_mqa_logits_fn": replacements.resolve_fp8_paged_mqa_logits_fn,
          "resolve_fp8_mqa_logits_fn": replacements.resolve_fp8_mqa_logits_fn,
          "pick_dsl_expand": None, "cutedsl_paged_mqa_logits": None, "aiter_paged_mqa_logits": None}
    lift("sglang.kernels.ops.attention.dsa.paged_mqa_logits", "_restore_row_stride", ns)
    for name in ("deepgemm_paged_mqa_logits_split", "deepgemm_paged_mqa_logits_native"):
        lift("sglang.kernels.ops.attention.dsa.paged_mqa_logits", name, ns)
    mq = "sglang.srt.layers.attention.mqa_logits_utils"
    ns.update(MQA_LOGITS_STATIC_SKIP_ELEMS=8_000_000, MQA_LOGITS_BYTES_PER_ELEM=4, MQA_LOGITS_MAX_BYTES_ROCM=2**31 - 1)
    for name in ("mqa_logits_needs_budget_check", "mqa_logits_should_chunk"):
        lift(mq, name, ns)
    lift("sglang.srt.layers.attention.kv_shard_hooks", "get_kv_shard_pool", ns)
    lift(f"{DSA}.dsa_indexer", "_index_k_write_targets", ns)
    lift(f"{DSA}.dsa_backend_mtp_precompute", "compute_cu_seqlens", ns)
    return ns


def topk_backend(ns: dict):
    """SGLang's DSATopKBackend (lifted), topk_transform wrapped by the plugin (counting)."""
    for name in ("TopkTransformMethod", "_topk_unfused"):
        lift(f"{DSA}.dsa_topk_backend", name, ns)
    cls = lift(f"{DSA}.dsa_topk_backend", "DSATopKBackend", ns)
    cls.topk_transform = _patched(f"{DSA}.dsa_topk_backend.DSATopKBackend.topk_transform", "always",
                                  cls.__dict__["topk_transform"])
    lift(f"{DSA}.dsa_indexer_metadata", "BaseIndexerMetadata", ns)
    lift(f"{DSA}.dsa_indexer_metadata", "DSAIndexerMetadata", ns)
    return cls


def key_pool(ns: dict, arm: str, pages: int, layers: int = 1):
    """SGLang's IndexKeyCache (bf16 methods from the plugin's patch table in the bf16 arm)
    behind DSATokenToKVPool's own accessors."""
    base = lift("sglang.srt.mem_cache.index_key_cache", "IndexKeyCache", ns)
    cls = type("IndexKeyCache", (base,), {})
    for p in all_patches():
        if p.target.startswith(IKC + ".") and p.when == arm:
            name = p.target.rsplit(".", 1)[1]
            setattr(cls, name, p.factory(getattr(base, name)))
    pool = types.SimpleNamespace(
        page_size=PAGE, index_kpool=1, index_page_size=PAGE, index_head_dim=HEAD_DIM, quant_block_size=128,
        index_k_with_scale_buffer_dtype=torch.uint8, device="cpu", layer_num=layers,
        skip_topk_layers=[False] * layers, start_layer=0, layer_transfer_counter=None, custom_mem_pool=None,
        memory_saver_adapter=types.SimpleNamespace(region=lambda _tag: contextlib.nullcontext()))
    pool.index_key_cache = cls(pool, pages * PAGE - PAGE)
    mp = "sglang.srt.mem_cache.memory_pool"
    for name in ("get_index_k_with_scale_buffer", "get_index_k_scale_buffer"):
        fn = lift(mp, f"DSATokenToKVPool.{name}", ns)
        setattr(pool, name, types.MethodType(fn, pool))
    ns["get_token_to_kv_pool"] = lambda: pool
    return pool


INDEXER_METHODS = ("_forward_cuda_k_only", "_fused_k_weights", "_fused_q_prepare_and_store",
                   "_fused_k_prepare_and_store", "_store_index_k_cache", "_get_topk_paged",
                   "_mask_init_and_local_tokens",
                   "_aiter_fused_fp8_active", "_get_mqa_logits_budget_bytes")


def indexer_class(ns: dict, arm: str):
    """An Indexer class of SGLang's lifted methods, with the plugin's patches for this arm."""
    m = {name: lift(f"{DSA}.dsa_indexer", f"Indexer.{name}", ns) for name in INDEXER_METHODS}
    m["_get_topk_ragged"] = lift(f"{DSA}.dsa_indexer", "Indexer._get_topk_ragged", ns, optimize=1)
    for name in ("_fused_k_prepare_and_store", "_store_index_k_cache", "_get_topk_paged"):
        m[name] = _patched(f"{IDX}.{name}", arm, m[name])
    m["_get_index_k_read_buffer"] = staticmethod(lift(f"{DSA}.dsa_indexer", "Indexer._get_index_k_read_buffer", ns))
    m["_pad_heads_for_deep_gemm"] = staticmethod(lift(f"{DSA}.dsa_indexer", "Indexer._pad_heads_for_deep_gemm", ns))
    m["_indexer_cos_sin_cache"] = property(lift(f"{DSA}.dsa_indexer", "Indexer._indexer_cos_sin_cache", ns))
    m["_with_real_sm_count"] = contextlib.contextmanager(lift(f"{DSA}.dsa_indexer", "Indexer._with_real_sm_count", ns))
    return type("Indexer", (), m)


class Linear:
    """A bias-free projection with ReplicatedLinear's call convention: (y, None)."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def __call__(self, x):
        return x @ self.weight.T, None


class Backend:
    """DSAPagedMQALogitsBackend's default (deepgemm) or another value, as the indexer asks it."""

    def __init__(self, value: str = "deepgemm"):
        self.value = value

    def is_deepgemm(self): return self.value == "deepgemm"
    def is_cutedsl(self): return self.value == "cutedsl"
    def is_aiter(self): return self.value == "aiter"


def cos_sin_cache(max_pos: int = 4096, base: float = 10000.0) -> torch.Tensor:
    """SGLang's rotary cos_sin_cache layout for the indexer: [max_pos, 64] = [cos x 32 | sin x 32]."""
    inv = 1.0 / base ** (torch.arange(0, ROPE, 2, dtype=torch.float32) / ROPE)
    ang = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv[None]
    return torch.cat((ang.cos(), ang.sin()), dim=1)


def make_indexer(cls, heads: int, hidden: int, topk: int, seed: int = 0, backend: str = "deepgemm"):
    """An instance with the attributes SGLang's __init__ sets on the fused CUDA path."""
    g = torch.Generator().manual_seed(seed)
    self = cls.__new__(cls)
    self.head_dim, self.n_heads, self.rope_head_dim, self.index_topk = HEAD_DIM, heads, ROPE, topk
    self.use_dsa_indexer_fusion, self.use_aiter_fused_fp8_writer = True, False
    self.alt_stream, self.logits_with_pp_recv = None, False
    self.num_init_tokens = self.num_local_tokens = 0
    self.softmax_scale = HEAD_DIM**-0.5
    self.sm_count = 132
    self.paged_mqa_logits_backend = Backend(backend)
    w = torch.randn(HEAD_DIM + heads, hidden, generator=g) / hidden**0.5
    w[: HEAD_DIM, torch.randperm(hidden, generator=g)[:4]] *= 8  # outlier input channels
    self.wk_weights_proj = Linear(w.bfloat16())
    self.k_norm = types.SimpleNamespace(weight=1 + 0.1 * torch.randn(HEAD_DIM, generator=g),
                                        bias=0.1 * torch.randn(HEAD_DIM, generator=g), variance_epsilon=1e-6)
    self.rotary_emb = types.SimpleNamespace(cos_sin_cache=cos_sin_cache())
    return self


def hadamard_stand_in(x: torch.Tensor) -> torch.Tensor:
    """SGLang's rotate_activation (JIT CUDA hadamard_transform, scale d^-0.5) in torch: Sylvester order."""
    d = x.shape[-1]
    h = torch.ones(1, 1, dtype=torch.float32)
    while h.shape[0] < d:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return (x.float() @ h.T * d**-0.5).to(x.dtype)


def unfused(ns: dict, idx, seed: int = 0) -> None:
    """The Indexer SGLang builds for a NeoX-RoPE config (DeepSeek-V3.2 without
    indexer_rope_interleave): fusion off, its own wk, k_norm (LayerNorm.forward_native) and
    rotary (RotaryEmbedding.forward_native, NeoX), lifted; the key is Hadamard-rotated."""
    g = torch.Generator().manual_seed(seed)
    cls = type(idx)
    cls._get_k_bf16 = lift(f"{DSA}.dsa_indexer", "Indexer._get_k_bf16", ns)
    cls._update_rope_guarded = staticmethod(lift(f"{DSA}.dsa_indexer", "Indexer._update_rope_guarded", ns))
    ns["rotate_activation"] = hadamard_stand_in
    idx.use_dsa_indexer_fusion = False
    hidden = idx.wk_weights_proj.weight.shape[1]
    idx.wk = Linear((torch.randn(HEAD_DIM, hidden, generator=g) / hidden**0.5).bfloat16())
    ln_ns = {"torch": torch, "F": torch.nn.functional}
    ln_fwd = lift("sglang.srt.layers.layernorm", "LayerNorm.forward_native", ln_ns)
    ln = types.SimpleNamespace(weight=idx.k_norm.weight, bias=idx.k_norm.bias, elementwise_affine=True, use_bias=True,
                               dtype=torch.float32, hidden_size=HEAD_DIM, variance_epsilon=idx.k_norm.variance_epsilon)
    idx.k_norm = type("LayerNorm", (), {"__call__": lambda self, x: ln_fwd(ln, x),
                                        "weight": ln.weight, "bias": ln.bias, "variance_epsilon": 1e-6})()
    rope_ns = {"torch": torch, "Optional": typing.Optional, "Tuple": typing.Tuple, "FusedSetKVBufferArg": object}
    fwd = lift("sglang.srt.layers.rotary_embedding.base", "RotaryEmbedding.forward_native", rope_ns)
    apply = lift("sglang.srt.layers.rotary_embedding.utils", "apply_rotary_emb", {"torch": torch})
    rope = types.SimpleNamespace(head_size=ROPE, rotary_dim=ROPE, is_neox_style=True,
                                 cos_sin_cache=idx.rotary_emb.cos_sin_cache, _apply_rotary_emb_wrapped=apply)
    idx.rotary_emb = type("Rope", (), {"__call__": lambda self, p, q, k: fwd(rope, p, q, k),
                                       "cos_sin_cache": rope.cos_sin_cache})()
