"""Test helpers: find SGLang's downloaded source wheel and lift pure functions out of it.

Nothing here imports sglang. `load_function` compiles one function (or class) from the
wheel's real source, by AST, into a namespace the test provides, so tests run SGLang's
own code where it is pure torch (e.g. its torch fallback for paged logits).
"""

from __future__ import annotations

import ast
import os
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def sglang_wheel() -> Path:
    """The sglang wheel in $SGLANG_SRC_CACHE (default <repo>/.cache/sglang); fail if absent."""
    cache = Path(os.environ.get("SGLANG_SRC_CACHE") or REPO / ".cache" / "sglang")
    wheels = sorted(cache.glob("sglang-0.5.23-*.whl")) if cache.is_dir() else []
    if not wheels:
        pytest.fail(f"SGLang 0.5.23 source wheel not found in {cache}: run `make setup` "
                    "(it runs `pip download --no-deps sglang==0.5.23 -d $SGLANG_SRC_CACHE`)")
    return wheels[-1]


def module_source(wheel: Path, module: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        return z.read(module.replace(".", "/") + ".py").decode()


def load_function(wheel: Path, module: str, qualname: str, namespace: dict):
    """Compile `qualname` ('f' or 'Class.f' or 'Class') from the wheel into `namespace`."""
    text = module_source(wheel, module)
    tree = ast.parse(text)
    body, node = tree.body, None
    for part in qualname.split("."):
        node = next(n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
        body = getattr(node, "body", [])
    seg = ast.get_source_segment(text, node, padded=False)
    if isinstance(node, ast.FunctionDef) and node.decorator_list:
        node.decorator_list = []
        seg = ast.unparse(node)
    import __future__
    import textwrap

    code = compile(textwrap.dedent(seg), f"<sglang {module}.{qualname}>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)
    return namespace[node.name]


def extract_tree(wheel: Path, dest: Path, modules: list[str]) -> Path:
    """Unpack the given modules (+ dist-info METADATA) of the wheel into dest."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for m in modules:
            for rel in (m.replace(".", "/") + ".py", m.replace(".", "/") + "/__init__.py"):
                if rel in names:
                    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                    (dest / rel).write_bytes(z.read(rel))
        for n in names:
            if n.endswith(".dist-info/METADATA"):
                (dest / n).parent.mkdir(parents=True, exist_ok=True)
                (dest / n).write_bytes(z.read(n))
    return dest
