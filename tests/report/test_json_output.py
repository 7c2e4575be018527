"""`--json` on compare, gate and plan, and `export -f json`: one JSON object (or array) on
stdout that any parser reads (no NaN), carrying the verdict the Markdown says; exit codes
unchanged. Hand-written runs (tests/report_runs.py), the CLI run in this process."""

from __future__ import annotations

import json
import os

import pytest
from report_runs import always, make_run

LENGTHS = (1024, 2048, 4096)
DEPTHS = (0.0, 50.0, 100.0)


def _niah(*args):
    from cli_inproc import niah

    return niah(*args, env=dict(os.environ))


def _parse(r) -> dict:
    return json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))


def _drop(cfg, length, depth, trial, rng):  # from 4096 on, half the needles are lost
    return "wrong" if length >= 4096 and trial % 2 == 0 else "correct"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("json")
    base = make_run(d / "base", {"c": {}}, LENGTHS, DEPTHS, trials=8, seed=3)
    cand = make_run(d / "cand", {"c": {}}, LENGTHS, DEPTHS, trials=8, seed=3, outcome=_drop)
    both = make_run(d / "both", {"bf16": {"index_dtype": "bf16"}, "fp8": {"index_dtype": "fp8"}}, LENGTHS, DEPTHS,
                    trials=8, seed=3, outcome={"bf16": always("correct"), "fp8": _drop})
    return base, cand, both


def test_gate_json_carries_the_verdict_and_every_case(runs, tmp_path):
    base, cand, _ = runs
    r = _niah("gate", "--baseline", base, "--candidate", base, "--json")
    assert r.returncode == 0, r.stderr
    ok = _parse(r)
    assert ok["schema"] == "niah.gate/1" and ok["verdict"] == "PASS" and ok["exit_code"] == 0
    assert ok["configs"] == {"c": {"baseline_config": "c", "pairing": "prompt", "attestation": "n/a",
                                   "verdict": "PASS"}}
    assert [c["length"] for c in ok["cases"]] == [*LENGTHS, "all"] and ok["failed"] == []

    r = _niah("gate", "--baseline", base, "--candidate", cand, "--json", "--summary", tmp_path / "s.md")
    assert r.returncode == 1, r.stderr  # the same exit code as without --json
    bad = _parse(r)
    assert bad["verdict"] == "REGRESSION" and bad["exit_code"] == 1
    assert bad["configs"]["c"]["verdict"] == "REGRESSION"
    assert {(f["length"], f["status"]) for f in bad["failed"]} == {(4096, "regression"), ("all", "regression")}
    case = next(c for c in bad["cases"] if c["length"] == 4096)
    assert case["row"]["recall_a"] == 1.0 and case["row"]["recall_b"] == 0.5 and case["row"]["losses"] == 12
    assert case["row"]["verdict"] == "B worse" and 0 < case["row"]["p"] < 0.05
    assert bad["rule"] == {"tolerance": 0.05, "alpha": 0.05, "max_error_rate": 0.1, "metric": "answer",
                           "rank_tolerance": 0.1}
    assert "## niah gate: REGRESSION" in (tmp_path / "s.md").read_text()  # --summary still written


def test_compare_json_two_runs_and_two_configs(runs):
    base, cand, both = runs
    d = _parse(r := _niah("compare", base, cand, "--json", "--by-depth"))
    assert r.returncode == 0, r.stderr
    assert d["schema"] == "niah.compare/1" and d["verdict"] == "B worse" and d["pairing"] == "prompt"
    assert d["a"] == {"run": str(base), "config": "c"} and d["b"] == {"run": str(cand), "config": "c"}
    assert [x["group"] for x in d["rows"]] == [*LENGTHS, "all"]
    assert d["rows"][0]["verdict"] == "no significant difference" and d["rows"][0]["p"] == 1.0
    assert d["cells"][0]["group"] == {"length": 1024, "depth": 0.0} and d["ranks"] == [] and d["fidelity"] is None

    d = _parse(_niah("compare", both, "--a", "fp8", "--b", "bf16", "--json", "--accept-unattested"))
    assert d["verdict"] == "B better" and (d["a"]["config"], d["b"]["config"]) == ("fp8", "bf16")
    assert len(d["attestation_notes"]) == 2  # the labels taken on their word, as the text says


def test_compare_json_unpaired_has_no_nan(tmp_path):
    a = make_run(tmp_path / "a", {"c": {}}, (1024,), (0.0,), trials=4, seed=1)
    b = make_run(tmp_path / "b", {"c": {}}, (1024,), (0.0,), trials=4, seed=2, outcome=always("error"))
    d = _parse(r := _niah("compare", a, b, "--json"))
    assert r.returncode == 0, r.stderr
    assert d["pairing"] is None and d["verdict"] == "no data" and d["rows"][-1]["recall_b"] is None


def test_plan_json_formula_and_bad_input():
    d = _parse(r := _niah("plan", "--recall", "0.95", "--drop", "0.1", "--depths", "5", "--json"))
    assert r.returncode == 0, r.stderr
    assert d["schema"] == "niah.plan/1" and d["mode"] == "formula" and d["drop"] == pytest.approx(0.1)
    assert {x["design"] for x in d["designs"]} == {"paired (nested errors)", "paired (independent errors)",
                                                    "unpaired"}
    assert all(x["trials_per_cell"] == -(-x["trials_per_side"] // 5) for x in d["designs"])
    r = _niah("plan", "--recall", "0.5", "--drop", "0.7", "--json")
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1


def test_plan_json_prints_rounded_numbers():
    r = _niah("plan", "--recall", "0.95", "--drop", "0.1", "--json")
    assert r.returncode == 0, r.stderr
    assert '"drop": 0.1,' in r.stdout and '"target": 0.85,' in r.stdout  # not 0.09999999999999998
    powers = [x["power"] for x in json.loads(r.stdout)["designs"]]
    assert powers and all(p == round(p, 4) for p in powers), powers


def test_export_json_is_the_records_as_stored(runs, tmp_path):
    base = runs[0]
    r = _niah("export", base, "-f", "json", "--out", tmp_path / "t.json")
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "t.json").read_text())
    stored = [json.loads(x) for x in (base / "trials.jsonl").read_text().splitlines() if x.strip()]
    assert rows == stored and len(rows) == len(LENGTHS) * len(DEPTHS) * 8
    r = _niah("export", base, "-f", "xml")
    assert r.returncode == 2 and "csv, parquet or json" in r.stderr
