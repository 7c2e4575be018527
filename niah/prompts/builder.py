"""Exact-length prompts: filler prose with one needle at a sentence boundary.

`build_prompt(tok, length, depth, seed, mode)` returns a `Prompt` whose *whole* token
count as the server sees it (chat template, instruction, question, special tokens) is
`length` as measured by `tok` (exact when `tok` is the server's /tokenize or a matching
HF tokenizer). The haystack is cut from the bundled corpus (niah/corpus/haystack.txt)
at a seeded sentence and trimmed word by word until the count hits the target; the
needle goes at the sentence boundary nearest the requested depth and the achieved depth
(needle token offset / haystack tokens) is recorded. Same arguments, same bytes.
`CHAT_PROBE` is the message, shaped like these prompts, that a server counter measures
its chat template on (handed to niah.tokens, which knows nothing of prompts).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import random
from dataclasses import dataclass, field

from niah.errors import BadInput
from niah.prompts.haystacks import PACKAGE_DIR, Corpus, load_haystack
from niah.prompts.needles import QUESTION, Needle, NeedleKind
from niah.tokens.counters import Tokenizer

INSTRUCTION = (
    "Below is a long text. Somewhere in it one sentence gives a special magic number. "
    "Read the text, then answer the question after it.\n\n"
)
MAX_ITER = 16
# Appended to the question with `answer_prefix`: the answer must start with it.
ANSWER_PREFIX_ASK = ' Begin your answer with "{prefix}".'
# The message a server counter measures its chat template on (niah.tokens.ServerTokenizer):
# shaped like every prompt built here (same first and last words), so the template's joins
# with the content tokenize the same way.
CHAT_PROBE = INSTRUCTION + "Hello." + "\n\n" + QUESTION.format(key="Lisbon")


def load_corpus() -> Corpus:
    """The bundled prose (the default haystack)."""
    return load_haystack("prose")


def corpus_info() -> dict:
    """Which filler text prompts are cut from (for the manifest)."""
    raw = (PACKAGE_DIR / "corpus" / "haystack.txt").read_bytes()
    return {"file": "niah/corpus/haystack.txt", "sha256": hashlib.sha256(raw).hexdigest(), "chars": len(raw)}


@dataclass
class Fact:
    """One inserted sentence: key, value, requested depth (percent), char span in content."""

    key: str
    value: str
    depth: float
    span: tuple[int, int] = (0, 0)
    asked: bool = False


@dataclass
class Prompt:
    mode: str  # chat | completion
    content: str  # the user message (chat) or the whole prompt text (completion)
    needle: Needle  # the asked fact at the requested depth
    seed: int
    length: int  # requested
    depth: float  # requested, percent
    depth_achieved: float = 0.0
    tokens: int = 0  # the tokenizer's count of the whole prompt
    needle_span: tuple[int, int] = (0, 0)  # needle's char span in `content`
    tokenizer: str = ""
    iterations: int = 0
    messages: list[dict[str, str]] = field(default_factory=list)
    distractors: list[Needle] = field(default_factory=list)  # facts of keys not asked
    facts: list[Fact] = field(default_factory=list)  # every inserted fact, in drawing order
    kind: NeedleKind = field(default_factory=NeedleKind)
    haystack: str = "prose"

    def body(self) -> dict:
        """The request fields that carry the prompt."""
        return {"messages": self.messages} if self.mode == "chat" else {"prompt": self.content}

    @property
    def asked_keys(self) -> list[str]:
        return list(dict.fromkeys(f.key for f in self.facts if f.asked))

    @property
    def expected(self) -> list[str]:
        return [f.value for f in self.facts if f.asked]

    @property
    def sha256(self) -> str:
        return prompt_sha256(self.mode, self.messages, self.content)


def prompt_sha256(mode: str, messages: list | None, content: str | None) -> str:
    """Hash of the exact prompt sent (messages JSON or text): pairs trials across configs."""
    if mode == "chat":
        data = json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    else:
        data = content or ""
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def _assemble(mode: str, question: str, prefix: str, haystack: str, inserts: list[tuple[int, int, str]],
              lead: str = "") -> tuple[str, list[tuple[int, int]]]:
    """Content with sentences inserted into the haystack at sentence starts (or its ends).

    `inserts` holds (char position, order, sentence); order 0 is the asked-for needle.
    Returns the content and each insert's char span in it, by order.
    """
    out = ""
    spans: dict[int, tuple[int, int]] = {}
    pos = 0
    for at, order, sentence in sorted(inserts):
        at = max(pos, min(at, len(haystack)))
        out = _join(out, haystack[pos:at])
        pos = at
        if out and not out[-1].isspace():
            out += " "
        start = len(lead) + len(INSTRUCTION) + len(out)
        spans[order] = (start, start + len(sentence))
        out += sentence
    out = _join(out, haystack[pos:])
    tail = "\n\n" + question
    if mode == "completion":
        tail += "\nAnswer: " + prefix
    return lead + INSTRUCTION + out + tail, [spans.get(i, (0, 0)) for i in range(max(spans, default=-1) + 1)]


def _join(out: str, text: str) -> str:
    if text and out and not out[-1].isspace() and not text[0].isspace():
        out += " "
    return out + text


class _Builder:
    """Holds one trial's fixed choices; `make(words)` gives the content for a haystack size."""

    def __init__(self, tok: Tokenizer, mode: str, kind: NeedleKind, facts: list[Fact], start: int,
                 corpus: Corpus, control: bool = False, lead: str = "", answer_prefix: str | None = None,
                 decode_ask: str = ""):
        self.tok, self.mode, self.kind, self.facts = tok, mode, kind, facts
        self.lead = lead  # a first line before the instruction (niah.sweep.cache_state: a cold prompt's nonce)
        self.control = control  # True: the asked facts are left out (a no-needle control)
        self.c = corpus
        self.start = start
        self.question = kind.question(list(dict.fromkeys(f.key for f in facts if f.asked)))
        if answer_prefix:
            self.question += ANSWER_PREFIX_ASK.format(prefix=answer_prefix)
        self.question += decode_ask  # niah.sweep.decode: write first, then answer
        # a completion prompt's answer opening would make the value the next token: none with a decode ask
        self.prefix = "" if decode_ask else kind.answer_prefix(list(dict.fromkeys(f.key for f in facts if f.asked)))
        self.tried: dict[int, int] = {}  # haystack words -> whole-prompt tokens (filled by _fit)
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

    def make(self, words: int) -> tuple[str, list[tuple[int, int]]]:
        hay = self.haystack(words)
        inserts = [(self.insertion_point(hay, f.depth), i, self.kind.sentence(f.key, f.value))
                   for i, f in enumerate(self.facts) if not (self.control and f.asked)]
        return _assemble(self.mode, self.question, self.prefix, hay, inserts, self.lead)

    def count(self, content: str) -> int:
        if self.mode == "chat":
            return self.tok.count_chat([{"role": "user", "content": content}])
        return self.tok.count_prompt(content)


def _tokens_per_word(tok: Tokenizer, corpus: Corpus | None = None) -> float:
    """The corpus' tokens per word under `tok` (measured once per corpus, kept on the tokenizer)."""
    c = corpus or load_corpus()
    cache = tok.__dict__.setdefault("_niah_tpw_by_corpus", {})
    if c.name not in cache:
        end = c.word_ends[min(4000, len(c.word_ends) // 2) - 1]
        cache[c.name] = max(0.2, tok.count_plain(c.text[:end]) / min(4000, len(c.word_ends) // 2))
    return cache[c.name]


def corpus_capacity(tok: Tokenizer, corpus: Corpus | None = None) -> int:
    """Roughly how many tokens of filler the corpus holds under `tok` (no repeats)."""
    c = corpus or load_corpus()
    return int(_tokens_per_word(tok, c) * bisect.bisect_right(c.word_ends, c.size))


def fixed_tokens(tok: Tokenizer, mode: str, kind: NeedleKind | None = None) -> int:
    """Tokens of a prompt with an empty haystack (template, instruction, facts, question)."""
    kind = kind or NeedleKind()
    rng = random.Random(0)
    facts = [Fact(kind.draw_key(rng), kind.draw_value(rng), 50.0, asked=i < kind.queries)
             for i in range(kind.keys) for _ in range(kind.values)]
    b = _Builder(tok, mode, kind, facts, 0, load_corpus())
    return b.count(b.make(0)[0])


def _clashes(c: Corpus, text: str) -> bool:
    """Does a key or value occur in the haystack text (so it would not be unique)?"""
    return any(w.lower() in c.words for w in text.replace("-", " ").split())


def draw_facts(rng: random.Random, kind: NeedleKind, depth: float, c: Corpus) -> tuple[list[Fact], int]:
    """Every fact of one trial, and the haystack's start; the RNG is used in a fixed order
    (one needle: key, value, start; then distractors: key, value, depth), so a default
    trial's bytes never change."""
    keys: set[str] = set()
    values: set[str] = set()

    def fresh_value() -> str:
        while True:
            v = kind.draw_value(rng)
            if v not in values and not _clashes(c, v):
                values.add(v)
                return v

    def fresh_fact() -> tuple[str, str]:
        while True:
            k, v = kind.draw_key(rng), kind.draw_value(rng)
            if k not in keys and v not in values and not _clashes(c, k) and not _clashes(c, v):
                keys.add(k)
                values.add(v)
                return k, v

    k, v = fresh_fact()
    facts = [Fact(k, v, float(depth), asked=True)]
    start = c.sentence_starts[rng.randrange(bisect.bisect_left(c.sentence_starts, c.size))]
    for _ in range(kind.values - 1):
        facts.append(Fact(k, fresh_value(), round(rng.uniform(0, 100), 3), asked=True))
    for i in range(1, kind.keys):
        k, v = fresh_fact()
        asked = i < kind.queries
        facts.append(Fact(k, v, round(rng.uniform(0, 100), 3), asked=asked))
        for _ in range(kind.values - 1):
            facts.append(Fact(k, fresh_value(), round(rng.uniform(0, 100), 3), asked=asked))
    return facts, start


def build_prompt(
    tok: Tokenizer, length: int, depth: float, seed: int, mode: str = "chat", needles: int = 1,
    kind: NeedleKind | None = None, haystack: str = "prose", control: bool = False, counts: dict | None = None,
    lead: str = "", answer_prefix: str | None = None, decode_ask: str = "",
) -> Prompt:
    """The prompt of one trial: `length` tokens (whole prompt), needle at `depth` percent.

    `kind` says which facts are hidden and asked (default: one city -> 7-digit number;
    `needles` > 1 is `NeedleKind(keys=needles)`: distractor facts at seeded random depths,
    the question asks for the one at `depth`). `haystack` is a kind of niah.prompts.haystacks.
    With `control` the same question is asked of a haystack that holds none of the asked
    facts (a no-needle control: needle_span is empty, depth_achieved the requested depth).
    `counts` ({haystack words: whole-prompt tokens}) carries the counts of earlier builds
    with the same seed, depth and options (another length of one residue block): filled
    and reused, so a neighbouring length costs few counts or none.
    `lead` opens the prompt before the instruction, counted in `length` (a cold prompt's
    nonce); `answer_prefix` asks, after the question, that the answer begin with it;
    `decode_ask` (niah.sweep.decode) follows it, asking for text before the answer.
    Without any, the bytes are those of every earlier release.
    """
    if mode not in ("chat", "completion"):
        raise BadInput(f"unknown mode {mode!r}: use chat or completion")
    if not 0 <= depth <= 100:
        raise BadInput(f"depth {depth:g} is outside 0-100")
    if needles < 1:
        raise BadInput(f"needles must be at least 1 (got {needles})")
    kind = kind or NeedleKind(keys=needles)
    kind.check()
    c = load_haystack(haystack, kind.value)
    facts, start = draw_facts(random.Random(seed), kind, depth, c)
    b = _Builder(tok, mode, kind, facts, start, c, control, lead, answer_prefix, decode_ask)
    if counts is not None:
        b.tried = counts
    words, n = _fit(b, tok, length, c)
    if counts is not None and n != length:  # a cache may stop the search early: try the neighbours
        for w in (words - 1, words + 1):
            if 0 <= w <= b.max_words and w not in counts:
                counts[w] = b.count(b.make(w)[0])
        words = min(counts, key=lambda w: (abs(counts[w] - length), counts[w] > length, w))
        n = counts[words]
    content, spans = b.make(words)
    spans += [(0, 0)] * (len(facts) - len(spans))
    for f, span in zip(facts, spans):
        left_out = control and f.asked
        f.span = (0, 0) if left_out else span
        assert left_out or content[span[0] : span[1]] == kind.sentence(f.key, f.value)
        if content.count(f.value) != (0 if left_out else 1):
            raise RuntimeError(f"needle value {f.value} occurs elsewhere in the prompt")
    needle = Needle(facts[0].key, facts[0].value)
    p = Prompt(
        mode=mode, content=content, needle=needle, seed=seed, length=length, depth=depth,
        tokens=n, needle_span=spans[0], tokenizer=tok.spec, iterations=len(b.tried),
        facts=facts, kind=kind, haystack=haystack,
    )
    if mode == "chat":
        p.messages = [{"role": "user", "content": content}]
    p.depth_achieved = float(depth) if control else _achieved_depth(tok, b.question, content, spans[0], len(lead))
    p.distractors = [Needle(f.key, f.value) for f in facts[1:] if not f.asked]
    return p


def _fit(b: _Builder, tok: Tokenizer, length: int, c: Corpus) -> tuple[int, int]:
    """Haystack words whose whole prompt counts closest to `length` (secant steps)."""
    tried = b.tried

    def f(words: int) -> int:
        if words not in tried:
            tried[words] = b.count(b.make(words)[0])
        return tried[words]

    base = f(0)
    if base > length:
        raise BadInput(f"length {length} is shorter than the prompt's fixed parts ({base} tokens)")
    tpw = _tokens_per_word(tok, c)
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
        raise BadInput(f"length {length} is longer than the {c.name} haystack can fill")
    words = min(tried, key=lambda w: (abs(tried[w] - length), tried[w] > length, w))
    return words, tried[words]


def _achieved_depth(tok: Tokenizer, question: str, content: str, span: tuple[int, int], lead: int = 0) -> float:
    """Needle token offset within the haystack / haystack tokens (needle excluded), percent."""
    hay_end = content.rindex("\n\n" + question)
    before = tok.count_plain(content[lead + len(INSTRUCTION) : span[0]])
    after = tok.count_plain(content[span[1] : hay_end])
    total = before + after
    return round(100.0 * before / total, 3) if total else 0.0
