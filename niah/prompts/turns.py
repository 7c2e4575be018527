"""Multi-turn prompts (OpenAI MRCR's idea): a chat whose earlier turns hold N alike needles.

    p, facts = build_turns(tok, length, depth, seed, needles=4)
    p.messages              # user/assistant turns, then the question: `length` tokens as a whole
    facts.prefix            # the random string the reply must start with
    facts.index             # which poem is asked (1-based, in conversation order)
    facts.turn, facts.pairs # the asked poem's turn (1-based) and the turns before the question

The conversation holds filler turns (the user asks for the next passage of the story, the
assistant answers with a piece of the haystack) and N needle turns (the user asks "Write a
short poem about TOPIC." and the assistant answers with a four-line poem drawn from a
seeded vocabulary: the N poems share the topic and the form and differ in their words).
The final user message asks the model to prepend a random 10-character string to the i-th
poem (1 indexed) and to write that poem again, nothing else.

Depth is where the asked poem's turn sits: the haystack is cut into `filler_turns(length)`
chunks and the asked poem goes before the chunk nearest `depth` percent of them; the other
N - 1 poems go at seeded random depths, so i = 1 + the number of poems before it (depth 0
asks the first poem, depth 100 the last). `depth_achieved` is the share of filler tokens
before the asked poem. The haystack's word count is fitted (niah.prompts.builder's search)
until the whole chat, template included, counts `length` tokens under `tok` (exact with a
counter that counts messages: the server's /tokenize of messages, or an HF tokenizer with
its chat template); where no word count lands on it, `_refine` makes the last filler turn a
few words longer or shorter, or opens its ask with a short lead-in (LAST_ASKS). Same
arguments, same bytes. Chat mode only.
"""

from __future__ import annotations

import bisect
import random
import string
from dataclasses import dataclass, field

from niah.errors import BadInput
from niah.prompts.builder import Fact, Prompt, _fit
from niah.prompts.haystacks import Corpus, load_haystack
from niah.prompts.needles import Needle
from niah.tokens.counters import Tokenizer

TOPICS = ("tapirs", "otters", "herons", "lighthouses", "glaciers", "orchards", "comets", "harbours")
_ADJ = ("quiet", "golden", "restless", "patient", "silver", "hollow", "gentle", "crooked", "distant", "bright",
        "weary", "tender", "salted", "frozen", "humble", "scarlet", "sleepy", "narrow", "ancient", "wild")
_VERB = ("wander", "linger", "gather", "shimmer", "whisper", "drift", "settle", "tremble", "glow", "rest",
         "circle", "murmur", "wait", "dream", "falter", "rise", "sing", "turn", "kneel", "listen")
_PREP = ("beneath", "beside", "across", "beyond", "within", "along", "behind", "toward")
_NOUN = ("river", "lantern", "meadow", "harvest", "window", "mountain", "garden", "ember", "shoreline", "orchard",
         "valley", "hearth", "chapel", "bridge", "forest", "market", "tide", "moonrise", "quarry", "willow")
FILLER_ASK = "Write the next passage of the story."
# The last filler turn's ask, for a count no word count reaches (_refine): about one token more each
LAST_ASKS = (FILLER_ASK, "Now w" + FILLER_ASK[1:], "And now w" + FILLER_ASK[1:], "And now, w" + FILLER_ASK[1:])
NEEDLE_ASK = "Write a short poem about {topic}."
QUESTION = ("Prepend {prefix} to the {ordinal} (1 indexed) short poem about {topic} in this conversation, then "
            "write that poem again exactly as it was. Do not include any other text in your response.")
FOUND_SIMILARITY = 0.9  # a reply found: its prefix, then this similarity to the asked poem (niah.sweep.multiturn)
PREFIX_CHARS = string.ascii_letters + string.digits
PREFIX_LEN = 10
MAX_FILLER_TURNS = 64


@dataclass
class TurnFacts:
    """What one multi-turn prompt asks: the trial's record and scorer need these."""

    needles: int  # N: poems of the asked topic in the conversation
    topic: str
    prefix: str  # the reply must start with it
    index: int  # i: the asked poem's place among the poems, 1-based
    turn: int = 0  # the asked poem's turn (user/assistant pair), 1-based
    pairs: int = 0  # user/assistant pairs before the question
    poems: list[str] = field(default_factory=list)  # in conversation order

    @property
    def expected(self) -> str:
        return self.poems[self.index - 1]


def ordinal(i: int) -> str:
    """1 -> 1st, 2 -> 2nd, 11 -> 11th, 23 -> 23rd."""
    suffix = "th" if 10 <= i % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(i % 10, "th")
    return f"{i}{suffix}"


def filler_turns(length: int) -> int:
    """Filler turns of a prompt of `length` tokens: one per ~400 tokens, 2 to 64."""
    return max(2, min(MAX_FILLER_TURNS, int(length) // 400))


def draw_poem(rng: random.Random, topic: str) -> str:
    """Four lines of one form: `<adj> <topic> <verb> <prep> the <adj> <noun>`."""
    lines = [f"{rng.choice(_ADJ)} {topic} {rng.choice(_VERB)} {rng.choice(_PREP)} the {rng.choice(_ADJ)} "
             f"{rng.choice(_NOUN)}" for _ in range(4)]
    text = ",\n".join(lines) + "."
    return text[0].upper() + text[1:]


class _TurnBuilder:
    """One trial's fixed choices; `make(words)` gives the messages for a haystack size."""

    def __init__(self, tok: Tokenizer, c: Corpus, start: int, facts: TurnFacts, depths: list[float],
                 asked: int, turns: int, lead: str):
        self.tok, self.c, self.start, self.facts = tok, c, start, facts
        self.turns, self.lead = turns, lead
        self.depths = depths  # the poems' depths, in conversation order
        self.asked_at = asked  # 0-based place of the asked poem
        self.tried: dict[int, int] = {}
        self.split: int | None = None  # set by _refine: chunks cut as for this many words, the last one grows
        self.last_ask = FILLER_ASK  # set by _refine: the last filler turn's ask (LAST_ASKS)
        self.first_word = bisect.bisect_right(c.word_ends, start)
        self.max_words = bisect.bisect_right(c.word_ends, start + c.size) - self.first_word

    def gap(self, depth: float) -> int:
        return round(depth / 100.0 * self.turns)

    def chunks(self, words: int) -> list[str]:
        """The haystack of `words` words cut into `turns` pieces of (nearly) equal words."""
        out = []
        split = words if self.split is None else self.split
        for j in range(self.turns):
            a, b = j * split // self.turns, (j + 1) * split // self.turns
            if j == self.turns - 1:
                b = max(a, words)
            if b <= a:
                out.append("")
                continue
            lo = self.start if a == 0 else self.c.word_ends[self.first_word + a - 1]
            out.append(self.c.text[lo:self.c.word_ends[self.first_word + b - 1]].strip())
        return out

    def make(self, words: int) -> tuple[list[dict[str, str]], list[str]]:
        """(messages, filler chunks); sets facts.turn and facts.pairs."""
        chunks = self.chunks(words)
        f = self.facts
        msgs: list[dict[str, str]] = []
        k = 0
        for g in range(self.turns + 1):
            while k < len(self.depths) and self.gap(self.depths[k]) == g:
                msgs += [{"role": "user", "content": NEEDLE_ASK.format(topic=f.topic)},
                         {"role": "assistant", "content": f.poems[k]}]
                if k == self.asked_at:
                    f.turn = len(msgs) // 2
                k += 1
            if g < self.turns:
                ask = self.last_ask if g == self.turns - 1 else FILLER_ASK
                msgs += [{"role": "user", "content": ask}, {"role": "assistant", "content": chunks[g]}]
        f.pairs = len(msgs) // 2
        msgs.append({"role": "user", "content": QUESTION.format(prefix=f.prefix, ordinal=ordinal(f.index),
                                                                topic=f.topic)})
        msgs[0] = {**msgs[0], "content": self.lead + msgs[0]["content"]}
        return msgs, chunks

    def count(self, messages: list[dict[str, str]]) -> int:
        return self.tok.count_chat(messages)

    def achieved_depth(self, chunks: list[str]) -> float:
        """Filler tokens before the asked poem / all filler tokens, percent."""
        g = self.gap(self.depths[self.asked_at])
        before = self.tok.count_plain("\n".join(chunks[:g])) if g else 0
        after = self.tok.count_plain("\n".join(chunks[g:])) if g < self.turns else 0
        return round(100.0 * before / (before + after), 3) if before + after else float(self.depths[self.asked_at])


def draw_turn_facts(rng: random.Random, needles: int, depth: float) -> tuple[TurnFacts, list[float], int]:
    """The topic, prefix and poems of one trial, the poems' depths (the asked one at `depth`)
    in conversation order and the asked poem's 0-based place; the RNG is used in this fixed
    order. Poems at equal depths keep the asked one first."""
    topic = rng.choice(TOPICS)
    prefix = "".join(rng.choice(PREFIX_CHARS) for _ in range(PREFIX_LEN))
    poems: list[str] = []
    while len(poems) < needles:
        p = draw_poem(rng, topic)
        if p not in poems:
            poems.append(p)
    depths = [float(depth)] + [round(rng.uniform(0, 100), 3) for _ in range(needles - 1)]
    order = sorted(range(needles), key=lambda k: (depths[k], k != 0, k))
    facts = TurnFacts(needles, topic, prefix, index=order.index(0) + 1, poems=[poems[k] for k in order])
    return facts, [depths[k] for k in order], order.index(0)


def _refine(b: _TurnBuilder, length: int, words: int, n: int) -> tuple[int, int]:
    """Where no word count hits `length` (words of two or more tokens; a word moved across a
    turn boundary), keep the fitted cut and try the last filler turn alone a few words
    longer or shorter, with each of LAST_ASKS (nearest first); the closest count is kept."""
    if n == length:
        return words, n
    b.split, best = words, (abs(n - length), n > length, 0, words, 0, n)
    for step in (0, 1, -1, 2, -2, 3, -3):
        w = words + step
        if not 0 <= w <= b.max_words or w < words - words // b.turns:
            continue
        for v, ask in enumerate(LAST_ASKS):
            if step == 0 and v == 0:
                continue
            b.last_ask = ask
            got = b.count(b.make(w)[0])
            best = min(best, (abs(got - length), got > length, abs(step) + v, w, v, got))
            if got == length:
                break
        if best[0] == 0:
            break
    _, _, _, w, v, got = best
    b.last_ask = LAST_ASKS[v]
    if w == words and v == 0:
        b.split = None
    return w, got


def build_turns(tok: Tokenizer, length: int, depth: float, seed: int, needles: int, haystack: str = "prose",
                lead: str = "") -> tuple[Prompt, TurnFacts]:
    """The multi-turn prompt of one trial (module doc) and what it asks. `lead` opens the
    first message, counted in `length` (a cold prompt's nonce)."""
    if not 0 <= depth <= 100:
        raise BadInput(f"depth {depth:g} is outside 0-100")
    if needles < 1:
        raise BadInput(f"--multi-turn needs at least 1 poem (got {needles})")
    rng = random.Random(seed)
    facts, depths, asked = draw_turn_facts(rng, needles, depth)
    c = load_haystack(haystack, "number")
    start = c.sentence_starts[rng.randrange(bisect.bisect_left(c.sentence_starts, c.size))]
    b = _TurnBuilder(tok, c, start, facts, depths, asked, filler_turns(length), lead)
    words, n = _fit(b, tok, length, c)
    words, n = _refine(b, length, words, n)
    messages, chunks = b.make(words)
    key = f"poem about {facts.topic}"
    p = Prompt(mode="chat", content=messages[-1]["content"], needle=Needle(key, facts.expected), seed=seed,
               length=length, depth=depth, tokens=n, tokenizer=tok.spec, iterations=len(b.tried),
               messages=messages, haystack=haystack,
               facts=[Fact(key, poem, d, asked=k == asked) for k, (poem, d) in enumerate(zip(facts.poems, depths))])
    p.distractors = [Needle(key, poem) for k, poem in enumerate(facts.poems) if k != asked]
    p.depth_achieved = b.achieved_depth(chunks)
    return p, facts
