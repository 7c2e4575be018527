"""Run a configuration matrix: every configuration on identical prompts, one run folder.

Each configuration is a niah.targets.Target run through the same stages as a plain sweep
(prepare: niah.targets, call: niah.run, store: niah.runfolder); a launched one has a
lifecycle (serving/launch.py's ServerProcess: start, dead, describe, stop).

External endpoints are swept first, concurrently; then each launched configuration in
turn: start its server (serving/launch.py), probe it, sweep it with `dead()` watching the
process, stop it. A configuration that fails to start, or whose server dies, gets its
remaining trials written as `error` with the cause from the server's log, and the next
configuration runs. Ctrl-C / SIGTERM stop the running server; finished trials stay.
"""

from __future__ import annotations

import asyncio
import os
import sys
from functools import partial
from pathlib import Path

from niah.errors import BadInput, LengthDrift, ServerError
from niah.serving.launch import ServerProcess, sigterm_as_interrupt
from niah.serving.matrix import Matrix, MatrixConfig
from niah.serving.matrix_commands import server_command


def _say(msg: str) -> None:
    print(f"niah: {msg}", file=sys.stderr, flush=True)


def record_errors(store, cfg: MatrixConfig, spec, error: str) -> int:
    """Write every pending trial of `cfg` as an error (niah.record); returns how many."""
    from niah.needles import trial_seed
    from niah.record import error_record
    from niah.run import pending_trials

    todo = pending_trials(cfg.name, spec, store.done)
    for length, depth, trial in todo:
        seed = trial_seed(spec.seed, length, depth, trial)
        store.append(error_record(cfg.name, cfg.settings.get("model"), length, depth, trial, seed, error))
    return len(todo)


def _target(cfg: MatrixConfig, endpoint: str, lifecycle=None):
    """The configuration as a niah.targets.Target (a launched one carries its server)."""
    from niah.targets import Target

    key_env = cfg.settings.get("api_key_env")
    api_key = os.environ.get(key_env) if key_env else None
    if key_env and not api_key:
        raise BadInput(f"{cfg.name}: api_key_env {key_env} is not set in the environment")
    return Target(endpoint=endpoint, model=cfg.settings.get("model"), name=cfg.name,
                  engine=cfg.engine, axes=dict(cfg.axes), api_key=api_key, lifecycle=lifecycle)


def begin_attestation(out: Path, prepared) -> None:
    """When a configuration's sweep starts (server ready and probed): read its attestation."""
    from niah.attestation import begin_segment, read_target

    begin_segment(out, prepared.target.name, read_target(prepared))


def end_attestation(out: Path, prepared) -> None:
    """When it ends (before teardown; a dead server is not asked): read it again, judge
    the configuration (niah/attestation.py) and say so when it is not valid."""
    from niah.attestation import end_segment, read_target, say_state

    say_state(prepared.target.name, *end_segment(out, prepared.target.name, read_target(prepared)), _say)


def _manifest_matrix(out: Path, matrix: Matrix) -> None:
    from niah.store import read_manifest, write_manifest

    manifest = read_manifest(out)
    manifest.pop("schema_version", None)
    try:
        text = matrix.path.read_text(encoding="utf-8")
    except OSError:
        text = None
    from niah.serving.matrix_commands import arm_of, axis_differences, matrix_commands

    manifest["matrix"] = {"path": str(matrix.path), "text": text, "configs": matrix.names(),
                          "commands": {cfg.name: line for cfg, line in matrix_commands(matrix)},
                          "differences": axis_differences(matrix),
                          "arms": {cfg.name: arm for cfg in matrix.configs if (arm := arm_of(cfg))}}
    write_manifest(out, manifest)


def _check_unchanged(out: Path, matrix: Matrix) -> None:
    """--resume must not mix two different servers under one configuration name."""
    from niah.store import read_manifest

    if not (out / "manifest.json").exists():
        return
    old = read_manifest(out).get("configs", {})
    for cfg in matrix.configs:
        before = old.get(cfg.name, {})
        if "settings" in before and (before["settings"], before.get("engine")) != (_jsonable(cfg.settings), cfg.engine):
            raise BadInput(
                f"{matrix.path}:{cfg.line}: configuration {cfg.name!r} differs from the one in {out} "
                f"(was {before.get('engine')} {before['settings']}); rename it or use another --out"
            )


def _jsonable(v):
    import json

    return json.loads(json.dumps(v))


def sweep_matrix(matrix: Matrix, spec, out: Path, resume: bool = False, progress=None,
                 force_config: bool = False) -> Path:
    """Sweep every configuration of a loaded `matrix` into `out`; returns `out`
    (serving.matrix.run_matrix is the entry point that reads the file)."""
    from niah.runfolder import start_run
    from niah.sweep import check_spec, load_prompt_set

    check_spec(spec)
    out = Path(out)
    prompt_set = load_prompt_set(spec)
    if resume and not force_config:
        _check_unchanged(out, matrix)
    store = start_run(out, spec, resume)
    run = _MatrixRun(spec, out, store, progress, prompt_set, force_config)
    try:
        _manifest_matrix(out, matrix)
        with sigterm_as_interrupt():
            if progress is not None:
                with progress:
                    run.all(matrix)
            else:
                run.all(matrix)
    finally:
        store.close()
    return out


class _MatrixRun:
    def __init__(self, spec, out: Path, store, progress, prompt_set, force: bool):
        self.spec, self.out, self.store, self.progress = spec, out, store, progress
        self.prompt_set, self.force = prompt_set, force

    def all(self, matrix: Matrix) -> None:
        externals = [c for c in matrix.configs if not c.launched]
        launched = [c for c in matrix.configs if c.launched]
        if externals:
            _run_externals(externals, self)
        for i, cfg in enumerate(launched, start=1):
            _run_launched(cfg, f"[{i}/{len(launched)}]", self)

    def prepare(self, cfg: MatrixConfig, endpoint: str, lifecycle=None):
        from niah.runfolder import check_same_tokenizers
        from niah.store import read_manifest
        from niah.targets import prepare_target

        p = prepare_target(_target(cfg, endpoint, lifecycle), self.spec, self.prompt_set)
        check_same_tokenizers(read_manifest(self.out), [p], self.force)
        return p


def _run_externals(configs: list[MatrixConfig], run: _MatrixRun) -> None:
    """Endpoints someone else runs: probe all (bad input fails before any trial), then
    sweep them concurrently."""
    from niah.run import run_target
    from niah.runfolder import record_config

    spec, out, store, progress = run.spec, run.out, run.store, run.progress
    prepared = []
    for cfg in configs:
        p = run.prepare(cfg, cfg.settings["endpoint"])
        record_config(out, cfg.name, {**p.info, "settings": cfg.settings})
        prepared.append(p)
        _say(f"{cfg.name}: external endpoint {p.endpoint}, model {p.model}")

    async def main() -> None:
        await asyncio.gather(*(run_target(p, spec, store, progress) for p in prepared))

    from niah.run import pending_trials

    began = [p for p in prepared if pending_trials(p.target.name, spec, store.done)]
    for p in began:
        begin_attestation(out, p)
    try:
        asyncio.run(main())
    finally:
        for cfg, p in zip(configs, prepared):
            if hasattr(p.tokenizer, "cost"):
                record_config(out, cfg.name, {"tokenizer_cost": p.tokenizer.cost})
        for p in began:
            end_attestation(out, p)


def _run_launched(cfg: MatrixConfig, tag: str, run: _MatrixRun) -> None:
    """Start one server, sweep it, stop it. Never lets its failure stop the matrix;
    BadInput (a spec the model cannot serve), a length drift and Ctrl-C do stop it."""
    from niah.run import pending_trials, run_target
    from niah.runfolder import record_config

    spec, out, store, progress = run.spec, run.out, run.store, run.progress

    todo = pending_trials(cfg.name, spec, store.done)
    if not todo:
        _say(f"{tag} {cfg.name}: every trial is already in the run folder; not started")
        return
    log = out / "logs" / f"{cfg.name}.log"
    srv = ServerProcess(
        cfg.name, partial(server_command, cfg), log_path=log,
        health_paths=cfg.health_paths, ready_timeout_s=cfg.ready_timeout_s,
    )
    base = {"engine": cfg.engine, "axes": dict(cfg.axes), "settings": cfg.settings, "log": str(log)}
    _say(f"{tag} {cfg.name}: starting the {cfg.engine} server ({len(todo)} trials to run; log {log})")
    try:
        srv.start()
    except ServerError as e:
        cause = srv.failure or str(e).splitlines()[0]
        _say(f"{tag} {e}")
        n = record_errors(store, cfg, spec, f"server failed to start: {cause}")
        record_config(out, cfg.name, {**base, **srv.describe(), "status": "failed to start", "cause": cause})
        _say(f"{tag} {cfg.name}: {n} trials recorded as errors; going on")
        return
    status, cause, prepared = "interrupted", None, None
    try:
        _say(f"{tag} {cfg.name}: ready in {srv.ready_s:.1f} s on {srv.endpoint} (pid {srv.pid})")
        record_config(out, cfg.name, {**base, **srv.describe(), "status": "running"})
        try:
            prepared = run.prepare(cfg, srv.endpoint, lifecycle=srv)
        except BadInput:
            cause = srv.dead()
            if cause is None:
                raise  # the server is fine: the spec itself is wrong for it
            prepared = None
        if prepared is not None:
            record_config(out, cfg.name, {**base, **srv.describe(), **prepared.info})
            begin_attestation(out, prepared)
            try:
                asyncio.run(run_target(prepared, spec, store, progress))  # polls srv.dead()
            finally:
                if hasattr(prepared.tokenizer, "cost"):
                    record_config(out, cfg.name, {"tokenizer_cost": prepared.tokenizer.cost})
            cause = srv.dead()
        if cause:
            record_errors(store, cfg, spec, f"server died: {cause}")
            status = "died"
            _say(f"{tag} {cfg.name}: the server died ({cause}); its remaining trials are recorded as errors; going on")
        else:
            status = "done"
    except (BadInput, LengthDrift):
        status = "stopped: bad input"
        raise
    finally:
        if prepared is not None:
            end_attestation(out, prepared)  # a dead server's segment ends unread: INVALID
        srv.stop()
        info = {"status": status}
        if cause:
            info["cause"] = cause
        record_config(out, cfg.name, info)
    _say(f"{tag} {cfg.name}: {status}; server stopped")
