"""From the command line's values to one checked SweepSpec, built and checked in one place.

    spec = make_spec("300,1k", "0,50,100", 3, 0, 32, "chat", None)          # checked (check_spec)
    spec = plan_spec(values, given, endpoint=url, coverage="field")          # presets, auto lengths

`make_spec` parses the grid (niah.sweep.spec), residues and cache states into a SweepSpec
and checks it (`check_spec`): the only check; nothing above it checks the spec again.
`plan_spec` first expands what needs a server: `--coverage PRESET` (`apply_coverage`: the
preset under the options given beside it, printed on stderr, recorded as spec.coverage)
and `--lengths auto` (niah.sweep.server_regime, or a matrix's regimes handed in by the
caller, which also gets one warning line per configuration whose lengths sit at or below
k). `check_choices` refuses option combinations where one option would silently ignore
another (BadInput, exit 2), before any probe. `given` is always the flags set on the
command line (`--needle-key`), never their values.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

from niah.errors import BadInput
from niah.prompts.sets import read_set
from niah.runs.folder import check_resumable
from niah.sweep.cache_state import parse_cache_states
from niah.sweep.coverage import check_preset, field_notes, field_options
from niah.sweep.indexer import length_warnings
from niah.sweep.residues import expand, parse_residues
from niah.sweep.server_regime import pick_auto_lengths, server_regime
from niah.sweep.spec import SweepSpec, check_spec, parse_depths, parse_lengths
from niah.tokens import ServerTokenizer
COVERED = ("lengths", "depths", "trials", "residues", "cache_state")  # what --coverage sets
FIXED_BY_PROMPTS = ("lengths", "depths", "trials", "seed", "mode", "tokenizer", "needles", "needle_key",
                    "needle_value", "values", "queries", "haystack")
MATRIX_OWNS = ("endpoint", "model", "api_key")


def make_spec(lengths, depths, trials, seed, max_tokens, mode, tokenizer, concurrency=1, timeout=600.0,
              retries=3, stream=True, needles=1, needle_key="city", needle_value="number", values=1,
              queries=1, haystack="prose", approximate_lengths=False, prompts=None, control=False, auto=None,
              residues=None, cache_state=None, answer_prefix=None, decode_first=None, multi_turn=None,
              coverage=None) -> SweepSpec:
    """The SweepSpec of these option values, checked (module doc)."""
    asked = (auto if lengths.strip() == "auto" else parse_lengths(lengths)) if prompts is None else [1]
    plan = parse_residues(residues)
    spec = SweepSpec(
        lengths=expand(asked, plan) if plan is not None and prompts is None else asked,
        depths=parse_depths(depths) if prompts is None else [0.0],
        trials=trials, seed=seed, max_tokens=max_tokens, mode=mode, tokenizer=tokenizer,
        concurrency=concurrency, timeout_s=timeout, retries=retries, stream=stream, needles=needles,
        needle_key=needle_key, needle_value=needle_value, values=values, queries=queries, haystack=haystack,
        approximate_lengths=approximate_lengths, prompts=str(prompts) if prompts is not None else None,
        control=control, residues=plan.text() if plan is not None else None,
        cache_states=parse_cache_states(cache_state), answer_prefix=answer_prefix, decode_first=decode_first,
        multi_turn=multi_turn, coverage=coverage,
    )
    check_spec(spec)
    return spec


def check_choices(given: list[str], *, matrix=None, prompts=None, executor: Optional[str] = None,
                  executor_set: tuple = (), dry_run: bool = False, resume: bool = False, out=None) -> None:
    """Options another one makes meaningless are refused, never silently ignored; a --resume
    names a run folder that holds a run (checked before any probe: a mistyped folder is
    refused at once, never started afresh)."""
    def among(names: tuple[str, ...]) -> list[str]:
        return [g for g in given if g[2:].replace("-", "_") in names]

    if matrix is not None and (mine := among(MATRIX_OWNS)):
        raise BadInput(f"--matrix names its own servers: {', '.join(mine)} would be ignored; "
                       "set endpoint, model or api_key_env in the matrix file instead")
    if prompts is not None and (fixed := among(FIXED_BY_PROMPTS)):
        raise BadInput(f"--prompts fixes the prompts: {', '.join(fixed)} would be ignored; "
                       "build another set with niah prompts build")
    if matrix is None and (executor is not None or executor_set):
        raise BadInput("--executor and --executor-set need --matrix")
    if dry_run:
        if matrix is None:
            raise BadInput("--dry-run needs --matrix")
        return
    if resume:
        if out is None:
            raise BadInput("--resume needs --out RUN, the run folder to resume")
        check_resumable(out)


def plan_spec(values: dict, given: list[str], *, endpoint: str, model: Optional[str] = None,
              api_key: Optional[str] = None, coverage: Optional[str] = None, geometry: Optional[dict] = None,
              matrix=None, matrix_regimes: Optional[Callable[[bool], tuple]] = None, build: bool = False
              ) -> SweepSpec:
    """The checked spec of `values` (make_spec's keyword arguments) once --coverage and
    --lengths auto are expanded against the server (module doc). `matrix_regimes(auto)`
    gives a matrix's ({config: Regime or None}, context); `build`: for a prompt set."""
    v, geometry = dict(values), geometry or {}
    timeout, max_tokens = v.get("timeout", 600.0), v.get("max_tokens", 32)
    cov = None
    if coverage is not None:  # the preset's values under the options given beside it
        now = {k: v.get(k) for k in COVERED}
        flags = [f"--{k.replace('_', '-')}" for k in COVERED]  # in COVERED's order, as the record lists them
        covered, cov = apply_coverage(coverage, now, [f for f in flags if f in given], endpoint=endpoint,
                                      model=model, api_key=api_key,
                                      timeout=timeout, geometry=geometry, tokenizer=v.get("tokenizer"),
                                      max_tokens=max_tokens, matrix=matrix, prompts=v.get("prompts"),
                                      control=v.get("control", False), build=build)
        v.update((k, x) for k, x in zip(COVERED, covered) if k in v or x is not None)
    is_auto = str(v["lengths"]).strip() == "auto"
    topks, context = {}, None
    if matrix_regimes is not None:
        if geometry:
            raise BadInput("--index-compression / --index-window are for one endpoint; with --matrix the "
                           "servers say their geometry")
        topks, context = matrix_regimes(is_auto)
    elif is_auto:
        topks, context = server_regime(endpoint, model, api_key, timeout, geometry)
    auto = pick_auto_lengths(topks, context, max_tokens) if is_auto else None
    spec = make_spec(**v, auto=auto, coverage=None if build else cov)
    if auto:
        print(f"niah: --lengths auto: {', '.join(map(str, auto))}", file=sys.stderr)
    if matrix_regimes is not None:
        _say_matrix_lengths(spec, topks)
    return spec


def _say_matrix_lengths(spec: SweepSpec, topks: dict) -> None:
    # a frozen set brings its own lengths (spec.lengths is a placeholder then)
    lengths = spec.lengths if spec.prompts is None else sorted({e.length for e in read_set(spec.prompts)})
    for line in length_warnings(lengths, topks):
        print(f"niah: {line}", file=sys.stderr)


# -- --coverage PRESET ---------------------------------------------------------------------
def counter_keeps_cold(tokenizer: Optional[str], endpoint: str, model: Optional[str], api_key: Optional[str],
                       timeout: float) -> bool:
    """False when the counter the sweep will use sends each prompt first (usage): an explicit
    `usage`, or `auto` against a server without a /tokenize niah reads."""
    spec = (tokenizer or "auto").strip()
    if spec == "usage":
        return False
    if spec != "auto":
        return True
    tok = ServerTokenizer(endpoint=endpoint, model=model, api_key=api_key, timeout_s=min(30.0, timeout))
    try:
        return bool(tok.probe())
    finally:
        tok.close()


def apply_coverage(preset: str, values: dict, given: list[str], *, endpoint: str, model: Optional[str],
                   api_key: Optional[str], timeout: float, geometry: dict, tokenizer: Optional[str],
                   max_tokens: int, matrix=None, prompts=None, control: bool = False, build: bool = False
                   ) -> tuple[tuple, dict]:
    """(the COVERED values: the preset's under the given options; the manifest's coverage
    record {"preset", "options", "given"}). The expansion and its notes go to stderr, one
    line each. Refused (BadInput): an unknown preset, --matrix (one server's regime),
    --prompts (a frozen set fixes the prompts), --control (the preset runs residues). A
    prompt set (`build`) holds no cache state: the preset's states are left out."""
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
    topks, context = server_regime(endpoint, model, api_key, timeout, geometry)
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


def _flags(values: dict) -> str:
    return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in values.items() if v is not None)


def _trials(v: dict) -> int:
    plan = parse_residues(v.get("residues"))
    lengths = parse_lengths(str(v["lengths"]))
    lengths = expand(lengths, plan) if plan is not None else lengths
    states = parse_cache_states(v.get("cache_state")) or [None]
    return len(lengths) * len(parse_depths(str(v["depths"]))) * int(v["trials"]) * len(states)
