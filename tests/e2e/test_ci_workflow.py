"""The example CI workflow, .github/workflows/niah-gate.yml, runs as written.

Its job's own `run:` steps are read from the YAML and run in order with bash
(tests/workflow_runner.py: GitHub's shell command line, GITHUB_OUTPUT / GITHUB_ENV /
GITHUB_STEP_SUMMARY / RUNNER_TEMP in a temp folder, `if:` conditions) against the server
its own step starts on loopback: the embedded server. Not run: the `uses:` steps (checkout,
setup-python, upload-artifact: the upload's paths are checked instead) and the step with
`id: install`, which would reinstall the environment this test runs in; its commands are
checked against the Makefile's `make setup`, and the environment against what they install.

A healthy server passes the gate against the committed baseline (the committed 30-prompt
set, results/baselines/README.md); the same steps against a server whose top-k loses the
needle fail the gate step with exit 1 (on 9 of the set's 15 prompts of 600 tokens, to save time).
docs/ci.md's variants run too: every snippet parses and names real options, and its
own-endpoint job and matrix steps run against loopback test servers (tests/servers/oracle.py).

The action for a user's own deployment (action.yml at the repository root) runs the same
way (tests/workflow_runner.py run_action): its `run:` steps in order, in a workspace that is
not this checkout, with the inputs docs/ci.md's "Gate my server" job gives it, against
oracle servers behind an API key: a healthy one passes, a lossy one fails the gate step
with exit 1 (and still reports and collects its artifact, with no file holding the key), a
pull request from a fork without secrets skips with a notice, bad inputs stop at the first
step with exit 2. Not run: the `uses:` steps (setup-python, cache, upload-artifact; their
`with:` are checked) and the install step (it installs from the action's own path; its
script is checked, and tests/harness/test_package.py installs the wheel into a fresh venv).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from workflow_runner import run_action, run_job

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "niah-gate.yml"
ACTION = ROOT / "action.yml"
USES = {"actions/checkout", "actions/setup-python", "actions/upload-artifact"}
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# A top-k of 4 keys per query: the needle's value tokens are not kept, the answers go wrong.
LOSES_THE_NEEDLE = "--attention dsa --index-dtype fp8 --index-topk 4"


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


def _job(workflow: dict) -> tuple[str, dict]:
    (job_id, job), = workflow["jobs"].items()  # one job
    return job_id, job


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _base_env() -> dict:
    """This environment, `niah` first on PATH (what the install step gives), no runner variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_"))}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def _run(workflow: dict, tmp_path: Path, **overrides):
    """The job's run steps on a free port (overrides: other values of the workflow's env)."""
    job_id, _ = _job(workflow)
    return run_job(workflow, job_id, ROOT, tmp_path / "runner-temp", base_env=_base_env(),
                   env_overrides={"NIAH_PORT": _free_port(), **overrides}, not_run=("install",))


def _logs(job) -> str:
    return "\n".join(f"--- {s.name} [{s.status} rc={s.rc}]\n{s.log[-3000:]}" for s in job.steps if s.log)


def _upload_paths(job) -> list[Path]:
    (up,) = [s for s in job.steps if (s.uses or "").startswith("actions/upload-artifact")]
    return [Path(p) for p in up.with_["path"].splitlines() if p.strip()]


def _junit(path: Path) -> dict[str, dict[str, str]]:
    """Parse and check JUnit's shape (testsuites > testsuite > testcase, counts that add up);
    returns {suite name: {case name: pass | failure | error | skipped}}."""
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    suites: dict[str, dict[str, str]] = {}
    for suite in root:
        assert suite.tag == "testsuite" and suite.get("name") not in (None, *suites)
        # JUnit's order: <properties> (the gate's caveats) first, the test cases, <system-out> last
        tags = [c.tag for c in suite]
        assert tags == (["properties"] if tags[:1] == ["properties"] else []) + ["testcase"] * tags.count("testcase") \
            + (["system-out"] if tags[-1:] == ["system-out"] else []), tags
        tcs = [c for c in suite if c.tag == "testcase"]
        assert all(tc.get("classname") and tc.get("name") for tc in tcs)
        assert int(suite.get("tests")) == len(tcs)
        cases = suites[suite.get("name")] = {}
        for tc in tcs:
            cases[tc.get("name")] = next((t for t in ("failure", "error", "skipped") if tc.find(t) is not None), "pass")
        for tag, attr in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
            assert int(suite.get(attr)) == list(cases.values()).count(tag)
    for tag, attr in (("failure", "failures"), ("error", "errors")):
        assert int(root.get(attr)) == sum(list(c.values()).count(tag) for c in suites.values())
    assert int(root.get("tests")) == sum(map(len, suites.values()))
    return suites


def _one_suite(path: Path) -> dict[str, str]:
    (cases,) = _junit(path).values()
    return cases


PINNED = re.compile(r"^\s*(?:- )?uses: ([\w.-]+/[\w.-]+)@([0-9a-f]{40}) # (v\d+\.\d+\.\d+)$")


@pytest.mark.parametrize("path", [WORKFLOW, ACTION], ids=["workflow", "action"])
def test_third_party_actions_are_pinned_by_commit(path):
    """Every `uses:` names a full commit SHA and, in a comment, the release tag it is."""
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if re.match(r"^\s*(- )?uses:", ln)]
    assert lines
    for ln in lines:
        assert PINNED.match(ln), f"not pinned by commit SHA with its tag: {ln.strip()}"
    # one SHA per action across both files (an update moves both)
    shas = {}
    for p in (WORKFLOW, ACTION):
        for m in filter(None, map(PINNED.match, p.read_text(encoding="utf-8").splitlines())):
            assert shas.setdefault(m.group(1), m.groups()[1:]) == m.groups()[1:], m.group(0)


def test_the_workflow_is_one_job_of_known_parts(workflow):
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert "pull_request" in triggers
    _, job = _job(workflow)
    steps = job["steps"]
    uses = [s["uses"].split("@")[0] for s in steps if "uses" in s]
    assert set(uses) == USES, "a new action is not emulated by tests/workflow_runner.py: check it here"
    ids = [s.get("id") for s in steps]
    assert ids.count("install") == 1 and "server" in ids and "gate" in ids
    # what must run after a failed gate: the report, its upload and the server's stop
    after_gate = steps[ids.index("gate") + 1:]
    assert after_gate and all(s.get("if") == "always()" for s in after_gate)
    env = workflow["env"]
    for key in ("NIAH_PROMPTS", "NIAH_BASELINE"):
        assert (ROOT / env[key]).is_file(), f"{key} names {env[key]}, not a committed file"


def _pip_lines(text: str, prefix: list[str]) -> list[list[str]]:
    lines = [shlex.split(ln) for ln in text.replace("\\\n", " ").splitlines() if ln.strip()]
    assert all(ln[:len(prefix)] == prefix for ln in lines), f"every line is `{' '.join(prefix)} ...`: {lines}"
    return [ln[len(prefix):] for ln in lines]


def _parts(args: list[str]) -> tuple[set[str], set[str]]:
    """(requirements, flags) of `pip install ARGS`; -q and the CPU index are not compared."""
    reqs, flags, skip = set(), set(), False
    for a in args:
        if skip:
            skip = False
        elif a == "--index-url":
            skip = True
        elif a == "-q":
            pass
        elif a.startswith("-"):
            flags.add(a)
        else:
            reqs.add(a)
    return reqs, flags


def _extras(req: str) -> tuple[str, set[str]]:
    m = re.fullmatch(r"([^\[]+)(?:\[(.*)\])?", req)
    return m.group(1), set(filter(None, (m.group(2) or "").split(",")))


def test_the_install_step_is_what_make_setup_installs(workflow):
    """The skipped install step installs what `make setup` installs for the server (same
    pins, order and flags; torch from the CPU index), and this test's environment is that."""
    _, job = _job(workflow)
    (install,) = [s for s in job["steps"] if s.get("id") == "install"]
    ours = _pip_lines(install["run"], ["python", "-m", "pip", "install"])
    make = (ROOT / "Makefile").read_text()
    recipe = make[make.index("$(STAMP):"):].split("\n\n")[0]
    theirs = _pip_lines("\n".join(ln.strip() for ln in recipe.splitlines() if "$(BIN)/pip install" in ln),
                        ["$(BIN)/pip", "install"])
    (torch_line,) = [a for a in ours if any(x.startswith("torch==") for x in a)]
    assert CPU_INDEX in torch_line and torch_line[torch_line.index(CPU_INDEX) - 1] == "--index-url", \
        "torch from PyTorch's CPU index (PyPI's Linux wheel is the CUDA build)"
    order = []
    for args in ours:
        reqs, flags = _parts(args)
        match = [i for i, t in enumerate(theirs)
                 if _parts(t)[1] == flags and all(any(_extras(r)[0] == _extras(q)[0] and _extras(r)[1] <= _extras(q)[1]
                                                      for q in _parts(t)[0]) for r in reqs)]
        assert match, f"`pip install {' '.join(args)}` is not a line of make setup (or a part of one): {theirs}"
        order.append(match[0])
    assert order == sorted(order), "the install step runs make setup's lines in another order"

    from importlib.metadata import requires, version

    import niah
    import torch
    from packaging.requirements import Requirement

    pins = dict(r.split("==") for args in ours for r in _parts(args)[0] if "==" in r)
    for name, pin in pins.items():
        assert version(name).split("+")[0] == pin, f"{name} {version(name)} here, the workflow installs {pin}"
    assert torch.version.cuda is None  # the CPU build
    assert Path(niah.__file__).resolve().parent == ROOT / "niah"  # `pip install -e .`: this checkout
    (editable,) = [r for args in ours for r in _parts(args)[0] if r.startswith(".")]
    for extra in _extras(editable)[1]:
        for spec in map(Requirement, requires("niah-lab")):
            if spec.marker and spec.marker.evaluate({"extra": extra}):
                assert spec.specifier.contains(version(spec.name), prereleases=True), f"[{extra}] needs {spec}"


def test_the_committed_baseline_pairs_with_the_committed_prompt_set(workflow):
    import json

    env = workflow["env"]
    prompts = [json.loads(ln) for ln in (ROOT / env["NIAH_PROMPTS"]).read_text().splitlines() if ln.strip()]
    base = json.loads((ROOT / env["NIAH_BASELINE"]).read_text())
    (cfg,) = base["configs"].values()
    assert sorted(t["prompt_sha256"] for t in cfg["trials"]) == sorted(p["prompt_sha256"] for p in prompts)
    # the workflow gates with --metric both: a baseline without the probe's measures would show
    # the needle-kept and fidelity cases skipped (and judge nothing there)
    (job,) = workflow["jobs"].values()
    assert any("--metric both" in (s.get("run") or "") for s in job["steps"])
    assert all({"rank", "kept", "fidelity"} <= set(t) for t in cfg["trials"]), \
        "refresh the baseline (results/baselines/README.md): its trials lack the probe's measures"


@pytest.mark.slow
def test_the_workflow_passes_a_healthy_server(workflow, ci_healthy_job):
    """The job as committed (tests/conftest.py runs it once; test_gate_selfgate.py gates its sweep too)."""
    job, temp = ci_healthy_job.job, ci_healthy_job.temp
    assert not job.failed, _logs(job)
    ran = {s.id or s.name: s for s in job.steps if s.status == "success"}
    skipped = {s.uses.split("@")[0] if s.uses else s.id for s in job.steps if s.status == "skipped"}
    assert skipped == USES | {"install"}, _logs(job)
    assert job.outputs["gate"]["exit-code"] == "0"
    assert "server ready" in ran["server"].log
    cases = _one_suite(temp / "niah-gate" / "gate.xml")
    assert {"length 600", "length 1500", "all lengths", "all lengths needle rank"} <= set(cases)
    assert set(cases.values()) == {"pass"}
    # the step summary: niah gate appended its table, each trial paired with the baseline's
    assert "## niah gate: PASS" in job.summary and "paired by prompt hash" in job.summary
    for p in _upload_paths(job):
        assert p.exists(), f"the upload step names {p}, which the job did not write"
    report = temp / "niah-run" / "report"
    assert report in _upload_paths(job)
    assert (report / "summary.md").stat().st_size > 0
    assert [p for p in report.glob("heatmap_*.png") if p.stat().st_size > 0]
    assert not _running(int(job.outputs["server"]["pid"])) and job.left_running == []


@pytest.mark.slow
def test_the_workflow_fails_a_server_that_loses_the_needle(workflow, tmp_path):
    """The same steps, the server at top-k 4; to keep it short, on the committed set's 15
    prompts of 600 tokens (every cell the baseline has at that length: a candidate that lacks
    a baseline trial is an outage, not a regression; the length 1500 it lacks is one, named,
    and the rest is gated)."""
    committed = (ROOT / workflow["env"]["NIAH_PROMPTS"]).read_text(encoding="utf-8").splitlines()
    short = tmp_path / "set-600.jsonl"
    short.write_text("".join(ln + "\n" for ln in committed
                             if json.loads(ln)["length"] == 600), encoding="utf-8")
    assert len(short.read_text().splitlines()) == 15
    job = _run(workflow, tmp_path, NIAH_SERVE_ARGS=LOSES_THE_NEEDLE, NIAH_PROMPTS=short)
    gate = job.step("gate")
    assert gate.status == "failure" and gate.rc == 1, _logs(job)
    assert job.outputs["gate"]["exit-code"] == "1"
    assert [s.name for s in job.steps if s.status == "failure"] == [gate.name], _logs(job)
    cases = _one_suite(tmp_path / "runner-temp" / "niah-gate" / "gate.xml")
    assert cases["length 600"] == "failure" and cases["length 600 needle rank"] == "failure"
    assert cases["length 1500"] == "error"  # not measured: an outage, never a pass
    assert "## niah gate: REGRESSION + OUTAGE" in job.summary and "length not in the candidate" in job.summary
    # after the failed gate, the report is still drawn, named for upload, and the server stopped
    (report,) = [s for s in job.steps if s.name == "Report"]
    assert report.index > gate.index and report.status == "success"
    assert (tmp_path / "runner-temp" / "niah-run" / "report" / "summary.md").exists()
    assert not _running(int(job.outputs["server"]["pid"])) and job.left_running == []


# -- docs/ci.md: its snippets parse, name real options, and its two job variants run ---------
DOCS = ROOT / "docs" / "ci.md"
SHELL_OPS = {"||", "&&", ";", "|", "&", ">", "2>", ">>"}


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)


def _niah_commands(text: str) -> list[list[str]]:
    """Every `niah ...` command of a block (continuations joined), up to a shell operator."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        toks = shlex.split(line, comments=True)
        for i, t in enumerate(toks):
            if t == "niah":
                cmd = []
                for u in toks[i + 1:]:
                    if u in SHELL_OPS or u.startswith((">", "2>")):
                        break
                    cmd.append(u)
                out.append(cmd)
    return out


def test_every_snippet_of_docs_ci_parses_and_names_real_options(workflow):
    import typer.main

    from niah.cli import _register, app

    _register()
    root = typer.main.get_command(app)
    def runs(node) -> list[str]:  # the `run:` scripts of a parsed YAML block
        if isinstance(node, dict):
            return ([v for k, v in node.items() if k == "run" and isinstance(v, str)]
                    + [r for v in node.values() for r in runs(v)])
        return [r for v in node for r in runs(v)] if isinstance(node, list) else []

    scripts = [r for block in _blocks("yaml") for r in runs(yaml.safe_load(block))] + runs(workflow)
    commands = [c for text in scripts + _blocks("bash") for c in _niah_commands(text)]
    assert len(commands) >= 12
    for toks in commands:
        cmd, rest = root, list(toks)
        while hasattr(cmd, "commands"):  # a group (typer may bring its own click: no isinstance)
            assert rest and rest[0] in cmd.commands, f"`niah {' '.join(toks)}`: no such command"
            cmd, rest = cmd.commands[rest[0]], rest[1:]
        opts = {o for p in cmd.params for o in p.opts + p.secondary_opts}
        for t in rest:
            if t.startswith("-"):
                assert t.split("=")[0] in opts, f"`niah {' '.join(toks)}`: {t} is not an option of it"


def _docs_job(pred) -> dict:
    (block,) = [b for b in _blocks("yaml") if pred(b)]
    return yaml.safe_load(block)


def _oracle_set(oracle, out: Path, api_key: str | None = None) -> None:
    r = _niah("prompts", "build", "--endpoint", oracle.url, "--tokenizer", "usage", "--lengths", "1000,2000",
              "--depths", "10,50,90", "--trials", "5", "--out", out, env={"NIAH_API_KEY": api_key} if api_key else {})
    assert r.returncode == 0, r.stdout + r.stderr


def _niah(*args, env=None):
    from cli_inproc import niah  # the entry point in this process (tests/cli_inproc.py)

    return niah(*args, env={**os.environ, **(env or {})})


def _run_doc_job(job: dict, tmp_path: Path, env: dict, secrets: dict | None = None):
    (job_id, _), = job["jobs"].items()
    wf = {**job, "env": {**(job.get("env") or {}), **env}}
    return run_job(wf, job_id, ROOT, tmp_path / "runner-temp", base_env=_base_env(), not_run=("install",),
                   secrets=secrets)


def test_the_matrix_variant_of_docs_ci_runs(oracle_factory, tmp_path):
    """docs/ci.md's matrix steps (one sweep over every configuration, one gate) and its
    per-configuration loop, the configurations being running loopback servers."""
    servers = {"good": oracle_factory(), "bad": oracle_factory("--wrong-above", "1500")}
    steps = yaml.safe_load(next(b for b in _blocks("yaml") if "NIAH_MATRIX" in b))
    job = {"jobs": {"recall-gate": {"defaults": {"run": {"shell": "bash"}}, "steps": steps}}}
    (toml,) = [b for b in _blocks("toml")]
    names = re.findall(r"-> (.*)", toml)[0].replace(" ", "").split(",")  # the names the docs promise

    def matrix(path: Path, second: str) -> Path:
        path.write_text('engine = "external"\n' + "".join(
            f'[[config]]\nname = "{n}"\nendpoint = "{servers[s].url}"\n'
            for n, s in zip(names, ("good", second))))
        return path

    prompts, baseline = tmp_path / "set.jsonl", tmp_path / "baseline.json"
    _oracle_set(servers["good"], prompts)
    r = _niah("sweep", "--matrix", matrix(tmp_path / "base.toml", "good"), "--prompts", prompts,
              "--out", tmp_path / "base", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    # no index_topk label: an external server's labels are unattested, and gate refuses them
    assert _niah("baseline", "export", tmp_path / "base", "-o", baseline).returncode == 0
    env = {"NIAH_PROMPTS": str(prompts), "NIAH_BASELINE": str(baseline)}
    ok = _run_doc_job(job, tmp_path / "ok", {**env, "NIAH_MATRIX": str(matrix(tmp_path / "ok.toml", "good"))})
    assert not ok.failed, _logs(ok)
    lossy = _run_doc_job(job, tmp_path / "lossy", {**env, "NIAH_MATRIX": str(matrix(tmp_path / "bad.toml", "bad"))})
    assert [s.rc for s in lossy.steps] == [0, 1], _logs(lossy)
    suites = _junit(tmp_path / "lossy" / "runner-temp" / "niah-gate" / "gate.xml")
    failing = {name: [c for c, st in cases.items() if st == "failure"] for name, cases in suites.items()}
    assert failing == {f"niah gate: {names[0]}": [], f"niah gate: {names[1]}": ["length 2000", "all lengths"]}
    # the per-configuration loop: exit 1 (the worst of 0 and 1), one JUnit file per configuration
    (loop,) = [b for b in _blocks("bash") if "for c in" in b]
    temp = tmp_path / "lossy" / "runner-temp"
    r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", loop], cwd=ROOT, text=True,
                       capture_output=True, env={**_base_env(), **env, "RUNNER_TEMP": str(temp)})
    assert r.returncode == 1, r.stdout + r.stderr
    assert all((temp / "niah-gate" / f"{n}.xml").is_file() for n in names)


# -- action.yml: the gate for a user's own deployment ------------------------------------------
ACTION_USES = {"actions/setup-python", "actions/cache", "actions/upload-artifact"}
KEY = "sk-test-0123456789abcdef"  # long enough that niah's redaction would search for it anywhere


@pytest.fixture(scope="module")
def action() -> dict:
    return yaml.safe_load(ACTION.read_text(encoding="utf-8"))


def _docs_action_step() -> dict:
    """The step of docs/ci.md's "Gate my server" job that uses this repository's action."""
    job = _docs_job(lambda b: "uses: <owner>/<repo>@" in b and "jobs:" in b)
    (steps,) = [j["steps"] for j in job["jobs"].values()]
    (step,) = [s for s in steps if str(s.get("uses", "")).startswith("<owner>/<repo>@")]
    return step


def _with(step: dict, secrets: dict) -> dict:
    def one(v) -> str:
        m = re.fullmatch(r"\$\{\{\s*secrets\.(\w+)\s*\}\}", str(v))
        return secrets[m.group(1)] if m else str(v)

    return {k: one(v) for k, v in step["with"].items()}


def test_the_action_declares_its_inputs_and_installs_only_itself(action):
    inputs = action["inputs"]
    assert {"endpoint", "model", "baseline", "api-key", "lengths", "depths", "trials", "thresholds"} <= set(inputs)
    assert all(spec.get("description") for spec in inputs.values())
    assert {k for k, v in inputs.items() if v.get("required")} == {"endpoint", "baseline"}
    steps = action["runs"]["steps"]
    assert action["runs"]["using"] == "composite"
    assert {s["uses"].split("@")[0] for s in steps if "uses" in s} == ACTION_USES
    for s in steps:  # inputs reach scripts through env, never pasted into them (script injection)
        assert "${{" not in s.get("run", ""), s.get("name")
    (install,) = [s for s in steps if s.get("id") == "install"]
    pip = [ln for ln in install["run"].splitlines() if " pip install" in ln]
    assert pip == ['"$RUNNER_TEMP/niah-venv/bin/python" -m pip install --quiet "$GITHUB_ACTION_PATH"'], pip
    assert "GITHUB_WORKSPACE" not in install["run"] and " -e " not in install["run"]
    # every output names a step that exists
    ids = {s.get("id") for s in steps}
    for out in action["outputs"].values():
        assert re.fullmatch(r"\$\{\{ steps\.([\w-]+)\.outputs\.[\w-]+ \}\}", out["value"]).group(1) in ids
    # the docs' job and the README's snippet pass only inputs the action declares
    assert set(_docs_action_step()["with"]) <= set(inputs)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ((step,),) = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", readme, re.S)]
    assert step["uses"] == "<owner>/<repo>@<tag>" and set(step["with"]) <= set(inputs)
    assert {"endpoint", "baseline"} <= set(step["with"])


@pytest.fixture(scope="module")
def user_repo(tmp_path_factory, oracle_factory_module):
    """A user's repository (not this checkout): a frozen prompt set and two baselines, built
    against a healthy oracle behind an API key (no /tokenize: counted through usage)."""
    good = oracle_factory_module("--no-tokenize", "--api-key", KEY)
    ws = tmp_path_factory.mktemp("user-repo")
    (ws / "ci").mkdir()
    work = tmp_path_factory.mktemp("user-runs")
    _oracle_set(good, ws / "ci" / "niah-prompts.jsonl", api_key=KEY)
    key = {"NIAH_API_KEY": KEY}
    for name, args in (("niah-baseline.json", ("--prompts", ws / "ci" / "niah-prompts.jsonl")),
                       ("niah-baseline-args.json", ("--lengths", "1000,2000", "--depths", "10,50,90",
                                                    "--trials", "3", "--seed", "7"))):
        run = work / name
        r = _niah("sweep", *args, "--endpoint", good.url, "--out", run, "-q", env=key)
        assert r.returncode == 0, r.stdout + r.stderr
        assert _niah("baseline", "export", run, "-o", ws / "ci" / name).returncode == 0
    return ws, good


@pytest.fixture(scope="module")
def oracle_factory_module():
    from oracle_server import OracleServer

    servers = []

    def start(*flags):
        servers.append(OracleServer(*flags))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def _act(action: dict, ws: Path, temp: Path, inputs: dict, **kw):
    return run_action(action, ROOT, ws, temp, base_env=_base_env(), inputs=inputs, not_run=("install",), **kw)


def _artifact(job) -> Path:
    (up,) = [s for s in job.steps if (s.uses or "").startswith("actions/upload-artifact")]
    assert up.why == "uses", _logs(job)
    return Path(up.with_["path"])


def test_the_action_passes_a_healthy_server(action, user_repo, tmp_path):
    """docs/ci.md's job, its inputs as written (the secrets given), on the frozen prompt set."""
    ws, good = user_repo
    inputs = _with(_docs_action_step(), {"NIAH_ENDPOINT": good.url, "NIAH_API_KEY": KEY})
    inputs["extra-body"] = '{"chat_template_kwargs": {"thinking": false}}'
    job = _act(action, ws, tmp_path / "rt", inputs)
    assert not job.failed, _logs(job)
    manifest = json.loads((tmp_path / "rt" / "niah-run" / "manifest.json").read_text())
    assert '"thinking": false' in json.dumps(manifest)  # passed through as one argument
    skipped = {s.uses.split("@")[0] if s.uses else s.id for s in job.steps if s.status == "skipped"}
    assert skipped == ACTION_USES | {"install"}, _logs(job)
    assert job.outputs["check"]["skip"] == "false" and job.outputs["gate"]["exit-code"] == "0"
    assert "## niah gate: PASS" in job.summary and "paired by prompt hash" in job.summary
    assert set(_one_suite(tmp_path / "rt" / "niah-gate" / "gate.xml").values()) == {"pass"}
    cache = next(s for s in job.steps if (s.uses or "").startswith("actions/cache"))
    assert cache.with_["key"].startswith("niah-Linux-py") and "~/.cache/pip" in cache.with_["path"]
    art = _artifact(job)
    for f in ("niah-run/manifest.json", "niah-run/trials.jsonl", "niah-run/report/index.html",
              "niah-gate/gate.xml", "niah-gate/gate.md"):
        assert (art / f).is_file(), f
    files = [p for p in art.rglob("*") if p.is_file()]
    assert not [p for p in files if KEY.encode() in p.read_bytes()]
    assert not (ws / "niah-run").exists() and not list(ws.glob("results*"))  # nothing written into the repo


def test_the_action_fails_a_server_that_loses_the_needle(action, user_repo, oracle_factory, tmp_path):
    """No prompt set: the lengths, depths, trials and seed come from the baseline, so the
    prompts are the baseline's again and pair; the gate step fails with exit 1, and the
    report and the artifact are still made."""
    ws, _ = user_repo
    bad = oracle_factory("--no-tokenize", "--api-key", KEY, "--wrong-above", "1500")
    inputs = {**_with(_docs_action_step(), {"NIAH_ENDPOINT": bad.url, "NIAH_API_KEY": KEY}),
              "prompts": "", "baseline": "ci/niah-baseline-args.json"}
    job = _act(action, ws, tmp_path / "rt", inputs)
    (failed,) = [s for s in job.steps if s.status == "failure"]
    assert failed.id == "gate" and failed.rc == 1, _logs(job)
    assert job.outputs["gate"]["exit-code"] == "1"
    sweep = job.step("sweep")
    assert "--lengths 1000,2000 --depths 10,50,90 --trials 3" not in sweep.run  # read at run time, not pasted
    cases = _one_suite(tmp_path / "rt" / "niah-gate" / "gate.xml")
    assert cases["length 2000"] == "failure" and cases["length 1000"] == "pass"
    assert "## niah gate: REGRESSION" in job.summary and "paired by prompt hash" in job.summary
    report = next(s for s in job.steps if s.name == "Report")
    assert report.status == "success" and job.step("collect").status == "success"
    assert (_artifact(job) / "niah-run" / "report" / "summary.md").is_file()


def test_the_action_skips_a_fork_pull_request_without_secrets(action, user_repo, tmp_path):
    ws, _ = user_repo
    inputs = _with(_docs_action_step(), {"NIAH_ENDPOINT": "", "NIAH_API_KEY": ""})
    event = {"pull_request": {"head": {"repo": {"full_name": "someone/fork"}}}}
    job = _act(action, ws, tmp_path / "rt", inputs, event=event, event_name="pull_request",
               repository="owner/repo")
    assert not job.failed, _logs(job)
    check = job.step("check")
    assert check.status == "success" and job.outputs["check"]["skip"] == "true"
    assert "::notice title=niah gate skipped::a pull request from someone/fork gets no secrets" in check.log
    assert "## niah gate: skipped" in job.summary
    assert [s.status for s in job.steps[1:]] == ["skipped"] * (len(job.steps) - 1)


@pytest.mark.parametrize("change, event_name, words", [
    ({"NIAH_API_KEY": ""}, "push", "api-key is empty: pass it from a secret"),
    ({"NIAH_API_KEY": ""}, "pull_request", "api-key is empty"),  # from this repository: no skip
    ({"thresholds": "tol=0.1"}, "push", "thresholds: 'tol=0.1' is not NAME=VALUE"),
    ({"thresholds": "alpha=x"}, "push", "thresholds: 'alpha=x' has no number"),
    ({"lengths": "4k"}, "push", "prompts fixes lengths, depths and trials"),
    ({"baseline": "ci/none.json"}, "push", "baseline ci/none.json is not a file in the workspace"),
    ({"metric": "recall"}, "push", "metric is answer, rank or both"),
])
def test_the_action_refuses_bad_inputs_before_it_sweeps(action, user_repo, tmp_path, change, event_name, words):
    ws, good = user_repo
    secrets = {"NIAH_ENDPOINT": good.url, "NIAH_API_KEY": KEY}
    secrets.update({k: v for k, v in change.items() if k.startswith("NIAH_")})
    inputs = {**_with(_docs_action_step(), secrets), **{k: v for k, v in change.items() if not k.startswith("NIAH_")}}
    event = {"pull_request": {"head": {"repo": {"full_name": "owner/repo"}}}} if event_name == "pull_request" else {}
    job = _act(action, ws, tmp_path / "rt", inputs, event=event, event_name=event_name, repository="owner/repo")
    check = job.step("check")
    assert check.status == "failure" and check.rc == 2 and words in check.log, check.log
    assert all(s.status == "skipped" for s in job.steps if s is not check)
