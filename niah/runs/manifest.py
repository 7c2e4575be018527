"""RUN/manifest.json: what was asked and who answered. The only code that writes it.

    manifest = read_manifest(run)                 # checked: schema_version understood
    change_manifest(run, lambda m: m.update(matrix=...))
    record_config(run, "bf16", {"status": "done"})
    update_config(run, "bf16", lambda entry: {...changes...})

Every change goes through `change_manifest`: read, change, write atomically (a temporary
file, then rename), under one lock, so concurrent configurations never lose each other's
entries. It owns `schema_version`: callers see and return the manifest without it, and it
is written first. `write_manifest` writes a whole manifest (tests build run folders with it).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Callable

from niah.errors import BadInput
from niah.runs.record import TRIAL_SCHEMA as SCHEMA_VERSION
from niah.runs.record import check_schema

MANIFEST = "manifest.json"
_lock = threading.RLock()


def read_manifest(run_dir: Path | str) -> dict[str, Any]:
    """RUN/manifest.json as stored (BadInput: missing, not JSON, or a newer schema)."""
    path = Path(run_dir) / MANIFEST
    if not path.exists():
        raise BadInput(f"{run_dir} is not a niah run folder (no {MANIFEST})")
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise BadInput(f"{path}: not valid JSON ({e})") from None
    check_schema(data.get("schema_version"), str(path))
    return data


def write_manifest(run_dir: Path | str, manifest: dict[str, Any]) -> None:
    """Write RUN/manifest.json atomically (schema_version added)."""
    run_dir = Path(run_dir)
    data = {"schema_version": SCHEMA_VERSION, **{k: v for k, v in manifest.items() if k != "schema_version"}}
    tmp = run_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    os.replace(tmp, run_dir / MANIFEST)


def change_manifest(run_dir: Path | str, change: Callable[[dict[str, Any]], Any],
                    fresh: bool = False) -> dict[str, Any]:
    """Read RUN/manifest.json (`fresh`: start from an empty one), let `change(manifest)`
    change it in place, write it back; under the manifest lock. Returns the new manifest
    (without schema_version)."""
    with _lock:
        manifest = {} if fresh else read_manifest(run_dir)
        manifest.pop("schema_version", None)
        change(manifest)
        write_manifest(run_dir, manifest)
        return manifest


def update_config(run_dir: Path | str, name: str, fn: Callable[[dict], dict]) -> dict:
    """configs[name] updated by `fn(entry) -> changes` (read, change, write under the
    manifest's lock); returns the new entry."""
    out: dict = {}

    def change(manifest: dict) -> None:
        configs = manifest.setdefault("configs", {})
        entry = configs.get(name, {})
        configs[name] = out["entry"] = {**entry, **fn(dict(entry))}

    change_manifest(run_dir, change)
    return out["entry"]


def record_config(run_dir: Path | str, name: str, info: dict) -> None:
    """Add (or update) configs[name] in RUN/manifest.json."""
    update_config(run_dir, name, lambda _entry: info)
