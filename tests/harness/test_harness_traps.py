"""Traps a new user hit: each test here fails on the code before it."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from niah.runs.trials import load_run, read_trials
from niah.sweep import SweepSpec, Target, run_sweep

ROOT = Path(__file__).resolve().parents[2]


def niah(*args, **kw):
    from cli_inproc import niah as run  # the entry point in this process (tests/cli_inproc.py)

    return run(*args, **kw)


def one_line_exit_2(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("niah: error:"), r.stderr
    return lines[0]


# -- part 3: no counter is trusted unchecked -----------------------------------------------------
@pytest.mark.parametrize("shape", ["odd", "zero"])
def test_tokenize_of_an_unknown_shape_or_zero_counts_is_not_a_tokenizer(oracle_factory, tmp_path, shape):
    srv = oracle_factory("--tokenize-shape", shape)
    line = one_line_exit_2(niah("sweep", "--endpoint", srv.url, "--tokenizer", "server", "--lengths", "500",
                                "--out", tmp_path / "x"))
    assert "is not a tokenizer" in line
    run_sweep([Target(srv.url)], SweepSpec(lengths=[700], depths=[50], trials=1), tmp_path / "auto")
    manifest, (rec,) = load_run(tmp_path / "auto")
    cfg = manifest["configs"]["default"]
    assert cfg["tokenizer"] == "usage" and rec["prompt_tokens"] == 700  # auto moved on to usage
    assert cfg["tokenizer_check"]["tried"][0]["tokenizer"] == "server"


def test_a_counter_that_disagrees_with_usage_is_not_used(oracle_factory, tmp_path):
    srv = oracle_factory("--tokenize-shape", "off")  # /tokenize answers, 25 tokens off
    line = one_line_exit_2(niah("sweep", "--endpoint", srv.url, "--tokenizer", "server", "--lengths", "500",
                                "--out", tmp_path / "x"))
    assert "--tokenizer server is not exact" in line and "counted 300 tokens where the server counts 275" in line
    run_sweep([Target(srv.url)], SweepSpec(lengths=[600], depths=[50], trials=1), tmp_path / "auto")
    manifest, (rec,) = load_run(tmp_path / "auto")
    check = manifest["configs"]["default"]["tokenizer_check"]
    assert manifest["configs"]["default"]["tokenizer"] == "usage" and abs(rec["prompt_tokens"] - 600) <= 4
    assert check["tried"][0] == {"tokenizer": "server", "ok": False,
                                 "note": "counted 300 tokens where the server counts 275"}


def test_a_counter_the_server_cannot_check_is_refused(oracle_factory, tmp_path):
    srv = oracle_factory("--no-usage")
    line = one_line_exit_2(niah("sweep", "--endpoint", srv.url, "--lengths", "500", "--out", tmp_path / "x"))
    assert "usage.prompt_tokens" in line and "--approximate-lengths" in line


def test_a_sweep_that_drifts_stops_after_the_first_such_trial(oracle_factory, tmp_path):
    """Prompts built for one server, sent to another whose template differs: stop early."""
    a, b = oracle_factory(), oracle_factory("--tokenize-text-only")
    set_file = tmp_path / "set.jsonl"
    r = niah("prompts", "build", "--endpoint", a.url, "--lengths", "600,900", "--depths", "0,100",
             "--trials", "2", "--mode", "completion", "--out", set_file)
    assert r.returncode == 0, r.stderr
    text = set_file.read_text().replace("\\nAnswer:", "\\nAnswer: " + "word " * 30)  # what another template adds
    lines = []
    from niah.prompts.builder import prompt_sha256

    for ln in text.splitlines():
        e = json.loads(ln)
        e["prompt_sha256"] = prompt_sha256("completion", None, e["prompt"])
        lines.append(json.dumps(e))
    set_file.write_text("\n".join(lines) + "\n")
    r = niah("sweep", "--endpoint", b.url, "--prompts", set_file, "--out", tmp_path / "run", "-q")
    assert r.returncode == 2 and "off by" in r.stderr and "--approximate-lengths" in r.stderr, r.stderr
    recs = read_trials(tmp_path / "run").records
    assert len(recs) == 1 and recs[0]["prompt_tokens"] - recs[0]["length"] > 4  # saved, with the numbers
    r = niah("sweep", "--endpoint", b.url, "--prompts", set_file, "--out", tmp_path / "run", "-q",
             "--resume", "--approximate-lengths")
    assert r.returncode == 0, r.stderr
    assert len(read_trials(tmp_path / "run").records) == 8 and "8 of 8 trials outside" in r.stdout


# -- part 4 ---------------------------------------------------------------------------------
def test_resume_against_another_model_is_refused(oracle, tmp_path):
    out = tmp_path / "run"
    run_sweep([Target(oracle.url)], SweepSpec(lengths=[400], depths=[50], trials=1), out)
    m = json.loads((out / "manifest.json").read_text())
    m["configs"]["default"]["model"] = "another-model"  # as if the run had been against another server
    (out / "manifest.json").write_text(json.dumps(m))
    args = ["sweep", "--endpoint", oracle.url, "--lengths", "400", "--depths", "50", "--trials", "2",
            "--out", out, "--resume", "-q"]
    line = one_line_exit_2(niah(*args))
    assert "was measured at model another-model" in line
    assert niah(*args, "--force-config").returncode == 0


def test_matrix_refuses_endpoint_model_and_api_key(tmp_path):
    matrix = tmp_path / "m.toml"
    matrix.write_text('engine = "external"\n[[config]]\nname = "a"\nendpoint = "http://127.0.0.1:9/v1"\n')
    for flag, value in (("--endpoint", "http://127.0.0.1:1/v1"), ("--model", "m"), ("--api-key", "k")):
        line = one_line_exit_2(niah("sweep", "--matrix", matrix, flag, value, "--out", tmp_path / "run"))
        assert f"{flag} would be ignored" in line


def test_two_sweeps_on_one_run_folder_the_second_refuses_naming_the_holder(oracle_factory, tmp_path):
    srv = oracle_factory("--delay", "0.3")
    out = tmp_path / "run"
    args = ["sweep", "--endpoint", srv.url, "--lengths", "300", "--depths", "0,50,100", "--trials", "3",
            "--out", out, "--quiet"]
    first = subprocess.Popen([sys.executable, "-m", "niah", *map(str, args)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (out / "trials.jsonl").exists():
            time.sleep(0.05)
        line = one_line_exit_2(niah(*args, "--resume"))
        assert "in use by another sweep" in line and f"pid {first.pid}" in line
        first.kill()  # kill -9: a stale lock file is left behind
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert (out / ".niah.lock").exists()
    r = niah(*args, "--resume")  # a stale lock does not block
    assert r.returncode == 0, r.stderr
    recs = read_trials(out).records
    assert len(recs) == 9 and len({(x["depth"], x["trial"]) for x in recs}) == 9


def _run_with_late_first_config(tmp_path: Path) -> Path:
    """A run whose matrix order is [fast-a, slow-b] but whose trials finished b first."""
    from niah.runs.manifest import write_manifest

    run = tmp_path / "run"
    run.mkdir()
    write_manifest(run, {"args": {}, "configs": {"fast-a": {}, "slow-b": {}},
                         "matrix": {"configs": ["fast-a", "slow-b"]}})
    lines = []
    for cfg, outcome in (("slow-b", "wrong"), ("fast-a", "correct")):
        for t in range(4):
            lines.append({"schema_version": 1, "config": cfg, "length": 500, "depth": 50.0, "trial": t,
                          "seed": t, "prompt_sha256": f"h{t}", "outcome": outcome, "correct": outcome == "correct"})
    (run / "trials.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def test_compare_direction_follows_the_matrix_not_finishing_order(tmp_path):
    run = _run_with_late_first_config(tmp_path)
    r = niah("compare", run)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# B: slow-b vs A: fast-a")
    assert "-100.0" in r.stdout  # B - A
    r = niah("compare", run, "--a", "slow-b", "--b", "fast-a")
    assert r.stdout.startswith("# B: fast-a vs A: slow-b")


def test_gate_unwritable_step_summary_is_exit_2_not_a_regression(tmp_path):
    baseline = ROOT / "results" / "baselines" / "embedded-selfgate.json"
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(tmp_path / "no-such-dir" / "summary.md")}
    r = niah("gate", "--baseline", baseline, "--candidate", baseline, env=env)
    line = one_line_exit_2(r)
    assert "GITHUB_STEP_SUMMARY" in line


def test_depth_ranges_say_count_and_accept_steps():
    from niah.sweep.spec import parse_depths

    assert parse_depths("0:100/10") == [float(x) for x in range(0, 101, 10)]
    assert len(parse_depths("0:100:10")) == 10
    help_text = " ".join(niah("sweep", "--help", env={**os.environ, "COLUMNS": "300"}).stdout.replace("│", " ").split())
    assert "N is a count, not a step (10:90:5 is 10, 30, 50, 70, 90)" in help_text
    assert "0:100/10 is 0, 10, ..., 100" in help_text


def test_prompt_counts_like_the_sweep_with_the_same_options(oracle_factory, tmp_path):
    """`niah prompt` counts with the sweep's counter (here usage, behind an API key)."""
    srv = oracle_factory("--no-tokenize", "--api-key", "sekrit")
    common = ["--length", "900", "--depth", "40", "--seed", "3", "--endpoint", srv.url]
    assert niah("prompt", *common).returncode == 2  # no key: the server refuses
    r = niah("prompt", *common, "--api-key", "sekrit", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["tokenizer"] == "usage" and p["tokens"] == 900
    run_sweep([Target(srv.url, api_key="sekrit")], SweepSpec(lengths=[900], depths=[40], trials=1, seed=3),
              tmp_path / "run")
    _, (rec,) = load_run(tmp_path / "run")
    assert rec["prompt_sha256"] == p["prompt_sha256"] and rec["prompt_tokens"] == 900


def test_make_test_fails_on_a_missing_extra(tmp_path):
    assert "NIAH_REQUIRE_EXTRAS=1" in (ROOT / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n")[0]
    for helper in ("conftest.py", "oracle_server.py"):   # the suite's conftest and what it imports
        (tmp_path / helper).write_text((ROOT / "tests" / helper).read_text())
    (tmp_path / "test_x.py").write_text(
        'import pytest\n\nmissing = pytest.importorskip("niah_no_such_extra_module")\n\n\ndef test_x():\n    pass\n')
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    lenient = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True,
                             env={k: v for k, v in os.environ.items() if k != "NIAH_REQUIRE_EXTRAS"})
    assert lenient.returncode in (0, 5) and "1 skipped" in lenient.stdout  # 5: no test ran
    strict = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "NIAH_REQUIRE_EXTRAS": "1"})
    assert strict.returncode != 0 and "niah_no_such_extra_module" in strict.stdout
