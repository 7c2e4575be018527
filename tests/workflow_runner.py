"""Run a GitHub Actions job's `run:` steps here, in order, as GitHub's Linux runner would
(tests/e2e/test_ci_workflow.py runs .github/workflows/niah-gate.yml with it), and the steps
of a composite action (the repository's action.yml) as a job step that `uses:` it would.

Strict on purpose: a step key, expression, `if:` condition or shell this module does not
know raises `Unsupported` instead of being guessed at, so a workflow edit the emulation
cannot follow fails the test rather than passing untested.

Emulated: one workspace for every step; `shell: bash` as `bash --noprofile --norc -eo
pipefail FILE`, no shell as `bash -e FILE` (GitHub's own command lines); env layered
workflow < job < $GITHUB_ENV of earlier steps < step, over the runner's variables (CI,
GITHUB_ACTIONS, GITHUB_WORKSPACE, RUNNER_TEMP, ...); fresh GITHUB_OUTPUT, GITHUB_ENV,
GITHUB_PATH and GITHUB_STEP_SUMMARY files per step, read back after it (steps.<id>.outputs,
env and PATH for later steps, the job summary); the expressions `runner.temp`, `env.X`,
`steps.ID.outputs.X` and `secrets.X` (the caller gives the secrets); `if:` always(),
success(), failure(), !cancelled(), `steps.ID.outputs.X == 'v'` / `!= 'v'`, and `&&` of
those; `timeout-minutes`;
and at the end of the job every process a step left running is ended, as the runner does
(each step runs in its own process group; only those groups are touched).
Not run: `uses:` steps and the steps whose id the caller names; both are returned with their
`with:` / `run:` expanded, for the caller to check.

A composite action (run_action): its `inputs:` with their defaults (an input it does not
declare, or a required one not given, raises), the expressions `inputs.X`,
`github.action_path` and `runner.os`, GITHUB_ACTION_PATH in every step's environment, the
event (GITHUB_EVENT_NAME, GITHUB_EVENT_PATH: a JSON file the caller gives, GITHUB_REPOSITORY,
GITHUB_ACTOR); every `run:` step must name its shell, as GitHub requires of composite steps.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

STEP_KEYS = {"name", "id", "if", "run", "uses", "with", "env", "shell", "timeout-minutes", "working-directory"}
_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


class Unsupported(Exception):
    """The workflow uses something this emulation does not implement."""


@dataclass
class StepResult:
    index: int
    name: str
    id: str | None
    status: str  # success | failure | skipped
    why: str = ""  # for a skipped step: "uses", "not run by the caller" or the false `if:`
    rc: int | None = None
    log: str = ""
    run: str = ""  # the script, expressions expanded
    with_: dict = field(default_factory=dict)  # a uses step's inputs, expressions expanded
    uses: str | None = None


@dataclass
class JobRun:
    steps: list[StepResult]
    outputs: dict[str, dict[str, str]]
    summary: str  # every step's $GITHUB_STEP_SUMMARY, in order
    left_running: list[int]  # pids the steps left running, ended at the end of the job

    def step(self, step_id: str) -> StepResult:
        return next(s for s in self.steps if s.id == step_id)

    @property
    def failed(self) -> bool:
        return any(s.status == "failure" for s in self.steps)


def _expand(text: str, ctx: dict) -> str:
    def one(m: re.Match) -> str:
        e = m.group(1)
        if e == "runner.temp":
            return ctx["temp"]
        if e == "runner.os" and "inputs" in ctx:
            return "Linux"
        if e == "github.action_path" and "action_path" in ctx:
            return ctx["action_path"]
        if mm := re.fullmatch(r"inputs\.([A-Za-z_][\w-]*)", e):
            if "inputs" not in ctx or mm.group(1) not in ctx["inputs"]:
                raise Unsupported(f"input {mm.group(1)} (not declared by the action)")
            return ctx["inputs"][mm.group(1)]
        if mm := re.fullmatch(r"env\.([A-Za-z_][A-Za-z0-9_]*)", e):
            return ctx["env"].get(mm.group(1), "")
        if mm := re.fullmatch(r"steps\.([A-Za-z_][\w-]*)\.outputs\.([A-Za-z_][\w-]*)", e):
            return ctx["outputs"].get(mm.group(1), {}).get(mm.group(2), "")
        if mm := re.fullmatch(r"secrets\.([A-Za-z_][A-Za-z0-9_]*)", e):
            if mm.group(1) not in ctx["secrets"]:
                raise Unsupported(f"secret {mm.group(1)} (not given to run_job)")
            return ctx["secrets"][mm.group(1)]
        raise Unsupported(f"expression ${{{{ {e} }}}}")

    return _EXPR.sub(one, str(text))


_COMPARE = re.compile(r"(steps\.([A-Za-z_][\w-]*)\.outputs\.([A-Za-z_][\w-]*)|inputs\.([A-Za-z_][\w-]*))"
                      r"\s*(==|!=)\s*'([^']*)'")


def _should_run(cond, failed: bool, outputs: dict | None = None, inputs: dict | None = None) -> bool:
    """A step's `if:`: a status function, an output or an input compared with a literal, or
    `&&` of those; without a status function GitHub adds success()."""
    if cond is None:
        return not failed
    c = str(cond).strip()
    if m := re.fullmatch(r"\$\{\{\s*(.*?)\s*\}\}", c):
        c = m.group(1)
    table = {"always()": True, "!cancelled()": True, "success() || failure()": True,
             "success()": not failed, "failure()": failed}
    if c in table:
        return table[c]
    parts = [p.strip() for p in c.split("&&")]
    if "||" in c or "(" in c.replace("()", ""):
        raise Unsupported(f"if: {cond}")
    values, status = [], False
    for part in parts:
        if part in table and part != "success() || failure()":
            values.append(table[part])
            status = True
        elif m := _COMPARE.fullmatch(part):
            if m.group(4) is not None:
                if inputs is None or m.group(4) not in inputs:
                    raise Unsupported(f"if: {cond} (input {m.group(4)} not declared)")
                got = inputs[m.group(4)]
            else:
                got = (outputs or {}).get(m.group(2), {}).get(m.group(3), "")
            values.append((got == m.group(6)) == (m.group(5) == "=="))
        else:
            raise Unsupported(f"if: {cond}")
    return all(values) and (status or not failed)


def _argv(shell, script: Path) -> list[str]:
    if shell is None:
        return ["bash", "-e", str(script)]
    if shell == "bash":
        return ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)]
    raise Unsupported(f"shell: {shell}")


def _read_kv(path: Path) -> dict[str, str]:
    """A $GITHUB_OUTPUT / $GITHUB_ENV file: NAME=value lines and NAME<<DELIM blocks."""
    out: dict[str, str] = {}
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            end = lines.index(delim, i + 1)
            out[name] = "\n".join(lines[i + 1:end])
            i = end + 1
            continue
        if line.strip():
            name, _, value = line.partition("=")
            out[name] = value
        i += 1
    return out


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group pgid, from /proc."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(d.name))
    return pids


def end_groups(pgids: list[int], grace_s: float = 10.0) -> list[int]:
    """SIGTERM, then SIGKILL after grace_s, every live process of these groups (the steps'
    own); returns the pids that were still running."""
    left = [p for g in pgids for p in _group_members(g)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while sig == signal.SIGTERM and time.monotonic() < deadline and any(_group_members(g) for g in pgids):
            time.sleep(0.2)
        if not any(_group_members(g) for g in pgids):
            break
    return left


def run_job(workflow: dict, job_id: str, workspace: Path, temp: Path, *, base_env: dict,
            env_overrides: dict | None = None, not_run: tuple[str, ...] = (),
            secrets: dict | None = None) -> JobRun:
    """Run job_id's steps in workspace with RUNNER_TEMP = temp (a fresh folder).

    env_overrides replace values of the workflow's own `env:` (a key it lacks raises);
    not_run: ids of run steps to skip (returned with their script)."""
    job = workflow["jobs"][job_id]
    wf_env = {k: str(v) for k, v in (workflow.get("env") or {}).items()}
    for k, v in (env_overrides or {}).items():
        if k not in wf_env:
            raise KeyError(f"the workflow's env has no {k}: nothing to override")
        wf_env[k] = str(v)
    shell = (((job.get("defaults") or {}).get("run") or {}).get("shell")
             or ((workflow.get("defaults") or {}).get("run") or {}).get("shell"))
    temp.mkdir(parents=True, exist_ok=True)
    env = {**base_env, "CI": "true", "GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(workspace),
           "GITHUB_JOB": job_id, "RUNNER_TEMP": str(temp), "RUNNER_OS": "Linux"}
    ctx = {"temp": str(temp), "env": env, "outputs": {}, "secrets": dict(secrets or {})}
    for layer in (wf_env, job.get("env") or {}):
        env.update({k: _expand(v, ctx) for k, v in layer.items()})
    return _run_steps(job["steps"], ctx, env, workspace, temp, shell=shell,
                      timeout_s=float(job.get("timeout-minutes", 360)) * 60, not_run=not_run)


def run_action(action: dict, action_path: Path, workspace: Path, temp: Path, *, base_env: dict,
               inputs: dict | None = None, event: dict | None = None, event_name: str = "push",
               repository: str = "owner/repo", actor: str = "someone", not_run: tuple[str, ...] = (),
               timeout_s: float = 3600) -> JobRun:
    """Run a composite action's steps (action: its action.yml, parsed) as a job step that
    `uses:` it with `with: inputs` would, in workspace, with RUNNER_TEMP = temp (a fresh
    folder) and the action's files at action_path; event: the webhook payload the step sees
    in GITHUB_EVENT_PATH."""
    runs = action.get("runs") or {}
    if runs.get("using") != "composite":
        raise Unsupported(f"runs.using: {runs.get('using')}")
    declared = action.get("inputs") or {}
    given = {k: str(v) for k, v in (inputs or {}).items()}
    unknown = set(given) - set(declared)
    if unknown:
        raise KeyError(f"the action declares no input {sorted(unknown)}")
    values = {}
    for name, spec in declared.items():
        spec = spec or {}
        if name not in given and spec.get("required") and "default" not in spec:
            raise KeyError(f"the action's input {name} is required")
        values[name] = given.get(name, str(spec.get("default", "")))
    temp.mkdir(parents=True, exist_ok=True)
    event_path = temp / "_event.json"
    event_path.write_text(json.dumps(event or {}), encoding="utf-8")
    env = {**base_env, "CI": "true", "GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(workspace),
           "GITHUB_JOB": "job", "RUNNER_TEMP": str(temp), "RUNNER_OS": "Linux",
           "GITHUB_ACTION_PATH": str(action_path), "GITHUB_EVENT_NAME": event_name,
           "GITHUB_EVENT_PATH": str(event_path), "GITHUB_REPOSITORY": repository, "GITHUB_ACTOR": actor}
    ctx = {"temp": str(temp), "env": env, "outputs": {}, "secrets": {}, "inputs": values,
           "action_path": str(action_path)}
    for i, step in enumerate(runs["steps"]):
        if "run" in step and "shell" not in step:
            raise Unsupported(f"composite step {i} has no shell (GitHub requires one)")
    return _run_steps(runs["steps"], ctx, env, workspace, temp, shell=None, timeout_s=timeout_s, not_run=not_run)


def _run_steps(steps: list, ctx: dict, env: dict, workspace: Path, temp: Path, *, shell, timeout_s: float,
               not_run: tuple[str, ...]) -> JobRun:
    job_timeout = timeout_s
    results, summaries, groups = [], [], []
    failed = False
    try:
        for i, step in enumerate(steps):
            extra = set(step) - STEP_KEYS
            if extra:
                raise Unsupported(f"step {i} key(s) {sorted(extra)}")
            res = StepResult(i, step.get("name") or step.get("uses") or f"step {i}", step.get("id"), "skipped",
                             uses=step.get("uses"))
            results.append(res)
            step_ctx = {**ctx, "env": {**env, **{k: _expand(v, ctx) for k, v in (step.get("env") or {}).items()}}}
            if "uses" in step:
                res.why = "uses"
                res.with_ = {k: _expand(v, step_ctx) for k, v in (step.get("with") or {}).items()}
                continue
            res.run = _expand(step["run"], step_ctx)
            if not _should_run(step.get("if"), failed, ctx["outputs"], ctx.get("inputs")):
                res.why = f"if: {step.get('if') or 'success()'}"
                continue
            if res.id in not_run:
                res.why = "not run by the caller"
                continue
            files = {k: temp / f"_step{i}_{k.lower()}" for k in
                     ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH", "GITHUB_STEP_SUMMARY")}
            for f in files.values():
                f.write_text("")
            script = temp / f"_step{i}.sh"
            script.write_text(res.run, encoding="utf-8")
            log = temp / f"_step{i}.log"
            step_env = {**step_ctx["env"], **{k: str(f) for k, f in files.items()}}
            cwd = workspace / step["working-directory"] if "working-directory" in step else workspace
            with open(log, "wb") as out:
                proc = subprocess.Popen(_argv(step.get("shell", shell), script), cwd=cwd, env=step_env,
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
                groups.append(proc.pid)
                try:
                    res.rc = proc.wait(timeout=float(step.get("timeout-minutes", job_timeout / 60)) * 60)
                except subprocess.TimeoutExpired:
                    end_groups([proc.pid], grace_s=5)
                    proc.wait()
                    res.rc = None
            res.log = log.read_text(encoding="utf-8", errors="replace")
            res.status = "success" if res.rc == 0 else "failure"
            failed = failed or res.status == "failure"
            if res.id:
                ctx["outputs"][res.id] = _read_kv(files["GITHUB_OUTPUT"])
            env.update(_read_kv(files["GITHUB_ENV"]))
            added = [p for p in files["GITHUB_PATH"].read_text().splitlines() if p.strip()]
            if added:
                env["PATH"] = os.pathsep.join(reversed(added)) + os.pathsep + env.get("PATH", "")
            summaries.append(files["GITHUB_STEP_SUMMARY"].read_text(encoding="utf-8"))
    except BaseException:
        end_groups(groups)
        raise
    return JobRun(results, ctx["outputs"], "".join(summaries), end_groups(groups))
