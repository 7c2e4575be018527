"""SGLang 0.5.23's DeepSeek-V4 C4-indexer code, lifted from its source (wheel or unpacked
tree) by AST into namespaces, wired to niah's plugin replacements the way the plugin
patches the live modules. Used by v4_gpu_evidence.py and tests/sglang/test_sglang_v4.py.

Lifted and run as SGLang wrote them: compressor_v2 `_forward_compress_all_in_one`
(+ `_get_paged_compress_metadata`, `_use_online_compress`, `is_overlap_compress`),
compress.py's plan tuples, the indexer pool's `_create_buffer` / `get_bytes_per_token` /
`get_dsv4_indexer_bytes_per_token` / `_num_dsv4_physical_kv_pages`, metadata.py's
`PagedIndexerMetadata`, and indexer.py's `forward_c4_indexer`, `_forward_prepare_normal`,
`_get_nonpaged_indexer_plan`, `_can_use_nonpaged_indexer`, `fp8_paged_mqa_logits_torch`
and its top-k transform (`topk_transform_pytorch_vectorized`).
Not SGLang's (JIT CUDA kernels, which cannot run without sglang's build): the compressor's
`compress_forward` returns the given compressed keys; `compute_q` / `compute_weights`
return the given fp8 query and weights; SGLang's fp8 key store (`fused_norm_rope_indexer`)
is niah's fp8 V4 store, bitwise equal to the torch reference of that kernel.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import math
import textwrap
import types
import typing
import zipfile
from pathlib import Path

import torch
import torch.nn.functional as F

CV2 = "sglang.srt.layers.attention.dsv4.compressor_v2"
IDX = "sglang.srt.layers.attention.dsv4.indexer"
CMP = "sglang.kernels.ops.attention.dsv4.compress"
POOL = "sglang.srt.mem_cache.deepseek_v4_memory_pool"
META = "sglang.srt.layers.attention.dsv4.metadata"
MODULES = (CV2, IDX, CMP, POOL, META, "sglang.srt.layers.attention.mqa_logits_utils")


class Source:
    """SGLang's source files from a wheel (zip) or an unpacked tree."""

    def __init__(self, path):
        self.path = Path(path)
        self._zip = zipfile.ZipFile(self.path) if self.path.is_file() else None

    def text(self, module: str) -> str:
        rel = module.replace(".", "/") + ".py"
        if self._zip is not None:
            return self._zip.read(rel).decode()
        return (self.path / rel).read_text()

    def extract(self, dest) -> None:
        """Copy MODULES into dest (a tree this class reads back)."""
        for m in MODULES:
            p = Path(dest) / (m.replace(".", "/") + ".py")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(self.text(m))


def lift(src: Source, module: str, qualname: str, ns: dict):
    """Compile `qualname` ('f', 'Class' or 'Class.f') from SGLang's source into ns; returns it.
    A lifted @dataclass class is passed through dataclasses.dataclass; function decorators
    (staticmethod) are dropped (the caller binds the function as it needs)."""
    text = src.text(module)
    body, node = ast.parse(text).body, None
    for part in qualname.split("."):
        node = next(n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
        body = getattr(node, "body", [])
    decorators = [ast.unparse(d) for d in node.decorator_list]
    node.decorator_list = []
    code = compile(textwrap.dedent(ast.unparse(node)), f"<sglang {module}.{qualname}>", "exec",
                   flags=__import__("__future__").annotations.compiler_flag, dont_inherit=True)
    exec(code, ns)
    obj = ns[node.name]
    if "dataclass" in decorators:
        obj = ns[node.name] = dataclasses.dataclass(obj)
    return obj


class Envs:
    """SGLang's `envs` registry read by the lifted code: name -> value (.get())."""

    def __init__(self, **values):
        self._values = values

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        value = self._values.get(name, False)
        return types.SimpleNamespace(get=lambda: value)


V4_ENVS = dict(SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=True, SGLANG_OPT_USE_TILELANG_INDEXER=False,
               SGLANG_OPT_USE_AITER_INDEXER=False, SGLANG_OPT_DSV4_NONPAGED_INDEXER=True,
               SGLANG_OPT_DSV4_NONPAGED_INDEXER_MIN_QUERY_TOKENS=0, SGLANG_OPT_USE_ONLINE_COMPRESS=False,
               SGLANG_DSA_FUSE_TOPK=False)
# SGLang's defaults (environ.py) for what the lifted code reads, but the non-paged prefill's
# 8,192-row threshold (0: any prefill row count takes it, so small tests reach it):
# forward_c4_indexer imports deep_gemm.fp8_paged_mqa_logits at call time.
PRODUCTION_ENVS = {**V4_ENVS, "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": False}


def base_ns(envs: dict | None = None) -> dict:
    return {"torch": torch, "F": F, "math": math, "typing": typing, "TYPE_CHECKING": False,
            "Any": typing.Any, "Optional": typing.Optional, "List": typing.List, "Tuple": typing.Tuple,
            "Union": typing.Union, "Callable": typing.Callable, "Dict": typing.Dict, "Literal": typing.Literal,
            "NamedTuple": typing.NamedTuple, "cast": typing.cast, "dataclass": dataclasses.dataclass,
            "field": dataclasses.field, "envs": Envs(**(V4_ENVS if envs is None else envs)), "is_hip": lambda: False,
            "is_xpu": lambda: False, "is_cuda": torch.cuda.is_available, "_is_hip": False, "_is_xpu": False,
            "nullcontext": contextlib.nullcontext, "ceil_div": lambda a, b: -(-a // b),
            "GPU_MEMORY_TYPE_KV_CACHE": "kv_cache"}


# ---------------------------------------------------------------------------------------
# One arm: SGLang's lifted V4 code with the plugin's bf16 replacements, or stock fp8.

HEAD_DIM, PAGE, RATIO = 128, 64, 4


def _jit_store_unreachable(*args, **kwargs):
    raise AssertionError("SGLang's JIT fused_norm_rope store was reached for an indexer row")


def niah_fp8_store(kv, plan, **kw):
    """Stand-in for SGLang's fused_norm_rope_indexer (JIT CUDA): niah's V4 fp8 store."""
    from niah.kernels import store_v4_index_keys

    freqs = torch.view_as_real(kw["freq_cis"]).flatten(-2)
    store_v4_index_keys(kv, plan[1], plan.is_decode, plan.compress_ratio, kw["norm_weight"].to(kv.dtype),
                        kw["norm_eps"], freqs, kw["out_loc"], kw["kvcache"], "fp8", kw["page_size"])


def make_pool(src: Source, arm: str, pages: int, device):
    """SGLang's DeepSeekV4IndexerPool allocation (lifted), through the plugin's wrappers for bf16
    (with the plugin's bf16 gather as get_index_k_scale_buffer)."""
    from niah.serving.sglang import v4

    ns = base_ns()
    lift(src, POOL, "_num_dsv4_physical_kv_pages", ns)
    bpt = lift(src, POOL, "get_dsv4_indexer_bytes_per_token", ns)
    methods = {name: lift(src, POOL, f"DeepSeekV4IndexerPool.{name}", ns)
               for name in ("_create_buffer", "get_bytes_per_token", "get_index_k_with_scale_buffer")}
    if arm == "bf16":
        ns["get_dsv4_indexer_bytes_per_token"] = v4.wrap_bytes_per_token(bpt)  # the plugin rebinds the global
        methods["_create_buffer"] = v4.wrap_create_buffer(methods["_create_buffer"])
        methods["get_index_k_scale_buffer"] = v4.gather_bf16_index_k
    cls = type("DeepSeekV4IndexerPool", (), {"quant_block_size": 128, "index_k_with_scale_buffer_dtype": torch.uint8,
                                             **methods})
    pool = cls.__new__(cls)
    pool.__dict__.update(size=pages * PAGE - PAGE, page_size=PAGE, global_page_size=PAGE, index_head_dim=HEAD_DIM,
                         layer_num=1, device=device, use_fp4_indexer=False, uses_aiter_fp4_layout=False,
                         custom_mem_pool=None,
                         memory_saver_adapter=types.SimpleNamespace(region=lambda tag: contextlib.nullcontext()))
    pool._create_buffer()
    return pool


def _cpu_torch():
    """torch with `torch.cuda.is_current_stream_capturing()` answering False: a CPU-only build
    raises there, and it is the one CUDA runtime query of SGLang's non-paged decision."""
    cuda = types.SimpleNamespace(**{k: getattr(torch.cuda, k) for k in dir(torch.cuda) if not k.startswith("__")})
    cuda.is_current_stream_capturing = lambda: False
    t = types.ModuleType("torch")
    t.__dict__.update({k: v for k, v in vars(torch).items() if k != "cuda"})
    t.cuda = cuda
    return t


def _production_ns(src: Source, ns: dict) -> None:
    """What the non-paged prefill needs, lifted; on a CPU-only machine the lifted code is told
    it runs on CUDA (`is_cuda`), the platform the plugin serves."""
    ns.update(Iterator=typing.Iterator, ceil_div=lambda a, b: -(-a // b), MQA_LOGITS_ROW_ALIGN_ELEMS=256,
              MQA_LOGITS_BYTES_PER_ELEM=4)
    lift(src, META, "NonPagedIndexerPlan", ns)
    lift(src, META, "iter_row_chunks", ns)
    for name in ("mqa_logits_row_bytes", "mqa_logits_rows_per_chunk"):
        lift(src, "sglang.srt.layers.attention.mqa_logits_utils", name, ns)
    if not torch.cuda.is_available():
        ns.update(is_cuda=lambda: True, torch=_cpu_torch())


def make_backend(src: Source, arm: str, pool, capture: dict, production: bool = False):
    """An object with SGLang's CompressorBackendMixin / C4IndexerBackendMixin methods (lifted).
    production=False: SGLANG_FP8_PAGED_MQA_LOGITS_TORCH on, the paged function is SGLang's torch
    fallback (fp8) or the plugin's replacement (bf16), its logits captured. production=True:
    SGLang's defaults; the lifted code imports `deep_gemm` itself (the caller provides the module,
    routed by the plugin), non-paged prefill included."""
    from niah.serving.sglang import v4

    envs = PRODUCTION_ENVS if production else None
    ns_c = base_ns(envs)
    ns_c["KVLayout"] = types.SimpleNamespace(V4="V4")
    for name in ("_use_online_compress", "is_overlap_compress"):
        lift(src, CV2, name, ns_c)
    cmeths = {n: lift(src, CV2, f"CompressorBackendMixin.{n}", ns_c)
              for n in ("_get_paged_compress_metadata", "_get_out_loc", "_forward_compress_all_in_one")}
    ns_c["compress_forward"] = lambda *, kv_score_input, **kw: kv_score_input  # JIT: returns the given keys
    ns_c["compress_norm_rope_store"] = (v4.wrap_compress_norm_rope_store(_jit_store_unreachable)
                                        if arm == "bf16" else niah_fp8_store)

    ns_i = base_ns(envs)
    ns_i.update(FP8_DTYPE=torch.float8_e4m3fn, _arange_cache={}, get_global_indexer_capturer=lambda: None,
                get_platform=lambda: types.SimpleNamespace(is_sm120=False),
                ForwardMode=types.SimpleNamespace(EXTEND="EXTEND"), is_in_tc_piecewise_cuda_graph=lambda: False,
                is_in_breakable_cuda_graph=lambda: False, get_parallel=lambda: types.SimpleNamespace(attn_cp_size=1))
    ns_m = base_ns()  # DeepGEMM's schedule metadata is not built (it is CUDA; niah's kernels take none)
    ns_i["PagedIndexerMetadata"] = lift(src, META, "PagedIndexerMetadata", ns_m)
    if production:
        _production_ns(src, ns_i)
    stock = lift(src, IDX, "fp8_paged_mqa_logits_torch", ns_i)
    for name in ("_topk_transform_vectorized", "topk_transform_pytorch_vectorized"):
        lift(src, IDX, name, ns_i)
    imeths = {n: lift(src, IDX, f"C4IndexerBackendMixin.{n}", ns_i)
              for n in ("forward_c4_indexer", "_forward_prepare_normal", "_get_nonpaged_indexer_plan",
                        "_can_use_nonpaged_indexer", "_gather_nonpaged_index_k", "_nonpaged_mqa_logits")}
    logits_fn = v4.paged_logits if arm == "bf16" else stock

    def captured(*args, **kwargs):
        out = logits_fn(*args, **kwargs)
        capture["logits"] = out
        return out

    if not production:
        ns_i["fp8_paged_mqa_logits_torch"] = captured
    for n in ("_gather_nonpaged_index_k", "_nonpaged_mqa_logits"):
        imeths[n] = staticmethod(imeths[n])
    cls = type("DeepseekV4Backend", (), {**cmeths, **imeths})
    backend = cls()
    backend.token_to_kv_pool = types.SimpleNamespace(
        get_index_k_with_scale_buffer=lambda layer_id: pool.get_index_k_with_scale_buffer(0),
        get_index_k_scale_buffer=lambda layer_id, **kw: pool.get_index_k_scale_buffer(0, **kw))
    backend.hisparse_coordinator = None
    backend.debug_use_external_c4_sparse_indices = False
    backend.dsa_topk_backend = types.SimpleNamespace(is_torch=lambda: True, is_sgl_kernel=lambda: False)
    backend.forward_indexer_compressor = _jit_store_unreachable  # skip_compressor=True below
    backend.plan_classes = (lift(src, CMP, "CompressorDecodePlan", base_ns()),
                            lift(src, CMP, "CompressorPrefillPlan", base_ns()))
    backend.metadata_class = ns_i["PagedIndexerMetadata"]
    return backend
