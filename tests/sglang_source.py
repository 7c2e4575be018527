"""Test helpers: find SGLang's downloaded source wheel and lift pure functions out of it.

Nothing here imports sglang. `load_function` compiles one function (or class) from the
wheel's real source, by AST, into a namespace the test provides, so tests run SGLang's
own code where it is pure torch (e.g. its torch fallback for paged logits).
`sglang_tree()` unpacks the wheel's Python sources once, so that a subprocess with it on
PYTHONPATH imports SGLang's pure-Python modules (its argument parser, its plugin loader)
on a CPU machine; `mutated_wheel` copies the wheel with edits, for contract tests.
"""

from __future__ import annotations

import ast
import os
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


SGLANG_RELEASES = ("0.5.16", "0.5.23")  # niah.serving.sglang.releases.SUPPORTED_VERSIONS (tests check it)


def sglang_wheel(version: str = "0.5.23") -> Path:
    """The sglang `version` wheel in $SGLANG_SRC_CACHE (default <repo>/.cache/sglang); fail if absent."""
    cache = Path(os.environ.get("SGLANG_SRC_CACHE") or REPO / ".cache" / "sglang")
    wheels = sorted(cache.glob(f"sglang-{version}-*.whl")) if cache.is_dir() else []
    if not wheels:
        pytest.fail(f"SGLang {version} source wheel not found in {cache}: run `make setup` "
                    f"(it runs `pip download --no-deps sglang=={version} -d $SGLANG_SRC_CACHE`)")
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


def unpack_python(wheel: Path, dest: Path) -> Path:
    """The wheel's sglang/**.py files and its dist-info (no compiled extensions) under dest."""
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist()
                 if (n.startswith("sglang/") and n.endswith(".py")) or ".dist-info/" in n]
        z.extractall(dest, names)
    return dest


def sglang_tree(version: str = "0.5.23") -> Path:
    """SGLang `version`'s Python sources and dist-info, unpacked once next to its wheel: on
    PYTHONPATH, that SGLang is the installed one as a wheel install lays it out (its
    pure-Python modules importable, importlib.metadata reading its version)."""
    import shutil
    import tempfile

    wheel = sglang_wheel(version)
    dest = wheel.parent / f"src-{wheel.stem}"
    if not (dest / ".complete").exists():
        tmp = Path(tempfile.mkdtemp(dir=wheel.parent, prefix=".unpack-"))
        unpack_python(wheel, tmp)
        (tmp / ".complete").write_text("")
        if (dest / ".complete").exists():  # another run finished first
            shutil.rmtree(tmp)
        else:
            shutil.rmtree(dest, ignore_errors=True)  # a partial one
            tmp.rename(dest)
    return dest


def with_sglang(tree: Path, env: dict | None = None) -> dict:
    """os.environ (or env) with `tree` first on PYTHONPATH: SGLang importable from it."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    return env


_WHEEL_FILES: list = []


def mutated_wheel(tmp_path: Path, edits: dict[str, tuple[str, str]], version: str | None = None,
                  name: str = "sglang-0.5.23-py3-none-any.whl") -> Path:
    """A copy of the real 0.5.23 wheel (its Python sources and metadata; compiled
    extensions left out: the contract reads source only) with `edits` applied:
    {path in wheel: (old text, new text)} (old must occur), and optionally another Version."""
    if not _WHEEL_FILES:
        with zipfile.ZipFile(sglang_wheel()) as z:
            _WHEEL_FILES.extend((n, z.read(n)) for n in z.namelist() if n.endswith(".py") or ".dist-info/" in n)
    out = tmp_path / name
    seen = set()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for n, data in _WHEEL_FILES:
            if n in edits:
                old, new = edits[n]
                text = data.decode()
                assert old in text, f"{old!r} not in {n}"
                data = text.replace(old, new, 1).encode()
                seen.add(n)
            if version and n.endswith(".dist-info/METADATA"):
                data = data.decode().replace("Version: 0.5.23", f"Version: {version}", 1).encode()
            z.writestr(n, data)
    assert seen == set(edits)
    return out
