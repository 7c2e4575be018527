"""Haystack kinds: the text a needle hides in.

- `prose`: niah/corpus/haystack.txt, plain descriptive prose written for niah (the default);
- `book`: a real novel, Jane Austen's *Pride and Prejudice* (public domain; see
  niah/corpus/SOURCE.md). Real prose is harder than generated prose: a uniform haystack
  turns retrieval into spotting the odd sentence;
- `noise`: RULER's repeated sentences ("The grass is green. The sky is blue. ...");
- `needles`: a haystack made of other key-value facts of the needle's own form;
- `file:PATH`: the user's own UTF-8 text.

Every kind is a `Corpus`: the text twice over (a haystack may wrap around its end), word
ends and sentence starts. The manifest and every trial record which kind was used
(`haystack_info` gives its file and sha256).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from niah.errors import BadInput
from niah.prompts.needles import NeedleKind

KINDS = ("prose", "book", "noise", "needles")
_FILES = {"prose": "corpus/haystack.txt", "book": "corpus/pride-and-prejudice.txt"}
# The bundled texts, found in the package folder above this module (not through `import
# niah`: run from the folder above a checkout named "niah", that name is the checkout, a
# namespace package).
PACKAGE_DIR = Path(__file__).resolve().parent.parent
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NOISE_REPEATS = 12_000  # about 240K tokens
NEEDLE_FACTS = 12_000  # about 200K tokens
NEEDLE_NAMES = tuple(
    "Agatha Alaric Amabel Ambrose Anselm Araminta Barnaby Beatrix Benedict Bertram Blanche Cedric "
    "Clarimond Clement Cordelia Cornelius Cuthbert Desmond Dorothea Drusilla Eadric Edmund Eglantine "
    "Elspeth Erasmus Euphemia Evander Fabian Felicity Florian Gideon Godfrey Griselda Gwendolyn "
    "Hamish Hermione Hilary Horatio Ignatius Imogen Isadora Jasper Jocelyn Leopold Lucinda Magnus "
    "Marigold Matilda Meredith Mortimer Neville Octavia Oswald Peregrine Perpetua Quentin Rosalind "
    "Rupert Sebastian Seraphina Silas Tabitha Tarquin Theodora Tobias Ursula Valentine Wilfred "
    "Winifred Xanthe Yolanda Zachary Zenobia".split()
)


@dataclass
class Corpus:
    text: str  # the corpus twice over, so a haystack may wrap around its end
    size: int  # length of one copy
    word_ends: list[int]  # positions just after each word (before whitespace)
    sentence_starts: list[int]  # positions where a sentence begins
    name: str = "prose"
    words: frozenset = field(default_factory=frozenset)  # lower-cased words of one copy


def check_kind(kind: str) -> None:
    """BadInput for an unknown haystack kind or a missing file, before any network."""
    if kind in KINDS:
        return
    if kind.startswith("file:") and kind[5:]:
        p = Path(kind[5:]).expanduser()
        if not p.is_file():
            raise BadInput(f"--haystack {kind}: no such file")
        return
    raise BadInput(f"unknown --haystack {kind!r}: use {', '.join(KINDS)} or file:PATH")


def _raw(kind: str, value_kind: str) -> str:
    if kind in _FILES:
        return (PACKAGE_DIR / _FILES[kind]).read_text(encoding="utf-8")
    if kind == "noise":
        return "\n".join(NOISE for _ in range(NOISE_REPEATS))
    if kind == "needles":
        return _needle_facts(value_kind)
    path = Path(kind[5:]).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"--haystack {kind}: cannot read it as UTF-8 text ({e})") from None
    if len(text.split()) < 200:
        raise BadInput(f"--haystack {kind}: too short to fill a haystack (under 200 words)")
    return text


def _needle_facts(value_kind: str) -> str:
    """Facts of the needle's own form about names no needle uses (fixed seed: same bytes)."""
    kind = NeedleKind(value="number" if value_kind not in ("uuid", "word") else value_kind)
    rng = random.Random(20261130)
    return " ".join(kind.sentence(rng.choice(NEEDLE_NAMES), kind.draw_value(rng)) for _ in range(NEEDLE_FACTS))


@lru_cache(maxsize=8)
def load_haystack(kind: str = "prose", value_kind: str = "number") -> Corpus:
    """The corpus of one haystack kind (`value_kind` matters only for `needles`)."""
    check_kind(kind)
    raw = _raw(kind, value_kind).strip() + "\n\n"
    text = raw + raw
    word_ends = [m.end() for m in re.finditer(r"\S+", text)]
    # (the bundled prose keeps its original rule: its prompts must not change)
    end = r"[.!?]\s+" if kind == "prose" else r"[.!?][\"')\]]*\s+"
    starts = [0] + [m.end() for m in re.finditer(end, text)]
    words = frozenset(w.lower() for w in re.findall(r"[\w-]+", raw))
    return Corpus(text=text, size=len(raw), word_ends=word_ends, sentence_starts=starts, name=kind, words=words)


def haystack_info(kind: str = "prose", value_kind: str = "number") -> dict:
    """Which filler text prompts are cut from (for the manifest)."""
    c = load_haystack(kind, value_kind)
    one = c.text[: c.size].encode("utf-8")
    info = {"kind": kind, "sha256": hashlib.sha256(one).hexdigest(), "chars": c.size}
    if kind in _FILES:
        info["file"] = "niah/" + _FILES[kind]
    elif kind.startswith("file:"):
        info["file"] = kind[5:]
    return info
