"""`--coverage field` through the real CLI against oracle test servers (tests/servers/oracle.py)
attesting DeepSeek-V4-Flash's index geometry (k 512, 4:1 compression, window 128: selection
starts at 2,180 tokens): the preset's expansion is printed and recorded, options beside it
win or are refused in one line, and it catches two planted faults, a last digit one off at
3 mod 4 prompt tokens and a prefix cache that corrupts what it reuses, where the gate of a
default sweep of the cache fault passes."""

from __future__ import annotations

import json

import pytest

from cli_inproc import niah
from niah.regime import Regime
from niah.sweep.coverage import field_lengths, field_options

V4 = ("--index-topk", "512", "--index-compression", "4", "--index-window", "128", "--max-model-len", "5000")


def test_field_lengths_straddle_where_selection_starts():
    v4 = Regime(512, 4, 128)
    assert field_lengths(v4, 5000, 32) == [1088, 2176, 2180, 4360]          # 2176..2179 dense, 2180.. sparse
    assert field_lengths(v4, 131072, 32) == [1088, 2176, 2180, 4360, 8720, 17440]   # up to 32k
    assert field_lengths(Regime(2048), 65536, 32) == [1024, 2044, 2052, 4098 // 4 * 4, 8196, 16392]
    assert field_lengths(None, 9000, 32) == [1024, 2048, 4096, 8192]
    assert field_lengths(Regime(128), 8192, 32) == [256, 516, 1032, 2064, 4128]   # no dense side above 256
    assert field_lengths(v4, None, 32) == [1088, 2176, 2180, 4360, 8720]    # no context: 4x first sparse
    assert field_options(v4, 5000, 32, cold=False)["cache_state"] == "warm"


def _sweep(server, out, *extra):
    p = niah("sweep", "--endpoint", server.url, "--out", out, "-q", *extra, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p


def _gate(base, cand):
    g = niah("gate", "--baseline", base, "--candidate", cand, "--json", capture_output=True, text=True)
    return g.returncode, json.loads(g.stdout)["cases"]


def test_field_preset_catches_both_planted_faults(oracle_factory, tmp_path):
    clean = oracle_factory(*V4)
    digit = oracle_factory(*V4, "--digit-off", "4:3")
    cache = oracle_factory(*V4, "--corrupt-cached-above", "1000")
    p = _sweep(clean, tmp_path / "base", "--coverage", "field")
    assert ("--coverage field: --lengths 1088,2176,2180,4360 --residues mod4 --depths 10,50,90 --trials 1 "
            "--cache-state cold,warm (96 trials)") in p.stderr
    args = json.loads((tmp_path / "base" / "manifest.json").read_text())["args"]
    assert args["coverage"] == "field" and args["coverage_given"] == []
    assert args["coverage_options"]["lengths"] == "1088,2176,2180,4360"
    assert args["residues"] == "4:0,1,2,3" and args["cache_states"] == ["cold", "warm"]
    recs = [json.loads(x) for x in (tmp_path / "base" / "trials.jsonl").read_text().splitlines()]
    assert len(recs) == 96 and {r["outcome"] for r in recs} == {"correct"}
    # a cold trial's random nonce may leave no exact fit: it draws another, so every cold
    # trial lands on its own residue (a token off, the residue fault would miss it)
    assert all(r["prompt_tokens"] == r["length"] for r in recs if r["cache_state"] == "cold")

    # the cache fault: a default sweep's gate passes, the preset's warm state fails
    _sweep(clean, tmp_path / "base-default")
    _sweep(cache, tmp_path / "cache-default")
    assert _gate(tmp_path / "base-default", tmp_path / "cache-default")[0] == 0
    _sweep(cache, tmp_path / "cache-field", "--coverage", "field")
    code, cases = _gate(tmp_path / "base", tmp_path / "cache-field")
    assert code == 1
    bad = {c["config"] for c in cases if c["status"] == "regression"}
    assert bad == {"default [cache warm]"}

    # the residue fault: only residue 3 mod 4 regresses, in both states
    _sweep(digit, tmp_path / "digit-field", "--coverage", "field")
    code, cases = _gate(tmp_path / "base", tmp_path / "digit-field")
    assert code == 1
    by_residue = {(c["config"], c["residue"]): c["status"] for c in cases if "residue" in c}
    for state in ("cold", "warm"):
        assert by_residue[(f"default [cache {state}]", "3 mod 4")] == "regression"
        assert all(by_residue[(f"default [cache {state}]", f"{v} mod 4")] == "pass" for v in (0, 1, 2))


def test_options_beside_the_preset_win_or_are_refused(oracle_factory, tmp_path):
    server = oracle_factory(*V4)
    p = _sweep(server, tmp_path / "d", "--coverage", "field", "--depths", "50", "--lengths", "2176")
    assert "--lengths 2176 --residues mod4 --depths 50 --trials 1 --cache-state cold,warm (8 trials)" in p.stderr
    args = json.loads((tmp_path / "d" / "manifest.json").read_text())["args"]
    assert args["depths"] == [50.0] and sorted(args["coverage_given"]) == ["--depths", "--lengths"]
    # the usage counter sends each prompt first: cold is left out, in one line
    p = _sweep(server, tmp_path / "u", "--coverage", "field", "--tokenizer", "usage", "--lengths", "2176")
    assert "--cache-state warm (12 trials)" in p.stderr and "cold is left out" in p.stderr
    for extra, words in [(("--control",), "not with --control"), (("--lengths", "auto"), "not auto"),
                         (("--prompts", tmp_path / "none.jsonl"), "builds its own prompts")]:
        r = niah("sweep", "--endpoint", server.url, "--coverage", "field", *extra, "--out", tmp_path / "x", "-q",
                 capture_output=True, text=True)
        assert r.returncode == 2 and words in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


@pytest.mark.parametrize("cmd", [("sweep",), ("prompts", "build")])
def test_unknown_preset_is_refused(oracle, tmp_path, cmd):
    r = niah(*cmd, "--endpoint", oracle.url, "--coverage", "wide", "--out", tmp_path / "x",
             capture_output=True, text=True)
    assert r.returncode == 2 and "unknown --coverage 'wide'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_prompt_set_with_the_preset_runs_warm_and_gates_the_residue_fault(oracle_factory, tmp_path):
    clean, digit = oracle_factory(*V4), oracle_factory(*V4, "--digit-off", "4:3")
    b = niah("prompts", "build", "--endpoint", clean.url, "--coverage", "field", "--out", tmp_path / "set.jsonl",
             capture_output=True, text=True)
    assert b.returncode == 0, b.stderr
    assert "--residues mod4 --depths 10,50,90 --trials 1 (48 trials)" in b.stderr
    assert "cache states are not part of a prompt set" in b.stderr
    rows = [json.loads(x) for x in (tmp_path / "set.jsonl").read_text().splitlines()]
    assert len(rows) == 48 and {r["length"] for r in rows} >= {2179, 2180, 4363}
    _sweep(clean, tmp_path / "base", "--prompts", tmp_path / "set.jsonl", "--cache-state", "warm")
    _sweep(digit, tmp_path / "cand", "--prompts", tmp_path / "set.jsonl", "--cache-state", "warm")
    code, cases = _gate(tmp_path / "base", tmp_path / "cand")
    assert code == 1
    rows_by_len = {}
    for r in rows:
        assert r["residues"] == "4:0,1,2,3"
        rows_by_len.setdefault((r["length"] // 4 * 4, r["depth"]), set()).add(r["seed"])
    assert all(len(s) == 1 for s in rows_by_len.values())  # a residue block shares its seed, as a sweep's does
    recs = [json.loads(x) for x in (tmp_path / "cand" / "trials.jsonl").read_text().splitlines()]
    assert all(r["residue"] == r["prompt_tokens_local"] % 4 and r["base_length"] % 4 == 0 for r in recs)
    residue_cases = {c["residue"]: c["status"] for c in cases if "residue" in c}
    assert residue_cases["3 mod 4"] == "regression"
    assert {residue_cases[f"{r} mod 4"] for r in (0, 1, 2)} == {"pass"}
    # the same verdict against the baseline file a CI job keeps
    assert niah("baseline", "export", tmp_path / "base", "-o", tmp_path / "base.json").returncode == 0
    code, cases = _gate(tmp_path / "base.json", tmp_path / "cand")
    assert code == 1 and {c["residue"]: c["status"] for c in cases if "residue" in c} == residue_cases


def test_a_set_without_residues_keeps_its_bytes(oracle, tmp_path):
    """A set built without --residues writes no residue field: a set's bytes (and sha256) do not
    change because the format can carry residues."""
    b = niah("prompts", "build", "--endpoint", oracle.url, "--lengths", "600", "--depths", "50", "--trials", "1",
             "--out", tmp_path / "set.jsonl", capture_output=True, text=True)
    assert b.returncode == 0, b.stderr
    assert "residues" not in json.loads((tmp_path / "set.jsonl").read_text().splitlines()[0])
