"""The contract's second half: callers and layout constants, found by pattern in SGLang's
source and checked against what niah knows about each.

- Call sites (`scan_calls`, dispositions in call_sites.py): in every SGLang module (but
  its shipped tests, sglang/test/), every reference to DeepGEMM (any attribute of an
  imported `deep_gemm` module, any name imported `from deep_gemm import ...`: callee
  "deep_gemm.<name>") and every call whose callee name reads or writes index keys or
  their scales, computes indexer logits, or runs V3.2's fused key store and the Indexer
  methods around it (`INDEX_NAMES`, a pattern, not a list). A site
  is (file, enclosing function, callee, count): a new callee, a new function, or a second
  identical call in the same function is a break naming its file and line.
- Layout constants (`LAYOUT`, `scan_layout`): the source text the plugin relies on (fp8
  rows of 132 bytes = 128 values + one 4-byte scale, 8,448-byte pages of 64 tokens, quant
  block 128, uint8 container). Every place the DSA/V4 sources write the fp8 row width
  (132, 8448, `head_dim + 4`, `head_dim // block * 4`) must be one of them.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import NamedTuple

# Callee names that read or write index keys or their scales, or compute indexer logits.
# `k_indexer` and `prepare_and_store`: V3.2's fused key store (fused_k_indexer_norm_rope_store)
# and the Indexer methods that run it (_fused_k_prepare_and_store, _fused_q_prepare_and_store).
INDEX_NAMES = re.compile(
    r"index_k(?!pool)|indexer_k(?!pool)|index_fp4|index_key|_index_cache|(^|_)(get|set|store)_index(_|$)"
    r"|(^|_)k_and_scale|(^|_)k_scale|(^|_)store_quantized$|mqa_logits|(^|_)k_indexer|prepare_and_store")
DEEP_GEMM = "deep_gemm"
NOT_SERVED = ("sglang/test/",)  # SGLang's own tests, shipped in the wheel; no server imports them
# Where the fp8 row width is watched: the DSA/V4 indexer, the key pools and their accounting.
LAYOUT_SCOPE = ("sglang/srt/layers/attention/dsa/", "sglang/srt/layers/attention/dsv4/",
                "sglang/srt/layers/attention/dsa_backend.py", "sglang/srt/layers/attention/deepseek_v4_backend.py",
                "sglang/srt/mem_cache/", "sglang/srt/model_executor/pool_configurator.py")
ROW_WIDTH = re.compile(r"head_dim \+ 4\b|\b128 \+ 4\b|head_dim // [\w.]+ \* 4\b")
ROW_NUMBERS = (132, 8448)
# Cheap text tests, supersets of what the scanners find: a DeepGEMM mention, a called
# name that INDEX_NAMES matches; for LAYOUT_SCOPE files, the row width.
_DEEP_GEMM_TEXT = re.compile(r"\bdeep_gemm\b")
_CALLED = re.compile(r"(\w+)\s*\(")
_LAYOUT_TEXT = re.compile(r"\b(132|8448)\b|\+ 4\b|\* 4\b")


_FRAGMENTS = ("index_k", "indexer_k", "index_fp4", "index_key", "_index_cache", "get_index", "set_index",
              "store_index", "k_and_scale", "k_scale", "store_quantized", "mqa_logits", "k_indexer",
              "prepare_and_store")  # each INDEX_NAMES branch


def _may_call(text: str) -> bool:
    if "deep_gemm" in text and _DEEP_GEMM_TEXT.search(text):
        return True
    if not any(f in text for f in _FRAGMENTS):
        return False
    return any(INDEX_NAMES.search(n) for n in set(_CALLED.findall(text)))


def scanned(rel: str, text: str) -> bool:
    """Whether a file can hold a watched site or layout constant (a cheap text test)."""
    if rel.startswith(NOT_SERVED):
        return False
    return _may_call(text) or (rel.startswith(LAYOUT_SCOPE) and bool(_LAYOUT_TEXT.search(text)))


class Site(NamedTuple):
    file: str
    line: int
    where: str  # enclosing qualname ("" at module level)
    callee: str  # the called name, or "deep_gemm.<dotted name>" for any DeepGEMM reference


def _scopes(body, prefix: tuple[str, ...] = (), constants: bool = False, out=None) -> list[tuple[int, int, str]]:
    """(first line, last line, qualname) of every def and class; with `constants`, also of
    every `NAME = ...` outside functions (module and class constants)."""
    out = [] if out is None else out
    for n in body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            q = (*prefix, n.name)
            out.append((n.lineno, n.end_lineno, ".".join(q)))
            _scopes(n.body, q, constants and isinstance(n, ast.ClassDef), out)
            continue
        if constants and isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                out.append((n.lineno, n.end_lineno, ".".join((*prefix, targets[0].id))))
        for field in ("body", "orelse", "finalbody"):
            _scopes(getattr(n, field, None) or [], prefix, constants, out)
        for inner in (*(getattr(n, "handlers", None) or []), *(getattr(n, "cases", None) or [])):
            _scopes(inner.body, prefix, constants, out)
    return out


def _enclosing(scopes, line: int) -> list[str]:
    """Qualnames of the scopes (sorted by first line) that contain `line`, outermost first."""
    return [q for start, end, q in scopes if start <= line <= end]


def _deep_gemm_bindings(node: ast.AST) -> dict[str, str]:
    """Names an import statement binds to DeepGEMM: name -> dotted path."""
    out = {}
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name.split(".")[0] == DEEP_GEMM:
                out[a.asname or DEEP_GEMM] = a.name if a.asname else DEEP_GEMM
    elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == DEEP_GEMM:
        for a in node.names:
            out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _chain(node: ast.AST) -> tuple[str, list[str]] | None:
    """(base name, attributes) of `a.b.c`, or None for anything else."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return (node.id, attrs[::-1]) if isinstance(node, ast.Name) else None


def _deep_gemm_refs(rel: str, tree: ast.Module, scopes) -> list[Site]:
    """Every reference to a name bound to DeepGEMM (module or function imports, in scope)."""
    bound: dict[str, dict[str, str]] = {}  # scope qualname ("" = module) -> bindings made there
    for node in ast.walk(tree):
        names = _deep_gemm_bindings(node)
        if names:
            inner = _enclosing(scopes, node.lineno)
            bound.setdefault(inner[-1] if inner else "", {}).update(names)
    if not bound:
        return []
    out, inside = [], set()
    for node in ast.walk(tree):  # parents before children: the outermost chain wins
        if id(node) in inside or not isinstance(node, (ast.Attribute, ast.Name)) or isinstance(node.ctx, ast.Store):
            continue
        chain = _chain(node)
        if chain is None:
            continue
        enclosing = _enclosing(scopes, node.lineno)
        visible = {k: v for scope in ("", *enclosing) for k, v in bound.get(scope, {}).items()}
        if chain[0] in visible:
            out.append(Site(rel, node.lineno, enclosing[-1] if enclosing else "",
                            ".".join([visible[chain[0]], *chain[1]])))
            inside.update(id(n) for n in ast.walk(node))
    return out


def scan_calls(rel: str, text: str) -> list[Site]:
    """Every watched site in one file: DeepGEMM references and calls of INDEX_NAMES."""
    if rel.startswith(NOT_SERVED) or not _may_call(text):
        return []
    tree = ast.parse(text)
    scopes = sorted(_scopes(tree.body))
    out = _deep_gemm_refs(rel, tree, scopes) if _DEEP_GEMM_TEXT.search(text) else []
    taken = {(s.line, s.callee.rsplit(".", 1)[-1]) for s in out}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
        if name and INDEX_NAMES.search(name) and (fn.lineno, name) not in taken:
            enclosing = _enclosing(scopes, node.lineno)
            out.append(Site(rel, node.lineno, enclosing[-1] if enclosing else "", name))
    return sorted(out, key=lambda s: s.line)


def check_call_sites(files: dict[str, str]) -> list[str]:
    """A problem "file:line: ..." for every site whose (file, function, callee, count) is not
    in CALL_SITES: a new site, or one called more (or fewer) times than the contract says."""
    from niah.serving.sglang.call_sites import call_counts, call_sites

    known_sites, counts = call_sites(), call_counts()
    problems = []
    for rel in sorted(files):
        groups: dict[tuple[str, str, str], list[int]] = {}
        for s in scan_calls(rel, files[rel]):
            groups.setdefault((s.file, s.where, s.callee), []).append(s.line)
        for (path, where, callee), lines in groups.items():
            n = len(lines)
            if (path, where, callee, n) in known_sites:
                continue
            fn = where or "<module>"
            known = counts.get((path, where, callee))
            if known is None:
                problems.append(f"{path}:{lines[0]}: new call site: {fn} calls {callee}, which niah neither "
                                "patches, refuses nor lists as unreachable")
            else:
                at = lines[known] if n > known else lines[0]
                problems.append(f"{path}:{at}: call count changed: {fn} calls {callee} {n} time(s), the contract "
                                f"knows {known}")
    return problems




# ---------------------------------------------------------------------------------------
# Layout constants


@dataclass(frozen=True)
class LayoutConstant:
    """Source text (normalised by ast.unparse) that `module.qualname` must contain."""

    module: str
    qualname: str
    expect: str
    why: str

    @property
    def file(self) -> str:
        return self.module.replace(".", "/") + ".py"


_MP = "sglang.srt.mem_cache.memory_pool"
_DSA = "sglang.srt.layers.attention.dsa"
_V4IDX = "sglang.srt.layers.attention.dsv4.indexer"
_ROW = "fp8 row: 128 values + one 4-byte scale = 132 bytes"
_NOT_NIAH = "pinned so that a change shows; niah does not run this path"
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
    LayoutConstant("sglang.srt.model_executor.pool_configurator", "HybridSWAPoolConfigurator.__init__",
                   "index_head_dim + index_head_dim // DSATokenToKVPool.quant_block_size * 4",
                   f"SWA-hybrid memory accounting: the {_ROW} (the hybrid pool's DSA keys)"),
    LayoutConstant(f"{_DSA}.dsa_indexer", "Indexer._get_topk_paged", "get_page_table_64()",
                   "decode reads 64-token pages"),
    LayoutConstant(f"{_DSA}.dsa_indexer", "Indexer._get_topk_paged", "head_dim_with_sf = 132",
                   f"decode views the pages as [pages, 64, 1, 132]: the {_ROW} (niah replaces this for bf16)"),
    LayoutConstant(f"{_DSA}.dsa_indexer", "Indexer._store_index_k_cache", "buf.view(-1, page_size, 132)",
                   f"the store views pages as [pages, 64, 132]: the {_ROW} (niah replaces this for bf16)"),
    LayoutConstant(f"{_DSA}.dsa_indexer", "Indexer._aiter_fused_fp8_prepare_and_store",
                   "self.head_dim + 4", f"ROCm aiter store: the {_ROW}; {_NOT_NIAH}"),
    LayoutConstant(f"{_DSA}.dsa_indexer_kpool", "IndexerKPool._get_topk_paged", "head_dim_with_sf = 132",
                   f"pooled keys (index_kpool > 1, refused): the {_ROW}; {_NOT_NIAH}"),
    LayoutConstant(f"{_DSA}.kpool_fp8_index", "all_gather_and_scatter_pool_slots", "payload_bytes = head_dim + 4",
                   f"pooled keys (index_kpool > 1, refused): the {_ROW}; {_NOT_NIAH}"),
    LayoutConstant(f"{_DSA}.gfx950_fused_indexer", "CACHE_TOK_STRIDE", "CACHE_TOK_STRIDE = 132",
                   f"ROCm gfx950 fused indexer: the {_ROW}; {_NOT_NIAH}"),
    LayoutConstant(f"{_DSA}.utils", "fp8_mqa_logits_make_fused_kv", "per_token_size = head_dim + 4",
                   f"prefill's fused key view: the {_ROW}"),
    LayoutConstant(f"{_DSA}.utils", "_fp8_paged_mqa_logits_torch",
                   "per_token_work_bytes = 2 * (head_dim + 4) + 2 * head_dim + 4",
                   f"SGLang's torch fallback sizes its work from the {_ROW}"),
    LayoutConstant(_V4IDX, "fp8_paged_mqa_logits_torch",
                   "assert kvcache_fp8.shape[1:] == (block_size, 1, head_dim + 4)",
                   f"V4 paged logits (niah replaces it in niah arms): the {_ROW}"),
    LayoutConstant(_V4IDX, "fp8_paged_mqa_logits_torch", "total_dim = block_size * (head_dim + 4)",
                   f"V4 paged logits (niah replaces it in niah arms): 64 x the {_ROW}"),
    LayoutConstant(_V4IDX, "fp8_paged_mqa_logits_torch_sm120",
                   "assert kvcache_fp8.shape[1:] == (block_size, 1, head_dim + 4)",
                   f"V4 paged logits on sm120 (niah replaces it in niah arms): the {_ROW}"),
    LayoutConstant(_V4IDX, "fp8_paged_mqa_logits_torch_sm120",
                   "kvcache_flat = kvcache_fp8.view(-1, block_size * (head_dim + 4))",
                   f"V4 paged logits on sm120 (niah replaces it in niah arms): 64 x the {_ROW}"),
    LayoutConstant(_V4IDX, "C4IndexerBackendMixin.forward_c4_indexer",
                   "head_dim_with_sf = 68 if use_fp4_indexer else 132",
                   f"the V4 C4 indexer views pages with the {_ROW} (fp4: 68)"),
    LayoutConstant("sglang.srt.mem_cache.deepseek_v4_memory_pool", "get_dsv4_indexer_bytes_per_token",
                   "return index_head_dim + index_head_dim // 128 * 4",
                   f"V4 pool accounting: the {_ROW}, which niah doubles for bf16"),
    LayoutConstant("sglang.srt.mem_cache.page_interleave", "_page_shard_row_bytes",
                   "kv_dim * kv_size + index_head_dim + index_head_dim // 128 * 4",
                   f"page-interleave pools (refused): the {_ROW}; {_NOT_NIAH}"),
    LayoutConstant("sglang.srt.mem_cache.pool_host.dsa", "dsa_indexer_bytes_per_token_per_layer",
                   "elems = index_head_dim + index_head_dim // quant_block_size * 4",
                   f"HiCache host pool (refused): the {_ROW}; {_NOT_NIAH}"),
)


def scan_layout(rel: str, text: str) -> list[Site]:
    """Every place a LAYOUT_SCOPE file writes the fp8 row width: the numbers 132 or 8448,
    or an expression of the form `head_dim + 4` / `head_dim // block * 4` (outermost)."""
    if not rel.startswith(LAYOUT_SCOPE) or not _LAYOUT_TEXT.search(text):
        return []
    tree = ast.parse(text)
    scopes = sorted(_scopes(tree.body, constants=True))
    out, inside = [], set()
    for node in ast.walk(tree):  # parents first: an outer matching expression covers the inner ones
        if id(node) in inside:
            continue
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value in ROW_NUMBERS:
            expr = str(node.value)
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult))
              and ROW_WIDTH.search(expr := ast.unparse(node))):
            inside.update(id(n) for n in ast.walk(node))
        else:
            continue
        enclosing = _enclosing(scopes, node.lineno)
        out.append(Site(rel, node.lineno, enclosing[-1] if enclosing else "", expr))
    return sorted(out, key=lambda s: s.line)


def _normal(text: str) -> str:
    return " ".join(text.split())


def check_layout(source, files: dict[str, str] | None = None) -> list[str]:
    """A problem "file:line: ..." for every layout constant the source no longer states, and
    for every place the source writes the fp8 row width that no constant covers."""
    from niah.serving.sglang.contract import ContractImportError

    problems = []
    for c in LAYOUT:
        try:
            sym = source.lookup(c.module, c.qualname)
        except ContractImportError as e:
            problems.append(f"{c.module}.{c.qualname}: {e}")
            continue
        if sym is None:
            problems.append(f"{c.module}.{c.qualname}: missing (layout constant: {c.why})")
        elif _normal(c.expect) not in _normal(sym.text):
            problems.append(f"{sym.where or c.module}: layout changed: {c.module}.{c.qualname} no longer says "
                            f"`{c.expect}` ({c.why})")
    for rel in sorted(files or {}):
        for s in scan_layout(rel, files[rel]):
            if not any(c.file == s.file and c.qualname == s.where and _normal(s.callee) in _normal(c.expect)
                       for c in LAYOUT):
                problems.append(f"{s.file}:{s.line}: new layout constant: {s.where or '<module>'} writes the fp8 "
                                f"row width as `{s.callee}`, which the contract does not know")
    return problems
