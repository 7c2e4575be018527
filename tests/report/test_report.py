"""`niah report` and `niah compare` on hand-written run folders."""

from __future__ import annotations


import pytest
from report_runs import always, make_run

from niah.errors import BadInput
from niah.report.data import config_infos, load_frame, one_axis_pairs
from niah.report.render import render_report

MATRIX = {
    "fp8_512": {"index_dtype": "fp8", "index_topk": 512},
    "fp8_1024": {"index_dtype": "fp8", "index_topk": 1024},
    "bf16_512": {"index_dtype": "bf16", "index_topk": 512},
    "bf16_1024": {"index_dtype": "bf16", "index_topk": 1024},
    "dense": {"attention": "dense"},
}


def _matrix_outcome(cfg, length, depth, trial, rng):
    # fp8 loses every needle from 4096 on; the rest are always right
    if cfg.startswith("fp8") and length >= 4096:
        return "wrong"
    return "correct"


def _niah(*args, env=None):
    from cli_inproc import niah  # the entry point in this process (tests/cli_inproc.py)

    return niah(*args, env=env)


@pytest.fixture(scope="module")
def matrix_run(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("m") / "run", MATRIX, lengths=(1024, 2048, 4096), depths=(0.0, 50.0, 100.0),
                   trials=4, outcome=_matrix_outcome, selection=True)
    return run, render_report(run)


def test_matrix_files(matrix_run):
    run, rep = matrix_run
    names = {p.name for p in (run / "report").iterdir()}
    for cfg in MATRIX:
        assert f"heatmap_{cfg}.png" in names
    assert {"grid.png", "recall_vs_length.png", "summary.md"} <= names
    # one-axis pairs: 2 dtype pairs + 2 top-k pairs, plus 4 against the dense control
    diffs = sorted(n for n in names if n.startswith("diff_"))
    assert diffs == sorted([
        "diff_fp8_1024__minus__fp8_512.png", "diff_bf16_1024__minus__bf16_512.png",
        "diff_bf16_512__minus__fp8_512.png", "diff_bf16_1024__minus__fp8_1024.png",
        "diff_fp8_512__minus__dense.png", "diff_fp8_1024__minus__dense.png",
        "diff_bf16_512__minus__dense.png", "diff_bf16_1024__minus__dense.png",
    ])
    for p in rep.figures:
        assert p.stat().st_size > 5000 and p.read_bytes()[:4] == b"\x89PNG"


def test_matrix_summary_tables(matrix_run):
    run, _ = matrix_run
    md = (run / "report" / "summary.md").read_text()
    # recall by length: fp8 12/12 at 1K, 0/12 at 4K, overall 24/36
    row = next(line for line in md.splitlines() if line.startswith("| `fp8_512` | 100.0%"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1].endswith("(12/12)") and cells[3].startswith("0.0% [0–24] (0/12)")
    assert cells[4].startswith("66.7%") and cells[4].endswith("(24/36)")
    # the per-cell table of fp8_512: depth 50%, 4K cell
    assert "| 50% | 1.00 (4/4) | 1.00 (4/4) | 0.00 (0/4) |" in md
    # the dtype difference at 4096 is 12 wins for bf16 out of 12 pairs: p = 2 * 0.5**12
    assert "| 4,096 | paired (prompt) | 0.0% (0/12) | 100.0% (12/12) | +100.0 pp | 0 / 12 | 0.00049 | B better |" in md
    # failure taxonomy: fp8_512 has 24 correct and 12 wrong of 36
    assert "| `fp8_512` | 24 | 12 | 0 | 0 | 0 | 0 | 36 |" in md
    # selection recall at 1024: layers [1.0, 0.875, 0.95] -> mean 0.942, weakest 0.875, strongest 1.0
    assert "| `fp8_512` | 0.942 (0.88–1.00, n=12) |" in md
    assert "Length check" in md
    assert "Every reported length is within max(4 tokens, 0.5%) of the request." in md


def test_one_axis_pairs_labels(matrix_run):
    run, _ = matrix_run
    manifest, df = load_frame(run)
    pairs = one_axis_pairs(config_infos(manifest, df))
    labels = {(a, b): lab for a, b, lab in pairs}
    assert labels[("fp8_512", "fp8_1024")] == "index_topk: 512 -> 1024 @ index_dtype=fp8"
    assert labels[("fp8_512", "bf16_512")] == "index_dtype: fp8 -> bf16 @ index_topk=512"
    assert ("fp8_512", "bf16_1024") not in labels  # two axes differ
    assert ("dense", "bf16_1024") in labels


def test_edge_cases_one_config_empty_cells_errors(tmp_path):
    def outcome(cfg, length, depth, trial, rng):
        if length == 2048 and depth == 50.0:
            return "error"  # an outage cell
        if length == 1024 and depth == 0.0 and trial == 0:
            return "error"  # a cell with one error
        return "correct" if trial % 2 == 0 else "truncated"

    run = make_run(tmp_path / "run", {"solo": {}}, lengths=(1024, 2048), depths=(0.0, 50.0, 100.0), trials=4,
                   outcome=outcome, skip=lambda c, length, depth, t: length == 2048 and depth == 100.0)
    rep = render_report(run)
    names = {p.name for p in rep.figures}
    assert names == {"heatmap_solo.png", "recall_vs_length.png"}  # no grid, no diffs for one config
    md = rep.summary.read_text()
    assert "| 0% | 0.33 (1/3) ⚠1 err | 0.50 (2/4) |" in md
    assert "| 50% | 0.50 (2/4) | outage (4 err) |" in md
    assert "| 100% | 0.50 (2/4) | no data |" in md
    # the errors are counted apart: 2048 has 4 answered of 8 trials, recall 2/4
    assert "| `solo` | 7 | 0 | 0 | 8 | 0 | 5 | 20 |" in md
    assert "HTTP 503: server died | 5 |" in md


def test_all_errors_and_svg(tmp_path):
    run = make_run(tmp_path / "run", {"a": {"index_topk": 512}, "b": {"index_topk": 1024}}, lengths=(1024,),
                   depths=(0.0, 100.0), trials=2, outcome=always("error"))
    rep = render_report(run, svg=True)
    assert all(p.suffix == ".svg" for p in rep.figures)
    assert {p.name for p in rep.figures} >= {"heatmap_a.svg", "grid.svg", "diff_b__minus__a.svg"}
    md = rep.summary.read_text()
    assert "outage (4 err)" in md and "| `a` | 0 | 0 | 0 | 0 | 0 | 4 | 4 |" in md
    assert "no data" in md


def test_no_trials_is_bad_input(tmp_path):
    run = make_run(tmp_path / "run", lengths=(1024,), depths=(0.0,), trials=1, skip=lambda *a: True)
    with pytest.raises(BadInput):
        render_report(run)


def test_report_cli(tmp_path):
    run = make_run(tmp_path / "run", {"x": {"index_topk": 512}, "y": {"index_topk": 1024}}, lengths=(1024, 2048),
                   depths=(0.0, 100.0), trials=3)
    r = _niah("report", run, "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "summary.md").exists() and (tmp_path / "out" / "diff_y__minus__x.png").exists()
    r = _niah("report", tmp_path / "missing")
    assert r.returncode == 2 and "niah: error:" in r.stderr


def test_compare_cli_paired_and_unpaired(tmp_path):
    a = make_run(tmp_path / "a", {"cfg": {}}, lengths=(1024, 2048), depths=(0.0, 50.0), trials=5, seed=1)

    def worse(cfg, length, depth, trial, rng):
        return "wrong" if length == 2048 else "correct"

    b = make_run(tmp_path / "b", {"cfg": {}}, lengths=(1024, 2048), depths=(0.0, 50.0), trials=5, seed=1, outcome=worse)
    r = _niah("compare", a, b)
    assert r.returncode == 0, r.stderr
    assert "paired by prompt hash" in r.stdout
    assert ("| 2,048 | paired (prompt) | 100.0% (10/10) | 0.0% (0/10) | -100.0 pp | 10 / 0 | 0.002 | B worse |"
            in r.stdout)
    # different seeds: nothing pairs, the comparison says so
    c = make_run(tmp_path / "c", {"cfg": {}}, lengths=(1024, 2048), depths=(0.0, 50.0), trials=5, seed=2, outcome=worse)
    r = _niah("compare", a, c, "--markdown", tmp_path / "cmp.md")
    assert r.returncode == 0, r.stderr
    assert "UNPAIRED" in r.stdout and "| 2,048 | unpaired |" in r.stdout
    assert (tmp_path / "cmp.md").read_text().startswith("# B:")


def test_compare_two_configs_in_one_run(matrix_run):
    run, _ = matrix_run
    r = _niah("compare", run, "--a", "fp8_1024", "--b", "bf16_1024", "--by-depth")
    assert r.returncode == 2 and "configuration 'fp8_1024' is unattested: labels index_dtype=fp8" in r.stderr
    # hand-written external runs: their labels are unattested, compared on their word
    r = _niah("compare", run, "--a", "fp8_1024", "--b", "bf16_1024", "--by-depth", "--accept-unattested")
    assert r.returncode == 0, r.stderr
    assert "| **all** | paired (prompt) | 66.7% (24/36) | 100.0% (36/36) | +33.3 pp | 0 / 12 |" in r.stdout
    assert "per cell" in r.stdout
    r = _niah("compare", run)
    assert r.returncode == 2 and "--a and --b" in r.stderr


def test_compare_the_two_configs_of_a_run(tmp_path):
    run = make_run(tmp_path / "run", {"x": {"index_topk": 512}, "y": {"index_topk": 1024}}, lengths=(1024,),
                   depths=(0.0,), trials=3, outcome={"x": always("correct"), "y": always("wrong")})
    r = _niah("compare", run, "--accept-unattested")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# B: y vs A: x")
    r = _niah("compare", run, "--b", "x", "--accept-unattested")
    assert r.stdout.startswith("# B: x vs A: y")


def test_length_check_flags_drift(tmp_path):
    import json

    run = make_run(tmp_path / "run", lengths=(1000, 8000), depths=(0.0,), trials=3)
    lines = [json.loads(x) for x in (run / "trials.jsonl").read_text().splitlines()]
    for rec in lines:
        if rec["length"] == 8000 and rec["trial"] == 2:
            rec["prompt_tokens"] = 8100  # 1.25% off: beyond max(4, 0.5% = 40)
        if rec["length"] == 1000 and rec["trial"] == 1:
            rec["prompt_tokens"] = 1004  # 4 tokens off: within max(4, 5)
        if rec["length"] == 1000 and rec["trial"] == 2:
            rec["prompt_tokens"] = None  # not reported
    (run / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    md = render_report(run).summary.read_text()
    assert "| `default` | 8,000 | 8,000 | 7,999–8,100 | +1.25% | **1** | 0 |" in md
    assert "| `default` | 1,000 | 1,002 | 999–1,004 | +0.40% | 0 | 1 |" in md
    assert "**1 trial(s) drift more than max(4 tokens, 0.5%) from the requested length.**" in md
