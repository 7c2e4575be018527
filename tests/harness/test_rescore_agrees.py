"""`niah rescore` scores as the sweep scored, through the real CLI against the oracle server:
a near miss stays `near` (with its closest value), a residue trial keeps its closest value,
and a `--decode-first` trial is scored after the count it was asked for (its K recorded)."""

import json

from niah.runs.trials import load_run


def niah(*args, **kw):
    from cli_inproc import niah as run  # the entry point in this process (tests/cli_inproc.py)

    return run(*args, capture_output=True, text=True, **kw)


def _rescore_changes_nothing(run):
    before = (run / "trials.jsonl").read_bytes()
    r = niah("rescore", run)
    assert r.returncode == 0, r.stderr
    assert ": 0 outcome(s) changed" in r.stdout, r.stdout
    return before


def test_rescore_keeps_near_misses_and_residue_closest_values(oracle_factory, tmp_path):
    bad = oracle_factory("--digit-off", "4:3")  # the last digit one off when prompt tokens = 3 mod 4
    out = tmp_path / "run"
    r = niah("sweep", "--endpoint", bad.url, "--lengths", "600", "--residues", "mod4", "--depths", "50",
             "--trials", "2", "--out", out, "-q")
    assert r.returncode == 0, r.stderr
    _, recs = load_run(out)
    assert {r["outcome"] for r in recs} == {"correct", "near"}
    before = {json.dumps(r, sort_keys=True) for r in recs}
    _rescore_changes_nothing(out)
    _, again = load_run(out)
    assert {json.dumps(r, sort_keys=True) for r in again} == before  # near and closest values kept


def test_rescore_scores_a_decode_trial_after_its_count(oracle_factory, tmp_path):
    server = oracle_factory()
    out = tmp_path / "run"
    r = niah("sweep", "--endpoint", server.url, "--lengths", "600", "--depths", "0,100", "--trials", "1",
             "--decode-first", "64", "--out", out, "-q")
    assert r.returncode == 0, r.stderr
    _, recs = load_run(out)
    for rec in recs:
        assert rec["outcome"] == "correct" and rec["decode_count_to"] > 1
        assert rec["answer"].startswith("1 2 3 ")
    _rescore_changes_nothing(out)
    # the same stored reply with the value written inside the count (before K): not an answer
    lines = [json.loads(x) for x in (out / "trials.jsonl").read_text().splitlines()]
    for rec in lines:
        k = rec["decode_count_to"]
        rec["answer"] = f"1 {rec['needle']} 3 {k}\nDone counting."
    (out / "trials.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = niah("rescore", out)
    assert r.returncode == 0, r.stderr
    _, recs = load_run(out)
    assert all(rec["outcome"] == "wrong" for rec in recs), [rec["outcome"] for rec in recs]
