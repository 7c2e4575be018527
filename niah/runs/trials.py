"""RUN/trials.jsonl: one line per finished trial, crash-safe and resumable.

`RunStore` appends each finished trial (flushed and fsynced) and knows which are done;
`read_trials` reads the file back; `load_run` gives a run folder's manifest
(niah.runs.manifest) and trials. A trial is identified by (config, length, depth, trial):
`trial_key()`. Resume reads the keys already present and runs only the rest; trials
recorded as `error` are set aside in trials.errors.jsonl and run again. A truncated last
line (kill -9 mid-write: no newline at its end) is reported and skipped; any other line
that is not a record, or a record whose fields cannot be read
(niah.runs.record.record_problem), is refused by a resume (and by rescore) naming
file:line, before anything changes; niah.runs.integrity checks a whole folder
for report, compare and gate. Records carry `schema_version` (niah.runs.record); readers
refuse a newer one. The full record layout is documented in docs/run-format.md.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from niah.errors import BadInput
from niah.runs.manifest import read_manifest
from niah.runs.record import TRIAL_SCHEMA as SCHEMA_VERSION  # one definition: niah.runs.record
from niah.runs.record import check_schema, record_problem

TRIALS = "trials.jsonl"
ERRORS = "trials.errors.jsonl"  # error records set aside by a resume that retries them


def trial_key(config: str, length: int, depth: float, trial: int, control: bool = False,
              cache_state: str | None = None) -> str:
    """Stable identity of one trial inside a run (a no-needle control trial is its own, and
    so is each cache state of niah.sweep.cache_state)."""
    return (f"{config}|{int(length)}|{float(depth):g}|{int(trial)}" + ("|control" if control else "")
            + (f"|{cache_state}" if cache_state else ""))


def record_key(rec: dict[str, Any]) -> str:
    return trial_key(rec["config"], rec["length"], rec["depth"], rec["trial"], bool(rec.get("control")),
                     rec.get("cache_state"))


@dataclass
class LoadResult:
    records: list[dict[str, Any]] = field(default_factory=list)
    skipped_lines: list[int] = field(default_factory=list)  # 1-based line numbers
    lines: list[int] = field(default_factory=list)  # the line of each record
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line, problem): fields that cannot be read
    last_line: int = 0  # the last non-empty line (where a kill mid-write cuts one short)
    cut_short: int | None = None  # the last line, when it does not parse and has no newline

    @property
    def corrupt(self) -> list[int]:
        """Lines that do not parse and are not a write cut short: never dropped silently."""
        return [n for n in self.skipped_lines if n != self.cut_short]

    def refuse_unreadable(self, path: Path | str) -> None:
        """What a writer (resume, rescore) checks before it rewrites the file: BadInput
        naming the first line that is not a record (other than a last line cut short),
        else `refuse_bad`."""
        if self.corrupt:
            line, more = self.corrupt[0], len(self.corrupt) - 1
            raise BadInput(f"{path}:{line}: not a JSON trial record, and not a write cut short (only the "
                           f"last line can be){f' (and {more} more)' if more else ''}; fix or remove the line")
        self.refuse_bad(path)

    def refuse_bad(self, path: Path | str) -> None:
        """BadInput naming the first record whose fields cannot be read, if any."""
        if self.bad:
            line, problem = self.bad[0]
            more = f" (and {len(self.bad) - 1} more)" if len(self.bad) > 1 else ""
            raise BadInput(f"{path}:{line}: trial record {problem}{more}; fix or remove the line")


def read_trials(path: Path | str) -> LoadResult:
    """Read trials.jsonl, skipping (and listing) lines that do not parse.

    Only a truncated *last* line is expected (a kill mid-write: it has no newline, the
    writer's last byte; `cut_short`); any other bad line is skipped too and listed, so one
    corrupt record never costs the rest of the run, and `corrupt` names it for the writers
    (resume, rescore) to refuse. Records that parse but whose fields cannot be read are
    listed in `bad`, not returned.
    """
    path = Path(path)
    if path.is_dir():
        path = path / TRIALS
    out = LoadResult()
    if not path.exists():
        return out
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            out.last_line = lineno
            out.cut_short = None
            try:
                rec = json.loads(raw)
            except ValueError:
                out.skipped_lines.append(lineno)
                if not raw.endswith(b"\n"):
                    out.cut_short = lineno
                continue
            if not isinstance(rec, dict):
                out.skipped_lines.append(lineno)
                continue
            check_schema(rec.get("schema_version"), f"{path}:{lineno}")
            problem = record_problem(rec)
            if problem:
                out.bad.append((lineno, problem))
                continue
            out.records.append(rec)
            out.lines.append(lineno)
    return out


class RunStore:
    """Appends finished trials to RUN/trials.jsonl; knows which trials are done."""

    def __init__(self, run_dir: Path | str):
        self.dir = Path(run_dir)
        self._fh = None
        self.done: set[str] = set()
        self.skipped_lines: list[int] = []
        self.retried = 0  # error records moved aside on resume, to run again
        self.prompts = None  # niah.runs.prompts.RunPrompts: the prompts this sweep built

    # -- opening -----------------------------------------------------------------------
    def open(self, resume: bool, retry_errors: bool = True) -> "RunStore":
        """Create (or, with resume, reopen) the folder. Refuses to mix runs silently.

        On resume, trials recorded as `error` (an outage, not a measurement) are gaps to
        fill: with `retry_errors` they move to trials.errors.jsonl (kept for the record)
        and run again, so trials.jsonl still holds exactly one record per trial.
        """
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / ".niah-write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise BadInput(f"cannot write to run folder {self.dir}: {e.strerror or e}") from None
        trials = self.dir / TRIALS
        if trials.exists() and trials.stat().st_size > 0 and not resume:
            raise BadInput(
                f"{self.dir} already holds trials; pass --resume to fill its gaps, "
                "or choose another --out"
            )
        if resume:
            loaded = read_trials(trials)
            loaded.refuse_unreadable(trials)  # before anything changes: never rewrite a line away
            self.skipped_lines = loaded.skipped_lines
            errors = [r for r in loaded.records if r.get("outcome") == "error"] if retry_errors else []
            if errors:
                self._archive(errors)
                loaded.records = [r for r in loaded.records if r.get("outcome") != "error"]
            self.retried = len(errors)
            self.done = {record_key(r) for r in loaded.records}
            if loaded.skipped_lines or errors:
                self._rewrite(trials, loaded.records)
        self._fh = open(trials, "a", encoding="utf-8")
        return self

    def _archive(self, records: list[dict[str, Any]]) -> None:
        """Append records to trials.errors.jsonl before they leave trials.jsonl."""
        with open(self.dir / ERRORS, "a", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _rewrite(self, trials: Path, records: list[dict[str, Any]]) -> None:
        """Rewrite trials.jsonl with `records` (atomically): drops unparsable lines, so
        appends after a resume never glue onto a half-written line."""
        _rewrite(trials, records)

    # -- writing -----------------------------------------------------------------------
    def append(self, rec: dict[str, Any]) -> None:
        """Write one finished trial durably (flush + fsync). Never writes a key twice."""
        assert self._fh is not None, "RunStore.open() first"
        key = record_key(rec)
        if key in self.done:
            return
        rec = {"schema_version": SCHEMA_VERSION, **rec}
        self._fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.done.add(key)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_run(run_dir: Path | str, warn: bool = True) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(manifest, records) of a run folder; warns about skipped lines."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BadInput(f"no run folder at {run_dir}")
    manifest = read_manifest(run_dir)
    loaded = read_trials(run_dir / TRIALS)
    loaded.refuse_bad(run_dir / TRIALS)
    if warn and loaded.skipped_lines:
        warnings.warn(
            f"{run_dir / TRIALS}: skipped unreadable line(s) {loaded.skipped_lines}",
            stacklevel=2,
        )
    return manifest, loaded.records


def rewrite_trials(run_dir: Path | str, records: list[dict[str, Any]]) -> None:
    """Replace RUN/trials.jsonl with `records` (atomically; rescore's writer)."""
    _rewrite(Path(run_dir) / TRIALS, records)


def _rewrite(trials: Path, records: list[dict[str, Any]]) -> None:
    tmp = trials.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, trials)
