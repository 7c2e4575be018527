"""Only niah/runs opens a run folder's files for writing.

Every call in niah/, serving/ and kernels/ that can write a file (open() with a w / a / x /
+ mode, os.open, os.fdopen for writing, Path.write_text / write_bytes, os.replace /
os.rename, shutil's copies and moves, json.dump, a figure's savefig, a frame's to_csv /
to_parquet) sits in niah/runs, or in one of the modules below, each of which writes a file
that is not a run folder's record:
- niah/errors.py `write_output`: files the user names (report pages, baselines, examples);
- niah/report/style.py: a report's figures, and niah/report/gate_output.py: the gate's
  JUnit and summary files (a report's own pages: derived from a run, never read back by
  niah as one);
- niah/prompts/sets.py `write_set`: the prompt-set file `niah prompts build --out` names;
- serving/embedded/weights.py: converted weights; serving/sglang/contract/scan_cache.py:
  the contract scan's cache (neither lives in a run folder).
A new writer elsewhere fails here: route it through niah.runs (niah.runs.side for side
files and logs, niah.runs.parts for a spread job's files).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"niah/errors.py", "niah/report/style.py", "niah/report/gate_output.py", "niah/prompts/sets.py",
           "serving/embedded/weights.py", "serving/sglang/contract/scan_cache.py"}
METHODS = {"write_text", "write_bytes", "savefig", "to_csv", "to_parquet"}
MODULE_CALLS = {("os", "replace"), ("os", "rename"), ("os", "open"), ("os", "fdopen"), ("json", "dump"),
                ("shutil", "copyfile"), ("shutil", "copy"), ("shutil", "copy2"), ("shutil", "move"),
                ("shutil", "copytree")}


def _mode(call: ast.Call) -> str | None:
    for kw in call.keywords:
        if kw.arg == "mode":
            return kw.value.value if isinstance(kw.value, ast.Constant) else "?"
    if len(call.args) > 1:
        return call.args[1].value if isinstance(call.args[1], ast.Constant) else "?"
    return None


def writes(path: Path) -> list[str]:
    """`line: call` for every call in `path` that can write a file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "open":
            mode = _mode(node)
            if mode is not None and (mode == "?" or set(str(mode)) & set("wax+")):
                out.append(f"{node.lineno}: open(..., {mode!r})")
        elif isinstance(f, ast.Attribute):
            base = f.value.id if isinstance(f.value, ast.Name) else None
            if f.attr in METHODS or (base, f.attr) in MODULE_CALLS:
                if (base, f.attr) == ("os", "fdopen") and not set(str(_mode(node) or "r")) & set("wax+?"):
                    continue
                out.append(f"{node.lineno}: {ast.unparse(f)}(...)")
    return out


def test_only_niah_runs_writes_run_folders():
    found = {}
    for top in ("niah", "serving", "kernels"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("niah/runs/") or rel in ALLOWED:
                continue
            if hits := writes(path):
                found[rel] = hits
    assert not found, f"files written outside niah/runs (route them through niah.runs): {found}"


def test_the_scan_sees_writers():
    """The scan itself: niah/runs holds the writers it looks for (else it finds nothing anywhere)."""
    seen = {p.name: writes(p) for p in (ROOT / "niah" / "runs").glob("*.py")}
    assert seen["manifest.py"] and seen["trials.py"] and seen["side.py"] and seen["parts.py"]
    assert seen["prompts.py"]
