"""The prompt set: every trial's prompt, frozen in a JSONL file, with everything to replay it.

    niah prompts build --endpoint URL --lengths ... --out set.jsonl    # prepare
    niah sweep --prompts set.jsonl --endpoint URL2 ...                  # call (any server)
    niah rescore RUN                                                    # evaluate again

One line per trial (`SetEntry`, schema `SET_SCHEMA`): the messages or prompt text, every
inserted fact (key, value, requested depth, char span, asked or not), the asked keys, the
expected values, the distractor values, the counter that measured it and its count, the
trial's seed and the base seed it came from (`base_seed`, schema 2; null in a schema-1
set) and the needle and haystack kinds. Building is deterministic: the same spec and
counter give the same bytes (keys sorted, no timestamps). A sweep without `--prompts`
writes the prompts it builds to RUN/prompts.jsonl (one line per distinct prompt,
niah.runs.prompts), which is itself a set `--prompts` accepts.

`load_set(path)` reads a set once and keeps what a run records about where its prompts
came from (`SetIndex.provenance()`: the file's sha256, its base seeds and its build
parameters); a resume compares sets by that sha256, never by the path as typed.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from niah.errors import BadInput
from niah.prompts.builder import build_prompt, prompt_sha256
from niah.prompts.needles import Needle, trial_seed

SET_SCHEMA = 2  # 2: base_seed; readers take 1 and 2


@dataclass
class SetEntry:
    length: int
    depth: float
    trial: int
    seed: int
    mode: str
    prompt_sha256: str
    tokens: int  # the counter's count of the whole prompt
    tokenizer: str  # the counter that measured it
    depth_achieved: float
    needle_span: list[int]
    facts: list[dict[str, Any]]  # {key, value, depth, span, asked}
    asked_keys: list[str]
    expected: list[str]
    distractors: list[str]
    needle_kind: dict[str, Any]
    haystack: str
    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    control: bool = False  # a no-needle control: the asked facts are not in the prompt
    base_seed: int | None = None  # the --seed the trial's seed came from (None: a schema-1 set)
    schema_version: int = field(default=SET_SCHEMA)
    residues: str | None = None  # a --residues set: its plan ("4:0,1,2,3"); written only when set

    @property
    def content(self) -> str:
        """The user message (chat) or the whole prompt text (completion)."""
        return self.messages[-1]["content"] if self.mode == "chat" else (self.prompt or "")

    @property
    def needle(self):
        """The asked fact at the requested depth (a niah.prompts.needles.Needle)."""
        return Needle(self.asked_keys[0], self.expected[0])

    def body(self) -> dict:
        """The request fields that carry the prompt."""
        return {"messages": self.messages} if self.mode == "chat" else {"prompt": self.prompt}

    def to_line(self) -> str:
        d = asdict(self)
        if d["residues"] is None:  # a set without residues keeps the bytes it always had
            del d["residues"]
        return json.dumps(d, ensure_ascii=False, sort_keys=True, separators=(",", ":"))

    @property
    def modulus(self) -> int | None:
        return int(self.residues.split(":", 1)[0]) if self.residues else None


def entry_from_prompt(p, trial: int, control: bool = False, base_seed: int | None = None) -> SetEntry:
    """A niah.prompts.builder.Prompt as a set entry (`base_seed`: the --seed it came from)."""
    return SetEntry(
        length=int(p.length), depth=float(p.depth), trial=int(trial), seed=int(p.seed), mode=p.mode,
        prompt_sha256=p.sha256, tokens=int(p.tokens), tokenizer=p.tokenizer,
        depth_achieved=p.depth_achieved, needle_span=list(p.needle_span),
        facts=[{"key": f.key, "value": f.value, "depth": f.depth, "span": list(f.span), "asked": f.asked}
               for f in p.facts],
        asked_keys=p.asked_keys, expected=p.expected,
        distractors=[f.value for f in p.facts if not f.asked],
        needle_kind=p.kind.as_dict(), haystack=p.haystack,
        messages=p.messages if p.mode == "chat" else None,
        prompt=p.content if p.mode == "completion" else None, control=control,
        base_seed=None if base_seed is None else int(base_seed),
    )


def build_set(tok, spec) -> list[SetEntry]:
    """Every trial of `spec` (a niah.sweep.SweepSpec), built with the counter `tok`. With
    `spec.residues` each length of a residue block is built from the block's seed and
    counts, as the sweep builds it (niah.sweep.residues), and every entry names the plan."""
    out = []
    m = int(spec.residues.split(":", 1)[0]) if spec.residues else None
    counts: dict[tuple, dict] = {}
    for n in spec.lengths:
        base = n if m is None else n // m * m
        for d in spec.depths:
            for t in range(spec.trials):
                seed = trial_seed(spec.seed, base, d, t)
                shared = None if m is None else counts.setdefault((seed, d), {})
                p = build_prompt(tok, n, d, seed, spec.mode, spec.needles, spec.kind, spec.haystack, False, shared)
                e = entry_from_prompt(p, t, base_seed=spec.seed)
                e.residues = spec.residues
                out.append(e)
    return out


def write_set(path: Path | str, entries: Iterable[SetEntry]) -> Path:
    """Write a set file atomically, sorted by (length, depth, trial)."""
    path = Path(path)
    rows = sorted(entries, key=lambda e: (e.length, e.depth, e.trial))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(e.to_line() + "\n" for e in rows), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        raise BadInput(f"cannot write {path}: {e.strerror or e}") from None
    return path


def _entry(data: Any, where: str) -> SetEntry:
    if not isinstance(data, dict):
        raise BadInput(f"{where}: not a JSON object")
    version = data.get("schema_version")
    if not isinstance(version, int) or version > SET_SCHEMA or version < 1:
        raise BadInput(f"{where}: prompt set schema_version {version!r} is not one this niah reads ({SET_SCHEMA})")
    try:
        e = SetEntry(**data)
    except TypeError as exc:
        raise BadInput(f"{where}: not a prompt set entry ({exc})") from None
    if e.mode not in ("chat", "completion") or (e.messages if e.mode == "chat" else e.prompt) is None:
        raise BadInput(f"{where}: entry has no {'messages' if e.mode == 'chat' else 'prompt'} for mode {e.mode!r}")
    if prompt_sha256(e.mode, e.messages, e.prompt) != e.prompt_sha256:
        raise BadInput(f"{where}: the prompt does not match its prompt_sha256 (edited by hand?)")
    return e


def read_set(path: Path | str) -> list[SetEntry]:
    """Read and check a set file; BadInput names the line of any problem."""
    return _read(path)[0]


def _read(path: Path | str) -> tuple[list[SetEntry], str]:
    """(entries, sha256 of the bytes they were read from)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        lines = raw.decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read prompt set {path}: {getattr(e, 'strerror', None) or e}") from None
    out = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError:
            raise BadInput(f"{path}:{i}: not JSON") from None
        out.append(_entry(data, f"{path}:{i}"))
    if not out:
        raise BadInput(f"{path}: the prompt set is empty")
    return out, hashlib.sha256(raw).hexdigest()


def load_set(path: Path | str) -> "SetIndex":
    """The set file at `path`, read once, checked and indexed, with its sha256."""
    entries, sha = _read(path)
    index = SetIndex(entries, path)
    index.sha256 = sha
    return index


class SetIndex:
    """A frozen set, looked up by trial coordinates; one mode, one set of kinds."""

    def __init__(self, entries: list[SetEntry], path: Path | str | None = None):
        self.path = path
        self.by: dict[tuple[int, float, int], SetEntry] = {}
        entries = [e for e in entries if not e.control]  # controls are the sweep's own (--control)
        for e in entries:
            key = (e.length, float(e.depth), e.trial)
            if key in self.by and self.by[key].prompt_sha256 != e.prompt_sha256:
                raise BadInput(f"{path}: two different prompts for length {e.length}, depth {e.depth:g}, "
                               f"trial {e.trial} (built with different counters?); keep one")
            self.by[key] = e
        modes = {e.mode for e in entries}
        if len(modes) != 1:
            raise BadInput(f"{path}: the set mixes modes {sorted(modes)}")
        self.mode = modes.pop()
        self.lengths = sorted({e.length for e in entries})
        self.depths = sorted({float(e.depth) for e in entries})
        self.trials = 1 + max(e.trial for e in entries)
        missing = [(n, d, t) for n in self.lengths for d in self.depths for t in range(self.trials)
                   if (n, d, t) not in self.by]
        if missing:
            n, d, t = missing[0]
            raise BadInput(f"{path}: the set is not a full grid: no prompt for length {n}, depth {d:g}, trial {t}")
        self.tokenizers = sorted({e.tokenizer for e in entries})
        self.sha256: str | None = None  # of the file's bytes (load_set)
        seeds = {e.base_seed for e in entries}
        self.base_seeds = None if None in seeds else sorted(seeds)  # None: a schema-1 set does not say
        self.kinds = sorted({json.dumps(e.needle_kind, sort_keys=True) for e in entries})
        self.haystacks = sorted({e.haystack for e in entries})
        self.size = len(entries)
        plans = {e.residues for e in entries}
        if len(plans) != 1:
            raise BadInput(f"{path}: the set mixes residue plans {sorted(map(str, plans))}")
        self.residues = plans.pop()  # the plan of a --residues set, else None

    def provenance(self) -> dict[str, Any]:
        """What a run records about the set (the manifest's args.prompt_set)."""
        return {"path": str(Path(self.path).resolve()) if self.path is not None else None, "sha256": self.sha256,
                "prompts": self.size, "base_seeds": self.base_seeds, "lengths": self.lengths,
                "depths": self.depths, "trials": self.trials, "mode": self.mode,
                "needle_kinds": [json.loads(k) for k in self.kinds], "haystacks": self.haystacks,
                "tokenizers": self.tokenizers}

    def get(self, length: int, depth: float, trial: int) -> SetEntry:
        return self.by[(int(length), float(depth), int(trial))]
