"""Engines and executors are one module plus one registry line: a throwaway executor and a
throwaway engine, registered from this file, run a real matrix (tiny HTTP servers on
loopback, real job processes), and an unknown name is one error listing the registered ones."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from niah.errors import BadInput
from niah.serving.matrix import parse_matrix, run_matrix
from niah.serving.matrix.backends import JobInfo, job_command
from niah.serving.matrix.engines import ENGINES, Engine, register_engine
from niah.serving.matrix.executor import Executor, override
from niah.serving.matrix.executors import EXECUTORS, register_executor
from niah.serving.matrix.executors.base import ExecutorKind, one_line
from niah.serving.matrix.keys import int_range
from niah.runs.parts import JOB_OUTPUT, part_dir
from niah.sweep import SweepSpec

try:
    from tests.lifecycle_helpers import read_manifest, read_trials, tiny_command, toml_list
except ImportError:
    from lifecycle_helpers import read_manifest, read_trials, tiny_command, toml_list  # type: ignore


# -- a throwaway executor: each job is the job's command as a plain subprocess ------------------
class SubprocessBackend:
    tool = "subprocess"
    poll_s = 0.2
    reattaches = False

    def __init__(self, settings: dict, out: Path, gpus: dict | None = None):
        self.out, self.procs = Path(out), {}

    def check(self) -> None:
        pass

    def record(self, name: str) -> dict:
        return {}

    def submit(self, name: str) -> str:
        job_id = f"sub-{len(self.procs) + 1}"
        with open(part_dir(self.out, name) / JOB_OUTPUT, "ab") as log:
            self.procs[job_id] = subprocess.Popen(job_command(self.out, name), stdin=subprocess.DEVNULL, stdout=log,
                                                  stderr=subprocess.STDOUT, start_new_session=True)
        return job_id

    def poll(self, ids: list[str]) -> dict[str, JobInfo]:
        out = {}
        for job_id in ids:
            rc = self.procs[job_id].poll()
            out[job_id] = JobInfo("RUNNING") if rc is None else JobInfo("COMPLETED" if rc == 0 else "FAILED",
                                                                        exit_code=str(rc))
        return out

    def cancel(self, ids: list[str]) -> None:
        for job_id in ids:
            self.procs[job_id].terminate()
            self.procs[job_id].wait()

    def adopt(self, job_id: str, name: str) -> None:
        pass

    def gpus_of(self, job_id: str) -> str | None:
        return None


def _plan(matrix, settings, out, file) -> None:
    print(f"\n# subprocess executor ({settings.get('label', 'no label')}): one process per configuration", file=file)


SUBPROCESS = ExecutorKind("subprocess", {"label": one_line}, spread=lambda settings: True,
                          backend=SubprocessBackend, print_plan=_plan)


# -- a throwaway engine: the tiny server, its top-k a flag of its own -------------------------
def _tiny(cfg, port):
    argv = tiny_command("--delay", str(cfg.settings.get("delay_ms", 0) / 1000))
    return [a.replace("{port}", str(port)) for a in argv], cfg.env


TINY = Engine("tiny", {"index_topk": int_range(1), "delay_ms": int_range(0)}, command=_tiny)


@pytest.fixture
def registered():
    register_executor(SUBPROCESS)
    register_engine(TINY)
    yield
    EXECUTORS.pop("subprocess", None)
    ENGINES.pop("tiny", None)


def test_a_registered_executor_runs_a_real_matrix(registered, tmp_path, capsys):
    matrix = tmp_path / "m.toml"
    matrix.write_text(f'engine = "command"\ncommand = {toml_list(tiny_command())}\n[axes]\nindex_topk = [1, 2]\n')
    executor = override(Executor(), "subprocess", ["label=throwaway"])
    assert executor.spread and executor.as_dict() == {"kind": "subprocess", "label": "throwaway"}

    from niah.serving.matrix.commands import print_matrix_commands

    print_matrix_commands(matrix, executor=executor, out=tmp_path / "plan")
    assert "# subprocess executor (throwaway): one process per configuration" in capsys.readouterr().out

    run = run_matrix(matrix, SweepSpec(lengths=[200], depths=[0.0, 100.0], trials=1), tmp_path / "run",
                     executor=executor)
    trials = read_trials(run)
    assert len(trials) == 4 and {t["outcome"] for t in trials} == {"correct"}
    m = read_manifest(run)
    assert m["executor"] == {"kind": "subprocess", "label": "throwaway"}
    for name in ("k1", "k2"):
        job = m["configs"][name]["job"]
        assert job["executor"] == "subprocess" and job["state"] == "COMPLETED" and job["id"].startswith("sub-")
        assert m["configs"][name]["status"] == "done"
        assert (run / "parts" / name / "trials.jsonl").is_file()  # the job wrote its own part


def test_a_registered_engine_is_parsed_and_launched(registered, tmp_path):
    matrix = tmp_path / "m.toml"
    matrix.write_text('engine = "tiny"\ndelay_ms = 1\n[axes]\nindex_topk = [1, 2]\n')
    with pytest.raises(BadInput, match=r"m.toml:2: unknown key 'window' for engine 'tiny'"):
        parse_matrix('engine = "tiny"\nwindow = 4\n[[config]]\nname = "a"\n', "m.toml")
    run = run_matrix(matrix, SweepSpec(lengths=[200], depths=[50.0], trials=1), tmp_path / "run")
    assert {t["config"]: t["outcome"] for t in read_trials(run)} == {"k1": "correct", "k2": "correct"}
    assert read_manifest(run)["configs"]["k1"]["engine"] == "tiny"


def test_unknown_names_list_the_registered_ones(registered):
    with pytest.raises(BadInput, match=r"^m.toml:1: unknown engine 'vllm' "
                                       r"\(engines: embedded, sglang, external, command, tiny\)$"):
        parse_matrix('engine = "vllm"\n[[config]]\nname = "a"\n', "m.toml")
    with pytest.raises(BadInput, match=r"^m.toml:3: executor kind must be one of 'local', 'slurm', 'subprocess', "
                                       r"not 'k8s'$"):
        parse_matrix('engine = "tiny"\n[executor]\nkind = "k8s"\n[[config]]\nname = "a"\n', "m.toml")
    assert parse_matrix('engine = "tiny"\n[executor]\nkind = "subprocess"\n[[config]]\nname = "a"\n',
                        "m.toml").executor == Executor("subprocess", {})
