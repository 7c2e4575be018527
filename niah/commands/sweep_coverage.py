"""The `--coverage PRESET` option of `niah sweep` and `niah prompts build`.

`apply_coverage` reads one server's sparse regime and context (niah.commands.sweep_regime),
expands the preset (niah.sweep.coverage) into plain option values, lets every covered
option given on the command line win, prints the expansion (and its notes) on stderr in
one line each before anything runs, and returns the values with the record the run's
manifest keeps: {"preset": "field", "options": {...the concrete values...}, "given": [...]}.
Refused with one line (BadInput, exit 2): an unknown preset, `--matrix` (one server's
regime), `--prompts` (a frozen set fixes the prompts), `--control` (the preset runs
residues, which control trials do not have). A prompt set (`build=True`) holds no cache
state: the preset's states are left out and the line says how to run the set warm.
"""

from __future__ import annotations

from typing import Optional

from niah.errors import BadInput

COVERED = ("lengths", "depths", "trials", "residues", "cache_state")


def _flags(values: dict) -> str:
    return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in values.items() if v is not None)


def counter_keeps_cold(tokenizer: Optional[str], endpoint: str, model: Optional[str], api_key: Optional[str],
                       timeout: float) -> bool:
    """False when the counter the sweep will use sends each prompt first (usage): an explicit
    `usage`, or `auto` against a server without a /tokenize niah reads."""
    spec = (tokenizer or "auto").strip()
    if spec == "usage":
        return False
    if spec != "auto":
        return True
    from niah.tokens import ServerTokenizer

    tok = ServerTokenizer(endpoint=endpoint, model=model, api_key=api_key, timeout_s=min(30.0, timeout))
    try:
        return bool(tok.probe())
    finally:
        tok.close()


def apply_coverage(preset: str, values: dict, given: list[str], *, endpoint: str, model: Optional[str],
                   api_key: Optional[str], timeout: float, geometry: dict, tokenizer: Optional[str],
                   max_tokens: int, matrix=None, prompts=None, control: bool = False, build: bool = False
                   ) -> tuple[tuple, dict]:
    """(the COVERED values, the preset's under the given options; the manifest's coverage record)."""
    import sys

    from niah.commands.sweep_regime import read_topks
    from niah.sweep.coverage import check_preset, field_notes, field_options

    name = check_preset(preset)
    if matrix is not None:
        raise BadInput(f"--coverage {name} reads one server's regime: not with --matrix")
    if prompts is not None:
        raise BadInput(f"--coverage {name} builds its own prompts: a frozen --prompts set fixes them "
                       f"(build the set with niah prompts build --coverage {name})")
    if control:
        raise BadInput(f"--coverage {name} runs residues, which --control trials do not have: not with --control")
    if str(values.get("lengths", "")).strip() == "auto" and "--lengths" in given:
        raise BadInput(f"--coverage {name} picks lengths around the regime: give --lengths as numbers, not auto")
    topks, context = read_topks(None, endpoint, model, api_key, True, timeout, geometry)
    regime = topks.get("default")
    cold = not build and counter_keeps_cold(tokenizer, endpoint, model, api_key, timeout)
    preset_values = field_options(regime, context, max_tokens, cold or build)
    notes = field_notes(regime, context, cold or build)
    if build:
        preset_values.pop("cache_state")
        notes.append("cache states are not part of a prompt set: run it with niah sweep --prompts SET "
                     "--cache-state warm (cold needs a per-trial nonce, which a frozen set cannot hold)")
    flags = {f"--{k.replace('_', '-')}" for k in preset_values}
    out = dict(values)
    for k, v in preset_values.items():
        if f"--{k.replace('_', '-')}" not in given:
            out[k] = v
    concrete = {k: out[k] for k in preset_values}
    over = [g for g in given if g in flags]
    print(f"niah: --coverage {name}: {_flags(concrete)} ({_trials(concrete)} trials)"
          + (f"; given: {', '.join(over)}" if over else ""), file=sys.stderr)
    for line in notes:
        print(f"niah: --coverage {name}: {line}", file=sys.stderr)
    record = {"preset": name, "options": concrete, "given": over}
    return tuple(int(out[k]) if k == "trials" else out[k] for k in COVERED), record


def _trials(v: dict) -> int:
    from niah.sweep.cache_state import parse_cache_states
    from niah.sweep.residues import expand, parse_residues
    from niah.sweep.spec import parse_depths, parse_lengths

    plan = parse_residues(v.get("residues"))
    lengths = parse_lengths(str(v["lengths"]))
    lengths = expand(lengths, plan) if plan is not None else lengths
    states = parse_cache_states(v.get("cache_state")) or [None]
    return len(lengths) * len(parse_depths(str(v["depths"]))) * int(v["trials"]) * len(states)
