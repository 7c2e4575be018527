"""Near misses: the answer's value closest to the needle's, and how far off it is.

    closest("4829163", "The number is 4829164.")   # Near(got="4829164", distance=1, at=6)

Candidates are the answer's normalised tokens of the value's shape (runs of digits for a
number, words otherwise) within two characters of its length; the closest by edit
distance (Levenshtein, characters) wins, the first on a tie. `at` is the first character
position where the candidate and the value differ. A candidate that is another fact's
value (a distractor) is never a near miss of this one. `is_near` says when a miss counts
as `near` (one character off). Pure functions of the stored answer.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from niah.sweep.scoring import normalise

NEAR_DISTANCE = 1


@dataclass(frozen=True)
class Near:
    got: str
    distance: int
    at: int

    def as_dict(self) -> dict:
        return asdict(self)


def edit_distance(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def first_difference(a: str, b: str) -> int:
    """The first index where a and b differ (the shorter one's length when one is a prefix)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def closest(value: str, text: str | None, distractors: tuple[str, ...] | list[str] = ()) -> Near | None:
    """The answer's candidate closest to `value` (module doc), or None without one."""
    want = normalise(value)
    pattern = r"\d+" if want.isdigit() else r"[0-9a-z][0-9a-z-]*"
    others = {normalise(d) for d in distractors}
    best: Near | None = None
    for got in re.findall(pattern, normalise(text or "")):
        if abs(len(got) - len(want)) > 2 or got in others:
            continue
        d = edit_distance(got, want)
        if best is None or d < best.distance:
            best = Near(got, d, first_difference(got, want))
    return best


def is_near(near: Near | None) -> bool:
    return near is not None and 0 < near.distance <= NEAR_DISTANCE
