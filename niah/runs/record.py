"""The trial record: one definition, written by the sweep, the matrix's error paths and rescore.

`TrialRecord` is the only place the layout of a line of RUN/trials.jsonl is written down;
docs/run-format.md lists the same fields (a test checks it against `record_fields()`).
Schema history: 1 = the first release; 2 adds the needle kinds (`expected`,
`asked_keys`, `distractors`, `hits`, `recall_share`, `needle_kind`, `haystack`).
Readers accept every version up to `TRIAL_SCHEMA` (`check_schema`, for trials and the
manifest alike). `record_problem` says what is wrong with a stored line's fields (None
when it can be read), for every reader of trials.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from niah.errors import BadInput

TRIAL_SCHEMA = 2

# Every trial outcome. `near` is a miss whose answer holds the value one character off
# (niah.sweep.scoring). `correct` is the only one that counts as a hit; `error` is an
# outage (HTTP error, timeout, dead server) and is kept apart from misses in every report.
OUTCOMES = ("correct", "wrong", "near", "empty", "truncated", "refused", "error")
# Outcomes of a no-needle control trial (`control: true`; niah/sweep/control.py defines them).
CONTROL_OUTCOMES = ("clean", "leak", "hallucinated", "error")
KEY_FIELDS = ("config", "length", "depth", "trial")  # a trial's identity (with control and cache_state)
CACHE_STATES = ("cold", "warm", "repeat")  # what niah.sweep.cache_state may record
_NUMBERS = ("prompt_tokens", "prompt_tokens_local", "depth_achieved", "latency_s", "ttft_s")
_INDEXER_NUMBERS = ("k", "rank_worst", "rank_best", "kept", "margin", "fidelity")


def check_schema(version: Any, where: str) -> None:
    if version is None:
        raise BadInput(f"{where}: record has no schema_version; not a niah run file")
    if not isinstance(version, int) or isinstance(version, bool):
        raise BadInput(f"{where}: schema_version {version!r} is not an integer; not a niah run file")
    if version > TRIAL_SCHEMA:
        raise BadInput(
            f"{where}: schema_version {version} is newer than this niah understands "
            f"({TRIAL_SCHEMA}); upgrade niah"
        )


def now() -> str:
    """ISO-8601 UTC, seconds: every timestamp a run writes."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class TrialRecord:
    """One finished trial (a measurement, or an `error` that is a gap to fill)."""

    config: str
    model: str | None
    length: int
    depth: float
    trial: int
    seed: int
    prompt_tokens: int | None = None
    prompt_tokens_local: int | None = None
    depth_achieved: float | None = None
    prompt_sha256: str | None = None
    needle: str | None = None
    needle_key: str | None = None
    expected: list[str] | None = None
    asked_keys: list[str] | None = None
    distractors: list[str] | None = None
    hits: list[bool] | None = None
    recall_share: float | None = None
    needle_kind: dict[str, Any] | None = None
    haystack: str | None = None
    answer: str | None = None
    reasoning: str | None = None
    correct: bool = False
    outcome: str = "error"
    finish_reason: str | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    error: str | None = None
    attempts: int = 0
    selection_recall: list[float | None] | None = field(default=None)
    indexer: dict[str, Any] | None = None  # summary of the server's indexer probe (niah.sweep.indexer)
    control: bool = False  # a no-needle control trial (niah.sweep.control)
    cache_state: str | None = None  # cold | warm | repeat (niah.sweep.cache_state); None: not controlled
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, where the server reports it
    warmup_error: str | None = None  # the warm-up (or repeat's first) request failed
    repeat_answer: str | None = None  # repeat: the first reply's content (the second is scored)
    repeat_fault: bool | None = None  # repeat: the two replies differ at temperature 0
    answer_prefix_ok: bool | None = None  # --answer-prefix: the answer started with it
    found_in: str | None = None  # with reasoning: content | reasoning | both | neither (niah.sweep.reasoning)
    finished_at: str | None = None
    residue: int | None = None  # --residues: the prompt's counted length mod the modulus
    base_length: int | None = None  # --residues: the length asked for, before the residue shift
    near: dict[str, Any] | None = None  # the answer's closest value: {"got", "distance", "at"}
    decode_first: int | None = None  # --decode-first: tokens asked before the value (niah.sweep.decode)
    decode_tokens: int | None = None  # --decode-first: the reply's tokens before the value, where found
    decode_count_to: int | None = None  # --decode-first: the K the prompt asked to count to (scored after it)
    multi_turn: int | None = None  # --multi-turn: N alike poems in the chat (niah.sweep.multiturn)
    turns: int | None = None  # --multi-turn: user/assistant pairs before the question
    asked_index: int | None = None  # --multi-turn: i, the asked poem's place among the poems (1-based)
    asked_turn: int | None = None  # --multi-turn: the asked poem's turn (1-based)
    required_prefix: str | None = None  # --multi-turn: the reply must start with it
    prefix_hit: bool | None = None  # --multi-turn: the reply started with it
    similarity: float | None = None  # --multi-turn: SequenceMatcher ratio of the rest to the poem

    def set_prompt(self, entry) -> None:
        """Copy what the prompt set entry (niah.prompts.sets.SetEntry) says about this trial."""
        self.prompt_tokens_local = entry.tokens
        self.depth_achieved = entry.depth_achieved
        self.prompt_sha256 = entry.prompt_sha256
        self.expected = list(entry.expected)
        self.needle = entry.expected[0] if entry.expected else None
        self.asked_keys = list(entry.asked_keys)
        self.needle_key = entry.asked_keys[0] if entry.asked_keys else None
        self.distractors = list(entry.distractors)
        self.needle_kind = dict(entry.needle_kind)
        self.haystack = entry.haystack

    def finish(self) -> dict[str, Any]:
        """Stamp it and return the line to store."""
        self.finished_at = self.finished_at or now()
        self.correct = self.outcome == "correct" and not self.control
        return to_dict(self)


# Written only when set: a trial of a sweep without --residues, --decode-first, --multi-turn
# and a near miss keeps the line it always had.
OPTIONAL_FIELDS = ("residue", "base_length", "near", "decode_first", "decode_tokens", "decode_count_to", "multi_turn",
                   "turns", "asked_index", "asked_turn", "required_prefix", "prefix_hit", "similarity")


def to_dict(rec: TrialRecord) -> dict[str, Any]:
    d = asdict(rec)
    for k in OPTIONAL_FIELDS:
        if d[k] is None:
            del d[k]
    return {"schema_version": TRIAL_SCHEMA, **d}


def record_fields() -> list[str]:
    """Every key of a stored trial line, in order."""
    return ["schema_version", *(f.name for f in fields(TrialRecord))]


def error_record(config: str, model: str | None, length: int, depth: float, trial: int, seed: int,
                 error: str, cache_state: str | None = None) -> dict[str, Any]:
    """A trial that was never asked (its server never came up, or had died), in its cache state."""
    rec = TrialRecord(config=config, model=model, length=int(length), depth=float(depth),
                      trial=int(trial), seed=int(seed), error=error, cache_state=cache_state)
    return rec.finish()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def record_problem(rec: dict[str, Any]) -> str | None:
    """What makes a stored trial unreadable (a missing key field, a field of the wrong
    type, an unknown outcome), in a few words; None when every reader can use it."""
    missing = [k for k in KEY_FIELDS if k not in rec]
    if missing:
        return f"lacks {', '.join(missing)}"
    config, length, depth, trial = (rec[k] for k in KEY_FIELDS)
    if not isinstance(config, str) or not config:
        return f"config {config!r} is not a name"
    if not _is_int(length) or length < 1:
        return f"length {length!r} is not a positive integer"
    if not _is_num(depth) or not 0 <= depth <= 100:
        return f"depth {depth!r} is not a percentage"
    if not _is_int(trial) or trial < 0:
        return f"trial {trial!r} is not a trial number"
    control = rec.get("control", False)
    if not isinstance(control, bool):
        return f"control {control!r} is not true or false"
    allowed = CONTROL_OUTCOMES if control else OUTCOMES
    if rec.get("outcome") not in allowed:
        return f"outcome {rec.get('outcome')!r} is not one of {', '.join(allowed)}"
    if rec.get("seed") is not None and not _is_int(rec["seed"]):
        return f"seed {rec['seed']!r} is not an integer"
    if rec.get("prompt_sha256") is not None and not isinstance(rec["prompt_sha256"], str):
        return f"prompt_sha256 {rec['prompt_sha256']!r} is not a hash"
    for k in _NUMBERS:
        if rec.get(k) is not None and not _is_num(rec[k]):
            return f"{k} {rec[k]!r} is not a number"
    state = rec.get("cache_state")
    if state is not None and state not in CACHE_STATES:
        return f"cache_state {state!r} is not one of {', '.join(CACHE_STATES)}"
    sel = rec.get("selection_recall")
    if sel is not None and not (isinstance(sel, list) and all(v is None or _is_num(v) for v in sel)):
        return f"selection_recall {sel!r} is not a list of numbers"
    for k in ("residue", "base_length"):
        if rec.get(k) is not None and not (_is_int(rec[k]) and rec[k] >= 0):
            return f"{k} {rec[k]!r} is not a whole number"
    idx = rec.get("indexer")
    if idx is not None:
        if not isinstance(idx, dict):
            return f"indexer {idx!r} is not an object"
        for k in _INDEXER_NUMBERS:
            if idx.get(k) is not None and not _is_num(idx[k]):
                return f"indexer.{k} {idx[k]!r} is not a number"
    return None
