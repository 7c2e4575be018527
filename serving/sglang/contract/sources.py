"""Where the contract reads SGLang: `AstSource` (the wheel or an unpacked tree) or
`InstalledSource` (the installed package's folder, the one the plugin checks before
patching). Both read SGLang's source as AST and import nothing of it, so the plugin's
launch-time check is the check the tests run on the wheels. Each gives, per symbol, its
parameters, the names its body mentions, where it is (file:line) and its normalised source
(`Symbol`), the SGLang version it is, and the files the call-site, flow and layout scans
read (`files()`: those `sites.scanned` keeps).

A source whose version cannot be told (an unpacked tree without its dist-info METADATA)
has version None; the check refuses it (check.py).
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import re
import zipfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version as dist_version
from pathlib import Path
from typing import Iterable, Protocol

from niah.errors import BadInput
from niah.serving.sglang.contract.scan_cache import cached_selection
from niah.serving.sglang.contract.sites import scanned


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
        elif isinstance(n, ast.alias):  # `from deep_gemm import fp8_paged_mqa_logits as fn` (a call-time import)
            out.update((n.name, *n.name.split(".")))
        elif isinstance(n, ast.ImportFrom) and n.module:
            out.update(n.module.split("."))
        elif isinstance(n, ast.Constant) and isinstance(n.value, (str, int)) and not isinstance(n.value, bool):
            out.add(str(n.value))  # int constants too: layout numbers (e.g. V4's 132-byte row)
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
                raise BadInput(f"{self.path} is not a wheel/zip file: {e}") from None
        elif self.path.is_dir():
            self._zip = None
        else:
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
        """Every sglang/**.py file (relative path -> text) that can hold a watched site."""
        if self._zip is not None:
            names = [n for n in self._zip.namelist() if n.startswith("sglang/") and n.endswith(".py")]
        else:
            names = [str(p.relative_to(self.path)) for p in self.path.glob("sglang/**/*.py")]
        texts = {n: self._read(n) or "" for n in names}
        return {n: texts[n] for n in cached_selection(texts, scanned)}

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


class InstalledSource(AstSource):
    """The SGLang installed here, read exactly as a wheel is: the `sglang` package folder
    `import sglang` would load (importlib.util.find_spec, which runs none of its code), read
    as AST. Its version is the sglang dist-info METADATA beside that folder (a wheel
    install), else the installed distribution's (an editable install); no package (or only
    a namespace folder named sglang): version None, nothing to read (refused by the check).

    Nothing of SGLang is imported: an imported symbol is not its source (SGLang 0.5.16's
    `register_custom_op` turns a function into a torch op packet without signature or body,
    and a function's bytecode names leave out its locals and constant dict keys), so the
    launch-time check would not be the check the tests run on the wheels. The plugin
    imports each module it patches when it patches it, and fails closed there."""

    label = "installed sglang"

    def __init__(self, package: str = "sglang"):
        spec = importlib.util.find_spec(package)
        regular = spec is not None and spec.origin not in (None, "namespace") and spec.submodule_search_locations
        self.path = Path(spec.origin).parent.parent if regular else None  # a folder without __init__.py is not it
        self._zip = None
        self._trees = {}
        self.version = self._read_version() if self.path is not None else None
        if self.path is not None and self.version is None:
            try:
                self.version = dist_version(package)
            except PackageNotFoundError:
                self.version = None

    def _read(self, rel: str) -> str | None:
        return None if self.path is None else super()._read(rel)

    def _names(self) -> list[str]:
        if self.path is None:
            return []
        return [str(p.relative_to(self.path)) for p in self.path.glob("sglang-*.dist-info/METADATA")]

    def files(self) -> dict[str, str]:
        return {} if self.path is None else super().files()

