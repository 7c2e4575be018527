"""The sparse regime per model and the length-residue axis, through the real CLI against the
oracle test server (tests/servers/oracle.py): a server attesting DeepSeek-V4's geometry
(k 512, 4:1 compression, window 128) gets its lengths up to 2,179 labelled dense and
`--lengths auto` around 2,176; `--residues mod4` runs every residue of a block on one seed,
records residue and near misses, and the report and the gate split recall by residue."""

from __future__ import annotations

import json

import pytest

from cli_inproc import niah
from niah.regime import Regime, config_regime, first_sparse_length, geometry_of
from niah.sweep.indexer import at_or_below_k, auto_lengths
from niah.sweep.near import closest
from niah.sweep.residues import expand, parse_residues


def test_first_sparse_length_follows_the_geometry():
    assert first_sparse_length(512) == 513                      # V3.2: selection above k
    assert first_sparse_length(512, 4, 128) == 2180             # V4-Flash: (L - 128) // 4 > 512
    assert first_sparse_length(1024, 4, 128) == 4228            # V4-Pro
    v4 = Regime(512, 4, 128)
    assert at_or_below_k([512, 1000, 2179, 2180, 4096], v4) == [512, 1000, 2179]
    assert at_or_below_k([512, 513], 512) == [512]
    assert auto_lengths([512], 8192, 24) == [256, 512, 1024, 2048, 4096]   # unchanged for a bare k
    assert auto_lengths([v4], 16384, 32) == [1088, 2176, 4352, 8704]


def test_the_embedded_servers_compression_and_window_give_its_regime():
    # `niah serve --index-compress 4 --window 128` reports these names in /v1/models and its facts
    said = {"attention": "dsa", "index_topk": 128, "index_compress": 4, "window": 128}
    assert geometry_of([said]) == Regime(128, 4, 128)                 # selection from 644 tokens, not 129
    entry = {"settings": {"index_topk": 128}, "server": {"models": {"data": [said]}}}
    assert config_regime(entry).first_sparse == 644
    assert geometry_of([{"index_topk": 128, "window": 0}]) == Regime(128)
    # the command line's and SGLang's names come first where both are given
    assert geometry_of([{"index_topk": 512, "index_compression": 4, "index_compress": 1}]) == Regime(512, 4)


def test_residues_parse_and_expand():
    r = parse_residues("mod4")
    assert (r.modulus, r.values) == (4, (0, 1, 2, 3))
    assert expand([1000, 4001], parse_residues("4:0,3")) == [1000, 1003, 4000, 4003]
    assert parse_residues(None) is None


@pytest.mark.parametrize("bad", ["mod1", "4:4", "4:1,1", "four", "4:"])
def test_bad_residues_fail_closed(oracle, tmp_path, bad):
    p = niah("sweep", "--endpoint", oracle.url, "--lengths", "1k", "--residues", bad, "--out", tmp_path / "r",
             "-q", capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "--residues" in p.stderr


def test_near_miss_is_one_character_off():
    n = closest("4829163", "The special magic number for Lisbon is 4829164.")
    assert (n.got, n.distance, n.at) == ("4829164", 1, 6)
    assert closest("4829163", "It is 4829164.", distractors=["4829164"]) is None


def _lines(run):
    return [json.loads(x) for x in (run / "trials.jsonl").read_text().splitlines()]


def test_attested_compression_labels_dense_and_picks_auto_lengths(oracle_factory, tmp_path):
    v4 = oracle_factory("--index-topk", "512", "--index-compression", "4", "--index-window", "128",
                        "--max-model-len", "9000")
    p = niah("sweep", "--endpoint", v4.url, "--lengths", "auto", "--depths", "50", "--trials", "1",
             "--out", tmp_path / "auto", "-q", capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "--lengths auto: 1088, 2176, 4352" in p.stderr
    assert "lengths 1088, 2176 are at or below index_topk 512 at 4:1 compression, window 128" in p.stderr
    # the same lengths on a V3.2-style server (no compression) are sparse above 512
    v32 = oracle_factory("--index-topk", "512")
    p = niah("sweep", "--endpoint", v32.url, "--lengths", "1088,2176", "--depths", "50", "--trials", "1",
             "--out", tmp_path / "v32", "-q", capture_output=True, text=True)
    assert p.returncode == 0 and "at or below" not in p.stderr


def test_command_line_geometry_is_recorded_and_a_contradiction_refused(oracle_factory, tmp_path):
    plain = oracle_factory("--index-topk", "512")
    p = niah("sweep", "--endpoint", plain.url, "--lengths", "1500,2500", "--depths", "50", "--trials", "1",
             "--index-compression", "4", "--index-window", "128", "--out", tmp_path / "g", "-q",
             capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "lengths 1500 are at or below index_topk 512 at 4:1 compression" in p.stderr
    cfg = json.loads((tmp_path / "g" / "manifest.json").read_text())["configs"]["default"]
    assert cfg["geometry"] == {"index_compression": 4, "index_window": 128}
    rep = niah("report", tmp_path / "g", capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    assert "at or below index_topk 512 at 4:1 compression" in (tmp_path / "g" / "report" / "summary.md").read_text()
    v4 = oracle_factory("--index-topk", "512", "--index-compression", "4")
    p = niah("sweep", "--endpoint", v4.url, "--lengths", "1500", "--index-compression", "2",
             "--out", tmp_path / "x", "-q", capture_output=True, text=True)
    assert p.returncode == 2 and "contradicts the server" in p.stderr


def test_residue_sweep_report_and_gate_by_residue(oracle_factory, tmp_path):
    good = oracle_factory()
    bad = oracle_factory("--digit-off", "4:3")  # the last digit one off when prompt tokens = 3 mod 4
    args = ["--lengths", "1k,3k", "--residues", "mod4", "--depths", "0:100:5", "--trials", "2", "-q"]
    assert niah("sweep", "--endpoint", good.url, *args, "--out", tmp_path / "base").returncode == 0
    assert niah("sweep", "--endpoint", bad.url, *args, "--out", tmp_path / "cand").returncode == 0
    recs = _lines(tmp_path / "cand")
    assert {r["length"] for r in recs} == {1000, 1001, 1002, 1003, 3000, 3001, 3002, 3003}
    for r in recs:
        assert r["residue"] == r["prompt_tokens_local"] % 4 and r["base_length"] in (1000, 3000)
        assert (r["outcome"] == "near") == (r["prompt_tokens"] % 4 == 3)
        if r["outcome"] == "near":
            assert r["near"]["distance"] == 1 and r["near"]["at"] == 6 and r["near"]["got"][:6] == r["needle"][:6]
    one_block = {r["seed"] for r in recs if r["base_length"] == 1000 and r["depth"] == 0 and r["trial"] == 0}
    assert len(one_block) == 1  # every residue of a block shares the block's seed
    rep = niah("report", tmp_path / "cand", capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    summary = (tmp_path / "cand" / "report" / "summary.md").read_text()
    assert "## Recall by length residue" in summary
    row3 = next(x for x in summary.splitlines() if x.startswith("| `default` | 3 mod 4 |"))
    assert "| 0% |" in row3
    gate = niah("gate", "--baseline", tmp_path / "base", "--candidate", tmp_path / "cand", "--json",
                capture_output=True, text=True)
    assert gate.returncode == 1
    cases = {c["residue"]: c["status"] for c in json.loads(gate.stdout)["cases"] if "residue" in c}
    assert cases == {"0 mod 4": "pass", "1 mod 4": "pass", "2 mod 4": "pass", "3 mod 4": "regression"}
    # the same verdict against the baseline exported from that run (a CI baseline file)
    assert niah("baseline", "export", tmp_path / "base", "-o", tmp_path / "base.json").returncode == 0
    exported = json.loads((tmp_path / "base.json").read_text())
    assert exported["source"]["args"]["residues"] == "4:0,1,2,3"
    assert all("residue" in t and "base_length" in t for t in exported["configs"]["default"]["trials"])
    gate = niah("gate", "--baseline", tmp_path / "base.json", "--candidate", tmp_path / "cand", "--json",
                capture_output=True, text=True)
    assert gate.returncode == 1, gate.stderr
    assert cases == {c["residue"]: c["status"] for c in json.loads(gate.stdout)["cases"] if "residue" in c}


def test_default_sweep_writes_no_new_fields(oracle, tmp_path):
    assert niah("sweep", "--endpoint", oracle.url, "--lengths", "600", "--depths", "50", "--trials", "1",
                "--out", tmp_path / "d", "-q").returncode == 0
    rec = _lines(tmp_path / "d")[0]
    assert not {"residue", "base_length", "near", "decode_first", "decode_tokens"} & set(rec)
    assert not {"multi_turn", "turns", "asked_index", "asked_turn", "required_prefix", "prefix_hit",
                "similarity"} & set(rec)
    args = json.loads((tmp_path / "d" / "manifest.json").read_text())["args"]
    assert not {"residues", "decode_first", "multi_turn"} & set(args)
