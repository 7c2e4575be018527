"""The run folder as the sweep writes it: lock it, write the manifest, check a resume.

`start_run` takes the folder's lock (niah.lock), checks that a resume keeps the arguments
that change prompts or answers, writes the manifest's args and opens the RunStore;
`record_config` adds one configuration's entry; `check_same_tokenizers` refuses a resume
that would mix two servers or two counters under one configuration name.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from niah.errors import BadInput
from niah.record import now as _now
from niah.store import RunStore, read_manifest, write_manifest


# -- the manifest ------------------------------------------------------------------------------
_manifest_lock = threading.Lock()


def record_config(out: Path | str, name: str, info: dict) -> None:
    """Add (or update) configs[name] in RUN/manifest.json, atomically."""
    with _manifest_lock:
        manifest = read_manifest(out)
        configs = manifest.setdefault("configs", {})
        configs[name] = {**configs.get(name, {}), **info}
        manifest.pop("schema_version", None)
        write_manifest(out, manifest)


def update_config(out: Path | str, name: str, fn) -> dict:
    """configs[name] updated by `fn(entry) -> changes` (read, change, write under the
    manifest's lock); returns the new entry."""
    with _manifest_lock:
        manifest = read_manifest(out)
        configs = manifest.setdefault("configs", {})
        entry = configs.get(name, {})
        configs[name] = {**entry, **fn(dict(entry))}
        manifest.pop("schema_version", None)
        write_manifest(out, manifest)
        return configs[name]


def _git_sha() -> str | None:
    import subprocess

    try:
        r = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("niah")
    except PackageNotFoundError:
        return None


# Arguments that change the prompts or answers: a resumed run must keep them.
_FIXED_ON_RESUME = ("seed", "mode", "max_tokens", "needles", "needle_key", "needle_value", "values",
                    "queries", "haystack", "prompts")


def start_run(out: Path | str, spec, resume: bool) -> RunStore:
    """Lock and open the run folder (BadInput if in use, unwritable, or if resume changes
    fixed args) and write the manifest's args; configs are added by `record_config`."""
    from niah.lock import RunLock

    out = Path(out)
    lock = RunLock(out).acquire()
    try:
        store = _open_run(out, spec, resume)
    except BaseException:
        lock.release()
        raise
    store.lock = lock
    return store


def _open_run(out: Path, spec, resume: bool) -> RunStore:
    from niah.haystacks import haystack_info
    from niah.prompts import corpus_info
    from niah.promptset import RunPrompts
    from niah.sweep import SweepSpec

    args = asdict(spec)
    manifest: dict[str, Any] = {}
    if resume and (out / "manifest.json").exists():
        # Check before opening the store: a refused resume must change nothing.
        manifest = read_manifest(out)
        manifest.pop("schema_version", None)
        old = manifest.get("args", {})
        for k in _FIXED_ON_RESUME:
            if old.get(k, SweepSpec.__dataclass_fields__[k].default) != args[k]:
                raise BadInput(f"--resume with a different {k} ({args[k]!r}, the run has {old.get(k)!r}): use another --out")
        manifest.setdefault("resumed", []).append(_now())
    store = RunStore(out).open(resume)
    from niah.needles import NEEDLE, QUESTION

    kind = spec.kind
    args["needle"] = {"sentence": NEEDLE, "question": QUESTION, "key": "city", "value": "7 digits"} if kind.default \
        else {"sentence": kind.sentence("{key}", "{value}"), "question": kind.question(["{key}"])}
    args["needle_kind"] = kind.as_dict()
    args["corpus"] = corpus_info() if spec.haystack == "prose" else haystack_info(spec.haystack, kind.value)
    manifest.update(niah_version=_version(), git_sha=_git_sha(), command=list(sys.argv), args=args)
    manifest.setdefault("created", _now())
    manifest.setdefault("configs", {})
    write_manifest(out, manifest)
    store.prompts = RunPrompts(out)  # what was sent, built here or taken from --prompts
    if store.skipped_lines:
        print(
            f"niah: {out / 'trials.jsonl'}: skipped unreadable line(s) {store.skipped_lines} "
            "(a write cut short); those trials run again",
            file=sys.stderr,
        )
    if store.retried:
        print(
            f"niah: {store.retried} trial(s) recorded as error run again "
            f"(the old records are kept in {out / 'trials.errors.jsonl'})",
            file=sys.stderr,
        )
    return store


def check_same_tokenizers(manifest: dict, prepared: list, force: bool = False) -> None:
    """A resumed configuration must be the same server (endpoint, model) counting tokens as
    before, or two servers' trials would merge under one name (`force`: allow another
    endpoint or model; the counter must still match, or the prompts would differ)."""
    old = manifest.get("configs", {})
    for p in prepared:
        before = old.get(p.target.name, {})
        was = before.get("tokenizer")
        now = p.info["tokenizer"]
        if was and was != now:
            raise BadInput(
                f"--resume: configuration {p.target.name!r} was measured with tokenizer {was}, "
                f"now {now}; prompts would differ: pass --tokenizer {was}"
            )
        if force or p.target.engine != "external":
            continue  # a launched server gets a new port each time; its settings are checked instead
        for key, new in (("endpoint", p.endpoint), ("model", p.model)):
            if before.get(key) and before[key] != new:
                raise BadInput(
                    f"--resume: configuration {p.target.name!r} was measured at {key} {before[key]}, "
                    f"now {new}; its trials would mix two servers: use another --out, or pass --force-config"
                )
