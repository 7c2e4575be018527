"""A run folder opened by a sweep: `Run` owns it from the first check to the last write.

    with Run.open(out, spec, resume, prompt_set, checks=[...]) as run:
        run.record_config("bf16", info)          # the manifest (niah.runs.manifest)
        orchestrate(prepared, spec, run)         # trials and prompts through run.append, run.prompts
        run.merge_part("bf16")                   # a spread job's part folder (niah.runs.parts)

`Run.open` is the one way a sweep (the plain sweep, the matrix, the spread coordinator and
each spread job) starts writing a folder. In this order, and before one byte is written:
a `--resume` needs a run there (`check_resumable`), a folder that is not a niah run's is
refused (`check_ours`), then the caller's `checks` run, each `check(out)` raising BadInput
(a resumed configuration that is another server, job folders of an earlier run). Then it
takes the folder's lock (niah.runs.lock: one sweep at a time), checks that a resume keeps
the arguments that change prompts or answers, writes the manifest's args and opens the
trials and the prompt log (niah.runs.folder `open_store`). A refusal at any step leaves the
folder as it was and holds no lock.

A Run is a trial store for the loop (`dir`, `done`, `append`, `prompts`: what
niah.sweep.run.run_target and niah.runs.parts.merge_part write through), and says where a
configuration's server log goes (`log_path`). `close` (the `with` block's end, however it
ends: an error, Ctrl-C, SIGTERM raised as an interrupt) closes the trials file and releases
the lock; finished trials are on disk already (each append is fsynced), so an interrupted
run resumes with `--resume`. Closing twice does nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from niah.runs.folder import check_ours, check_resumable, check_same_tokenizers, open_store
from niah.runs.lock import RunLock
from niah.runs.manifest import change_manifest, read_manifest, record_config, update_config
from niah.runs.parts import merge_part
from niah.runs.side import LOGS
from niah.runs.trials import RunStore

Check = Callable[[Path], None]


class Run:
    """One run folder held by this process (module doc); made by `Run.open`."""

    def __init__(self, out: Path, store: RunStore, lock: RunLock, prompt_set=None):
        self.dir, self.store, self._lock, self.prompt_set = out, store, lock, prompt_set

    @classmethod
    def open(cls, out: Path | str, spec, resume: bool, prompt_set=None, checks: Iterable[Check] = ()) -> "Run":
        """Check, lock and start the folder `out` (module doc); BadInput on any refusal.
        `spec` is a niah.sweep.SweepSpec, `prompt_set` the niah.prompts.sets.SetIndex of
        spec.prompts (or None)."""
        out = Path(out)
        if resume:
            check_resumable(out)
        check_ours(out)  # before the lock file: a folder that is not ours gets nothing
        for check in checks:
            check(out)
        lock = RunLock(out).acquire()
        try:
            store = open_store(out, spec, resume, prompt_set)
        except BaseException:
            lock.release()
            raise
        return cls(out, store, lock, prompt_set)

    # -- the trial store the loop writes through ------------------------------------------
    @property
    def done(self) -> set[str]:
        return self.store.done

    @property
    def prompts(self):
        return self.store.prompts

    def append(self, rec: dict[str, Any]) -> None:
        self.store.append(rec)

    # -- the manifest ---------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        return read_manifest(self.dir)

    def configs(self) -> dict[str, Any]:
        return self.manifest().get("configs") or {}

    def record_config(self, name: str, info: dict) -> None:
        record_config(self.dir, name, info)

    def update_config(self, name: str, fn: Callable[[dict], dict]) -> dict:
        return update_config(self.dir, name, fn)

    def change_manifest(self, change: Callable[[dict], Any]) -> dict:
        return change_manifest(self.dir, change)

    def check_tokenizers(self, prepared: list, force: bool = False) -> None:
        """niah.runs.folder.check_same_tokenizers against this run's manifest."""
        check_same_tokenizers(self.manifest(), prepared, force)

    # -- side files and parts -------------------------------------------------------------
    def log_path(self, name: str) -> Path:
        """RUN/logs/<name>.log: where a launched configuration's server writes."""
        return self.dir / LOGS / f"{name}.log"

    def merge_part(self, name: str, errors: bool = True) -> int:
        """RUN/parts/<name> merged into this run (niah.runs.parts.merge_part)."""
        return merge_part(self.dir, self, name, errors)

    # -- the end --------------------------------------------------------------------------
    def close(self) -> None:
        self.store.close()
        self._lock.release()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
