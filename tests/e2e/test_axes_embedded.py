"""The field axes end to end against niah's embedded server (a real model, SmolLM2 on the CPU),
through the CLI: residues, cache states, the decode path, multi-turn needles and the answer
prefix each run, keep every prompt at its exact length as the server counts it, record what
the axis says per trial, and compare against themselves pairing by the axis. What the model
answers is its own (a 135M model): the assertions are about what niah did, not its recall."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

FLAGS = ("--attention", "dsa", "--index-dtype", "fp8", "--index-topk", "128")


def niah(*args, **kw):
    from cli_inproc import niah as run  # the entry point in this process (tests/cli_inproc.py)

    return run(*map(str, args), capture_output=True, text=True, **kw)


def _sweep(server, out, *extra):
    r = niah("sweep", "--endpoint", server.url, "--tokenizer", "server", "--depths", "50", "--trials", "1",
             "--out", out, "-q", *extra)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in (out / "trials.jsonl").read_text().splitlines()]
    for rec in recs:
        assert rec["error"] is None and rec["prompt_tokens"] == rec["prompt_tokens_local"], rec
    return recs


def _self_gate(run):
    g = niah("gate", "--baseline", run, "--candidate", run, "--json")
    assert g.returncode == 0, g.stderr + g.stdout
    return json.loads(g.stdout)["cases"]


def test_every_axis_runs_against_the_embedded_server(embedded_server, tmp_path):
    server = embedded_server(*FLAGS)

    recs = _sweep(server, tmp_path / "res", "--lengths", "400", "--residues", "4:0,3", "--cache-state", "cold,warm")
    assert sorted(r["cache_state"] for r in recs) == ["cold", "cold", "warm", "warm"]
    # a cold prompt opens with a nonce drawn for it: where no haystack cut reaches the asked
    # residue it is recorded at the residue it was counted at; the warm prompts are the set's own
    assert sorted(r["residue"] for r in recs if r["cache_state"] == "warm") == [0, 3]
    assert all(r["base_length"] == 400 and r["prompt_tokens"] % 4 == r["residue"] for r in recs)
    for r in recs:  # a residue run keeps the answer's closest value (absent when it holds no candidate)
        assert "near" not in r or set(r["near"]) == {"got", "distance", "at"}
    cases = _self_gate(tmp_path / "res")
    assert {c.get("residue") for c in cases} >= {"0 mod 4", "3 mod 4"}
    assert any("[cache warm]" in c["config"] for c in cases) and any("[cache cold]" in c["config"] for c in cases)

    recs = _sweep(server, tmp_path / "dec", "--lengths", "400", "--decode-first", "24")
    assert all(r["decode_first"] == 24 and r["decode_count_to"] >= 2 and r["completion_tokens"] > 0 for r in recs)
    _self_gate(tmp_path / "dec")

    recs = _sweep(server, tmp_path / "mt", "--lengths", "700", "--multi-turn", "2")
    assert all(r["multi_turn"] == 2 and r["asked_index"] in (1, 2) and r["required_prefix"] for r in recs)
    assert all(0.0 <= r["similarity"] <= 1.0 for r in recs)
    _self_gate(tmp_path / "mt")

    recs = _sweep(server, tmp_path / "pre", "--lengths", "400", "--answer-prefix", "ANSWER:")
    assert all(r["answer_prefix_ok"] in (True, False) for r in recs)

    rep = niah("report", tmp_path / "mt")
    assert rep.returncode == 0, rep.stderr
