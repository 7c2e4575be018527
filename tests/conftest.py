"""Shared pytest fixtures; each area keeps its own marked block."""

import importlib as _importlib
import os as _os
import subprocess as _subprocess
import sys as _sys
from pathlib import Path as _Path

import pytest as _pytest

# ---- optional dependencies: `make test` sets NIAH_REQUIRE_EXTRAS=1, and then a missing
# [serve]/[dev]/[kernels] extra is a failure, never a silently skipped test ----


def _strict_importorskip(modname, minversion=None, reason=None, **kw):
    """pytest.importorskip that raises instead of skipping (the module must be installed)."""
    return _importlib.import_module(modname)


def pytest_configure(config):
    if _os.environ.get("NIAH_REQUIRE_EXTRAS") == "1":
        _pytest.importorskip = _strict_importorskip
    # The Ctrl-C tests send SIGINT to a `niah` they start. A process started with SIGINT ignored
    # (a background job of a script, a pytest-xdist worker) hands that on to its children, and
    # Python then never raises KeyboardInterrupt in them; with a handler here they start with
    # SIGINT's default, as from a terminal, however the suite was launched.
    import signal as _signal

    if _signal.getsignal(_signal.SIGINT) == _signal.SIG_IGN:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    # pytest-xdist 3.8's loadgroup reads groups from node ids as pytest 8 keeps them; under pytest 9
    # the groups are silently ignored (see "parallel runs" below), so such a run stops at once.
    if getattr(config.option, "dist", "no") == "loadgroup" and int(_pytest.__version__.split(".")[0]) >= 9:
        raise _pytest.UsageError(f"--dist loadgroup needs pytest 8 here (pytest {_pytest.__version__} is "
                                 "installed): use the pytest that pyproject.toml's dev extra pins")
# ---- end optional dependencies ----

# ---- the embedded model's converted weights: cached in the checkout, not in $HOME, so a
# test run depends on no state outside it (the first run converts the GGUF, ~17 s) ----
_os.environ.setdefault("NIAH_CACHE", str(_Path(__file__).resolve().parents[1] / ".cache" / "niah"))

# ---- harness: the oracle server, a real OpenAI-compatible process on loopback ----
from oracle_server import OracleServer  # noqa: E402 - tests/oracle_server.py, beside the fixtures


@_pytest.fixture
def oracle_factory():
    """`start(*flags)` -> OracleServer; every server started is killed after the test."""
    servers: list[OracleServer] = []

    def start(*flags: str) -> OracleServer:
        s = OracleServer(*flags)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


@_pytest.fixture(scope="module")
def oracle():
    """One plain oracle server (perfect recall, max_model_len 65536) per test module."""
    s = OracleServer()
    yield s
    s.stop()
# ---- end harness ----

# ---- the committed CI prompt set, swept once per test run on the embedded server ----------
# .github/workflows/niah-gate.yml's job, run as written (tests/workflow_runner.py: its `run:`
# steps in order, the server its own step starts, NIAH_PORT a free port, the install step not
# run). tests/e2e/test_ci_workflow.py checks the job; tests/e2e/test_gate_selfgate.py gates the run
# folder it swept ($RUNNER_TEMP/niah-run) against the self-gate's baseline: both need a sweep
# of the same 30 prompts on the same server (DSA, fp8 index keys, top-k 128), made once here.
ROOT = _Path(__file__).resolve().parents[1]
CI_WORKFLOW = ROOT / ".github" / "workflows" / "niah-gate.yml"


def ci_base_env() -> dict:
    """This environment, `niah` first on PATH (what the install step gives), no runner variables."""
    env = {k: v for k, v in _os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_"))}
    env["PATH"] = str(_Path(_sys.executable).parent) + _os.pathsep + env.get("PATH", "")
    return env


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CIJob:
    """A finished run of the workflow's job: `job` (workflow_runner.JobRun) and `temp` (its RUNNER_TEMP)."""

    def __init__(self, job, temp: _Path):
        self.job, self.temp = job, temp
        self.run = temp / "niah-run"  # the sweep step's --out


@_pytest.fixture(scope="session")
def ci_healthy_job(tmp_path_factory) -> CIJob:
    """The workflow's job as committed (the healthy server), run once for the whole test run."""
    yaml = _pytest.importorskip("yaml")
    from workflow_runner import run_job

    workflow = yaml.safe_load(CI_WORKFLOW.read_text(encoding="utf-8"))
    (job_id,) = workflow["jobs"]
    temp = tmp_path_factory.mktemp("ci-healthy") / "runner-temp"
    job = run_job(workflow, job_id, ROOT, temp, base_env=ci_base_env(),
                  env_overrides={"NIAH_PORT": free_port()}, not_run=("install",))
    return CIJob(job, temp)
# ---- end CI prompt set ---------------------------------------------------------------------

# ---- one real matrix run with the indexer probe, shared by the modules that read one -------
# Embedded servers launched by a matrix, as the demo does: dense, and DSA with fp8 index keys
# at top-k 64 and 512; lengths 400 (at or below k = 512: no selection there) and 1000, one
# trial per cell plus the no-needle control. tests/e2e/test_indexer_sweep.py checks the trials,
# report, compare and gate on it; tests/report/test_report_html.py opens its report page in a browser.
INDEXER_MATRIX = """
engine = "embedded"
attention = "dsa"
index_dtype = "fp8"

[[config]]
name = "dense"
attention = "dense"

[axes]
index_topk = [64, 512]
"""


@_pytest.fixture(scope="session")
def indexer_run(tmp_path_factory) -> _Path:
    """The run folder of INDEXER_MATRIX's sweep (three embedded servers, 12 trials)."""
    _pytest.importorskip("torch")
    _pytest.importorskip("fastapi")
    from niah.serving.matrix import run_matrix
    from niah.sweep import SweepSpec

    root = tmp_path_factory.mktemp("indexer")
    (root / "m.toml").write_text(INDEXER_MATRIX)
    spec = SweepSpec(lengths=[400, 1000], depths=[50.0], trials=1, max_tokens=24, control=True)
    return run_matrix(root / "m.toml", spec, root / "run")
# ---- end indexer run -----------------------------------------------------------------------

# ---- embedded model servers (`niah serve`), one per set of flags for the whole test run ------
class EmbeddedServer:
    """`niah serve FLAGS` as a real subprocess on a free loopback port, ready ("ready on")."""

    def __init__(self, *flags: str, ready_timeout_s: float = 240.0):
        import threading
        import time

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + "/v1"
        cmd = [_sys.executable, "-m", "niah", "serve", *flags, "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = _subprocess.Popen(cmd, stdout=_subprocess.PIPE, stderr=_subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        ready = threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.lines.append(line)
                if "ready on" in line:
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + ready_timeout_s       # the first run converts the GGUF
        while not ready.is_set() and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if not ready.is_set():
            self.proc.kill()
            self.proc.wait()
            _pytest.fail(f"`niah serve {' '.join(flags)}` did not become ready:\n" + "".join(self.lines[-30:]))

    def stop(self) -> int:
        """SIGTERM (a clean shutdown); the exit code."""
        import signal
        import time

        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=60)
        except _subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        time.sleep(0.2)  # the pump thread reads the last lines
        return code


@_pytest.fixture(scope="session")
def embedded_server():
    """`get(*flags)` -> EmbeddedServer: the one server of those flags, started at its first use
    and shared by every test that asks for the same flags (order counts). A test that needs a
    server to die or restart starts its own. At the end each is stopped by SIGTERM, and must
    exit 0 and say "stopped"."""
    _pytest.importorskip("torch")
    _pytest.importorskip("fastapi")
    _pytest.importorskip("uvicorn")
    servers: dict[tuple[str, ...], EmbeddedServer] = {}

    def get(*flags) -> EmbeddedServer:
        key = tuple(map(str, flags))
        if key not in servers:
            servers[key] = EmbeddedServer(*key)
        return servers[key]

    yield get
    for key, s in servers.items():
        code = s.stop()
        assert code == 0, f"`niah serve {' '.join(key)}` exited {code} on SIGTERM:\n" + "".join(s.lines[-20:])
        assert any("stopped" in line for line in s.lines), "".join(s.lines[-20:])
# ---- end embedded model servers ------------------------------------------------------------

# ---- parallel runs (`make test` runs pytest-xdist: -n 2 --dist loadgroup) -----------------------
# The tests that use one of the session fixtures below (a swept run folder, the CI job's run, the
# Slurm daemons) are one unit of work, kept on one worker, so the fixture is built once for the
# run; a test module with a module-scoped fixture is one unit, so that fixture is built once;
# every other test (modules without one, the kernel tests, the modules whose module fixture only
# names the wheel or its unpacked tree) goes out one at a time. embedded_server's users ask for different
# flags (one server each), so they need no common unit. Units are handed out longest first (the
# order below, by their measured time on the 2-core machine; the rest after), so that no long unit
# starts last and alone: the tests of one 2-minute unit run last once kept one worker busy for
# 105 s after the other had finished. Without -n only the
# order of modules changes.
SHARED_FIXTURES = {"ci_healthy_job": "ci-job", "indexer_run": "indexer-run", "slurm": "slurm"}
LONGEST_FIRST = ["ci-job", "e2e/test_ci_workflow.py", "indexer-run", "sglang/test_sglang_v4.py",
                 "embedded/test_embedded_dsa.py", "embedded/test_embedded_server.py", "e2e/test_axes_embedded.py",
                 "slurm",
                 "e2e/test_lifecycle_embedded.py", "embedded/test_rotation.py", "sglang/test_sglang_v32.py",
                 "report/test_report.py", "matrix/test_lifecycle.py", "sglang/test_sglang_gpu_evidence.py",
                 "sglang/test_sglang_fp4.py", "sglang/test_sglang_kernels.py", "report/test_report_sweep.py",
                 "report/test_gate_coverage.py", "harness/test_package.py", "matrix/test_executor.py",
                 "report/test_report_html.py"]
PER_TEST = ("kernels/", "sglang/test_sglang_contract.py", "sglang/test_sglang_refusals.py")
_MODULE_FIXTURE = ("scope=\"module\"", "scope='module'")


def _rel(item) -> str:
    path = _Path(str(item.fspath)).resolve()
    try:
        return path.relative_to(_Path(__file__).resolve().parent).as_posix()
    except ValueError:  # a test outside this folder (a copy of this conftest elsewhere)
        return path.as_posix()


def _has_module_fixture(path: str, seen: dict = {}) -> bool:  # noqa: B006 - a cache per run
    if path not in seen:
        text = (_Path(__file__).resolve().parent / path).read_text(encoding="utf-8")   # absolute paths stay
        seen[path] = any(m in text for m in _MODULE_FIXTURE)
    return seen[path]


def _unit(item) -> str | None:
    shared = [SHARED_FIXTURES[f] for f in SHARED_FIXTURES if f in item.fixturenames]
    if shared:
        return shared[0]
    rel = _rel(item)
    return rel if not rel.startswith(PER_TEST) and _has_module_fixture(rel) else None


@_pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks into the node ids
def pytest_collection_modifyitems(config, items):
    units = {id(item): _unit(item) for item in items}
    for item in items:
        if units[id(item)] is not None:
            item.add_marker(_pytest.mark.xdist_group(units[id(item)]))
    rank = {u: i for i, u in enumerate(LONGEST_FIRST)}
    # stable: the rest keep their order; a module's tests sent one at a time rank as the module
    items.sort(key=lambda item: rank.get(units[id(item)] or _rel(item), len(rank)))
# ---- end parallel runs -----------------------------------------------------------------------
