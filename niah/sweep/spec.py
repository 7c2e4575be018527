"""The sweep's spec: what to ask, identical for every configuration, checked once.

    spec = SweepSpec(lengths=parse_lengths("300,1k,4k"), depths=parse_depths("0:100:5"), trials=3)
    check_spec(spec)       # BadInput before any network; a checked spec is not checked again

Parsing the grid: lengths (`300,1k,4k,22k`, `300:22k:8`) and depths (`0,50,100`,
`0:100:5`, `0:100/10`). Suffixes: `k` = 1,000, `ki` = 1,024, `m` = 1,000,000
(case-insensitive). A range `LO:HI:N` gives N values from LO to HI inclusive (N is a
count, not a step): log-spaced for lengths, evenly spaced for depths (`0:100:10` is 10
values 11.1 apart). For depths, `LO:HI/STEP` steps by STEP (`0:100/10` is 0, 10, ..., 100).
Everything else of the sweep (targets, the call stage, orchestrate) sits above this module.
"""

from __future__ import annotations

import math
import re
from dataclasses import astuple, dataclass

from niah.errors import BadInput
from niah.prompts.haystacks import check_kind
from niah.prompts.needles import NeedleKind
from niah.sweep.residues import parse_residues
from niah.sweep.cache_state import check_states
from niah.sweep.decode import check_decode
from niah.sweep.multiturn import check_multi_turn
from niah.tokens import check_tokenizer_spec

_NUM = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ki|k|m)?\s*$", re.IGNORECASE)
_MULT = {None: 1, "k": 1000, "ki": 1024, "m": 1_000_000}


def parse_count(text: str, what: str = "length") -> int:
    """`22k` -> 22000, `128ki` -> 131072, `943` -> 943."""
    m = _NUM.match(text)
    if not m:
        raise BadInput(f"bad {what} {text!r}: expected a number like 943, 4k or 128ki")
    value = float(m.group(1)) * _MULT[(m.group(2) or "").lower() or None]
    if value != int(value):
        raise BadInput(f"bad {what} {text!r}: not a whole number of tokens")
    return int(value)


def _range(text: str) -> tuple[str, str, int] | None:
    parts = text.split(":")
    if len(parts) == 1:
        return None
    if len(parts) != 3:
        raise BadInput(f"bad range {text!r}: expected LO:HI:N, e.g. 300:22k:8")
    try:
        n = int(parts[2])
    except ValueError:
        raise BadInput(f"bad range {text!r}: N must be a whole number") from None
    if n < 1:
        raise BadInput(f"bad range {text!r}: N must be at least 1")
    return parts[0], parts[1], n


def parse_lengths(text: str) -> list[int]:
    """Comma list of lengths and log-spaced ranges; sorted, duplicates removed."""
    out: list[int] = []
    for item in _items(text, "lengths"):
        rng = _range(item)
        if rng is None:
            out.append(parse_count(item))
            continue
        lo, hi, n = parse_count(rng[0]), parse_count(rng[1]), rng[2]
        if lo > hi:
            raise BadInput(f"bad range {item!r}: LO is larger than HI")
        if n == 1 or lo == hi:
            out.append(lo)
            continue
        step = (math.log(hi) - math.log(lo)) / (n - 1)
        out.extend(round(math.exp(math.log(lo) + i * step)) for i in range(n))
    for v in out:
        if v < 1:
            raise BadInput(f"bad length {v}: must be at least 1 token")
    return sorted(set(out))


def parse_depths(text: str) -> list[float]:
    """Comma list of percentages and evenly spaced ranges, each within 0-100."""
    out: list[float] = []
    for item in _items(text, "depths"):
        if "/" in item:
            out.extend(_stepped(item))
            continue
        rng = _range(item)
        if rng is None:
            out.append(_depth(item))
            continue
        lo, hi, n = _depth(rng[0]), _depth(rng[1]), rng[2]
        if n == 1:
            out.append(lo)
            continue
        out.extend(round(lo + i * (hi - lo) / (n - 1), 6) for i in range(n))
    return sorted(set(out))


def _stepped(item: str) -> list[float]:
    """`LO:HI/STEP`: LO, LO+STEP, ... up to HI (HI included when a step lands on it)."""
    span, _, step_text = item.partition("/")
    parts = span.split(":")
    if len(parts) != 2:
        raise BadInput(f"bad range {item!r}: expected LO:HI/STEP, e.g. 0:100/10")
    lo, hi = _depth(parts[0]), _depth(parts[1])
    try:
        step = float(step_text)
    except ValueError:
        raise BadInput(f"bad range {item!r}: STEP must be a number") from None
    if not step > 0 or lo > hi:
        raise BadInput(f"bad range {item!r}: STEP must be positive and LO <= HI")
    n = int(math.floor((hi - lo) / step + 1e-9))
    return [round(lo + i * step, 6) for i in range(n + 1)]


def _depth(text: str) -> float:
    try:
        v = float(text.strip().rstrip("%"))
    except ValueError:
        raise BadInput(f"bad depth {text!r}: expected a percentage 0-100") from None
    if not 0 <= v <= 100 or math.isnan(v):
        raise BadInput(f"depth {text.strip()} is outside 0-100 (depths are percentages)")
    return v


def _items(text: str, what: str) -> list[str]:
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise BadInput(f"no {what} given")
    return items


@dataclass
class SweepSpec:
    """What to ask; identical for every configuration."""

    lengths: list[int]
    depths: list[float]
    trials: int = 3
    seed: int = 0
    max_tokens: int = 32
    mode: str = "chat"  # chat | completion
    tokenizer: str | None = None  # None = auto (server /tokenize, else usage), checked
    concurrency: int = 1
    timeout_s: float = 600.0
    retries: int = 3
    stream: bool = True
    needles: int = 1  # keys in each haystack; the question asks for the one at `depth`
    needle_key: str = "city"  # city | word
    needle_value: str = "number"  # number | uuid | word
    values: int = 1  # values per key (all asked)
    queries: int = 1  # keys asked at once
    haystack: str = "prose"  # prose | book | noise | needles | file:PATH
    approximate_lengths: bool = False  # run even when the counter is not exact
    prompts: str | None = None  # a frozen prompt set (niah prompts build) to run
    control: bool = False  # add one no-needle control trial per (length, depth) cell
    residues: str | None = None  # "4:0,1,2,3": lengths are residue blocks (niah.sweep.residues)
    cache_states: list[str] | None = None  # None: not controlled; else cold/warm/repeat (niah.sweep.cache_state)
    answer_prefix: str | None = None  # the answer must start with it (niah.sweep.reasoning)
    decode_first: int | None = None  # recall after about N generated tokens (niah.sweep.decode)
    multi_turn: int | None = None  # N alike needles in a chat, the i-th asked (niah.sweep.multiturn)
    coverage: dict | None = None  # --coverage: {"preset", "options", "given"} (niah.sweep.plan.apply_coverage)

    @property
    def kind(self) -> NeedleKind:
        return NeedleKind(key=self.needle_key, value=self.needle_value, values=self.values,
                          keys=self.needles, queries=self.queries)


# -- checking the spec ------------------------------------------------------------------------
def check_spec(spec: SweepSpec) -> None:
    """Reject an impossible spec (BadInput), before any network. Checked once: a spec
    already checked and not changed since is not checked again."""
    if getattr(spec, "_checked", None) == _fingerprint(spec):  # an attribute, not a field: not in the manifest
        return
    if spec.trials < 1:
        raise BadInput(f"--trials must be at least 1 (got {spec.trials})")
    if not spec.lengths:
        raise BadInput("no lengths given")
    if not spec.depths:
        raise BadInput("no depths given")
    for length in spec.lengths:
        if int(length) < 1:
            raise BadInput(f"length {length} must be at least 1 token")
    for d in spec.depths:
        if not 0 <= float(d) <= 100:
            raise BadInput(f"depth {d:g} is outside 0-100 (depths are percentages)")
    if spec.mode not in ("chat", "completion"):
        raise BadInput(f"unknown --mode {spec.mode!r}: use chat or completion")
    if spec.max_tokens < 1:
        raise BadInput(f"--max-tokens must be at least 1 (got {spec.max_tokens})")
    spec.kind.check()
    check_kind(spec.haystack)
    if spec.concurrency < 1:
        raise BadInput(f"--concurrency must be at least 1 (got {spec.concurrency})")
    if spec.retries < 0:
        raise BadInput(f"--retries must be 0 or more (got {spec.retries})")
    if not spec.timeout_s > 0:
        raise BadInput(f"--timeout must be positive (got {spec.timeout_s})")
    check_tokenizer_spec(spec.tokenizer)
    if spec.control and (not spec.kind.default or spec.prompts is not None):
        raise BadInput("--control works with the default needle kind, on prompts it builds "
                       "(not with --needle-key/--needle-value/--values/--queries or --prompts)")
    if spec.residues is not None and (spec.prompts is not None or spec.control):
        raise BadInput("--residues builds its own prompts: not with --prompts or --control")
    parse_residues(spec.residues)
    check_states(spec.cache_states, spec.prompts)
    if spec.answer_prefix is not None and (not spec.answer_prefix.strip() or spec.prompts is not None):
        raise BadInput("--answer-prefix needs a non-empty TEXT and prompts niah builds (not --prompts)")
    check_decode(spec.decode_first, spec.prompts)
    check_multi_turn(spec)
    spec._checked = _fingerprint(spec)


def _fingerprint(spec: SweepSpec) -> str:
    return repr(astuple(spec))
