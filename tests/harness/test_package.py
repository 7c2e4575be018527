"""The distribution as a user gets it: a wheel built from the sources with the standard build
backend (setuptools.build_meta, through `pip wheel --no-build-isolation`, offline), installed
into a fresh virtual environment, runs without torch.

What is checked:
- the wheel's metadata: the name niah-lab (never `niah`, which is another project on PyPI),
  the version from niah/__init__.py, a core without torch, triton or transformers, the extras
  serve / kernels / sglang / dev, the `niah` console script and the SGLang plugin entry point;
- its files: every module of niah/, kernels/ and serving/ under niah/, niah.kernels and
  niah.serving (a folder missing from pyproject.toml's `packages` list fails here), and the
  package data (corpus, report page, example matrices);
- the installed wheel in a fresh venv (`python -m venv --without-pip`, the wheel installed by
  this environment's pip with --no-deps; the core's dependencies seen from this environment's
  site-packages through a .pth file, and the heavy modules made unimportable by a meta-path
  blocker, so nothing can reach torch even where this environment has it): `niah --version`,
  `niah sweep --help`, a real sweep, report, baseline export, compare and gate against the
  oracle server on loopback, all from the installed copy, not the checkout; `niah serve`
  refuses with one line naming the [serve] extra;
- README.md, the wheel's long description and a user's first page: at most 120 lines, a
  sweep of one's own server in its first 40, links that resolve, and every `niah` command of
  it naming real commands and options.
"""

from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import distribution
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# import package -> source folder (pyproject.toml's package-dir)
SOURCES = {"niah": ROOT / "niah", "niah/kernels": ROOT / "kernels", "niah/serving": ROOT / "serving"}
HEAVY = ("torch", "triton", "transformers", "sglang", "fastapi", "uvicorn", "gguf", "accelerate",
         "safetensors", "tokenizers", "scipy", "selenium")
BLOCKER = """import sys
HEAVY = {heavy!r}
class _NoHeavy:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: not in niah's core)", name=name)
        return None
sys.meta_path.insert(0, _NoHeavy())
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for folder in ("niah", "kernels", "serving"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-index", "--no-build-isolation",
                        "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # no packaging warning of the build backend (a folder of modules or data not in `packages`)
    warned = [ln for ln in (r.stdout + r.stderr).splitlines()
              if re.search(r"(BuildBackend|Setuptools)\w*Warning", ln)]
    assert not warned, "\n".join(warned)
    (whl,) = out.glob("*.whl")
    return whl


def _metadata(whl: Path) -> email.message.Message:
    with zipfile.ZipFile(whl) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(z.read(meta))


def test_the_wheel_is_niah_lab_at_the_one_version_with_a_light_core(wheel):
    import niah

    meta = _metadata(wheel)
    assert meta["Name"] == "niah-lab" and meta["Version"] == niah.__version__
    assert wheel.name == f"niah_lab-{niah.__version__}-py3-none-any.whl"
    reqs = meta.get_all("Requires-Dist")
    core = [r for r in reqs if "extra ==" not in r]
    assert core and not [r for r in core if r.split(">")[0].split("=")[0].split("<")[0].strip() in HEAVY], core
    assert set(meta.get_all("Provides-Extra")) == {"serve", "kernels", "sglang", "dev"}
    assert any(r.startswith("torch") and 'extra == "serve"' in r for r in reqs)
    (sglang_req,) = [r for r in reqs if r.startswith("sglang") and 'extra == "sglang"' in r]
    from packaging.requirements import Requirement

    from niah.serving.sglang.releases import SUPPORTED_VERSIONS
    spec = Requirement(sglang_req.split(";")[0]).specifier  # the releases the plugin is proven on, no others
    assert all(spec.contains(v) for v in SUPPORTED_VERSIONS), sglang_req
    assert not any(spec.contains(v) for v in ("0.5.15", "0.5.17", "0.5.20", "0.5.22", "0.5.24")), sglang_req
    with zipfile.ZipFile(wheel) as z:
        (eps,) = [n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = z.read(eps).decode()
    assert "[console_scripts]\nniah = niah.cli:main" in text
    assert "[sglang.srt.plugins]\nniah = niah.serving.sglang.plugin:sglang_plugin" in text


def test_the_wheel_holds_every_module_and_the_package_data(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    want = set()
    for prefix, folder in SOURCES.items():
        for f in folder.rglob("*.py"):
            rel = f.relative_to(folder)
            # a sub-package of its own mapping (niah/kernels lives in kernels/, not niah/kernels)
            if prefix == "niah" and rel.parts[0] in ("kernels", "serving"):
                continue
            # modules of packages (a folder with an __init__.py); niah/corpus/generate.py is a
            # maintainer's script beside the corpus data, not part of the package
            if "__pycache__" not in rel.parts and (f.parent / "__init__.py").is_file():
                want.add(f"{prefix}/{rel.as_posix()}")
    missing = sorted(want - names)
    assert not missing, f"not in the wheel (add the folder to pyproject.toml's packages): {missing[:10]}"
    for data in ("niah/report/page.html", "niah/report/page.css", "niah/report/page.js",
                 "niah/serving/examples/demo.toml"):
        assert data in names
    assert [n for n in names if n.startswith("niah/corpus/") and n.endswith(".txt")]
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "results/"))]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed (no deps); the core's deps from this environment."""
    v = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(v)], check=True, timeout=120)
    py = v / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                        str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    meta = _metadata(wheel)
    dirs = []
    for req in (r for r in meta.get_all("Requires-Dist") if "extra ==" not in r):
        name = req.split(">")[0].split("=")[0].split("<")[0].strip()
        d = str(Path(distribution(name).locate_file("")).resolve())
        if d not in dirs:
            dirs.append(d)
    (site / "_niah_no_heavy.py").write_text(BLOCKER.format(heavy=HEAVY))
    (site / "00-niah-no-heavy.pth").write_text("import _niah_no_heavy\n")
    (site / "zz-core-deps.pth").write_text("".join(d + "\n" for d in dirs))
    assert sysconfig.get_paths()["purelib"] != str(site)
    return v


def _env(venv: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = str(venv / "bin") + os.pathsep + env.get("PATH", "")
    return env


def _run(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "niah"), *args], cwd=cwd, env=_env(venv), capture_output=True,
                          text=True, timeout=300)


def test_the_installed_wheel_runs_without_torch(venv, oracle, tmp_path):
    import niah

    py = str(venv / "bin" / "python")
    where = subprocess.run([py, "-c", "import niah, importlib.metadata as m; print(niah.__file__); "
                                      "print(m.version('niah-lab')); import torch"],
                           cwd=tmp_path, env=_env(venv), capture_output=True, text=True, timeout=120)
    lines = where.stdout.splitlines()
    assert Path(lines[0]).is_relative_to(venv), lines  # the installed copy, not the checkout
    assert lines[1] == niah.__version__
    assert where.returncode == 1 and "No module named 'torch' (blocked" in where.stderr

    r = _run(venv, tmp_path, "--version")
    assert r.returncode == 0 and r.stdout.strip() == f"niah {niah.__version__}", r.stdout + r.stderr
    r = _run(venv, tmp_path, "sweep", "--help")
    assert r.returncode == 0 and "--endpoint" in r.stdout, r.stderr
    r = _run(venv, tmp_path, "sweep", "--endpoint", oracle.url, "--lengths", "600,1200", "--depths", "50",
             "--trials", "2", "--out", "run", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run(venv, tmp_path, "report", "run")
    assert r.returncode == 0 and (tmp_path / "run" / "report" / "index.html").is_file(), r.stdout + r.stderr
    assert _run(venv, tmp_path, "baseline", "export", "run", "-o", "base.json").returncode == 0
    r = _run(venv, tmp_path, "compare", "run", "run")
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run(venv, tmp_path, "gate", "--baseline", "base.json", "--candidate", "run", "--junit", "gate.xml")
    assert r.returncode == 0 and (tmp_path / "gate.xml").is_file(), r.stdout + r.stderr
    r = _run(venv, tmp_path, "serve", "--port", "0")
    assert r.returncode == 2 and "niah serve needs the [serve] extra" in r.stderr and "niah-lab[serve]" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_readme_matrix_example_works_for_a_pip_user(venv, tmp_path):
    """README's `niah examples` lines, from the installed wheel, in a folder with no checkout."""
    shipped = [p.stem for p in sorted((ROOT / "serving" / "examples").glob("*.toml"), key=lambda p: p.name)]
    r = _run(venv, tmp_path, "examples")
    assert r.returncode == 0 and [ln.split()[0] for ln in r.stdout.splitlines()[:len(shipped)]] == shipped, r.stdout
    text = (ROOT / "serving" / "examples" / "sglang.toml").read_text()
    r = _run(venv, tmp_path, "examples", "sglang")
    assert r.returncode == 0 and r.stdout == text
    r = _run(venv, tmp_path, "examples", "sglang", "-o", "sglang.toml")
    assert r.returncode == 0 and (tmp_path / "sglang.toml").read_text() == text, r.stderr
    assert _run(venv, tmp_path, "examples", "sglang", "-o", "sglang.toml").returncode == 2  # never overwrites
    # the copy is a matrix file `niah sweep --matrix` reads (embedded: sglang's is blocked in this venv)
    assert _run(venv, tmp_path, "examples", "embedded.toml", "-o", "embedded.toml").returncode == 0
    r = _run(venv, tmp_path, "sweep", "--matrix", "embedded.toml", "--dry-run")
    assert r.returncode == 0 and "-m niah serve --attention dense" in r.stdout, r.stdout + r.stderr


# -- README.md: the distribution's long description, a user's first page -----------------------
README = ROOT / "README.md"


def _readme_commands() -> list[list[str]]:
    import shlex

    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    out = []
    for line in "\n".join(blocks).replace("\\\n", " ").splitlines():
        toks = shlex.split(line, comments=True)
        if toks[:1] == ["niah"]:
            out.append(toks[1:])
    return out


def test_the_readme_is_short_and_starts_with_the_users_server():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 120
    assert any(ln.startswith("niah sweep --endpoint ") for ln in lines[:40])
    assert "pip install niah-lab" in "\n".join(lines[:40])
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", "\n".join(lines)):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links {target}, which does not exist"
    for page in ("docs/demo.md", "docs/workflow.md"):
        for img in re.findall(r"!\[[^]]*\]\(([^)]+)\)", (ROOT / page).read_text(encoding="utf-8")):
            assert (ROOT / "docs" / img).is_file(), f"{page} shows {img}, which does not exist"


def test_every_command_of_the_readme_names_real_options():
    import typer.main

    from niah.cli import _register, app

    _register()
    root = typer.main.get_command(app)
    commands = _readme_commands()
    assert {c[0] for c in commands} >= {"sweep", "report", "compare", "prompts", "plan"}
    for toks in commands:
        cmd, rest = root, list(toks)
        while hasattr(cmd, "commands"):
            assert rest and rest[0] in cmd.commands, f"`niah {' '.join(toks)}`: no such command"
            cmd, rest = cmd.commands[rest[0]], rest[1:]
        opts = {o for p in cmd.params for o in p.opts + p.secondary_opts}
        for t in rest:
            if t.startswith("-"):
                assert t.split("=")[0] in opts, f"`niah {' '.join(toks)}`: {t} is not an option of it"


def test_no_text_file_holds_a_merge_conflict_marker():
    """A merge left half-done shows in the shipped docs and code as these lines."""
    markers = re.compile(r"^(<{7} |={7}$|>{7} )", re.M)
    found = []
    for top in ("docs", "niah", "serving", "kernels", "tests", "benchmarks", "results"):
        for path in (ROOT / top).rglob("*"):
            if path.suffix in (".md", ".py", ".toml", ".yml", ".yaml", ".txt", ".sh", ".json") and path.is_file():
                text = path.read_text(errors="replace")
                found += [f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}"
                          for m in markers.finditer(text)]
    for name in ("README.md", "Makefile", "pyproject.toml", "action.yml"):
        if markers.search((ROOT / name).read_text()):
            found.append(name)
    assert not found, found
