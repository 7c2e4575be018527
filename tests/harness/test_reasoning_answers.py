"""`--answer-prefix`, thinking on/off in the manifest and answers found only in the reasoning,
through the real CLI against the oracle server (tests/servers/oracle.py --think-drop-above:
every reply reasons with the value; the final content keeps it only up to N prompt tokens)."""

import json

from niah.runs.trials import load_run


def niah(*args, **kw):
    from cli_inproc import niah as run  # the entry point in this process (tests/cli_inproc.py)

    return run(*args, **kw)


def _sweep(server, out, *extra):
    r = niah("sweep", "--endpoint", server.url, "--lengths", "600,2000", "--depths", "0,100", "--trials", "2",
             "--max-tokens", "128", "--out", out, "--quiet", *extra)
    assert r.returncode == 0, r.stderr
    return load_run(out)


def test_reasoning_only_answers_are_counted_per_length(oracle_factory, tmp_path):
    server = oracle_factory("--think-drop-above", "1000")
    manifest, recs = _sweep(server, tmp_path / "run", "--answer-prefix", "ANSWER:", "--extra-body",
                            json.dumps({"chat_template_kwargs": {"thinking": True}}))
    assert manifest["configs"]["default"]["thinking"] is True
    assert manifest["args"]["answer_prefix"] == "ANSWER:"
    for r in recs:
        assert r["answer_prefix_ok"] is True, r
        if r["length"] == 600:
            assert (r["found_in"], r["outcome"]) == ("both", "correct"), r
        else:  # found while reasoning, not said: scored on the content, so a miss
            assert (r["found_in"], r["outcome"]) == ("reasoning", "wrong"), r
    assert niah("report", tmp_path / "run").returncode == 0
    summary = (tmp_path / "run" / "report" / "summary.md").read_text()
    assert "| `default` | on | 0 / 0 / 4 / 0 | 4 / 0 / 0 / 0 |" in summary
    assert "| `default` | 4 of 4 | 4 of 4 |" in summary


def test_a_missing_prefix_is_recorded_and_thinking_off_is_recorded(oracle_factory, tmp_path):
    server = oracle_factory("--ignore-answer-prefix")
    manifest, recs = _sweep(server, tmp_path / "run", "--answer-prefix", "ANSWER:", "--extra-body",
                            json.dumps({"chat_template_kwargs": {"enable_thinking": False}}))
    assert manifest["configs"]["default"]["thinking"] is False
    assert all(r["answer_prefix_ok"] is False and r["outcome"] == "correct" for r in recs)
    assert all(r["found_in"] is None for r in recs)  # no reasoning: nothing to say
    assert niah("report", tmp_path / "run").returncode == 0
    assert "| `default` | 0 of 4 | 0 of 4 |" in (tmp_path / "run" / "report" / "summary.md").read_text()


def test_defaults_record_nothing_new(oracle, tmp_path):
    manifest, recs = _sweep(oracle, tmp_path / "run")
    assert manifest["configs"]["default"]["thinking"] is None and manifest["args"]["answer_prefix"] is None
    assert all(r["answer_prefix_ok"] is None and r["found_in"] is None and r["cache_state"] is None for r in recs)
    assert niah("report", tmp_path / "run").returncode == 0
    summary = (tmp_path / "run" / "report" / "summary.md").read_text()
    assert "answer prefix" not in summary and "Where the answer was found" not in summary


def test_answer_prefix_with_a_frozen_set_is_refused(oracle, tmp_path):
    built = niah("prompts", "build", "--endpoint", oracle.url, "--lengths", "600", "--depths", "50", "--trials", "1",
                 "--out", tmp_path / "set.jsonl")
    assert built.returncode == 0, built.stderr
    r = niah("sweep", "--endpoint", oracle.url, "--prompts", tmp_path / "set.jsonl", "--answer-prefix", "A:",
             "--out", tmp_path / "run", "--quiet")
    assert r.returncode == 2 and "--answer-prefix needs" in r.stderr
    r = niah("sweep", "--endpoint", oracle.url, "--prompts", tmp_path / "set.jsonl", "--cache-state", "cold",
             "--out", tmp_path / "run", "--quiet")
    assert r.returncode == 2 and "cannot be made cold" in r.stderr
