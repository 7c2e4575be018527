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
The matrix itself (file, commands, differences, arms) is recorded in the manifest.
Before anything starts, every SGLang fp4 arm is asked of its server's Python whether SGLang
accepts `--enable-deepseek-v4-fp4-indexer` on this machine (serving/sglang/fp4.py); where
SGLang would refuse it (SM90, e.g. an H200) the run stops there with SGLang's reason.
"""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

from niah.attestation import open_segment
from niah.errors import BadInput, LengthDrift, ServerError
from niah.kernels import forms
from niah.redact import redact_settings, redact_text, remember_from, remember_secret
from niah.prompts.needles import trial_seed
from niah.runs.folder import check_same_tokenizers, start_run
from niah.runs.manifest import MANIFEST, change_manifest, read_manifest, record_config
from niah.runs.record import error_record
from niah.serving.launch import ServerProcess
from niah.serving.matrix.commands import arm_of, axis_differences, matrix_commands, server_command
from niah.serving.matrix.parse import Matrix, MatrixConfig
from niah.serving.sglang.fp4 import fp4_platform_refusal
from niah.sweep import SweepSpec, Target, check_spec, prepare_target
from niah.sweep.interrupt import terminate_as_interrupt
from niah.sweep.orchestrate import load_prompt_set, orchestrate, say
from niah.sweep.run import pending_trials
from niah.sweep.residues import block, parse_residues


def record_errors(store, cfg: MatrixConfig, spec: SweepSpec, error: str) -> int:
    """Write every pending trial of `cfg` as an error (niah.runs.record), each in its cache
    state and with the seed its trial would have had (a residue block's); returns how many."""
    todo = pending_trials(cfg.name, spec, store.done)
    residues = parse_residues(spec.residues)
    for length, depth, trial, state in todo:
        base = length if residues is None else block(length, residues.modulus)
        seed = trial_seed(spec.seed, base, depth, trial)
        store.append(error_record(cfg.name, cfg.settings.get("model"), length, depth, trial, seed, error,
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


def manifest_matrix(out: Path, matrix: Matrix) -> None:
    """Record the matrix (its text, commands, per-axis differences, arms) in the manifest."""
    try:
        text = redact_text(matrix.path.read_text(encoding="utf-8"))
    except OSError:
        text = None
    record = {"path": str(matrix.path), "text": text, "configs": matrix.names(),
              "commands": {cfg.name: line for cfg, line in matrix_commands(matrix)},
              "differences": axis_differences(matrix),
              "arms": {cfg.name: arm for cfg in matrix.configs if (arm := arm_of(cfg))}}
    change_manifest(out, lambda manifest: manifest.update(matrix=record))


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
    check_spec(spec)
    check_fp4_platform(matrix)
    out = Path(out)
    prompt_set = load_prompt_set(spec)
    remember_secrets(matrix)  # before anything is compared with, or written to, the run folder
    if resume and not force_config:
        _check_unchanged(out, matrix)
    store = start_run(out, spec, resume, prompt_set)
    run = _MatrixRun(spec, out, store, progress, prompt_set, force_config)
    try:
        manifest_matrix(out, matrix)
        with terminate_as_interrupt():
            if progress is not None:
                with progress:
                    run.all(matrix)
            else:
                run.all(matrix)
    finally:
        store.close()
    return out


def check_fp4_platform(matrix: Matrix) -> None:
    """SGLang's refusal of an fp4 arm on this machine, before any server starts (BadInput)."""
    for cfg in matrix.configs:
        form = forms.get(cfg.settings.get("index_dtype") or forms.DEFAULT)
        if cfg.engine == "sglang" and cfg.launched and form is not None and form.sglang_flag:  # fp4
            argv, env = server_command(cfg, 30000)  # a port SGLang's parser takes; nothing listens
            merged = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
            problem = fp4_platform_refusal(argv[0], argv[3:], merged)
            if problem:
                raise BadInput(f"{cfg.name} (line {cfg.line}): {problem}")


class _MatrixRun:
    def __init__(self, spec: SweepSpec, out: Path, store, progress, prompt_set, force: bool):
        self.spec, self.out, self.store, self.progress = spec, out, store, progress
        self.prompt_set, self.force = prompt_set, force

    def all(self, matrix: Matrix) -> None:
        externals = [c for c in matrix.configs if not c.launched]
        launched = [c for c in matrix.configs if c.launched]
        if externals:
            self.externals(externals)
        for i, cfg in enumerate(launched, start=1):
            _run_launched(cfg, f"[{i}/{len(launched)}]", self)

    def prepare(self, cfg: MatrixConfig, endpoint: str, lifecycle=None):
        p = prepare_target(_target(cfg, endpoint, lifecycle), self.spec, self.prompt_set)
        check_same_tokenizers(read_manifest(self.out), [p], self.force)
        return p

    def externals(self, configs: list[MatrixConfig]) -> None:
        """Endpoints someone else runs: probe all (bad input fails before any trial), then
        sweep them concurrently."""
        prepared = []
        for cfg in configs:
            p = self.prepare(cfg, cfg.settings["endpoint"])
            record_config(self.out, cfg.name, {**p.info, "settings": redact_settings(cfg.settings)})
            prepared.append(p)
            say(f"{cfg.name}: external endpoint {p.endpoint}, model {p.model}")
        orchestrate(prepared, self.spec, self.store, self.progress, concurrent=True)


def _start(cfg: MatrixConfig, tag: str, run: _MatrixRun, srv: ServerProcess, base: dict) -> bool:
    """Start the server; on failure record its trials as errors and say so (False)."""
    try:
        srv.start()
    except ServerError as e:
        cause = srv.failure or str(e).splitlines()[0]
        say(f"{tag} {e}")
        n = record_errors(run.store, cfg, run.spec, f"server failed to start: {cause}")
        record_config(run.out, cfg.name, {**base, **srv.describe(), "status": "failed to start", "cause": cause})
        say(f"{tag} {cfg.name}: {n} trials recorded as errors; going on")
        return False
    return True


def _run_launched(cfg: MatrixConfig, tag: str, run: _MatrixRun) -> None:
    """Start one server, sweep it, stop it. Never lets its failure stop the matrix;
    BadInput (a spec the model cannot serve), a length drift and Ctrl-C do stop it."""
    spec, out, store = run.spec, run.out, run.store
    todo = pending_trials(cfg.name, spec, store.done)
    unclosed = open_segment((read_manifest(out).get("configs") or {}).get(cfg.name) or {})
    if not todo and not unclosed:
        say(f"{tag} {cfg.name}: every trial is already in the run folder; not started")
        return
    log = out / "logs" / f"{cfg.name}.log"
    srv = ServerProcess(
        cfg.name, partial(server_command, cfg), log_path=log,
        health_paths=cfg.health_paths, ready_timeout_s=cfg.ready_timeout_s,
    )
    base = {"engine": cfg.engine, "axes": dict(cfg.axes), "settings": redact_settings(cfg.settings), "log": str(log)}
    why = (f"{len(todo)} trials to run" if todo
           else "no trial left: its attestation is read to close the interrupted segment")
    say(f"{tag} {cfg.name}: starting the {cfg.engine} server ({why}; log {log})")
    if not _start(cfg, tag, run, srv, base):
        return
    status, cause = "interrupted", None
    try:
        say(f"{tag} {cfg.name}: ready in {srv.ready_s:.1f} s on {srv.endpoint} (pid {srv.pid})")
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
            orchestrate([prepared], spec, store, run.progress)  # polls srv.dead(); a dead server's segment is INVALID
            cause = srv.dead()
        if cause:
            record_errors(store, cfg, spec, f"server died: {cause}")
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
        record_config(out, cfg.name, info)
    say(f"{tag} {cfg.name}: {status}; server stopped")
