"""Deterministic scoring: one outcome per trial, by matching the needle's value.

Outcomes (niah.runs.trials.OUTCOMES), decided in this order:
- `error`: the request failed (HTTP error after retries, timeout, dead server).
- `correct`: the needle's value appears in the answer, after normalisation (case, and
  separators inside numbers: "4,829,163" and "4 829 163" both hold 4829163; a longer
  number such as 14829163 does not), and no distractor's value does too (an answer
  that lists every number in the haystack has not recalled the needle). The answer
  is `content`; when `content` is empty, `reasoning_content` is scored instead.
- `truncated`: finish_reason `length` before the value appeared.
- `empty`: nothing but whitespace came back.
- `refused`: the answer declines ("I can't", "I'm sorry", "unable to", ...).
- `wrong`: anything else.

With several expected values (`--values`, `--queries`), `score_values` records a hit per
value: the outcome is `correct` when every value came back (and no distractor did), and
`recall_share` is the share found. Pure functions of the stored answer and facts, so
`niah rescore` re-scores an old run from its trials.jsonl alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Separators inside one number; not newlines or tabs, which separate two numbers.
_SEP_IN_NUMBER = re.compile(r"(?<=\d)[ ,._'\u00a0\u202f-](?=\d)")
_REFUSAL = re.compile(
    r"\b(i\s*(?:can(?:no|')t|cannot|am\s+(?:not\s+able|unable)|'m\s+(?:not\s+able|unable|sorry)|"
    r"do(?:n't| not)\s+(?:know|have|see)|apologi[sz]e)|sorry|unable\s+to|as\s+an\s+ai|"
    r"(?:no|not\s+(?:any|a))\s+(?:special\s+)?magic\s+number\s+(?:is\s+)?(?:mentioned|given|provided|found)|"
    r"(?:is\s+)?not\s+(?:mentioned|provided|given|found|stated)\s+in\s+the\s+text)",
    re.IGNORECASE,
)


def normalise(text: str) -> str:
    """Lower-case, join digit groups split by separators, collapse whitespace."""
    text = _SEP_IN_NUMBER.sub("", text or "")
    return " ".join(text.lower().split())


def holds(answer: str | None, value: str) -> bool:
    """The value occurs in the answer as a whole (not inside a longer number or word)."""
    norm = normalise(value)
    before = "0-9" if norm[:1].isdigit() else "0-9a-z"  # a number may touch a letter, a word may not
    after = "0-9" if norm[-1:].isdigit() else "0-9a-z"
    return re.search(rf"(?<![{before}]){re.escape(norm)}(?![{after}])", normalise(answer or "")) is not None


def scored_text(answer: str | None, reasoning: str | None) -> str:
    """What is scored: `content`, or `reasoning_content` when content is empty."""
    if answer and answer.strip():
        return answer
    return reasoning or ""


def score(
    value: str,
    answer: str | None,
    reasoning: str | None = None,
    finish_reason: str | None = None,
    error: str | None = None,
    distractors: tuple[str, ...] | list[str] = (),
) -> str:
    """The trial's outcome (see module doc). `distractors`: the other facts' values."""
    if error:
        return "error"
    text = scored_text(answer, reasoning)
    if holds(text, value):
        return "wrong" if any(holds(text, d) for d in distractors) else "correct"
    return miss(text, finish_reason)


def miss(text: str, finish_reason: str | None) -> str:
    """The outcome of an answer that does not hold what was asked: truncated (cut by
    max_tokens), empty, refused, else wrong."""
    if finish_reason == "length":
        return "truncated"
    if not text.strip():
        return "empty"
    if _REFUSAL.search(text):
        return "refused"
    return "wrong"


@dataclass
class Score:
    outcome: str
    hits: list[bool] = field(default_factory=list)  # one per expected value, in order

    @property
    def recall_share(self) -> float | None:
        return sum(self.hits) / len(self.hits) if self.hits else None


def score_values(
    expected: list[str] | tuple[str, ...],
    answer: str | None,
    reasoning: str | None = None,
    finish_reason: str | None = None,
    error: str | None = None,
    distractors: tuple[str, ...] | list[str] = (),
) -> Score:
    """Outcome and per-value hits for every expected value (see module doc)."""
    if error:
        return Score("error", [False] * len(expected))
    text = scored_text(answer, reasoning)
    hits = [holds(text, v) for v in expected]
    if hits and all(hits):
        return Score("wrong" if any(holds(text, d) for d in distractors) else "correct", hits)
    if len(expected) == 1:
        return Score(score(expected[0], answer, reasoning, finish_reason, error, distractors), hits)
    if finish_reason == "length":
        return Score("truncated", hits)
    if not text.strip():
        return Score("empty", hits)
    if not any(hits) and _REFUSAL.search(text):
        return Score("refused", hits)
    return Score("wrong", hits)
