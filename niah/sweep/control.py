"""The no-needle control (`niah sweep --control`): one trial per cell whose haystack holds
no needle, asked the same question. Outcomes (niah.runs.trials.CONTROL_OUTCOMES):

- `leak`: the answer holds a value of the needle's form (a number with as many digits as
  a needle value) that is NOT in this prompt but IS the value of another trial's needle
  of the same sweep (same seed and grid): state from another request came through
  (prefix cache, index-key pool reuse).
- `hallucinated`: the answer holds such a number that is neither in this prompt nor any
  needle value of the sweep: the model made it up.
- `clean`: no such number, or only numbers that are in the prompt (e.g. a distractor).
- `error`: the request failed (an outage, as for needle trials).

`leak` wins when the answer holds both kinds.
"""

from __future__ import annotations

import random
import re

from niah.prompts.needles import make_needle, trial_seed
from niah.runs.trials import trial_key
from niah.sweep.scoring import normalise

_NUMBER = re.compile(r"(?<![0-9])[0-9]+(?![0-9])")


def sweep_values(spec) -> set[str]:
    """The needle value of every (length, depth, trial) of a sweep spec (the first draws of
    each trial's seeded RNG, as niah.prompts.builder.build_prompt makes them)."""
    return {make_needle(random.Random(trial_seed(spec.seed, n, d, t))).value
            for n in spec.lengths for d in spec.depths for t in range(spec.trials)}


def classify(answer: str | None, prompt: str, known: set[str], error: str | None = None,
             digits: int = 7) -> str:
    """The control trial's outcome (see the module doc)."""
    if error:
        return "error"
    found = [m for m in _NUMBER.findall(normalise(answer or "")) if len(m) == digits]
    foreign = [v for v in found if v not in prompt]
    if any(v in known for v in foreign):
        return "leak"
    return "hallucinated" if foreign else "clean"


def pending_controls(name: str, spec, done: set[str]) -> list[tuple[int, float]]:
    """(length, depth) cells whose no-needle control trial is not yet in the store."""
    if not spec.control:
        return []
    return [(int(n), float(d)) for n in spec.lengths for d in spec.depths
            if trial_key(name, n, d, 0, control=True) not in done]
