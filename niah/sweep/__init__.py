"""The sweep: a spec, targets, the call stage, scoring, and the one orchestrator.

    from niah.sweep import SweepSpec, Target, run_sweep
    run_sweep([Target("http://127.0.0.1:30000/v1")], SweepSpec(lengths=[300], depths=[50]), out)

Modules: spec (SweepSpec, check_spec, parsing the grid), counter (choosing and checking
the token counter), targets (Target, prepare_target), run (the call stage), scoring,
control (no-needle controls), rescore, indexer (the indexer's per-trial summary and
lengths relative to k), progress (what a sweep shows) and orchestrate (the one loop,
niah.sweep.orchestrate.orchestrate, and `run_sweep`).
"""

from niah.sweep.orchestrate import run_sweep
from niah.sweep.run import run_target
from niah.sweep.spec import SweepSpec, check_spec
from niah.sweep.targets import PreparedTarget, Target, prepare_target

__all__ = ["PreparedTarget", "SweepSpec", "Target", "check_spec", "prepare_target", "run_sweep", "run_target"]
