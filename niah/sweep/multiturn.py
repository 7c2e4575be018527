"""`--multi-turn N`: recall of one of N alike needles in a long chat, scored as OpenAI MRCR scores.

    check_multi_turn(spec)                    # BadInput for what cannot be asked (below)
    check_counter(tok)                        # BadInput: a counter that counts one message only
    p, facts = build_turn_prompt(tok, spec, length, depth, seed, lead)   # niah.prompts.turns.build_turns
    set_fields(rec, facts); score_reply(rec, facts, reply)   # the trial's fields and outcome
    rescore(rec)                              # the same score from a stored record

Each trial's prompt is a conversation (niah.prompts.turns) whose earlier turns hold N poems
about one topic among filler turns of haystack prose; the final user message asks for the
i-th poem (1 indexed; i follows from the trial's seed and depth), prefixed by a random
10-character string. Its length stays exact: the whole chat, template included, counts the
requested tokens (a counter that counts messages is needed: the server's /tokenize of
messages or `--tokenizer hf:<model folder>`; SGLang's text-only /tokenize is refused).

Scoring, as MRCR's: the reply (content, else reasoning_content; leading whitespace
dropped) must start with the prefix (`prefix_hit`); the rest, stripped, is compared with
the asked poem by difflib.SequenceMatcher's ratio (`similarity`, also recorded when the
prefix is missing, where MRCR's own score would be 0). A trial is `correct` when the prefix
hit and the similarity is at least `THRESHOLD` (0.9: a poem written back with a word or two
changed still passes; a neighbouring poem, same form and topic, scores about 0.4-0.7).
Otherwise: `error`, `truncated` (finish_reason length), `empty`, `refused` or `wrong`, as
niah.sweep.scoring decides them. Each trial records `multi_turn` (N), `turns` (user/assistant
pairs before the question), `asked_index` (i), `asked_turn` (the asked poem's turn),
`required_prefix`, `prefix_hit` and `similarity`.

Cost: the reply is the prefix and a poem, so max_tokens grows by `REPLY_ROOM`; the prompt
is counted as a whole chat on every fitting step (a handful of /tokenize calls per trial,
as for single-turn prompts). Not with --prompts, --control, --mode completion,
--answer-prefix, --decode-first or a needle kind other than the default (the poems are
the needles); N outside 1-`MAX_NEEDLES` is refused. Needle-span and indexer-probe request
extensions are not sent (the needle is not in the last message).
"""

from __future__ import annotations

import difflib

from niah.errors import BadInput, ServerError
from niah.prompts.turns import FOUND_SIMILARITY, TurnFacts, build_turns
from niah.sweep.scoring import miss, scored_text

MULTI_TURN_HELP = ("MRCR-style recall: the prompt (its length still exact) is a chat whose earlier turns hold N "
                   "alike poems among haystack turns; the last message asks for the i-th, prefixed by a random "
                   "string; scored by prefix and similarity (>= 0.9). Recorded per trial (multi_turn, asked_index, "
                   "prefix_hit, similarity); the report has a section.")
MAX_NEEDLES = 64
THRESHOLD = FOUND_SIMILARITY
REPLY_ROOM = 96  # tokens added to max_tokens: a 10-character prefix and a four-line poem
FIELDS = ("multi_turn", "turns", "asked_index", "asked_turn", "required_prefix", "prefix_hit", "similarity")


def check_multi_turn(spec) -> None:
    """BadInput for an N that cannot be asked, or options it cannot go with (module doc)."""
    n = getattr(spec, "multi_turn", None)
    if n is None:
        return
    if not 1 <= int(n) <= MAX_NEEDLES:
        raise BadInput(f"--multi-turn must be 1-{MAX_NEEDLES} poems (got {n})")
    clash = [name for name, on in (("--prompts", spec.prompts is not None), ("--control", spec.control),
                                   ("--mode completion", spec.mode != "chat"),
                                   ("--answer-prefix", spec.answer_prefix is not None),
                                   ("--decode-first", spec.decode_first is not None),
                                   ("a needle kind option", not spec.kind.default)) if on]
    if clash:
        raise BadInput(f"--multi-turn builds its own chat prompts and scoring: not with {', '.join(clash)}")


def check_counter(tok) -> None:
    """BadInput when `tok` cannot count a chat of several messages (one try, before any trial)."""
    probe = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi."},
             {"role": "user", "content": "Bye."}]
    try:
        tok.count_chat(probe)
    except ServerError as e:
        raise BadInput(f"--multi-turn counts whole chats and the counter {tok.spec} cannot ({e}); pass "
                       "--tokenizer hf:<model folder>") from None


def max_tokens(spec_max_tokens: int) -> int:
    """The request's max_tokens: the sweep's, plus room for the prefix and the poem."""
    return spec_max_tokens + REPLY_ROOM


def build_turn_prompt(tok, spec, length: int, depth: float, seed: int, lead: str = ""):
    """(niah.prompts.builder.Prompt, TurnFacts) of one trial."""
    return build_turns(tok, length, depth, seed, int(spec.multi_turn), spec.haystack, lead)


def set_fields(rec, facts: TurnFacts) -> None:
    """The trial's fields that do not depend on the reply."""
    rec.multi_turn, rec.turns, rec.asked_index = facts.needles, facts.pairs, facts.index
    rec.asked_turn, rec.required_prefix = facts.turn, facts.prefix


def similarity_of(prefix: str, expected: str, text: str | None) -> tuple[bool, float]:
    """(prefix hit, similarity of the rest to `expected`) of a reply text."""
    text = (text or "").lstrip()
    hit = text.startswith(prefix)
    rest = (text[len(prefix):] if hit else text).strip()
    return hit, round(difflib.SequenceMatcher(None, rest, expected.strip()).ratio(), 4)


def outcome(hit: bool, similarity: float, text: str, finish_reason: str | None, error: str | None) -> str:
    """One outcome of niah.runs.record.OUTCOMES (module doc)."""
    if error:
        return "error"
    if hit and similarity >= THRESHOLD:
        return "correct"
    return miss(text, finish_reason)


def _score(prefix: str, expected: str, answer, reasoning, finish_reason, error) -> dict:
    text = scored_text(answer, reasoning)
    if error:
        return {"outcome": "error", "prefix_hit": None, "similarity": None}
    hit, sim = similarity_of(prefix, expected, text)
    return {"outcome": outcome(hit, sim, text, finish_reason, error), "prefix_hit": hit, "similarity": sim}


def score_reply(rec, facts: TurnFacts, reply) -> None:
    """Score one reply into the trial record (outcome, prefix_hit, similarity; hits)."""
    got = _score(facts.prefix, facts.expected, reply.answer, reply.reasoning, reply.finish_reason,
                 reply.error)
    rec.outcome, rec.prefix_hit, rec.similarity = got["outcome"], got["prefix_hit"], got["similarity"]
    rec.hits = [rec.outcome == "correct"]
    rec.recall_share = float(rec.outcome == "correct")


def rescore(rec: dict) -> dict:
    """A stored multi-turn record scored again (its prefix and poem are in the record)."""
    if not rec.get("required_prefix") or not rec.get("needle"):
        return dict(rec)
    got = _score(rec["required_prefix"], rec["needle"], rec.get("answer"), rec.get("reasoning"),
                 rec.get("finish_reason"), rec.get("error"))
    correct = got["outcome"] == "correct"
    return {**rec, **got, "correct": correct, "hits": [correct], "recall_share": float(correct)}
