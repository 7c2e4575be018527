"""The matrix's [executor] table: its checks and command-line overrides, the dry run's job
plan, and `local` with `gpus_per_config` on this CPU machine with a fake GPU list (the
placement: disjoint GPU sets, never two servers on one GPU; real tiny servers on loopback
print the CUDA_VISIBLE_DEVICES they were given). The slurm executor against a real Slurm
is tests/matrix/test_slurm.py."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from niah.errors import BadInput
from niah.serving.matrix import load_matrix, parse_matrix
from niah.serving.matrix.executor import Executor, override
from niah.serving.matrix.executors.local import gpu_slots

try:
    from tests.lifecycle_helpers import ROOT, read_manifest, read_trials, tiny_command, toml_list
except ImportError:
    from lifecycle_helpers import ROOT, read_manifest, read_trials, tiny_command, toml_list  # type: ignore

EXAMPLES = ROOT / "serving" / "examples"
BASE = 'engine = "embedded"\n[[config]]\nname = "dense"\nattention = "dense"\n'


def test_no_table_is_the_local_executor_as_before():
    m = parse_matrix(BASE, "m.toml")
    assert m.executor == Executor("local", {}) and not m.executor.spread


def test_the_table_is_read_and_checked_naming_the_line():
    m = parse_matrix(BASE + '[executor]\nkind = "slurm"\npartition = "gpu"\ntime = "04:00:00"\ngpus = 8\n'
                     'extra = ["--qos=high"]\n', "m.toml")
    assert m.executor.as_dict() == {"kind": "slurm", "partition": "gpu", "time": "04:00:00", "gpus": 8,
                                    "extra": ["--qos=high"]}
    assert m.executor.spread
    for table, msg in [
        ('kind = "k8s"', r"m.toml:6: executor kind must be one of 'local', 'slurm', not 'k8s'"),
        ('kind = "slurm"\ngpus_per_config = 2', r"m.toml:7: unknown key 'gpus_per_config' for executor 'slurm' "
                                                r"\(it is a key of executor 'local'\)"),
        ('kind = "slurm"\ntime = 04:00:00', r"m.toml:7: executor time must be a quoted time limit"),
        ('kind = "slurm"\nnodes = 0', r"m.toml:7: executor nodes must be an integer >= 1, not 0"),
        ('gpus = ["0", "1"]', r"m.toml:6: executor gpus lists GPUs to share out: set gpus_per_config too"),
        ('gpus_per_config = 1\ngpus = ["0", "0"]', r"m.toml:7: executor gpus must be a non-empty list of distinct"),
        ('configs_per_gpu = 2', r"m.toml:6: executor configs_per_gpu shares each GPU set among arms"),
        ('gpus_per_config = 1\nconfigs_per_gpu = 0', r"m.toml:7: executor configs_per_gpu must be an integer >= 1"),
    ]:
        with pytest.raises(BadInput, match=msg):
            parse_matrix(BASE + "[executor]\n" + table + "\n", "m.toml")


def test_the_command_line_overrides_the_table():
    file = Executor("slurm", {"partition": "gpu", "time": "60"})
    assert override(file, None, ["time=04:00:00", "gpus=4", 'extra=["--exclusive"]']).as_dict() == {
        "kind": "slurm", "partition": "gpu", "time": "04:00:00", "gpus": 4, "extra": ["--exclusive"]}
    assert override(file, "local", []) == Executor("local", {})  # another kind: the file's keys do not carry over
    assert override(Executor(), "slurm", ["account=team"]).as_dict() == {"kind": "slurm", "account": "team"}
    with pytest.raises(BadInput, match=r"--executor-set partition: unknown key 'partition' for executor 'local'"):
        override(Executor(), None, ["partition=gpu"])
    with pytest.raises(BadInput, match=r"write KEY=VALUE"):
        override(file, None, ["gpus"])


def test_gpu_sets_are_disjoint():
    assert gpu_slots(["0", "1", "2", "3", "4"], 2) == [("0", "1"), ("2", "3")]  # the fifth is left idle
    # configs_per_gpu: each set taken that many times, every set once before any twice
    assert gpu_slots(["0", "1", "2", "3"], 2, 2) == [("0", "1"), ("2", "3"), ("0", "1"), ("2", "3")]
    assert gpu_slots(["0"], 1, 3) == [("0",), ("0",), ("0",)]
    with pytest.raises(BadInput, match="gpus_per_config = 3, but only 2 GPU"):
        gpu_slots(["0", "1"], 3)


def test_dry_run_prints_the_slurm_job_scripts(tmp_path, capsys):
    from niah.serving.matrix.commands import print_matrix_commands

    out = tmp_path / "run"
    print_matrix_commands(EXAMPLES / "sglang.toml", executor=override(Executor(), "slurm", ["partition=gpu"]),
                          out=out)
    text = capsys.readouterr().out
    assert text.count("#!/bin/bash") == 4 and text.count("#SBATCH --gres=gpu:8") == 4  # tp = 8
    assert f"#SBATCH --output={out.resolve()}/parts/bf16-k1024/job.out" in text
    assert "#SBATCH --partition=gpu" in text and "-m niah.serving.matrix.job " in text
    assert not out.exists()  # nothing written


def test_dry_run_prints_the_local_placement(tmp_path, capsys, monkeypatch):
    from niah.serving.matrix.commands import print_matrix_commands

    m = tmp_path / "m.toml"
    m.write_text((EXAMPLES / "embedded.toml").read_text() + '\n[executor]\ngpus_per_config = 2\ngpus = [0, 1, 2, 3]\n')
    print_matrix_commands(m, out=tmp_path / "run")
    text = capsys.readouterr().out
    assert "2 configuration(s) at once on disjoint GPU sets (0,1; 2,3)" in text
    assert "# dense: CUDA_VISIBLE_DEVICES=0,1\n# fp8-k128: CUDA_VISIBLE_DEVICES=2,3\n" in text
    assert "# fp8-k512: waits for the first free slot" in text
    m.write_text((EXAMPLES / "embedded.toml").read_text() + '\n[executor]\ngpus_per_config = 1\ngpus = [0]\n'
                 'configs_per_gpu = 2\n')
    print_matrix_commands(m, out=tmp_path / "run")
    text = capsys.readouterr().out
    assert "2 configuration(s) at once on disjoint GPU sets, 2 a set (0; 0)" in text
    assert "# dense: CUDA_VISIBLE_DEVICES=0\n# fp8-k128: CUDA_VISIBLE_DEVICES=0\n" in text
    # planned where no GPU is listed or found: the plan says so instead of failing
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    m.write_text((EXAMPLES / "embedded.toml").read_text() + '\n[executor]\ngpus_per_config = 1\n')
    print_matrix_commands(m, out=tmp_path / "run")
    assert "# local executor: executor gpus_per_config: no GPU found" in capsys.readouterr().out


# -- local, gpus_per_config: placement on a fake GPU list ---------------------------------------
def test_gpus_per_config_runs_arms_at_once_on_disjoint_gpu_sets(tmp_path):
    from niah.runs.integrity import load_checked
    from niah.serving.matrix import run_matrix
    from niah.sweep import SweepSpec

    matrix = tmp_path / "m.toml"
    matrix.write_text('engine = "command"\n'
                      f"command = {toml_list(tiny_command('--delay', '0.3', '--print-env', 'CUDA_VISIBLE'))}\n"
                      "[axes]\nindex_topk = [1, 2, 3]\n"
                      '[executor]\ngpus_per_config = 2\ngpus = ["0", "1", "2", "3"]\n')
    run = run_matrix(matrix, SweepSpec(lengths=[200], depths=[0.0, 100.0], trials=1), tmp_path / "run")
    checked = load_checked(run)
    assert checked.problems == [] and len(checked.records) == 6  # one run folder, every arm's trials
    assert {r["outcome"] for r in checked.records} == {"correct"}
    m = read_manifest(run)
    spans, given = {}, {}
    for name in ("k1", "k2", "k3"):
        job = m["configs"][name]["job"]
        assert job["executor"] == "local" and job["state"] == "COMPLETED" and m["configs"][name]["status"] == "done"
        log = (run / "parts" / name / "logs" / f"{name}.log").read_text()
        seen = [ln.split("=", 1)[1] for ln in log.splitlines() if ln.startswith("env CUDA_VISIBLE_DEVICES=")]
        assert seen == [job["gpus"]]  # what the server was given is what the manifest says
        given[name] = set(job["gpus"].split(","))
        status = json.loads((run / "parts" / name / "job.status.json").read_text())
        spans[name] = (datetime.fromisoformat(status["started"]), datetime.fromisoformat(status["ended"]))
    assert all(len(g) == 2 and g <= {"0", "1", "2", "3"} for g in given.values())
    assert given["k1"].isdisjoint(given["k2"])  # the first two at once, on disjoint sets
    for a in given:
        for b in given:
            overlap = spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]
            if a < b and overlap:
                assert given[a].isdisjoint(given[b]), (a, b)  # never two servers on one GPU
    assert spans["k3"][0] >= min(spans["k1"][1], spans["k2"][1])  # the third waited for a free set
    assert m["executor"] == {"kind": "local", "gpus_per_config": 2, "gpus": ["0", "1", "2", "3"]}
    # a resume finds nothing missing and starts nothing
    run_matrix(matrix, SweepSpec(lengths=[200], depths=[0.0, 100.0], trials=1), run, resume=True)
    assert len(read_trials(run)) == 6 and read_manifest(run)["configs"]["k1"]["jobs"] == m["configs"]["k1"]["jobs"]


def test_configs_per_gpu_runs_arms_at_once_on_one_gpu(tmp_path):
    """configs_per_gpu = 2 on one GPU: both arms' servers are given it and run at once."""
    from niah.runs.integrity import load_checked
    from niah.serving.matrix import run_matrix
    from niah.sweep import SweepSpec

    matrix = tmp_path / "m.toml"
    matrix.write_text('engine = "command"\n'
                      f"command = {toml_list(tiny_command('--delay', '0.5', '--print-env', 'CUDA_VISIBLE'))}\n"
                      "[axes]\nindex_topk = [1, 2]\n"
                      '[executor]\ngpus_per_config = 1\ngpus = ["0"]\nconfigs_per_gpu = 2\n')
    run = run_matrix(matrix, SweepSpec(lengths=[200], depths=[0.0, 100.0], trials=1), tmp_path / "run")
    checked = load_checked(run)
    assert checked.problems == [] and len(checked.records) == 4
    spans = {}
    for name in ("k1", "k2"):
        job = read_manifest(run)["configs"][name]["job"]
        assert job["state"] == "COMPLETED" and job["gpus"] == "0"
        log = (run / "parts" / name / "logs" / f"{name}.log").read_text()
        assert "env CUDA_VISIBLE_DEVICES=0" in log.splitlines()
        status = json.loads((run / "parts" / name / "job.status.json").read_text())
        spans[name] = (datetime.fromisoformat(status["started"]), datetime.fromisoformat(status["ended"]))
    assert spans["k1"][0] < spans["k2"][1] and spans["k2"][0] < spans["k1"][1]  # at once, not one after the other


def test_the_local_executor_without_gpus_per_config_keeps_the_plain_run_folder(tmp_path):
    from niah.serving.matrix import run_matrix
    from niah.sweep import SweepSpec

    matrix = tmp_path / "m.toml"
    matrix.write_text(f'engine = "command"\ncommand = {toml_list(tiny_command())}\n[[config]]\nname = "a"\n'
                      '[executor]\nkind = "local"\n')
    run = run_matrix(matrix, SweepSpec(lengths=[200], depths=[50.0], trials=1), tmp_path / "run")
    assert not (run / "parts").exists() and len(read_trials(run)) == 1
    assert "job" not in read_manifest(run)["configs"]["a"]
    assert load_matrix(matrix).executor == Executor("local", {})


def test_cli_refuses_executor_options_without_a_matrix():
    from cli_inproc import niah

    r = niah("sweep", "--executor", "slurm", "--endpoint", "http://127.0.0.1:9/v1")
    assert r.returncode == 2 and r.stderr.strip() == "niah: error: --executor and --executor-set need --matrix"


def test_a_slurm_dry_run_from_the_command_line(tmp_path):
    from cli_inproc import niah

    r = niah("sweep", "--matrix", str(EXAMPLES / "sglang.toml"), "--executor", "slurm", "--executor-set",
             "time=04:00:00", "--dry-run", "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("#SBATCH --time=04:00:00") == 4 and not Path(tmp_path / "run").exists()
