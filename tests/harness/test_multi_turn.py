"""`--multi-turn N` through the real CLI against the oracle server (tests/servers/oracle.py finds
the asked poem in the chat; --mrcr-off-by-one answers the neighbouring one): lengths stay exact,
a healthy server is found, the planted fault is scored wrong and fails the gate, compare and
gate refuse sides of another N, bad values are refused in one line, rescore keeps the score."""

import json

from niah.runs.trials import load_run


def niah(*args, **kw):
    from cli_inproc import niah as run  # the entry point in this process (tests/cli_inproc.py)

    return run(*args, **kw)


def _sweep(server, out, *extra, lengths="600,2000", depths="0,50,100"):
    r = niah("sweep", "--endpoint", server.url, "--lengths", lengths, "--depths", depths, "--trials", "2",
             "--out", out, "--quiet", *extra)
    assert r.returncode == 0, r.stderr
    return load_run(out)


def test_multi_turn_found_with_exact_lengths_and_reported(oracle, tmp_path):
    manifest, recs = _sweep(oracle, tmp_path / "run", "--multi-turn", "4")
    assert manifest["args"]["multi_turn"] == 4 and len(recs) == 12
    for r in recs:
        assert r["outcome"] == "correct" and r["prompt_tokens"] == r["length"], r
        assert r["multi_turn"] == 4 and r["prefix_hit"] is True and r["similarity"] == 1.0, r
        assert r["answer"].startswith(r["required_prefix"]) and len(r["required_prefix"]) == 10
        assert r["turns"] >= 4 + 2 and 1 <= r["asked_turn"] <= r["turns"]
        assert r["asked_index"] == {0.0: 1, 100.0: 4}.get(r["depth"], r["asked_index"]), r
        assert r["needle"] in r["answer"] and len(r["distractors"]) == 3
    assert {r["asked_index"] for r in recs if r["depth"] == 50.0} <= {1, 2, 3, 4}
    prompts = [json.loads(line) for line in (tmp_path / "run" / "prompts.jsonl").read_text().splitlines()]
    for p in prompts:
        msgs = p["messages"]
        asks = [m for m in msgs if m["role"] == "user" and m["content"].startswith("Write a short poem about")]
        assert len(asks) == 4 and msgs[-1]["content"].startswith("Prepend ") and msgs[-2]["role"] == "assistant"

    assert niah("report", tmp_path / "run").returncode == 0
    summary = (tmp_path / "run" / "report" / "summary.md").read_text()
    assert "## Multi-turn recall (--multi-turn 4)" in summary
    assert "| `default` | 6/6, sim 1.00, prefix 6/6 | 6/6, sim 1.00, prefix 6/6 |" in summary

    r = niah("rescore", tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert [x["outcome"] for x in load_run(tmp_path / "run")[1]] == [x["outcome"] for x in recs]


def test_off_by_one_is_wrong_and_fails_the_gate(oracle, oracle_factory, tmp_path):
    _sweep(oracle, tmp_path / "base", "--multi-turn", "3")
    bad = oracle_factory("--mrcr-off-by-one")
    _, recs = _sweep(bad, tmp_path / "cand", "--multi-turn", "3")
    for r in recs:
        assert r["outcome"] == "wrong" and r["prefix_hit"] is True and r["similarity"] < 0.9, r
        assert r["prompt_tokens"] == r["length"]
    r = niah("gate", "--baseline", tmp_path / "base", "--candidate", tmp_path / "cand", "--accept-unattested")
    assert r.returncode == 1, r.stdout + r.stderr
    r = niah("gate", "--baseline", tmp_path / "base", "--candidate", tmp_path / "base", "--accept-unattested")
    assert r.returncode == 0, r.stdout + r.stderr
    # the same fault is invisible to a plain sweep: its prompts never ask for a poem
    _, plain = _sweep(bad, tmp_path / "plain", lengths="600", depths="50")
    assert all(r["outcome"] == "correct" and "multi_turn" not in r for r in plain)


def test_compare_and_gate_refuse_sides_of_another_multi_turn(oracle, tmp_path):
    _sweep(oracle, tmp_path / "a", "--multi-turn", "2", lengths="600", depths="50")
    _sweep(oracle, tmp_path / "b", "--multi-turn", "3", lengths="600", depths="50")
    _sweep(oracle, tmp_path / "c", lengths="600", depths="50")
    r = niah("compare", tmp_path / "a", tmp_path / "b")
    assert r.returncode == 2 and "--multi-turn 2" in r.stderr and "with 3" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = niah("compare", tmp_path / "a", tmp_path / "c")
    assert r.returncode == 2 and "with none" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = niah("gate", "--baseline", tmp_path / "a", "--candidate", tmp_path / "b", "--accept-unattested")
    assert r.returncode == 2 and "--multi-turn" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    exported = niah("baseline", "export", tmp_path / "a", "--out", tmp_path / "base.json")
    assert exported.returncode == 0, exported.stderr
    r = niah("gate", "--baseline", tmp_path / "base.json", "--candidate", tmp_path / "c", "--accept-unattested")
    assert r.returncode == 2 and "--multi-turn" in r.stderr, r.stderr
    r = niah("gate", "--baseline", tmp_path / "base.json", "--candidate", tmp_path / "a", "--accept-unattested")
    assert r.returncode == 0, r.stdout + r.stderr
    r = niah("sweep", "--endpoint", oracle.url, "--lengths", "600", "--depths", "50", "--trials", "2",
             "--multi-turn", "3", "--out", tmp_path / "a", "--resume", "--quiet")
    assert r.returncode == 2 and "--resume with a different --multi-turn" in r.stderr


def test_bad_multi_turn_is_refused_in_one_line(oracle, oracle_factory, tmp_path):
    cases = [("0",), ("65",), ("3", "--mode", "completion"), ("3", "--control"), ("3", "--decode-first", "8"),
             ("3", "--answer-prefix", "X"), ("3", "--needle-value", "uuid")]
    for extra in cases:
        r = niah("sweep", "--endpoint", oracle.url, "--multi-turn", *extra, "--out", tmp_path / "x", "--quiet")
        assert r.returncode == 2 and "--multi-turn" in r.stderr, (extra, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    built = niah("prompts", "build", "--endpoint", oracle.url, "--lengths", "600", "--depths", "50", "--trials", "1",
                 "--out", tmp_path / "set.jsonl")
    assert built.returncode == 0, built.stderr
    r = niah("sweep", "--endpoint", oracle.url, "--prompts", tmp_path / "set.jsonl", "--multi-turn", "3",
             "--out", tmp_path / "run", "--quiet")
    assert r.returncode == 2 and "not with --prompts" in r.stderr
    text_only = oracle_factory("--tokenize-text-only")  # SGLang's /tokenize: one message at most
    r = niah("sweep", "--endpoint", text_only.url, "--lengths", "600", "--depths", "50", "--trials", "1",
             "--multi-turn", "3", "--out", tmp_path / "t", "--quiet")
    assert r.returncode == 2 and "--multi-turn counts whole chats" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
