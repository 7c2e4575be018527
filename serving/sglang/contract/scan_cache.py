"""The contract's scans of SGLang's files (which files to scan; sites.scan_calls,
flows.scan_flows, layout.scan_layout of each), kept on disk.

    cached_scan(kind, scan, rel, text, row) -> list[row]
    cached_selection(texts, keep) -> [rel for rel in texts if keep(rel, texts[rel])]

A scan is a pure function of (file name, file text): the same SGLang file always gives the
same sites and flows. Checking SGLang's 129 watched files parses and walks every one of
them (~15 s of CPU here), so a second `niah doctor`, plugin install or dry run of the same
source reads the scans back instead. An entry is keyed by the SHA-256 of everything the
answer depends on: the kind, the file's name and text (for the selection: every file's
name and text), the Python version (its `ast`), and
the source of every module of this contract package (any change to the scanning code, or
to the tables, is a new key). An entry that is missing, unreadable, of another shape or
written under another key is scanned again and rewritten; nothing is ever approximated.
Entries live under $NIAH_CACHE/sglang-contract/ (niah/cache.py); deleting them costs time
only. NIAH_CONTRACT_CACHE=0 scans every file every time.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, NamedTuple, TypeVar

from niah.cache import cache_root

Row = TypeVar("Row", bound=NamedTuple)


@functools.cache
def _code_key() -> str:
    """The SHA-256 of this package's sources (the scanning code and its tables)."""
    h = hashlib.sha256(f"python {sys.version_info[0]}.{sys.version_info[1]}\n".encode())
    for p in sorted(Path(__file__).parent.glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _key(kind: str, rel: str, text: str) -> str:
    h = hashlib.sha256(f"{_code_key()}\0{kind}\0{rel}\0".encode())
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _folder() -> Path:
    return cache_root() / "sglang-contract"


def _enabled() -> bool:
    return os.environ.get("NIAH_CONTRACT_CACHE", "1") != "0"


def _read(key: str):
    try:
        entry = json.loads((_folder() / key[:2] / f"{key}.json").read_text())
        return entry["rows"] if entry["key"] == key else None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no entry, or not one this code wrote


def _write(key: str, rows: list) -> None:
    path = _folder() / key[:2] / f"{key}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "rows": rows}, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only or full cache folder: the scan stands, uncached


def cached_scan(kind: str, scan: Callable[[str, str], list[Row]], rel: str, text: str,
                row: type[Row]) -> list[Row]:
    """scan(rel, text), read from the cache when an entry for exactly these inputs exists."""
    if not _enabled():
        return scan(rel, text)
    key = _key(kind, rel, text)
    rows = _read(key)
    if rows is not None:
        try:
            return [row(*r) for r in rows]
        except TypeError:
            pass  # another shape: scan
    found = scan(rel, text)
    _write(key, [list(r) for r in found])
    return found


def cached_selection(texts: dict[str, str], keep: Callable[[str, str], bool]) -> list[str]:
    """The names of the files `keep` selects, read from the cache when an entry for exactly
    these files (names and texts) exists. `keep` is this package's sites.scanned: its code is
    in the key, a function from elsewhere is not."""
    if not _enabled():
        return [rel for rel, text in texts.items() if keep(rel, text)]
    h = hashlib.sha256(f"{_code_key()}\0selection\0".encode())
    for rel in sorted(texts):
        h.update(rel.encode() + b"\0" + hashlib.sha256(texts[rel].encode("utf-8", "surrogatepass")).digest())
    key = h.hexdigest()
    rows = _read(key)
    if isinstance(rows, list) and all(isinstance(r, str) and r in texts for r in rows):
        return rows
    chosen = [rel for rel, text in texts.items() if keep(rel, text)]
    _write(key, chosen)
    return chosen
