"""Coverage presets: a small, fixed budget of trials spread over the field's failure axes.

    field_options(Regime(512, 4, 128), context=9000, max_tokens=32, cold=True)
    # {"lengths": "1088,2168,2184,4360,8720", "residues": "mod4", "depths": "10,50,90",
    #  "trials": "1", "cache_state": "cold,warm"}

The one preset, `field`, is (every value a plain command-line option, so a run can be
repeated without the preset):

- lengths: half the regime's scale (`compression * k + window`), the last residue block
  wholly below where selection starts (`Regime.first_sparse`), the first block wholly at or
  above it, then 2x, 4x, 8x ... the first sparse length, each while it fits under the
  ceiling: the smaller of FIELD_CEILING tokens and the model's context less max_tokens and
  one residue block; none shorter than FIELD_FLOOR (256) tokens, so a small k (128) loses
  its dense side and the notes say so. No regime (a dense server, or none reported): 1k, 2k, 4k, ... up to
  that ceiling. An unknown context: the ceiling is 4x the first sparse length (16k dense).
- residues: every residue mod 4 of each length (niah.sweep.residues);
- depths: 10, 50, 90 percent; trials: 1 per cell;
- cache states: cold and warm (niah.sweep.cache_state); warm only where the counter
  cannot keep a prompt cold (`cold=False`: it sends every prompt before its trial).

`field_notes` gives the one-line notes the command prints beside the expansion (what was
dropped and why). Pure functions; BadInput on an unknown preset name.
"""

from __future__ import annotations

from niah.errors import BadInput
from niah.regime import Regime

PRESETS = ("field",)
FIELD_CEILING = 32768
FIELD_FLOOR = 256  # shorter prompts do not hold the needle, the question and the template
FIELD_MODULUS = 4
FIELD_DEPTHS = "10,50,90"
FIELD_TRIALS = 1
COVERAGE_HELP = ("field: a small budget over the field's failure axes: lengths on both sides of where selection "
                 "starts (the server's index geometry) doubling up to 32k or the context, every residue mod 4, "
                 "depths 10,50,90, 1 trial, cache states cold and warm. The expansion is printed and recorded "
                 "in the manifest; options given beside it win.")


def check_preset(name: str) -> str:
    """The preset's canonical name; BadInput for an unknown one."""
    key = str(name).strip().lower()
    if key not in PRESETS:
        raise BadInput(f"unknown --coverage {name!r}: use {', '.join(PRESETS)}")
    return key


def ceiling(regime: Regime | None, context: int | None, max_tokens: int) -> int:
    """The longest length the preset asks for (module doc)."""
    if not context:
        return 4 * regime.first_sparse if regime else 16384
    return min(FIELD_CEILING, int(context) - int(max_tokens) - FIELD_MODULUS)


def field_lengths(regime: Regime | None, context: int | None, max_tokens: int) -> list[int]:
    """The preset's asked lengths (each the start of a residue block)."""
    top, m = ceiling(regime, context, max_tokens), FIELD_MODULUS
    if regime is None:
        out, n = [], 1024
        while n <= top:
            out.append(n)
            n *= 2
        return out
    f = regime.first_sparse
    below = (f - m) // m * m                    # its block's last length (below + m - 1) < f
    above = -(-f // m) * m                      # its block's first length >= f
    out = [max(m, regime.scale // 2 // m * m), below, above]
    n = 2 * f
    while n <= top:
        out.append(n // m * m)
        n *= 2
    return sorted({x for x in out if FIELD_FLOOR <= x <= top})


def field_options(regime: Regime | None, context: int | None, max_tokens: int, cold: bool) -> dict[str, str]:
    """The preset as command-line option values, by the sweep's parameter names."""
    lengths = field_lengths(regime, context, max_tokens)
    if not lengths:
        raise BadInput(f"--coverage field: no length fits the model's context ({context} tokens)")
    return {"lengths": ",".join(map(str, lengths)), "residues": f"mod{FIELD_MODULUS}", "depths": FIELD_DEPTHS,
            "trials": str(FIELD_TRIALS), "cache_state": "cold,warm" if cold else "warm"}


def field_notes(regime: Regime | None, context: int | None, cold: bool) -> list[str]:
    """One line per thing the preset could not cover as documented."""
    notes = []
    if regime is None:
        notes.append("no sparse regime reported (no index_topk): lengths double from 1k, not around k")
    else:
        notes.append(f"selection starts at {regime.first_sparse:,} tokens ({regime.words()})")
        if regime.first_sparse - FIELD_MODULUS < FIELD_FLOOR:
            notes.append(f"no length below where selection starts: a prompt under {FIELD_FLOOR} tokens does not "
                         "hold the needle and the question")
    if not context:
        notes.append("the server reports no max_model_len: lengths stop at 4x where selection starts")
    if not cold:
        notes.append("cold is left out: the token counter sends every prompt before its trial (it would be "
                     "warm); cache state warm only")
    return notes
