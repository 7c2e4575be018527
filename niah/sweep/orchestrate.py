"""One way to run targets into a run folder: `orchestrate`, used by the plain sweep and the matrix.

    spec = SweepSpec(lengths=[300, 4000], depths=[0, 50, 100], trials=3)
    run_sweep([Target("http://127.0.0.1:30000/v1")], spec, Path("results/run"))

Every driver (`run_sweep` here, niah.serving.matrix's local and spread runs) plans the same
way: `plan_set(spec)` checks the spec and loads its frozen set, the driver checks its
targets, then it opens one niah.runs.run.Run (the folder's checks, lock, manifest and
trials; closed however the sweep ends) and hands its prepared targets to `orchestrate`.

`orchestrate(prepared, spec, run)` is the loop every configuration goes through: for
each prepared target with trials left, read its server's attestation (begin segment),
run its trials (niah.sweep.run), record its counter's cost, read the attestation again
(end segment) and say when the configuration is not valid. A start reading that
contradicts a configuration's label (or a server that came back different on --resume)
is refused (BadInput) before any trial is asked. A configuration whose last segment has no
end reading (niah was killed) gets a segment even with no trial left, so the new start
reading closes the old one (niah.attestation.rules). The readings are judged by
niah.attestation (pure) and written through the Run (niah.runs.manifest). `run_sweep` is the plain
sweep over endpoints someone else runs; niah.serving.matrix starts a server per
configuration (a Target with a lifecycle) and calls `orchestrate` for it.

Every trial's prompt depends only on (seed, length, depth, trial) and the tokenizer, so
every configuration answers identical prompts (`prompt_sha256` pairs them).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Callable

from niah.attestation import begin_segment, end_segment, open_segment, read_server, say_state, start_contradiction
from niah.errors import BadInput
from niah.prompts.sets import SetIndex, load_set
from niah.runs.folder import check_same_tokenizers
from niah.runs.manifest import MANIFEST, read_manifest
from niah.runs.run import Run
from niah.sweep.indexer import length_warnings
from niah.sweep.interrupt import run_async
from niah.sweep.run import pending_trials, run_target
from niah.sweep.spec import SweepSpec, check_spec
from niah.sweep.targets import PreparedTarget, Target, prepare_target


def say(msg: str) -> None:
    """A line for the person running the sweep (stderr, `niah: ` first)."""
    print(f"niah: {msg}", file=sys.stderr, flush=True)


def read_target(prepared: PreparedTarget, timeout: float = 10.0) -> dict:
    """A READING (niah.attestation.readings) of a prepared target's server, its requests
    bounded by `timeout` (the sweep's --timeout where smaller than 10 s); a launched one
    that died is not asked."""
    life = prepared.target.lifecycle
    cause = life.dead() if life is not None else None
    if cause:
        return {"error": f"the server died before it was asked: {cause}"}
    return read_server(prepared.endpoint, prepared.target.api_key, timeout)


def orchestrate(prepared: list[PreparedTarget], spec: SweepSpec, run: Run, progress=None, concurrent: bool = False,
                live: bool = False, tell: Callable[[str], None] = say) -> None:
    """Begin segment -> run -> record -> end segment for every prepared target (module doc).

    Targets run one after another, or all at once with `concurrent`. `progress` (a
    niah.sweep.progress.SweepProgress) is shown while they run when `live` (else the
    caller shows it). The end segment is read however the run ends (an error, Ctrl-C)."""
    configs = run.configs()
    began = [p for p in prepared if pending_trials(p.target.name, spec, run.done)
             or open_segment(configs.get(p.target.name) or {})]
    refused = []
    for p in began:
        reading = read_target(p, min(10.0, spec.timeout_s))
        entry = run.update_config(p.target.name, lambda entry: begin_segment(entry, reading))
        bad = start_contradiction(entry)
        if bad:
            refused.append(f"{p.target.name}: {bad}")
    if refused:  # the server is not what its label says: not one trial is asked of it
        for p in began:
            reading = read_target(p, min(10.0, spec.timeout_s))
            run.update_config(p.target.name, lambda entry: end_segment(entry, reading))
        raise BadInput(f"refusing to sweep: {refused[0]}")

    async def main() -> None:
        if concurrent:
            await asyncio.gather(*(run_target(p, spec, run, progress) for p in prepared))
        else:
            for p in prepared:
                await run_target(p, spec, run, progress)

    try:
        with progress if live and progress is not None else contextlib.nullcontext():
            run_async(main())
    finally:
        for p in prepared:
            if hasattr(p.tokenizer, "cost"):
                run.record_config(p.target.name, {"tokenizer_cost": p.tokenizer.cost})
        for p in began:
            reading = read_target(p, min(10.0, spec.timeout_s))
            entry = run.update_config(p.target.name, lambda entry: end_segment(entry, reading))
            verdict = entry["attestation_verdict"]
            say_state(p.target.name, verdict["state"], verdict["reason"], tell)


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
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise BadInput(f"configuration names must be unique: {names}")
    out = Path(out)
    prompt_set = plan_set(spec)
    # Probe every target before touching the run folder: bad input changes nothing.
    prepared = [prepare_target(t, spec, prompt_set) for t in targets]

    def same_servers(folder: Path) -> None:
        if resume and (folder / MANIFEST).exists():
            check_same_tokenizers(read_manifest(folder), prepared, force_config)

    for line in length_warnings(spec.lengths, {p.target.name: p.regime for p in prepared}):
        print(f"niah: {line}", file=sys.stderr)
    with Run.open(out, spec, resume, prompt_set, checks=[same_servers]) as run:
        for p in prepared:
            run.record_config(p.target.name, p.info)
        orchestrate(prepared, spec, run, progress, concurrent, live=True)
    return out


def plan_set(spec: SweepSpec) -> SetIndex | None:
    """What every driver does first: check the spec (BadInput) and load its frozen set
    (`load_prompt_set`)."""
    check_spec(spec)
    return load_prompt_set(spec)


def load_prompt_set(spec: SweepSpec) -> SetIndex | None:
    """The frozen set of spec.prompts (its grid, mode and base seed become the spec's), or None."""
    if spec.prompts is None:
        return None
    index = load_set(spec.prompts)
    spec.lengths, spec.depths, spec.trials, spec.mode = index.lengths, index.depths, index.trials, index.mode
    if index.base_seeds and len(index.base_seeds) == 1:
        spec.seed = index.base_seeds[0]
    return index
