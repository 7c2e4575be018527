"""Exact-length prompts: filler prose with one needle at a sentence boundary.

`build_prompt(tok, length, depth, seed, mode)` returns a `Prompt` whose *whole* token
count as the server sees it (chat template, instruction, question, special tokens) is
`length` as measured by `tok` (exact when `tok` is the server's /tokenize or a matching
HF tokenizer). The haystack is cut from the bundled corpus (niah/corpus/haystack.txt)
at a seeded sentence and trimmed word by word until the count hits the target; the
needle goes at the sentence boundary nearest the requested depth and the achieved depth
(needle token offset / haystack tokens) is recorded. Same arguments, same bytes.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from niah.errors import BadInput
from niah.needles import Needle, make_needle
from niah.tokenize import Tokenizer

INSTRUCTION = (
    "Below is a long text. Somewhere in it one sentence gives a special magic number. "
    "Read the text, then answer the question after it.\n\n"
)
MAX_ITER = 16


@dataclass
class Corpus:
    text: str  # the corpus twice over, so a haystack may wrap around its end
    size: int  # length of one copy
    word_ends: list[int]  # positions just after each word (before whitespace)
    sentence_starts: list[int]  # positions where a sentence begins


@lru_cache(maxsize=1)
def load_corpus() -> Corpus:
    raw = resources.files("niah").joinpath("corpus/haystack.txt").read_text(encoding="utf-8")
    raw = raw.strip() + "\n\n"
    text = raw + raw
    word_ends = [m.end() for m in re.finditer(r"\S+", text)]
    starts = [0] + [m.end() for m in re.finditer(r"[.!?]\s+", text)]
    return Corpus(text=text, size=len(raw), word_ends=word_ends, sentence_starts=starts)


def corpus_info() -> dict:
    """Which filler text prompts are cut from (for the manifest)."""
    raw = resources.files("niah").joinpath("corpus/haystack.txt").read_bytes()
    return {"file": "niah/corpus/haystack.txt", "sha256": hashlib.sha256(raw).hexdigest(), "chars": len(raw)}


@dataclass
class Prompt:
    mode: str  # chat | completion
    content: str  # the user message (chat) or the whole prompt text (completion)
    needle: Needle
    seed: int
    length: int  # requested
    depth: float  # requested, percent
    depth_achieved: float = 0.0
    tokens: int = 0  # the tokenizer's count of the whole prompt
    needle_span: tuple[int, int] = (0, 0)  # needle's char span in `content`
    tokenizer: str = ""
    iterations: int = 0
    messages: list[dict[str, str]] = field(default_factory=list)
    distractors: list[Needle] = field(default_factory=list)  # other facts in the haystack

    def body(self) -> dict:
        """The request fields that carry the prompt."""
        return {"messages": self.messages} if self.mode == "chat" else {"prompt": self.content}

    @property
    def sha256(self) -> str:
        if self.mode == "chat":
            data = json.dumps(self.messages, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        else:
            data = self.content
        return hashlib.sha256(data.encode("utf-8")).hexdigest()


def _assemble(mode: str, needle: Needle, haystack: str, inserts: list[tuple[int, int, str]]) -> tuple[str, tuple[int, int]]:
    """Content with sentences inserted into the haystack at sentence starts (or its ends).

    `inserts` holds (char position, order, sentence); order 0 is the asked-for needle.
    Returns the content and the needle's char span in it.
    """
    out = ""
    span = (0, 0)
    pos = 0
    for at, order, sentence in sorted(inserts):
        at = max(pos, min(at, len(haystack)))
        out = _join(out, haystack[pos:at])
        pos = at
        if out and not out[-1].isspace():
            out += " "
        if order == 0:
            span = (len(out), len(out) + len(sentence))
        out += sentence
    out = _join(out, haystack[pos:])
    tail = "\n\n" + needle.question
    if mode == "completion":
        tail += "\nAnswer: " + needle.answer_prefix
    content = INSTRUCTION + out + tail
    return content, (span[0] + len(INSTRUCTION), span[1] + len(INSTRUCTION))


def _join(out: str, text: str) -> str:
    if text and out and not out[-1].isspace() and not text[0].isspace():
        out += " "
    return out + text


class _Builder:
    """Holds one trial's fixed choices; `make(words)` gives the content for a haystack size."""

    def __init__(
        self, tok: Tokenizer, mode: str, needle: Needle, start: int, depth: float,
        distractors: list[tuple[Needle, float]] = (),
    ):
        self.tok, self.mode, self.needle, self.depth = tok, mode, needle, depth
        self.control = False  # True: the haystack holds no needle (a no-needle control)
        self.distractors = list(distractors)  # (needle, depth percent)
        self.c = load_corpus()
        self.start = start
        self.first_word = bisect.bisect_right(self.c.word_ends, start)
        self.max_words = bisect.bisect_right(self.c.word_ends, start + self.c.size) - self.first_word

    def haystack(self, words: int) -> str:
        if words <= 0:
            return ""
        end = self.c.word_ends[self.first_word + words - 1]
        hay = self.c.text[self.start : end].rstrip(",;:")
        return hay if hay[-1] in ".!?" else hay + "."

    def insertion_point(self, hay: str, depth: float) -> int:
        """Sentence start (or either end) nearest to depth% of the haystack."""
        if not hay:
            return 0
        target = self.start + depth / 100.0 * len(hay)
        s = self.c.sentence_starts
        i = bisect.bisect_left(s, target)
        cands = [p - self.start for p in s[max(0, i - 1) : i + 1] if self.start < p < self.start + len(hay)]
        cands += [0, len(hay)]
        rel = target - self.start
        return min(cands, key=lambda p: (abs(p - rel), p))

    def make(self, words: int) -> tuple[str, tuple[int, int]]:
        hay = self.haystack(words)
        inserts = [] if self.control else [(self.insertion_point(hay, self.depth), 0, self.needle.sentence)]
        for i, (n, d) in enumerate(self.distractors, start=1):
            inserts.append((self.insertion_point(hay, d), i, n.sentence))
        return _assemble(self.mode, self.needle, hay, inserts)

    def count(self, content: str) -> int:
        if self.mode == "chat":
            return self.tok.count_chat([{"role": "user", "content": content}])
        return self.tok.count_prompt(content)


def _tokens_per_word(tok: Tokenizer) -> float:
    """The corpus' tokens per word under `tok` (measured once, kept on the tokenizer)."""
    cached = getattr(tok, "_niah_tpw", None)
    if cached is None:
        c = load_corpus()
        end = c.word_ends[4000 - 1]
        cached = max(0.2, tok.count_plain(c.text[:end]) / 4000)
        tok._niah_tpw = cached
    return cached


def corpus_capacity(tok: Tokenizer) -> int:
    """Roughly how many tokens of filler the corpus holds under `tok` (no repeats)."""
    c = load_corpus()
    return int(_tokens_per_word(tok) * bisect.bisect_right(c.word_ends, c.size))


def fixed_tokens(tok: Tokenizer, mode: str) -> int:
    """Tokens of a prompt with an empty haystack (template, instruction, needle, question)."""
    b = _Builder(tok, mode, Needle("Lisbon", "1234567"), 0, 50.0)
    return b.count(b.make(0)[0])


def build_prompt(
    tok: Tokenizer, length: int, depth: float, seed: int, mode: str = "chat", needles: int = 1,
    control: bool = False,
) -> Prompt:
    """The prompt of one trial: `length` tokens (whole prompt), needle at `depth` percent.

    With `needles` > 1, that many - 1 distractor facts (other cities, other values) go at
    seeded random depths; the question still asks for the one at `depth`. With `control`
    the same question is asked of a haystack that holds no needle (needle_span is empty).
    """
    if mode not in ("chat", "completion"):
        raise BadInput(f"unknown mode {mode!r}: use chat or completion")
    if not 0 <= depth <= 100:
        raise BadInput(f"depth {depth:g} is outside 0-100")
    rng = random.Random(seed)
    needle = make_needle(rng)
    c = load_corpus()
    start = c.sentence_starts[rng.randrange(bisect.bisect_left(c.sentence_starts, c.size))]
    if needles < 1:
        raise BadInput(f"needles must be at least 1 (got {needles})")
    distractors: list[tuple[Needle, float]] = []
    keys, values = {needle.key}, {needle.value}
    while len(distractors) < needles - 1:
        n = make_needle(rng)
        if n.key not in keys and n.value not in values:
            keys.add(n.key)
            values.add(n.value)
            distractors.append((n, round(rng.uniform(0, 100), 3)))
    b = _Builder(tok, mode, needle, start, depth, distractors)
    b.control = control

    tried: dict[int, int] = {}

    def f(words: int) -> int:
        if words not in tried:
            tried[words] = b.count(b.make(words)[0])
        return tried[words]

    base = f(0)
    if base > length:
        raise BadInput(f"length {length} is shorter than the prompt's fixed parts ({base} tokens)")
    tpw = _tokens_per_word(tok)
    words = min(b.max_words, max(1, round((length - base) / tpw)))
    prev: tuple[int, int] | None = None
    for _ in range(MAX_ITER):
        n = f(words)
        if n == length:
            break
        slope = tpw
        if prev is not None and prev[0] != words and prev[1] != n:
            slope = max(0.2, (n - prev[1]) / (words - prev[0]))
        step = round((length - n) / slope) or (1 if n < length else -1)
        nxt = min(b.max_words, max(0, words + step))
        prev = (words, n)
        if nxt in tried:  # adjacent sizes bracket the target: take the nearer
            break
        words = nxt
    if words >= b.max_words and f(words) < length - 4:
        raise BadInput(f"length {length} is longer than the bundled corpus can fill")
    words = min(tried, key=lambda w: (abs(tried[w] - length), tried[w] > length, w))
    content, span = b.make(words)
    assert control or content[span[0] : span[1]] == needle.sentence
    for v in values:  # the corpus holds no digits; guard anyway
        if content.count(v) != (0 if control and v == needle.value else 1):
            raise RuntimeError(f"needle value {v} occurs elsewhere in the prompt")

    p = Prompt(
        mode=mode, content=content, needle=needle, seed=seed, length=length, depth=depth,
        tokens=tried[words], needle_span=span, tokenizer=tok.spec, iterations=len(tried),
    )
    if mode == "chat":
        p.messages = [{"role": "user", "content": content}]
    p.depth_achieved = depth if control else _achieved_depth(tok, needle, content, span)
    p.distractors = [n for n, _ in distractors]
    return p


def _achieved_depth(tok: Tokenizer, needle: Needle, content: str, span: tuple[int, int]) -> float:
    """Needle token offset within the haystack / haystack tokens (needle excluded), percent."""
    hay_end = content.rindex("\n\n" + needle.question)
    before = tok.count_plain(content[len(INSTRUCTION) : span[0]])
    after = tok.count_plain(content[span[1] : hay_end])
    total = before + after
    return round(100.0 * before / total, 3) if total else 0.0
