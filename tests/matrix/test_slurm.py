"""The matrix's slurm executor against a real single-node Slurm (Debian's slurmctld, slurmd,
munge) started here as root: embedded-server arms end to end into one run folder, a job
cancelled with scancel recorded with its cause and finished by --resume, Ctrl-C cancelling
what niah submitted.

The cluster (`slurm` fixture, once per test run, idempotent: daemons already running with
this configuration are reused and left running) is one node named after this host, its
CPUs, four fake GPUs (gres over /dev/fakegpuN character devices, so jobs get disjoint
CUDA_VISIBLE_DEVICES), its own SLURM_CONF in a state folder. `make slurm` installs the
packages (.ci/run calls it). Without them, or without root, the tests fail under
NIAH_REQUIRE_EXTRAS=1 (`make test`) and skip saying why otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from tests.lifecycle_helpers import ROOT, read_manifest, read_trials, session_members, tiny_command, toml_list, \
        wait_for
except ImportError:
    from lifecycle_helpers import ROOT, read_manifest, read_trials, session_members, tiny_command, toml_list, \
        wait_for  # type: ignore

STATE = Path(os.environ.get("NIAH_TEST_SLURM_DIR", "/var/tmp/niah-test-slurm"))
BINARIES = ("slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo", "munged", "munge", "unmunge")
GPUS = 4


def _unavailable() -> str | None:
    if not sys.platform.startswith("linux"):
        return "a local Slurm runs on Linux only"
    missing = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing): `make slurm` installs it (apt, as root)"
    if os.geteuid() != 0:
        return "a local Slurm is started as root (slurmd, munged); run the tests as root"
    return None


def _sh(*argv: str, check: bool = False, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr or r.stdout}")
    return r


def _munge_up() -> bool:
    return subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0


def _start_munge() -> None:
    if _munge_up():
        return
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    shutil.chown(key, "munge", "munge")
    key.chmod(0o400)
    for d in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        os.makedirs(d, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    _sh("runuser", "-u", "munge", "--", shutil.which("munged") or "/usr/sbin/munged", check=True)
    wait_for(_munge_up, timeout=30, what="munged to answer")


def _conf(host: str) -> str:
    cpus = os.cpu_count() or 1
    return "\n".join([
        "ClusterName=niahtest", f"SlurmctldHost={host}", "SlurmUser=root", "AuthType=auth/munge",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "GresTypes=gpu", "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none",
        f"StateSaveLocation={STATE}/state", f"SlurmdSpoolDir={STATE}/spool",
        f"SlurmctldPidFile={STATE}/slurmctld.pid", f"SlurmdPidFile={STATE}/slurmd.pid",
        f"SlurmctldLogFile={STATE}/slurmctld.log", f"SlurmdLogFile={STATE}/slurmd.log",
        "ReturnToService=2", "MinJobAge=600", "KillWait=5", "SchedulerType=sched/builtin",
        f"NodeName={host} CPUs={cpus} RealMemory=1000 Gres=gpu:{GPUS} State=UNKNOWN",
        f"PartitionName=niah Nodes={host} Default=YES MaxTime=INFINITE State=UP", ""])


def _alive(pidfile: Path) -> bool:
    try:
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def _node_state(env: dict) -> str:
    return _sh("sinfo", "-h", "-o", "%T", env=env).stdout.strip()


def start_cluster() -> dict:
    """Start (or reuse) munge + slurmctld + slurmd for this host; the environment to use it."""
    host = socket.gethostname().split(".")[0]
    for d in ("state", "spool"):
        (STATE / d).mkdir(parents=True, exist_ok=True)
    conf = STATE / "slurm.conf"
    text = _conf(host)
    changed = not conf.exists() or conf.read_text() != text
    conf.write_text(text)
    (STATE / "gres.conf").write_text(f"Name=gpu File=/dev/fakegpu[0-{GPUS - 1}]\n")
    for i in range(GPUS):
        if not Path(f"/dev/fakegpu{i}").exists():
            _sh("mknod", f"/dev/fakegpu{i}", "c", "1", "3", check=True)  # like /dev/null: a device to hand out
    env = {**os.environ, "SLURM_CONF": str(conf)}
    _start_munge()
    for daemon in ("slurmctld", "slurmd"):
        pidfile = STATE / f"{daemon}.pid"
        if changed and _alive(pidfile):
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)
            wait_for(lambda: not _alive(pidfile), timeout=30, what=f"the old {daemon} to stop")
        if not _alive(pidfile):
            _sh(shutil.which(daemon) or f"/usr/sbin/{daemon}", "-f", str(conf), env=env, check=True)
    state = wait_for(lambda: _node_state(env) or None, timeout=60, what="sinfo to answer")
    if state.rstrip("*") not in ("idle", "mixed", "allocated"):
        _sh("scontrol", "update", f"NodeName={host}", "State=RESUME", env=env)
    wait_for(lambda: _node_state(env).rstrip("*") in ("idle", "mixed", "allocated"), timeout=60,
             what=f"node {host} to be up (sinfo: {_node_state(env)!r}; logs in {STATE})")
    return env


@pytest.fixture(scope="session")
def slurm():
    why = _unavailable()
    if why:
        if os.environ.get("NIAH_REQUIRE_EXTRAS") == "1":
            pytest.fail(f"the Slurm tests cannot run: {why}")
        pytest.skip(why)
    env = start_cluster()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = env["SLURM_CONF"]  # sbatch / scontrol / scancel of niah in this process
    yield env
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


def scontrol_state(job_id: str) -> str:
    out = _sh("scontrol", "show", "job", "-o", job_id).stdout
    return next((f.split("=", 1)[1] for f in out.split() if f.startswith("JobState=")), "")


def job_of(run: Path, name: str) -> dict:
    return (read_manifest(run).get("configs", {}).get(name) or {}).get("job") or {}


def sweep(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "niah", "sweep", *args, "--quiet"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


SLURM = '\n[executor]\nkind = "slurm"\ngpus = 1\ntime = "10"\npoll_s = 0.5\n'


# -- embedded-server arms, end to end ---------------------------------------------------------
def test_embedded_arms_run_as_slurm_jobs_into_one_run_folder(slurm, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("fastapi")
    from cli_inproc import niah

    from niah.runs.integrity import load_checked
    from niah.serving.matrix import run_matrix
    from niah.sweep import SweepSpec

    matrix = tmp_path / "m.toml"
    matrix.write_text('engine = "embedded"\nattention = "dsa"\nindex_dtype = "fp8"\n'
                      '[[config]]\nname = "dense"\nattention = "dense"\n'
                      '[[config]]\nname = "fp8-k64"\nindex_topk = 64\n' + SLURM)
    run = run_matrix(matrix, SweepSpec(lengths=[300], depths=[50.0], trials=1, max_tokens=16), tmp_path / "run")
    checked = load_checked(run)
    assert checked.problems == []
    assert sorted(r["config"] for r in checked.records) == ["dense", "fp8-k64"]  # both jobs' trials, one folder
    assert all(r["outcome"] != "error" for r in checked.records), checked.records  # answered: no outage
    m = checked.manifest
    assert m["executor"] == {"kind": "slurm", "gpus": 1, "time": "10", "poll_s": 0.5}
    host = socket.gethostname().split(".")[0]
    ids = set()
    for name in ("dense", "fp8-k64"):
        entry = m["configs"][name]
        job = entry["job"]
        assert job["executor"] == "slurm" and job["id"].isdigit() and job["state"] == "COMPLETED"
        assert job["nodes"] == host and job["gpus"] in {str(i) for i in range(GPUS)}
        assert "cause" not in job and entry["status"] == "done"
        assert entry["attestation_verdict"]["state"] == "valid"  # the part's attestation, merged
        assert Path(entry["log"]) == run / "parts" / name / "logs" / f"{name}.log"
        assert scontrol_state(job["id"]) == "COMPLETED"
        script = (run / "parts" / name / "job.sh").read_text()
        assert "#SBATCH --gres=gpu:1" in script and "#SBATCH --time=10" in script
        ids.add(job["id"])
    assert len(ids) == 2
    # one run folder, read as a local run's: report and compare across the two jobs
    r = niah("compare", str(run), "--a", "dense", "--b", "fp8-k64")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dense" in r.stdout and "fp8-k64" in r.stdout
    r = niah("report", str(run), "--out", str(tmp_path / "report"))
    assert r.returncode == 0, r.stdout + r.stderr
    summary = (tmp_path / "report" / "summary.md").read_text(encoding="utf-8")
    for name in ("dense", "fp8-k64"):  # each job's configuration has its headline and heatmap
        assert f"- `{name}`:" in summary, summary[:2000]
        assert (tmp_path / "report" / f"heatmap_{name}.png").is_file()


# -- a job cancelled under niah, then resumed ---------------------------------------------------
def slow_matrix(path: Path, *names: str, delay: float = 0.6) -> Path:
    path.write_text('engine = "command"\n'
                    f"command = {toml_list(tiny_command('--delay', str(delay)))}\n"
                    + "".join(f'[[config]]\nname = "{n}"\n' for n in names) + SLURM)
    return path


def test_a_cancelled_job_is_recorded_with_its_cause_and_resume_finishes_it(slurm, tmp_path):
    matrix = slow_matrix(tmp_path / "m.toml", "quick", "slow")
    matrix.write_text(matrix.read_text().replace('name = "quick"\n', 'name = "quick"\n'
                                                 f"command = {toml_list(tiny_command())}\n"))
    run = tmp_path / "run"
    args = ["--matrix", str(matrix), "--lengths", "200", "--depths", "0:100:6", "--trials", "1", "--out", str(run)]
    proc = sweep(*args)
    try:
        job_id = wait_for(lambda: job_of(run, "slow").get("id"), what="the slow job's submission")
        wait_for(lambda: read_trials(run / "parts" / "slow"), what="the slow job's first trial")
        _sh("scancel", job_id, check=True)  # as a user or the cluster would
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out  # trials without an answer: exit 1, --resume offered
    assert "--resume" in out
    entry = read_manifest(run)["configs"]["slow"]
    cause = f"slurm job {job_id} CANCELLED"
    assert entry["job"]["state"] == "CANCELLED" and entry["job"]["cause"].startswith(cause)
    assert entry["status"] == "cancelled" and entry["cause"].startswith(cause)
    assert scontrol_state(job_id) == "CANCELLED"
    slow = [r for r in read_trials(run) if r["config"] == "slow"]
    assert len(slow) == 6 and any(r["outcome"] == "correct" for r in slow)  # what it answered is kept
    errors = [r for r in slow if r["outcome"] == "error"]
    assert errors and {r["error"] for r in errors} == {entry["cause"]}
    quick_job = job_of(run, "quick")
    assert quick_job["state"] == "COMPLETED"
    assert {r["outcome"] for r in read_trials(run) if r["config"] == "quick"} == {"correct"}
    pid = read_manifest(run / "parts" / "slow")["configs"]["slow"]["pid"]
    assert session_members(pid) == []  # the cancelled job stopped its server

    # --resume submits only the missing configuration and finishes it
    proc = sweep(*args, "--resume")
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    m = read_manifest(run)
    assert m["configs"]["quick"]["job"] == quick_job  # not submitted again
    jobs = m["configs"]["slow"]["jobs"]
    assert [j["state"] for j in jobs] == ["CANCELLED", "COMPLETED"] and jobs[0]["id"] == job_id
    assert m["configs"]["slow"]["status"] == "done" and "resumed" in m
    recs = read_trials(run)
    assert len(recs) == 12 and {r["outcome"] for r in recs} == {"correct"}
    assert len({(r["config"], r["depth"]) for r in recs}) == 12  # never a trial twice
    archived = (run / "trials.errors.jsonl").read_text().splitlines()
    assert len(archived) == len(errors)


# -- Ctrl-C ---------------------------------------------------------------------------------------
def test_ctrl_c_cancels_the_jobs_niah_submitted(slurm, tmp_path):
    run = tmp_path / "run"
    matrix = slow_matrix(tmp_path / "m.toml", "a", "b", delay=2.0)
    # many trials: the jobs must still be running when the test sees a trial of each (it then interrupts)
    proc = sweep("--matrix", str(matrix), "--lengths", "200", "--depths", "0:100:2", "--out", str(run))
    try:
        def running():
            jobs = [job_of(run, n) for n in ("a", "b")]
            return [j["id"] for j in jobs] if all(j.get("state") == "RUNNING" for j in jobs) else None

        ids = wait_for(running, what="both jobs running")
        wait_for(lambda: all(read_trials(run / "parts" / n) for n in ("a", "b")), what="a trial of each job")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out
    assert "interrupted" in out and "cancelling 2 slurm job(s)" in out
    for job_id in ids:
        assert wait_for(lambda: scontrol_state(job_id) in ("CANCELLED", "COMPLETED") and scontrol_state(job_id),
                        what="the job to end") == "CANCELLED"
    m = read_manifest(run)
    for n in ("a", "b"):
        job = m["configs"][n]["job"]
        assert job["state"] == "CANCELLED" and job["cause"] == "cancelled by niah: interrupted (SIGINT)"
        assert m["configs"][n]["status"] == "cancelled"
        pid = read_manifest(run / "parts" / n)["configs"][n]["pid"]
        assert wait_for(lambda: session_members(pid) == [], what="the job's server to stop")
    recs = read_trials(run)
    assert recs and {r["outcome"] for r in recs} == {"correct"}  # finished trials kept, no error invented
    assert json.loads((run / "parts" / "a" / "job.status.json").read_text())["exit"] in (130, 143)


# -- a job that fails -----------------------------------------------------------------------------
def test_a_failed_job_is_recorded_with_its_cause(slurm, tmp_path):
    from niah.serving.matrix import run_matrix
    from niah.sweep import SweepSpec

    matrix = slow_matrix(tmp_path / "m.toml", "broken")
    matrix.write_text(matrix.read_text() + 'setup = ["echo no such environment >&2", "exit 3"]\n')
    run = run_matrix(matrix, SweepSpec(lengths=[200], depths=[50.0], trials=1), tmp_path / "run")
    entry = read_manifest(run)["configs"]["broken"]
    job = entry["job"]
    assert job["state"] == "FAILED" and job["exit_code"] == "3:0"
    assert job["cause"] == f"slurm job {job['id']} FAILED: NonZeroExitCode; exit code 3:0; no such environment"
    assert entry["status"] == "failed" and entry["cause"] == job["cause"]
    (rec,) = read_trials(run)
    assert rec["outcome"] == "error" and rec["error"] == job["cause"]
