"""`--decode-first N`: the needle is recalled only after the model has generated about N tokens.

    plan = decode_plan(tok, 256)        # DecodePlan(count_to=K, tokens=T): "1 2 ... K" is T >= 256 tokens
    plan.ask                            # appended to the question (inside the counted length)
    after_count("1 2 ... K\\nThe value is 4829163.", plan.count_to)   # the text after the count

The prompt asks the model to first count from 1 to K (numbers separated by spaces) and only
then answer; K is the smallest count whose text is at least N tokens under the trial's
counter (one binary search per counter and N, kept on the counter). So the value is written
at a decode position about N tokens past the prompt: the indexer's decode read, not only
the prefill, must select the needle. The request's max_tokens is the sweep's plus the
count's tokens (`max_tokens`).

Scoring (niah.sweep.scoring, unchanged) reads the reply after the count (`after_count`:
the text after the first whole-number K; the whole reply when the count never reached K, so
a model that skipped the count is still scored, and its `decode_tokens` says so). Each trial
records `decode_first` (N) and `decode_tokens`: the counter's tokens of the reply before the
value's first occurrence, else before the count's end (None when neither is in the reply or no
counter is at hand).
N outside 1-32,768, or with --prompts (a frozen set's prompts cannot ask), is refused
(BadInput).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from niah.errors import BadInput

DECODE_HELP = ("Recall after about N generated tokens: the prompt (its length still exact) asks the model to first "
               "count from 1 to K (K: the count that is N tokens) and then answer; max_tokens grows by the count; the "
               "value is scored after the count. Recorded per trial (decode_first, decode_tokens); the report has a "
               "line.")
MAX_DECODE = 32_768
ASK = " Before you answer, first count from 1 to {k}, writing the numbers separated by spaces; then answer."


@dataclass(frozen=True)
class DecodePlan:
    first: int  # N, as asked
    count_to: int  # K
    tokens: int  # the counter's tokens of "1 2 ... K"

    @property
    def ask(self) -> str:
        return ASK.format(k=self.count_to)


def check_decode(n: int | None, prompts: str | None) -> None:
    """BadInput for an N that cannot be asked (module doc)."""
    if n is None:
        return
    if not 1 <= int(n) <= MAX_DECODE:
        raise BadInput(f"--decode-first must be 1-{MAX_DECODE} tokens (got {n})")
    if prompts is not None:
        raise BadInput("--decode-first asks in the prompts niah builds: not with --prompts")


def count_text(k: int) -> str:
    return " ".join(str(i) for i in range(1, k + 1))


def decode_plan(tok, n: int) -> DecodePlan:
    """The smallest K whose count text is at least `n` tokens under `tok` (kept on `tok`)."""
    cache = tok.__dict__.setdefault("_niah_decode_plans", {})
    if n not in cache:
        lo, hi = 1, max(1, n)  # every number is at least one token: K = n is enough
        while lo < hi:
            mid = (lo + hi) // 2
            if tok.count_plain(count_text(mid)) >= n:
                hi = mid
            else:
                lo = mid + 1
        cache[n] = DecodePlan(n, lo, tok.count_plain(count_text(lo)))
    return cache[n]


def max_tokens(spec_max_tokens: int, plan: DecodePlan) -> int:
    """The request's max_tokens: room for the count (and a few tokens of slack), then the answer."""
    return spec_max_tokens + plan.tokens + max(8, plan.tokens // 20)


def after_count(text: str | None, k: int) -> str | None:
    """The reply after the first whole number K (the count's end); the whole reply without it."""
    if not text:
        return text
    m = re.search(rf"(?<![0-9]){k}(?![0-9])", text)
    return text[m.end():] if m else text


def decode_tokens(tok, text: str | None, value: str | None, k: int) -> int | None:
    """The counter's tokens of `text` before the value's first occurrence, or, without it,
    before the count's end (None: neither is there)."""
    if not text or tok is None:
        return None
    at = text.find(value) if value else -1
    if at < 0:
        rest = after_count(text, k)
        if rest is text:
            return None
        at = len(text) - len(rest)
    try:
        return tok.count_plain(text[:at]) if at else 0
    except Exception:  # noqa: BLE001 - a counter that fails leaves the field unknown, never the trial
        return None
