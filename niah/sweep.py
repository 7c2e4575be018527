"""Sweep orchestration: ask every (length, depth, trial) of one or more targets, store each.

Library API:

    spec = SweepSpec(lengths=[300, 4000], depths=[0, 50, 100], trials=3)
    run_sweep([Target("http://127.0.0.1:30000/v1")], spec, Path("results/run"))

The stages live in their own modules and are importable from here too: niah.targets
(Target, prepare_target), niah.run (run_target, pending_trials), niah.runfolder
(start_run, record_config, check_same_tokenizers); serving.matrix_run uses the same ones.

Every trial's prompt depends only on (seed, length, depth, trial) and the tokenizer, so
every configuration answers identical prompts (`prompt_sha256` pairs them).
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

from niah.errors import BadInput
from niah.needles import NeedleKind
from niah.run import DeadFn, pending_trials, run_target  # noqa: F401 (public names)
from niah.runfolder import check_same_tokenizers, record_config, start_run  # noqa: F401
from niah.store import read_manifest
from niah.targets import PreparedTarget, Target, prepare_target  # noqa: F401
from niah.usage import length_tolerance  # noqa: F401 (public name)


@dataclass
class SweepSpec:
    """What to ask; identical for every configuration."""

    lengths: list[int]
    depths: list[float]
    trials: int = 3
    seed: int = 0
    max_tokens: int = 32
    mode: str = "chat"  # chat | completion
    tokenizer: str | None = None  # None = auto (server /tokenize, else usage), checked
    concurrency: int = 1
    timeout_s: float = 600.0
    retries: int = 3
    stream: bool = True
    needles: int = 1  # keys in each haystack; the question asks for the one at `depth`
    needle_key: str = "city"  # city | word
    needle_value: str = "number"  # number | uuid | word
    values: int = 1  # values per key (all asked)
    queries: int = 1  # keys asked at once
    haystack: str = "prose"  # prose | book | noise | needles | file:PATH
    approximate_lengths: bool = False  # run even when the counter is not exact
    prompts: str | None = None  # a frozen prompt set (niah prompts build) to run
    control: bool = False  # add one no-needle control trial per (length, depth) cell

    @property
    def kind(self) -> NeedleKind:
        return NeedleKind(key=self.needle_key, value=self.needle_value, values=self.values,
                          keys=self.needles, queries=self.queries)


# -- checking the spec ------------------------------------------------------------------------
def check_spec(spec: SweepSpec) -> None:
    """Reject an impossible spec (BadInput), before any network."""
    from niah.haystacks import check_kind
    from niah.tokenize import check_tokenizer_spec

    if spec.trials < 1:
        raise BadInput(f"--trials must be at least 1 (got {spec.trials})")
    if not spec.lengths:
        raise BadInput("no lengths given")
    if not spec.depths:
        raise BadInput("no depths given")
    for length in spec.lengths:
        if int(length) < 1:
            raise BadInput(f"length {length} must be at least 1 token")
    for d in spec.depths:
        if not 0 <= float(d) <= 100:
            raise BadInput(f"depth {d:g} is outside 0-100 (depths are percentages)")
    if spec.mode not in ("chat", "completion"):
        raise BadInput(f"unknown --mode {spec.mode!r}: use chat or completion")
    if spec.max_tokens < 1:
        raise BadInput(f"--max-tokens must be at least 1 (got {spec.max_tokens})")
    spec.kind.check()
    check_kind(spec.haystack)
    if spec.concurrency < 1:
        raise BadInput(f"--concurrency must be at least 1 (got {spec.concurrency})")
    if spec.retries < 0:
        raise BadInput(f"--retries must be 0 or more (got {spec.retries})")
    if not spec.timeout_s > 0:
        raise BadInput(f"--timeout must be positive (got {spec.timeout_s})")
    check_tokenizer_spec(spec.tokenizer)
    if spec.control and (not spec.kind.default or spec.prompts is not None):
        raise BadInput("--control works with the default needle kind, on prompts it builds "
                       "(not with --needle-key/--needle-value/--values/--queries or --prompts)")


def run_sweep(
    targets: list[Target],
    spec: SweepSpec,
    out: Path,
    resume: bool = False,
    concurrent: bool = False,
    progress=None,
    force_config: bool = False,
) -> Path:
    """Run a whole sweep into one run folder; returns the folder.

    Every target is probed first (so bad input fails before any trial); then targets run
    one after another, or all at once with `concurrent=True`. With spec.prompts the
    frozen set is run instead of building prompts.
    """
    check_spec(spec)
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise BadInput(f"configuration names must be unique: {names}")
    out = Path(out)
    prompt_set = load_prompt_set(spec)
    # Probe every target before touching the run folder: bad input changes nothing.
    prepared = [prepare_target(t, spec, prompt_set) for t in targets]
    if resume and (out / "manifest.json").exists():
        check_same_tokenizers(read_manifest(out), prepared, force_config)
    from niah.indexer import length_warnings

    for line in length_warnings(spec.lengths, {p.target.name: p.index_topk for p in prepared}):
        print(f"niah: {line}", file=sys.stderr)
    store = start_run(out, spec, resume)
    try:
        for p in prepared:
            record_config(out, p.target.name, p.info)

        async def main() -> None:
            if concurrent:
                await asyncio.gather(*(run_target(p, spec, store, progress) for p in prepared))
            else:
                for p in prepared:
                    await run_target(p, spec, store, progress)

        from niah.attestation import begin_segment, end_segment, read_target, say_state

        # What each server's indexer ran, read before and after its trials (niah/attestation.py).
        began = [p for p in prepared if pending_trials(p.target.name, spec, store.done)]
        for p in began:
            begin_segment(out, p.target.name, read_target(p))
        try:
            if progress is not None:
                with progress:
                    asyncio.run(main())
            else:
                asyncio.run(main())
        finally:
            for p in prepared:
                if p.tokenizer is not None and hasattr(p.tokenizer, "cost"):
                    record_config(out, p.target.name, {"tokenizer_cost": p.tokenizer.cost})
            for p in began:
                state, reason = end_segment(out, p.target.name, read_target(p))
                say_state(p.target.name, state, reason, lambda m: print(f"niah: {m}", file=sys.stderr))
    finally:
        store.close()
    return out


def load_prompt_set(spec: SweepSpec):
    """The frozen set of spec.prompts (its grid becomes the spec's), or None."""
    if spec.prompts is None:
        return None
    from niah.promptset import SetIndex, read_set

    index = SetIndex(read_set(spec.prompts), spec.prompts)
    spec.lengths, spec.depths, spec.trials, spec.mode = index.lengths, index.depths, index.trials, index.mode
    return index
