"""`niah prompt`: the prompt one sweep trial would send (same counter, same seed, same bytes).

`preview_prompt` builds the trial's spec (niah.sweep.plan.make_spec, checked there),
prepares the target (the counter a sweep would choose) and builds trial `trial` at
(length, depth); `show_prompt` prints it: the content on stdout and one line of facts on
stderr, or everything as one JSON object on stdout.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Optional

from niah.errors import BadInput
from niah.prompts.builder import build_prompt
from niah.prompts.needles import trial_seed
from niah.prompts.sets import entry_from_prompt
from niah.sweep.plan import make_spec
from niah.sweep.spec import parse_count
from niah.sweep.targets import Target, prepare_target

def preview_prompt(length: str, depth: float, trial: int, seed: int, mode: str, tokenizer: Optional[str],
                   endpoint: str, model: Optional[str] = None, api_key: Optional[str] = None,
                   approximate_lengths: bool = False, **kinds):
    """The niah.prompts.builder prompt of trial `trial` at (length, depth)."""
    n = parse_count(length)
    if not 0 <= depth <= 100:  # a number here, not a list: the grid parser's words would quote it
        raise BadInput(f"depth {depth:g} is outside 0-100 (depths are percentages)")
    spec = make_spec(str(n), str(depth), trial + 1, seed, 32, mode, tokenizer,
                     approximate_lengths=approximate_lengths, **kinds)
    prepared = prepare_target(Target(endpoint, model=model, api_key=api_key), spec)
    s = trial_seed(seed, n, depth, trial)
    return build_prompt(prepared.tokenizer, n, depth, s, mode, spec.needles, spec.kind, spec.haystack)


def show_prompt(p, depth: float, trial: int, seed: int, json_out: bool = False) -> None:
    """Print prompt `p` (module doc)."""
    if json_out:
        e = entry_from_prompt(p, trial, base_seed=seed)
        print(json.dumps({**asdict(e), "needle": p.needle.value, "needle_key": p.needle.key, "content": p.content,
                          "distractor_facts": [{"key": d.key, "value": d.value} for d in p.distractors]},
                         ensure_ascii=False))
        return
    sys.stdout.write(p.content + "\n")
    print(f"# {p.tokens} tokens ({p.tokenizer}); needle {p.needle.value} for {p.needle.key} "
          f"at depth {p.depth_achieved:g}% (asked {depth:g}%)", file=sys.stderr)
