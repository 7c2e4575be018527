"""The length-residue axis: exact lengths at chosen residues around each asked length.

    r = parse_residues("mod4")          # Residues(modulus=4, values=(0, 1, 2, 3))
    parse_residues("4:0,3")             # Residues(4, (0, 3))
    expand([1000, 4001], r)             # [1000, 1001, 1002, 1003, 4000, 4001, 4002, 4003]

Each asked length L gives, per residue v, the length of its block (L rounded down to a
multiple of the modulus, `block`) plus v. Every length of one block shares the block's
trial seed (niah.sweep.run): the same needle,
the same haystack start, only the trailing filler differs, so the residue is the one
thing that changes between them, and the builder's token counts for that seed are
reused from one residue to the next (niah.prompts.builder's `counts`). Asked lengths in
one block give that block once. A modulus outside 2-64 and residues outside
0..modulus-1 are refused (BadInput). The trial records the residue its prompt was
counted at (the builder's count can miss the asked length by a token where no haystack
cut hits it; the record says so rather than relabel).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from niah.errors import BadInput

_MOD = re.compile(r"^\s*mod\s*(\d+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Residues:
    modulus: int
    values: tuple[int, ...]

    def text(self) -> str:
        """The canonical spelling recorded in the manifest: "4:0,1,2,3"."""
        return f"{self.modulus}:{','.join(map(str, self.values))}"


def parse_residues(text: str | None) -> Residues | None:
    """`modM` (every residue 0..M-1) or `M:v,v,...`; None for None or empty."""
    if text is None or not str(text).strip():
        return None
    text = str(text).strip()
    if m := _MOD.match(text):
        modulus, values = int(m.group(1)), None
    else:
        mod, sep, rest = text.partition(":")
        try:
            modulus = int(mod)
            values = [int(v) for v in rest.split(",") if v.strip()]
        except ValueError:
            modulus, values = 0, []
        if not sep or not values:
            raise BadInput(f"bad --residues {text!r}: expected modM (e.g. mod4) or M:v,v (e.g. 4:0,1,2,3)")
    if not 2 <= modulus <= 64:
        raise BadInput(f"bad --residues {text!r}: the modulus must be 2-64")
    values = list(range(modulus)) if values is None else values
    if any(not 0 <= v < modulus for v in values) or len(set(values)) != len(values):
        raise BadInput(f"bad --residues {text!r}: residues must be distinct, 0..{modulus - 1}")
    return Residues(modulus, tuple(sorted(values)))


def expand(lengths: list[int], residues: Residues) -> list[int]:
    """The exact lengths of every asked length's block (module doc), sorted."""
    out = {block(int(L), residues.modulus) + v for L in lengths for v in residues.values}
    if min(out) < 1:
        raise BadInput(f"--residues {residues.text()}: length {min(out)} is not a length; ask longer lengths")
    return sorted(out)


def block(length: int, modulus: int) -> int:
    """The block start a length belongs to: the length rounded down to a multiple of the
    modulus (its `base_length`; every length of a block shares its seed)."""
    return length - length % modulus
