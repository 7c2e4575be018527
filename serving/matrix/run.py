"""Run a configuration matrix: every configuration on identical prompts, one run folder.

Each configuration is a niah.sweep.Target run through the same
niah.sweep.orchestrate.orchestrate as a plain sweep (begin segment -> run -> record ->
end segment); a launched one has a lifecycle (serving/launch.py's ServerProcess: start,
dead, describe, stop) that this module starts before and stops after.

External endpoints are swept first, concurrently; then each launched configuration in
turn: start its server (serving/launch.py), probe it, sweep it with `dead()` watching the
process, stop it. A configuration that fails to start, or whose server dies, gets its
remaining trials written as `error` with the cause from the server's log, and the next
configuration runs. Ctrl-C / SIGTERM stop the running server; finished trials stay.
The run folder is one niah.runs.run.Run (`open_matrix_run`, shared with the spread
coordinator: the spec checked, the matrix's secrets remembered, a changed configuration
refused on --resume, then the folder's lock, manifest and trials); the matrix itself (file,
commands, differences, arms) is recorded in its manifest.
Before anything starts, each launched configuration's engine is asked whether this machine
can serve it (`preflight`; e.g. SGLang's fp4 arm, where SGLang refuses
`--enable-deepseek-v4-fp4-indexer` on SM90): the run stops there with the engine's reason.
"""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path
from typing import Iterable

from niah.attestation import open_segment
from niah.errors import BadInput, LengthDrift, ServerError
from niah.redact import redact_settings, redact_text, remember_from, remember_secret
from niah.prompts.needles import trial_seed
from niah.runs.manifest import MANIFEST, read_manifest
from niah.runs.record import error_record
from niah.runs.run import Check, Run
from niah.serving.launch import ServerProcess
from niah.serving.matrix.commands import arm_of, axis_differences, matrix_commands, server_command
from niah.serving.matrix.parse import Matrix, MatrixConfig
from niah.sweep import SweepSpec, Target, prepare_target
from niah.sweep.interrupt import terminate_as_interrupt
from niah.sweep.orchestrate import orchestrate, plan_set, say
from niah.sweep.run import pending_trials
from niah.sweep.residues import block, parse_residues


def record_errors(run: Run, cfg: MatrixConfig, spec: SweepSpec, error: str) -> int:
    """Write every pending trial of `cfg` as an error (niah.runs.record), each in its cache
    state and with the seed its trial would have had (a residue block's); returns how many."""
    todo = pending_trials(cfg.name, spec, run.done)
    residues = parse_residues(spec.residues)
    for length, depth, trial, state in todo:
        base = length if residues is None else block(length, residues.modulus)
        seed = trial_seed(spec.seed, base, depth, trial)
        run.append(error_record(cfg.name, cfg.settings.get("model"), length, depth, trial, seed, error,
                                  cache_state=state))
    return len(todo)


def _target(cfg: MatrixConfig, endpoint: str, lifecycle=None) -> Target:
    """The configuration as a niah.sweep.Target (a launched one carries its server)."""
    key_env = cfg.settings.get("api_key_env")
    api_key = os.environ.get(key_env) if key_env else None
    if key_env and not api_key:
        raise BadInput(f"{cfg.name}: api_key_env {key_env} is not set in the environment")
    remember_secret(api_key)  # whatever its variable's name, it is masked in all niah records
    return Target(endpoint=endpoint, model=cfg.settings.get("model"), name=cfg.name,
                  engine=cfg.engine, axes=dict(cfg.axes), api_key=api_key, lifecycle=lifecycle)


def remember_secrets(matrix: Matrix) -> None:
    """Every token the matrix holds or names (a command's `--api-key`, a secret-named env
    variable, api_key_env's value) is masked in whatever this sweep records (niah.redact)."""
    for cfg in matrix.configs:
        remember_secret(os.environ.get(cfg.settings.get("api_key_env") or ""))
        remember_from([*(cfg.settings.get("command") or []), *(cfg.settings.get("args") or [])], cfg.env)


def manifest_matrix(run: Run, matrix: Matrix) -> None:
    """Record the matrix (its text, commands, per-axis differences, arms) in the manifest."""
    try:
        text = redact_text(matrix.path.read_text(encoding="utf-8"))
    except OSError:
        text = None
    record = {"path": str(matrix.path), "text": text, "configs": matrix.names(),
              "commands": {cfg.name: line for cfg, line in matrix_commands(matrix)},
              "differences": axis_differences(matrix),
              "arms": {cfg.name: arm for cfg in matrix.configs if (arm := arm_of(cfg))}}
    run.change_manifest(lambda manifest: manifest.update(matrix=record))


def _check_unchanged(out: Path, matrix: Matrix) -> None:
    """--resume must not mix two different servers under one configuration name."""
    if not (out / MANIFEST).exists():
        return
    old = read_manifest(out).get("configs", {})
    for cfg in matrix.configs:
        before = old.get(cfg.name, {})
        if "settings" in before and ((before["settings"], before.get("engine"))
                                     != (_jsonable(redact_settings(cfg.settings)), cfg.engine)):
            raise BadInput(
                f"{matrix.path}:{cfg.line}: configuration {cfg.name!r} differs from the one in {out} "
                f"(was {before.get('engine')} {before['settings']}); rename it or use another --out"
            )


def _jsonable(v):
    return json.loads(json.dumps(v))


def sweep_matrix(matrix: Matrix, spec: SweepSpec, out: Path, resume: bool = False, progress=None,
                 force_config: bool = False) -> Path:
    """Sweep every configuration of a loaded `matrix` into `out`; returns `out`."""
    check_platform(matrix)
    out = Path(out)
    with open_matrix_run(matrix, spec, out, resume, force_config) as run:
        local = _MatrixRun(spec, run, progress, force_config)
        with terminate_as_interrupt():
            if progress is not None:
                with progress:
                    local.all(matrix)
            else:
                local.all(matrix)
    return out


def open_matrix_run(matrix: Matrix, spec: SweepSpec, out: Path, resume: bool, force_config: bool,
                    checks: Iterable[Check] = ()) -> Run:
    """The matrix's Run (niah.runs.run), for a local or a spread matrix: the spec checked and
    its set loaded, every secret the matrix names remembered before anything is compared with
    or written to the folder, a resumed configuration refused when it changed (unless
    `force_config`), then `checks`; the matrix recorded in the manifest."""
    prompt_set = plan_set(spec)
    remember_secrets(matrix)
    unchanged = [] if not resume or force_config else [partial(_check_unchanged, matrix=matrix)]
    run = Run.open(out, spec, resume, prompt_set, checks=[*unchanged, *checks])
    try:
        manifest_matrix(run, matrix)
    except BaseException:
        run.close()
        raise
    return run


def check_platform(matrix: Matrix) -> None:
    """Each engine's refusal of a configuration on this machine (e.g. SGLang's fp4 arm where
    SGLang refuses its flag), before any server starts (BadInput naming the configuration)."""
    for cfg in matrix.configs:
        problem = cfg.kind.preflight(cfg) if cfg.launched else None
        if problem:
            raise BadInput(f"{cfg.name} (line {cfg.line}): {problem}")


class _MatrixRun:
    def __init__(self, spec: SweepSpec, run: Run, progress, force: bool):
        self.spec, self.run, self.progress, self.force = spec, run, progress, force

    def all(self, matrix: Matrix) -> None:
        externals = [c for c in matrix.configs if not c.launched]
        launched = [c for c in matrix.configs if c.launched]
        if externals:
            self.externals(externals)
        for i, cfg in enumerate(launched, start=1):
            _run_launched(cfg, f"[{i}/{len(launched)}]", self)

    def prepare(self, cfg: MatrixConfig, endpoint: str, lifecycle=None):
        p = prepare_target(_target(cfg, endpoint, lifecycle), self.spec, self.run.prompt_set)
        self.run.check_tokenizers([p], self.force)
        return p

    def externals(self, configs: list[MatrixConfig]) -> None:
        """Endpoints someone else runs: probe all (bad input fails before any trial), then
        sweep them concurrently."""
        prepared = []
        for cfg in configs:
            p = self.prepare(cfg, cfg.settings["endpoint"])
            self.run.record_config(cfg.name, {**p.info, "settings": redact_settings(cfg.settings)})
            prepared.append(p)
            say(f"{cfg.name}: external endpoint {p.endpoint}, model {p.model}")
        orchestrate(prepared, self.spec, self.run, self.progress, concurrent=True)


def _start(cfg: MatrixConfig, tag: str, local: _MatrixRun, srv: ServerProcess, base: dict) -> bool:
    """Start the server; on failure record its trials as errors and say so (False)."""
    try:
        srv.start()
    except ServerError as e:
        cause = srv.failure or str(e).splitlines()[0]
        say(f"{tag} {e}")
        n = record_errors(local.run, cfg, local.spec, f"server failed to start: {cause}")
        local.run.record_config(cfg.name, {**base, **srv.describe(), "status": "failed to start", "cause": cause})
        say(f"{tag} {cfg.name}: {n} trials recorded as errors; going on")
        return False
    return True


def _run_launched(cfg: MatrixConfig, tag: str, local: _MatrixRun) -> None:
    """Start one server, sweep it, stop it. Never lets its failure stop the matrix;
    BadInput (a spec the model cannot serve), a length drift and Ctrl-C do stop it."""
    spec, run = local.spec, local.run
    todo = pending_trials(cfg.name, spec, run.done)
    unclosed = open_segment(run.configs().get(cfg.name) or {})
    if not todo and not unclosed:
        say(f"{tag} {cfg.name}: every trial is already in the run folder; not started")
        return
    log = run.log_path(cfg.name)
    srv = ServerProcess(
        cfg.name, partial(server_command, cfg), log_path=log,
        health_paths=cfg.health_paths, ready_timeout_s=cfg.ready_timeout_s,
    )
    base = {"engine": cfg.engine, "axes": dict(cfg.axes), "settings": redact_settings(cfg.settings), "log": str(log)}
    why = (f"{len(todo)} trials to run" if todo
           else "no trial left: its attestation is read to close the interrupted segment")
    say(f"{tag} {cfg.name}: starting the {cfg.engine} server ({why}; log {log})")
    if not _start(cfg, tag, local, srv, base):
        return
    status, cause = "interrupted", None
    try:
        say(f"{tag} {cfg.name}: ready in {srv.ready_s:.1f} s on {srv.endpoint} (pid {srv.pid})")
        run.record_config(cfg.name, {**base, **srv.describe(), "status": "running"})
        try:
            prepared = local.prepare(cfg, srv.endpoint, lifecycle=srv)
        except BadInput:
            cause = srv.dead()
            if cause is None:
                raise  # the server is fine: the spec itself is wrong for it
            prepared = None
        if prepared is not None:
            run.record_config(cfg.name, {**base, **srv.describe(), **prepared.info})
            orchestrate([prepared], spec, run, local.progress)  # polls srv.dead(); a dead server's segment is INVALID
            cause = srv.dead()
        if cause:
            record_errors(run, cfg, spec, f"server died: {cause}")
            status = "died"
            say(f"{tag} {cfg.name}: the server died ({cause}); its remaining trials are recorded as errors; going on")
        else:
            status = "done"
    except (BadInput, LengthDrift):
        status = "stopped: bad input"
        raise
    finally:
        srv.stop()
        info = {"status": status}
        if cause:
            info["cause"] = cause
        run.record_config(cfg.name, info)
    say(f"{tag} {cfg.name}: {status}; server stopped")
