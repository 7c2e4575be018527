"""Call sites: where SGLang calls what the contract watches, found by pattern in its source
and checked against what niah knows about each (dispositions in call_sites.py).

In every SGLang module (but its shipped tests, sglang/test/): every reference to DeepGEMM
(any attribute of an imported `deep_gemm` module, any name imported `from deep_gemm import
...`: callee "deep_gemm.<name>") and every call whose callee name reads or writes index
keys or their scales, computes indexer logits, or runs V3.2's fused key store and the
Indexer methods around it (`INDEX_NAMES`, a pattern, not a list). A site is (file,
enclosing function, callee, count): a new callee, a new function, or a second identical
call in the same function is a break naming its file and line. `scanned` is the cheap
text test that picks the files the call-site, flow and layout scans read.
"""

from __future__ import annotations

import ast
import re
from typing import NamedTuple

from niah.serving.sglang.contract.tables import call_counts, call_sites
from niah.serving.sglang.releases import NEWEST
from niah.serving.sglang.contract.scan_cache import cached_scan

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


def check_call_sites(files: dict[str, str], release: str = NEWEST) -> list[str]:
    """A problem "file:line: ..." for every site whose (file, function, callee, count) is not
    in `release`'s table: a new site, or one called more (or fewer) times than it says."""
    known_sites, counts = call_sites(release), call_counts(release)
    problems = []
    for rel in sorted(files):
        groups: dict[tuple[str, str, str], list[int]] = {}
        for s in cached_scan("calls", scan_calls, rel, files[rel], Site):
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
