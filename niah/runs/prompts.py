"""RUN/prompts.jsonl: the prompts a sweep sent, one niah.prompts.sets.SetEntry line per
distinct prompt and coordinates; itself a set `niah sweep --prompts` accepts.

`RunPrompts` appends what a sweep builds (or takes from a frozen set), each line flushed
and fsynced, never the same (prompt, coordinates) twice, and ends a line a kill cut short
before it appends. `merge_prompts` adds a spread job's part file to RUN's
(niah.runs.parts).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from niah.prompts.sets import SetEntry

RUN_PROMPTS = "prompts.jsonl"


class RunPrompts:
    """RUN/prompts.jsonl: the prompts a sweep built, one line per distinct prompt and
    coordinates (two residue lengths of one block whose counts land on one haystack cut
    send one prompt at two coordinates: both are written)."""

    def __init__(self, run_dir: Path | str):
        self.path = Path(run_dir) / RUN_PROMPTS
        self.seen: set[tuple] = set()
        if self.path.exists():
            with open(self.path, "rb+") as f:  # a line cut short by a kill: end it, so the next starts clean
                if f.seek(0, os.SEEK_END):
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        f.write(b"\n")
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    self.seen.add(_coordinates(json.loads(line)))
                except (ValueError, KeyError, TypeError):
                    continue  # a half-written last line: that prompt is written again

    def add(self, entry: SetEntry) -> None:
        at = _coordinates(asdict(entry))
        if at in self.seen:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(entry.to_line() + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.seen.add(at)


def _coordinates(e: dict) -> tuple:
    return (e["prompt_sha256"], int(e["length"]), float(e["depth"]), int(e["trial"]), bool(e.get("control")))


def merge_prompts(part: Path | str, prompts: "RunPrompts | None") -> None:
    """Add every readable line of part/prompts.jsonl to `prompts` (a line cut short is left
    out: the job writes it again when it resumes)."""
    path = Path(part) / RUN_PROMPTS
    if prompts is None or not path.is_file():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            data = json.loads(line)
            entry = SetEntry(**data)
        except (ValueError, TypeError):
            continue
        prompts.add(entry)
