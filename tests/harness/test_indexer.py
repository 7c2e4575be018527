"""The indexer's early warning without a server: the probe's per-row arithmetic, the trial
summary, the paired rank metric in compare/gate, lengths relative to k, the control."""

from __future__ import annotations

import json
import math

import pytest

from niah.errors import BadInput

from report_runs import make_run


# -- the probe of one query row ------------------------------------------------------------
def test_row_stats_ranks_margin_and_fidelity():
    torch = pytest.importorskip("torch")
    from niah.serving.embedded.probe import row_stats

    # 10 candidates; k = 4. The value's tokens are positions 2 and 3 (scores 8 and 5).
    scores = torch.tensor([9.0, 1.0, 8.0, 5.0, 7.0, 0.0, 6.0, 0.0, 2.0, 0.0])
    kept = torch.zeros(10, dtype=torch.bool)
    kept[scores.topk(4).indices] = True                      # {0, 2, 4, 6}: 5.0 is rank 5, not kept
    exact = scores.clone()
    exact[6] = -1.0                                          # exact keys would keep 3 instead of 6
    s = row_stats(scores, kept, exact, 4, (2, 4))
    assert s["kept"] == 0.5
    assert s["rank_best"] == 2 / 4 and s["rank_worst"] == 5 / 4
    assert s["margin"] == pytest.approx((8.0 - 6.0) / (9.0 - 6.0))     # worst KEPT value token over the k-th
    assert s["fidelity"] == 3 / 4
    # ties rank at the bottom of their group: a zero-score value token among four zeros
    s = row_stats(scores, kept, scores, 4, (5, 6))
    assert s["rank_worst"] == 10 / 4 and s["kept"] == 0.0 and s["margin"] is None and s["fidelity"] == 1.0


def test_summary_medians_and_inactive_rows():
    from niah.sweep.indexer import summarise

    step = {"position": 99, "context": 100, "active": True, "kept": [1.0, 0.0, 0.5],
            "rank_best": [0.1, 2.0, 0.5], "rank_worst": [0.2, 3.0, 1.5], "margin": [0.4, None, 0.0],
            "fidelity": [1.0, 0.9, 0.8]}
    s = summarise({"k": 64, "value_tokens": 7, "value_complete": True, "steps": [step, {**step, "position": 100}]})
    assert s["selection_active"] is True and s["steps"] == 2 and s["context"] == 100
    assert s["rank_worst"] == pytest.approx((0.2 * 3.0 * 1.5) ** (1 / 3), abs=1e-5)
    assert s["rank_best"] == pytest.approx((0.1 * 2.0 * 0.5) ** (1 / 3), abs=1e-5) and s["margin"] == 0.2
    assert s["kept"] == 0.5 and s["fidelity"] == pytest.approx(0.9) and s["layers_lost"] == 1
    off = summarise({"k": 512, "value_tokens": 7, "value_complete": True,
                     "steps": [{"position": 399, "context": 400, "active": False}]})
    assert off["selection_active"] is False and off["rank_worst"] is None and off["fidelity"] is None
    assert summarise(None) is None                            # dense: null, never 1.0


# -- lengths relative to k -----------------------------------------------------------------
def test_auto_lengths_and_warnings():
    from niah.sweep.indexer import auto_lengths, length_warnings

    assert auto_lengths([512], 8192, 24) == [256, 512, 1024, 2048, 4096]
    assert auto_lengths([64, 2048], 8192, 24) == [128, 256, 512, 1024, 2048, 4096]
    lines = length_warnings([1000, 4000], {"ci": 2048 * 2, "mixed": 2048, "dense": None})
    assert any("every length of 'ci'" in x and "never exercised" in x for x in lines)
    assert any("'mixed'" in x and "1000" in x and "4000" not in x for x in lines)
    assert not any("dense" in x for x in lines)


def test_config_topk_reads_axes_settings_and_server():
    from niah.sweep.indexer import config_topk

    assert config_topk({"axes": {"index_topk": 64}}) == 64
    assert config_topk({"server": {"models": {"data": [{"attention": "dsa", "index_topk": 512}]}}}) == 512
    assert config_topk({"axes": {"attention": "dense"}, "settings": {"index_topk": 512}}) is None


# -- the no-needle control -------------------------------------------------------------------
def test_control_outcomes():
    from niah.sweep.control import classify

    prompt = "filler text; The special magic number for Oslo is 1112223. more filler"
    known = {"4829163", "7000001"}
    assert classify("The number is 4,829,163.", prompt, known) == "leak"
    assert classify("It is 5551234.", prompt, known) == "hallucinated"
    assert classify("1112223", prompt, known) == "clean"                 # in the prompt: a distractor
    assert classify("I cannot find it.", prompt, known) == "clean"
    assert classify("5551234 or 7000001", prompt, known) == "leak"      # leak wins
    assert classify("", prompt, known, error="HTTP 503") == "error"


# -- the paired rank metric --------------------------------------------------------------------
def _deeper(factor: float):
    """Write trials whose indexer summary puts B's needle `factor` times deeper than A's."""
    def rank(cfg, length, depth, trial):
        base = 0.2 + 0.01 * trial + depth / 1000
        return base * (factor if cfg == "B" else 1.0)
    return rank


def _add_indexer(run, rank_fn, k=64):
    path = run / "trials.jsonl"
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    for r in recs:
        active = r["length"] > k
        r["indexer"] = {"selection_active": active, "k": k,
                        "rank_worst": rank_fn(r["config"], r["length"], r["depth"], r["trial"]) if active else None}
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_rank_compare_finds_a_deeper_needle(tmp_path):
    from niah.report.data import load_frame
    from niah.report.ranks import rank_compare

    run = make_run(tmp_path / "r", configs={"A": {"index_topk": 64}, "B": {"index_topk": 64}},
                   lengths=(64, 1024, 2048), depths=(10.0, 50.0, 90.0), trials=4)
    _add_indexer(run, _deeper(1.3))
    _, df = load_frame(run)
    rows = rank_compare(df[df["config"] == "A"], df[df["config"] == "B"])
    first, total = rows[0], rows[-1]
    assert first.group == 64 and first.n == 0 and first.inactive == 12      # length <= k: no selection
    assert total.n == 24 and total.deeper == 24 and total.ratio == pytest.approx(1.3)
    assert total.p < 1e-4 and total.r == 1.0 and total.verdict == "B's needle deeper"


def test_gate_fails_on_rank_before_answers_flip(tmp_path, capsys):
    from niah.report.gate import run_gate
    from niah.report.gate_output import markdown

    run = make_run(tmp_path / "r", configs={"A": {"index_topk": 64}, "B": {"index_topk": 64}},
                   lengths=(64, 2048), depths=(10.0, 50.0, 90.0), trials=8)
    _add_indexer(run, _deeper(1.5))
    base = make_run(tmp_path / "base", configs={"X": {"index_topk": 64}}, lengths=(64, 2048),
                    depths=(10.0, 50.0, 90.0), trials=8)
    cand = make_run(tmp_path / "cand", configs={"X": {"index_topk": 64}}, lengths=(64, 2048),
                    depths=(10.0, 50.0, 90.0), trials=8)
    _add_indexer(base, lambda c, L, d, t: 0.2 + 0.01 * t + d / 1000)
    _add_indexer(cand, lambda c, L, d, t: 1.5 * (0.2 + 0.01 * t + d / 1000))
    # hand-written external runs labelled index_topk: unattested, accepted on their word
    answer = run_gate(base, cand, accept_unattested=True)
    assert answer.exit_code == 0                                  # every answer is still right
    both = run_gate(base, cand, metric="both", accept_unattested=True)
    assert both.exit_code == 1
    failed = [c for c in both.failed]
    assert {c.name for c in failed} == {"length 2048 needle rank", "all lengths needle rank"}
    md = markdown(both)
    assert "Wilcoxon" in md and "at or below index_topk 64" in md
    ok = run_gate(base, cand, metric="rank", rank_tolerance=0.6, accept_unattested=True)   # within the tolerance
    assert ok.exit_code == 0 and not ok.failed
    assert any(c.metric == "rank" and c.status == "pass" for c in ok.cases)
    with pytest.raises(BadInput, match="--metric must be answer, rank or both"):
        run_gate(base, cand, metric="median", accept_unattested=True)


def _add_probe(run, kept, fidelity, k=64):
    """Each trial's probe summary: the same rank on every side, kept / fidelity from the callables."""
    path = run / "trials.jsonl"
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    for r in recs:
        active = r["length"] > k
        key = (r["length"], r["depth"], r["trial"])
        r["indexer"] = {"selection_active": active, "k": k, "rank_worst": 0.5 + r["trial"] / 100 if active else None,
                        "kept": kept(*key) if active else None, "fidelity": fidelity(*key) if active else None}
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.mark.parametrize("measure", ["kept", "fidelity"])
def test_gate_fails_on_what_the_selection_kept_while_rank_and_answers_hold(tmp_path, measure):
    """A top-k keeping fewer keys than attested (the scores, so the rank, unmoved) lowers the
    needle's kept share; keys read slightly wrong lower the fidelity: each fails its case
    alone, beyond the tolerance only, and identical probes pass."""
    from niah.report.baseline import export_baseline
    from niah.report.gate import run_gate

    geo = dict(configs={"X": {"index_topk": 64}}, lengths=(64, 2048), depths=(10.0, 50.0, 90.0), trials=8)
    kept_a = lambda L, d, t: 0.4 + t / 100                              # noqa: E731
    fid_a = lambda L, d, t: 0.99 - t / 1000                             # noqa: E731
    drop = {"kept": (lambda L, d, t: 0.6 * kept_a(L, d, t), fid_a),
            "fidelity": (kept_a, lambda L, d, t: 1 - 2 * (1 - fid_a(L, d, t)))}[measure]
    base, cand, same = (make_run(tmp_path / n, **geo) for n in ("base", "cand", "same"))
    _add_probe(base, kept_a, fid_a)
    _add_probe(cand, *drop)
    _add_probe(same, kept_a, fid_a)
    assert run_gate(base, cand, accept_unattested=True).exit_code == 0          # answers alone see nothing
    res = run_gate(base, cand, metric="both", accept_unattested=True)
    assert res.exit_code == 1
    name = {"kept": "all lengths needle kept", "fidelity": "all lengths selection fidelity"}[measure]
    assert [c.name for c in res.failed] == [name]
    loose = run_gate(base, cand, metric="rank", rank_tolerance=1.5, accept_unattested=True)
    assert loose.exit_code == 0                   # kept ratio 0.6 / miss ratio 2: within a tolerance of 1.5
    assert run_gate(base, same, metric="both", accept_unattested=True).exit_code == 0
    up = run_gate(cand, base, metric="both", accept_unattested=True)          # the other way round: better
    assert up.exit_code == 0
    export_baseline(base, tmp_path / "base.json")                              # the exported baseline carries both
    exported = run_gate(tmp_path / "base.json", cand, metric="both", accept_unattested=True)
    assert [c.name for c in exported.failed] == [name]
    data = json.loads((tmp_path / "base.json").read_text())                  # one exported before it did
    for t in data["configs"]["X"]["trials"]:
        t.pop("kept"), t.pop("fidelity")
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = run_gate(tmp_path / "old.json", cand, metric="both", accept_unattested=True)
    assert old.exit_code == 0
    assert {"all lengths needle kept", "all lengths selection fidelity"} <= {
        c.name for c in old.cases if c.status == "skipped"}


def test_plan_bootstrap_needs_fewer_rank_pairs(tmp_path):
    from niah.report.data import load_frame
    from niah.report.ranks import rank_pairs, trials_needed_bootstrap

    run = make_run(tmp_path / "r", configs={"A": {}, "B": {}}, lengths=(2048,), depths=(10.0, 50.0, 90.0),
                   trials=10, outcome={"A": lambda *a: "correct",
                                       "B": lambda c, L, d, t, rng: "wrong" if t == 0 else "correct"})
    _add_indexer(run, lambda c, L, d, t: (0.3 + 0.02 * t) * (1.2 if c == "B" and t % 3 else 0.95 if c == "B" else 1))
    _, df = load_frame(run)
    pairs = rank_pairs(df[df["config"] == "A"], df[df["config"] == "B"])
    rank, answer = trials_needed_bootstrap(pairs, reps=200)
    assert rank.n is not None and answer.n is not None and rank.n < answer.n
    assert math.isfinite(rank.power_at_max)


def test_matrix_topks_feed_lengths_auto():
    from niah.demo import demo_matrix
    from niah.sweep.indexer import auto_lengths
    from niah.serving.matrix import matrix_topks

    topks, context = matrix_topks(demo_matrix(), context_too=True)
    assert topks == {"dense": None, "fp8-k64": 64, "fp8-k512": 512, "bf16-k64": 64, "bf16-k512": 512,
                     "fp8-hadamard-k64": 64}
    assert context == 8192
    assert auto_lengths([k for k in topks.values() if k], context, 24) == [128, 256, 512, 1024, 2048, 4096]
