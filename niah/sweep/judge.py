"""One trial's outcome from its reply: the one path the sweep and `niah rescore` both score by.

    j = judge(["4829163"], "The number is 4829164.", distractors=[])
    j.outcome, j.near            # ("near", Near(got="4829164", distance=1, at=6))

Scoring (niah.sweep.scoring) gives the outcome and per-value hits; a single-value miss whose
closest candidate is one character off becomes `near` (niah.sweep.near). With `count_to`
(a `--decode-first` trial: the prompt asked for a count from 1 to K first) the reply is
scored after the count (niah.sweep.decode.after_count). `near` is kept on the result when
the outcome is `near`, or for every scored single-value trial when `keep_near` (a
`--residues` sweep records the closest value on every trial). Pure: the same stored reply
always judges the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from niah.sweep.decode import after_count
from niah.sweep.near import Near, closest, is_near
from niah.sweep.scoring import score_values, scored_text


@dataclass
class Judged:
    outcome: str
    hits: list[bool] = field(default_factory=list)
    recall_share: float | None = None
    near: Near | None = None
    answer: str | None = None  # what was scored (after the count for a decode trial)
    reasoning: str | None = None


def judge(expected, answer: str | None, reasoning: str | None = None, finish_reason: str | None = None,
          error: str | None = None, distractors=(), count_to: int | None = None,
          keep_near: bool = False) -> Judged:
    """The trial's outcome, hits and near miss (module doc)."""
    if count_to is not None:
        answer, reasoning = after_count(answer, count_to), after_count(reasoning, count_to)
    sc = score_values(list(expected), answer, reasoning, finish_reason, error, distractors=list(distractors))
    out = Judged(sc.outcome, sc.hits, sc.recall_share, None, answer, reasoning)
    if len(expected) == 1 and sc.outcome in ("wrong", "correct"):
        near = closest(expected[0], scored_text(answer, reasoning), distractors)
        if sc.outcome == "wrong" and is_near(near):
            out.outcome = "near"
        if out.outcome == "near" or (keep_near and near is not None):
            out.near = near
    return out
