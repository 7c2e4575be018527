"""Data flow: where SGLang's index keys go, whatever the callee is called.

Names do not say where keys are read: a new kernel under any name, or a branch widened
to send CUDA down another platform's kernel, calls nothing the call-site pattern
watches. So, inside every function of the scanned files (sites.scanned), the keys are
followed: a name bound from a call of one of the pool's accessors (`POOL_ACCESSORS`,
e.g. `get_index_k_scale_buffer`), then every name bound from it through assignments,
unpacking, loops, subscripts and method calls on it (`k.view(...)`, `kv[0]`, `(k, s)`);
a nested function inherits what its outer function holds. A flow is each call of an
accessor and each call that receives such a name as an argument, together with the
branch conditions on the way to it (`if` / `elif` / conditional expressions, as
`ast.unparse` writes them; the `else` side as `not (...)`).

A flow is (file, function, callee, conditions), counted; FLOWS (flow_sites.py) lists
SGLang 0.5.23's (tables.py: each release's). A new flow, the same call under other conditions, or a different count
is a break naming its file and line. Reading a `.shape` or `.dtype` of the keys is not a
flow (a number, not the keys).
"""

from __future__ import annotations

import ast
from typing import NamedTuple

from niah.serving.sglang.contract.tables import known_flows
from niah.serving.sglang.releases import NEWEST
from niah.serving.sglang.contract.scan_cache import cached_scan

# The pool's accessors: what returns index keys (or their scales / fp4 payloads) from a pool.
POOL_ACCESSORS = frozenset({
    "get_index_k_with_scale_buffer", "get_index_k_scale_buffer", "_get_index_k_read_buffer", "get_k_and_scale",
    "get_index_k_buffer", "get_index_kv_buffer", "get_index_k_cache", "get_index_k",
    "get_index_k_fp4_payload_buffer", "get_index_k_fp4_scale_buffer", "_gather_nonpaged_index_k",
    "get_low_ratio_index_k_dequant", "get_low_ratio_index_k_fp4", "low_ratio_index_k_page8",
    "index_k_page8_views", "materialize_full_indexer_k_cache",
})
ALWAYS = ""  # the conditions of a call no branch guards


class Flow(NamedTuple):
    file: str
    line: int
    where: str  # enclosing function's qualname
    callee: str  # ast.unparse of the called expression
    guard: str  # the branch conditions on the way, joined with " and " (ALWAYS: none)


def _name(fn: ast.AST) -> str | None:
    return fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None


def _holds_keys(e: ast.AST, keys: set[str]) -> bool:
    """Whether expression `e` is the keys (or a view of them) given the names in `keys`."""
    if isinstance(e, ast.Name):
        return e.id in keys
    if isinstance(e, (ast.Starred, ast.Subscript)):
        return _holds_keys(e.value, keys)
    if isinstance(e, (ast.Tuple, ast.List)):
        return any(_holds_keys(x, keys) for x in e.elts)
    if isinstance(e, ast.IfExp):
        return _holds_keys(e.body, keys) or _holds_keys(e.orelse, keys)
    if isinstance(e, ast.Call):
        f = e.func
        return (isinstance(f, ast.Attribute) and _holds_keys(f.value, keys)) or _name(f) in POOL_ACCESSORS
    return False


def _bound(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _bound(e)]
    if isinstance(target, ast.Starred):
        return _bound(target.value)
    return []


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _own(fn: ast.AST):
    """The nodes of a function's body, not those of the functions or classes it defines."""
    stack = [n for n in fn.body if not isinstance(n, _SCOPES)]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(c for c in ast.iter_child_nodes(n) if not isinstance(c, _SCOPES))


def _bindings(n: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    if isinstance(n, ast.Assign):
        return [(t, n.value) for t in n.targets]
    if isinstance(n, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and n.value is not None:
        return [(n.target, n.value)]
    if isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
        return [(n.target, n.iter)]
    if isinstance(n, ast.withitem) and n.optional_vars is not None:
        return [(n.optional_vars, n.context_expr)]
    return []


def _keys_in(fn: ast.FunctionDef | ast.AsyncFunctionDef, inherited: set[str]) -> set[str]:
    """Names that hold keys in `fn` (flow-insensitive: bound from keys anywhere in it)."""
    a = fn.args
    keys = set(inherited) - {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x}
    pairs = []
    for n in _own(fn):
        for target, value in _bindings(n):
            if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
                    and len(target.elts) == len(value.elts):
                pairs += list(zip(target.elts, value.elts))
            else:
                pairs.append((target, value))
    changed = True
    while changed:
        changed = False
        for target, value in pairs:
            if _holds_keys(value, keys):
                new = set(_bound(target)) - keys
                keys |= new
                changed = changed or bool(new)
    return keys


def _guards(fn: ast.AST) -> dict[int, tuple[str, ...]]:
    """id(call) -> the branch conditions on the way to it inside `fn`."""
    out: dict[int, tuple[str, ...]] = {}

    def visit(n: ast.AST, path: tuple[str, ...]) -> None:
        if isinstance(n, _SCOPES):
            return
        if isinstance(n, (ast.If, ast.IfExp)):
            cond = ast.unparse(n.test)
            cond = f"({cond})" if isinstance(n.test, (ast.BoolOp, ast.IfExp, ast.NamedExpr)) else cond
            visit(n.test, path)
            for part, side in ((n.body, cond), (n.orelse, f"not ({cond})")):
                for child in (part if isinstance(part, list) else [part]):
                    visit(child, path + (side,))
            return
        if isinstance(n, ast.Call):
            out[id(n)] = path
        for child in ast.iter_child_nodes(n):
            visit(child, path)

    for stmt in fn.body:
        visit(stmt, ())
    return out


def scan_flows(rel: str, text: str) -> list[Flow]:
    """Every flow of the keys in one file (see the module docstring)."""
    out: list[Flow] = []

    def functions(body, prefix: tuple[str, ...], inherited: set[str]) -> None:
        for n in body:
            if isinstance(n, ast.ClassDef):
                functions(n.body, (*prefix, n.name), set())
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                q = (*prefix, n.name)
                keys = _keys_in(n, inherited)
                guards = _guards(n) if keys or any(isinstance(c, ast.Call) and _name(c.func) in POOL_ACCESSORS
                                                   for c in _own(n)) else {}
                for c in _own(n):
                    if not isinstance(c, ast.Call):
                        continue
                    receives = any(_holds_keys(a, keys) for a in (*c.args, *(k.value for k in c.keywords)))
                    if receives or _name(c.func) in POOL_ACCESSORS:
                        out.append(Flow(rel, c.lineno, ".".join(q), ast.unparse(c.func),
                                        " and ".join(guards.get(id(c), ()))))
                functions(n.body, q, keys)
            elif isinstance(n, (ast.If, ast.Try, ast.With)):
                inner = [*n.body, *getattr(n, "orelse", []), *getattr(n, "finalbody", [])]
                for h in getattr(n, "handlers", []):
                    inner += h.body
                functions(inner, prefix, inherited)

    functions(ast.parse(text).body, (), set())
    return sorted(out, key=lambda f: (f.line, f.callee))


def _when(guard: str) -> str:
    return f"when `{guard}`" if guard else "unconditionally"


def check_flows(files: dict[str, str], release: str = NEWEST) -> list[str]:
    """A problem "file:line: ..." for every flow `release`'s table does not list: a new callee
    of the keys, a known call under other branch conditions, or another count."""
    known = known_flows(release)
    guards_of: dict[tuple[str, str, str], list[str]] = {}
    for (f, where, callee, guard) in known:
        guards_of.setdefault((f, where, callee), []).append(guard)
    problems = []
    for rel in sorted(files):
        groups: dict[tuple[str, str, str, str], list[int]] = {}
        for fl in cached_scan("flows", scan_flows, rel, files[rel], Flow):
            groups.setdefault((fl.file, fl.where, fl.callee, fl.guard), []).append(fl.line)
        for key, lines in groups.items():
            path, where, callee, guard = key
            n, count = len(lines), known.get(key)
            if count == n:
                continue
            if count is not None:
                at = lines[count] if n > count else lines[0]
                problems.append(f"{path}:{at}: flow count changed: {where} hands index keys to {callee} "
                                f"{_when(guard)} {n} time(s), the contract knows {count}")
            elif (path, where, callee) in guards_of:
                was = "; ".join(_when(g) for g in guards_of[(path, where, callee)])
                problems.append(f"{path}:{lines[0]}: branch changed: {where} hands index keys to {callee} "
                                f"{_when(guard)}; the contract knows it only {was}")
            else:
                problems.append(f"{path}:{lines[0]}: new data flow: {where} hands index keys to {callee} "
                                f"{_when(guard)}, which the contract does not know")
    return problems

