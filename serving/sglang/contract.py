"""The plugin's contract with SGLang, as data, and the one function that checks it.

Every symbol the plugin replaces, wraps or relies on is a `PatchPoint`: the module, the
qualified name inside it, the parameter names it must have (in order, keyword-only
ones included), and names its body must still reference (so that, say, the decode
path still asks `resolve_fp8_paged_mqa_logits_fn` for its kernel). `check_contract`
runs the list against a `SymbolSource`: either SGLang's source read as AST (from the
downloaded wheel, or an unpacked tree; nothing is imported) or the live, installed
modules (via inspect). The plugin refuses to start unless the check passes.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
import types
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Protocol

SUPPORTED_VERSIONS = ("0.5.23",)
_VERSION_RE = re.compile(r"^(\d+\.\d+\.\d+)(\.post\d+)?(\+[A-Za-z0-9.]+)?$")


def supported_version(version: str) -> bool:
    """Any build of a supported release: 0.5.23, 0.5.23.post1, 0.5.23+cu130 (not rc/dev)."""
    m = _VERSION_RE.match(version or "")
    return bool(m) and m.group(1) in SUPPORTED_VERSIONS

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
    # -- top-k: the torch backend's unfused top-k runs niah.kernels.topk_indices.
    PatchPoint(f"{_DSA}.dsa_topk_backend", "DSATopKBackend.topk_func",
               ("self", "score", "lengths", "topk", "row_starts"), "replace", "always",
               "the unfused top-k (--dsa-topk-backend torch, SGLANG_DSA_FUSE_TOPK=false): niah's kernel",
               ("is_torch", "_topk_unfused")),
    PatchPoint(f"{_DSA}.dsa_topk_backend", "DSATopKBackend.topk_transform", None, "uses", "always",
               "with SGLANG_DSA_FUSE_TOPK false every top-k goes through topk_func",
               ("SGLANG_DSA_FUSE_TOPK", "topk_func")),
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
               "decode: views the key cache as 132-byte fp8 rows; niah reads bf16 pages instead",
               ("resolve_fp8_paged_mqa_logits_fn", "get_page_table_64", "get_seqlens_int32",
                "get_dsa_extend_len_cpu", "_mask_init_and_local_tokens", "topk_transform",
                "index_page_size", "paged_mqa_ctx_lens_2d")),
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer._store_index_k_cache",
               ("self", "forward_batch", "layer_id", "key", "act_quant", "out_cache_loc"),
               "replace", "always", "stores index keys (fp8 quantise; counted); bf16: niah stores them unquantised",
               ("get_token_to_kv_pool", "set_index_k_scale_buffer")),
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer._mask_init_and_local_tokens",
               ("self", "logits", "lengths", "row_starts"), "uses", "bf16",
               "called by niah's bf16 decode path, as by the original"),
    PatchPoint(f"{_DSA}.dsa_indexer", "get_token_to_kv_pool", None, "uses", "bf16",
               "the pool accessor the indexer module imports"),
    PatchPoint(f"{_DSA}.dsa_indexer", "Indexer.__init__", None, "uses", "bf16",
               "sets use_dsa_indexer_fusion from SGLANG_DISABLE_DSA_INDEXER_FUSION",
               ("use_dsa_indexer_fusion", "SGLANG_DISABLE_DSA_INDEXER_FUSION")),
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

V4_POINTS: tuple[PatchPoint, ...] = (
    # -- DeepSeek-V4 (C4 indexer): the torch paged-logits fallback niah takes over.
    PatchPoint(f"{_DSV4}.indexer", "fp8_paged_mqa_logits_torch",
               ("q_fp8", "kvcache_fp8", "weight", "seq_lens", "page_table",
                "deep_gemm_metadata", "max_seq_len", "clean_logits"),
               "replace", "niah", "V4 paged logits behind SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"),
    PatchPoint(f"{_DSV4}.indexer", "fp8_paged_mqa_logits_torch_sm120",
               ("q_fp8", "kvcache_fp8", "weight", "seq_lens", "page_table",
                "deep_gemm_metadata", "max_seq_len", "clean_logits"),
               "replace", "niah", "the same fallback on SM120"),
    PatchPoint(f"{_DSV4}.indexer", "C4IndexerBackendMixin.forward_c4_indexer",
               ("self", "x", "q_lora", "c4_indexer", "forward_batch", "alt_streams",
                "enable_multi_stream", "q_lora_ready", "skip_compressor", "q_lora_quant"),
               "uses", "niah", "selects the torch fallback when SGLANG_FP8_PAGED_MQA_LOGITS_TORCH is set",
               ("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "fp8_paged_mqa_logits_torch",
                "fp8_paged_mqa_logits_torch_sm120")),
    PatchPoint("sglang.srt.mem_cache.deepseek_v4_memory_pool", "DeepSeekV4TokenToKVPool.__init__",
               None, "wrap", "bf16", "bf16 keys are not implemented for V4: niah refuses there"),
)

FAMILY_POINTS = {"server": SERVER_POINTS, "deepseek-v3.2": V32_POINTS, "deepseek-v4": V4_POINTS}
PATCH_POINTS: tuple[PatchPoint, ...] = tuple(p for pts in FAMILY_POINTS.values() for p in pts)


def points_for(index_dtype: str, kernels: str | None = None) -> tuple[PatchPoint, ...]:
    """The patch points needed for one arm: index dtype "fp8" / "bf16", kernels "stock" /
    "niah" (None: both kernels)."""
    wanted = {"always", index_dtype, *((kernels,) if kernels else ("stock", "niah"))}
    return tuple(p for p in PATCH_POINTS if p.when in wanted)


# ---------------------------------------------------------------------------------------
# Symbol sources


@dataclass
class Symbol:
    """What a source knows about one symbol: its parameters (None if not a function),
    the names its body mentions, where it is (file:line) and its normalised source."""

    params: tuple[str, ...] | None
    names: frozenset[str]
    where: str | None = None
    text: str = ""


class SymbolSource(Protocol):
    version: str | None
    label: str

    def lookup(self, module: str, qualname: str) -> Symbol | None: ...


def _ast_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args)]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return tuple(names)


def _ast_names(node: ast.AST) -> frozenset[str]:
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.add(n.value)
    return frozenset(out)


def _find_in_body(body: Iterable[ast.stmt], name: str) -> ast.AST | None:
    """A top-level def/class/assignment/import named `name` in a module or class body
    (the last one wins, as at run time)."""
    found = None
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((al.asname or al.name.split(".")[0]) == name for al in node.names):
                found = node
        elif isinstance(node, (ast.If, ast.Try)):
            inner = [*node.body, *getattr(node, "orelse", [])]
            for h in getattr(node, "handlers", []):
                inner += h.body
            hit = _find_in_body(inner, name)
            if hit is not None:
                found = hit
    return found


class AstSource:
    """SGLang's source read without importing it: a wheel (zip) or an unpacked tree."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.label = str(self.path)
        self._trees: dict[str, ast.Module | None] = {}
        if self.path.is_file():
            try:
                self._zip: zipfile.ZipFile | None = zipfile.ZipFile(self.path)
            except zipfile.BadZipFile as e:
                from niah.errors import BadInput

                raise BadInput(f"{self.path} is not a wheel/zip file: {e}") from None
        elif self.path.is_dir():
            self._zip = None
        else:
            from niah.errors import BadInput

            raise BadInput(f"SGLang source not found: {self.path}")
        self.version = self._read_version()

    def _read(self, rel: str) -> str | None:
        if self._zip is not None:
            try:
                return self._zip.read(rel).decode("utf-8")
            except KeyError:
                return None
        p = self.path / rel
        return p.read_text(encoding="utf-8") if p.is_file() else None

    def _names(self) -> list[str]:
        if self._zip is not None:
            return self._zip.namelist()
        return [str(p.relative_to(self.path)) for p in self.path.glob("*.dist-info/METADATA")]

    def _read_version(self) -> str | None:
        for name in self._names():
            if re.fullmatch(r"sglang-[^/]+\.dist-info/METADATA", name):
                text = self._read(name) or ""
                m = re.search(r"^Version:\s*(\S+)", text, re.M)
                if m:
                    return m.group(1)
        return None

    def _tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            base = module.replace(".", "/")
            text = self._read(base + ".py")
            if text is None:
                text = self._read(base + "/__init__.py")
            self._trees[module] = ast.parse(text) if text is not None else None
        return self._trees[module]

    def module_file(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for rel in (base + ".py", base + "/__init__.py"):
            if self._read(rel) is not None:
                return rel
        return None

    def files(self) -> dict[str, str]:
        """Every sglang/**.py file (relative path -> text) that mentions a watched call."""
        from niah.serving.sglang.contract_sites import WATCHED

        if self._zip is not None:
            names = [n for n in self._zip.namelist() if n.startswith("sglang/") and n.endswith(".py")]
        else:
            names = [str(p.relative_to(self.path)) for p in self.path.glob("sglang/**/*.py")]
        out = {}
        for n in names:
            text = self._read(n) or ""
            if any(w in text for w in WATCHED):
                out[n] = text
        return out

    def lookup(self, module: str, qualname: str) -> Symbol | None:
        tree = self._tree(module)
        if tree is None:
            return None
        node: ast.AST | None = None
        body: list[ast.stmt] = tree.body
        for part in qualname.split("."):
            node = _find_in_body(body, part)
            if node is None:
                return None
            body = node.body if isinstance(node, ast.ClassDef) else []
        where = f"{self.module_file(module)}:{node.lineno}"
        params = _ast_params(node) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
        return Symbol(params, _ast_names(node), where, ast.unparse(node))

    def near(self, module: str, qualname: str) -> str:
        """Where a missing symbol might have gone: the module file, and the closest name
        defined where it should be (file:line), for the error message."""
        import difflib

        rel = self.module_file(module)
        tree = self._tree(module)
        if rel is None or tree is None:
            return f"{module.replace('.', '/')}.py: module missing"
        body: list[ast.stmt] = tree.body
        parts = qualname.split(".")
        for part in parts[:-1]:
            node = _find_in_body(body, part)
            if not isinstance(node, ast.ClassDef):
                return f"{rel}:1"
            body = node.body
        defs = {n.name: n.lineno for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        close = difflib.get_close_matches(parts[-1], list(defs), n=1, cutoff=0.6)
        return f"{rel}:{defs[close[0]]} (closest: {close[0]})" if close else f"{rel}:1"


def _code_names(code: types.CodeType) -> set[str]:
    out = set(code.co_names) | {c for c in code.co_consts if isinstance(c, str)}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _code_names(c)
    return out


def _live_params(fn) -> tuple[str, ...]:
    names = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            names.append("*" + p.name)
        elif p.kind is p.VAR_KEYWORD:
            names.append("**" + p.name)
        else:
            names.append(p.name)
    return tuple(names)


class LiveSource:
    """The installed SGLang, imported (only where SGLang and its GPU stack are installed)."""

    label = "installed sglang"

    def __init__(self):
        from importlib.metadata import PackageNotFoundError, version

        try:
            self.version = version("sglang")
        except PackageNotFoundError:
            self.version = None

    def lookup(self, module: str, qualname: str) -> Symbol | None:
        try:
            obj = importlib.import_module(module)
        except ImportError as e:
            raise ContractImportError(module, e) from e
        for part in qualname.split("."):
            if isinstance(obj, type):
                raw = None
                for klass in obj.__mro__:
                    if part in klass.__dict__:
                        raw = klass.__dict__[part]
                        break
                if raw is None:
                    return None
                obj = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
            else:
                if not hasattr(obj, part):
                    return None
                obj = getattr(obj, part)
        fn = inspect.unwrap(obj) if callable(obj) else obj
        if inspect.isfunction(fn) or inspect.isclass(fn):
            try:
                where = f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
                text = ast.unparse(ast.parse(textwrap.dedent(inspect.getsource(fn))))
            except (OSError, TypeError, SyntaxError):
                where, text = None, ""
            if inspect.isclass(fn):
                return Symbol(None, frozenset(), where, text)
            return Symbol(_live_params(fn), frozenset(_code_names(fn.__code__)), where, text)
        return Symbol(None, frozenset(), None, f"{qualname.split('.')[-1]} = {obj!r}")

    def near(self, module: str, qualname: str) -> str:
        return module

    def files(self) -> dict[str, str]:
        """The installed sglang package's files that mention a watched call."""
        import importlib.util

        from niah.serving.sglang.contract_sites import WATCHED

        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            return {}
        root = Path(list(spec.submodule_search_locations)[0]).parent
        out = {}
        for p in root.glob("sglang/**/*.py"):
            text = p.read_text(encoding="utf-8", errors="replace")
            if any(w in text for w in WATCHED):
                out[str(p.relative_to(root))] = text
        return out


class ContractImportError(Exception):
    """A module of the contract could not be imported from the installed SGLang."""

    def __init__(self, module: str, err: Exception):
        super().__init__(f"cannot import {module}: {type(err).__name__}: {err}")
        self.module = module


# ---------------------------------------------------------------------------------------
# The check


@dataclass
class ContractReport:
    version: str | None
    source: str
    checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        v = self.version or "unknown version"
        if self.ok:
            return f"plugin contract OK: sglang {v} ({self.checked} patch points, {self.source})"
        head = (f"niah's SGLang plugin does not fit sglang {v} ({self.source}): "
                f"{'; '.join(self.problems)}. Supported SGLang versions: "
                f"{', '.join(SUPPORTED_VERSIONS)}")
        return head


def check_contract(source: SymbolSource, points: Iterable[PatchPoint] = PATCH_POINTS,
                   callers: bool | None = None) -> ContractReport:
    """Check every patch point against `source`, then (for the plugin's own points, or
    when `callers` is True) the layout constants and every call site of the index-key
    pool and indexer kernels (contract_sites.py). Collects every problem; each names the
    file and line where SGLang's source says so."""
    from niah.serving.sglang.contract_sites import check_call_sites, check_layout

    points = list(points)
    report = ContractReport(version=source.version, source=source.label)
    if source.version is not None and not supported_version(source.version):
        report.problems.append(f"version {source.version} is not a supported version")
    _check_points(source, points, report)
    if callers if callers is not None else all(p in PATCH_POINTS for p in points):
        report.problems += check_layout(source)
        report.problems += check_call_sites(source.files())
    return report


def _check_points(source: SymbolSource, points: list[PatchPoint], report: ContractReport) -> None:
    for p in points:
        report.checked += 1
        try:
            sym = source.lookup(p.module, p.qualname)
        except ContractImportError as e:
            report.problems.append(f"{p.target}: {e}")
            continue
        if sym is None:
            report.problems.append(f"{source.near(p.module, p.qualname)}: missing symbol {p.target} ({p.why})")
            continue
        at = f"{sym.where}: " if sym.where else ""
        if p.params is not None and sym.params != p.params:
            got = "not a function" if sym.params is None else f"({', '.join(sym.params)})"
            report.problems.append(
                f"{at}signature changed: {p.target} expected ({', '.join(p.params)}), found {got}")
        missing_refs = [r for r in p.references if r not in sym.names]
        if missing_refs:
            report.problems.append(
                f"{at}{p.target} no longer references {', '.join(missing_refs)} ({p.why})")
