"""`niah sweep --cache-state cold,warm,repeat` through the real CLI against the oracle server,
whose real prefix cache (tests/servers/oracle.py) reports what each request reused: cold is
cold, warm is warm, repeat faults are flagged, and report, compare and gate keep states apart."""

import json

import httpx

from niah.runs.trials import load_run


def niah(*args, **kw):
    from cli_inproc import niah as run  # the entry point in this process (tests/cli_inproc.py)

    return run(*args, **kw)


def _sweep(server, out, *extra):
    r = niah("sweep", "--endpoint", server.url, "--lengths", "600,2000", "--depths", "0,100", "--trials", "2",
             "--out", out, "--quiet", *extra)
    assert r.returncode == 0, r.stderr
    return load_run(out)


def _by_state(recs):
    out = {}
    for r in recs:
        out.setdefault(r["cache_state"], []).append(r)
    return out


def test_cold_is_cold_warm_is_warm_repeat_is_flagged(oracle_factory, tmp_path):
    # a cache path that corrupts any prefix it reuses beyond 1,000 tokens
    server = oracle_factory("--corrupt-cached-above", "1000")
    manifest, recs = _sweep(server, tmp_path / "run", "--cache-state", "warm,repeat,cold")
    assert manifest["args"]["cache_states"] == ["cold", "repeat", "warm"]
    states = _by_state(recs)
    assert sorted(states) == ["cold", "repeat", "warm"] and all(len(v) == 8 for v in states.values())
    for r in states["cold"]:  # only the chat template's first tokens are shared with anything earlier
        assert r["cached_tokens"] <= 8 and r["outcome"] == "correct", r
    for r in states["warm"]:  # the whole prompt but its last token came from the cache
        assert r["cached_tokens"] >= r["prompt_tokens"] - 1, r
        assert r["outcome"] == ("wrong" if r["length"] == 2000 else "correct"), r
    for r in states["repeat"]:  # first request uncached (correct), second cached: they differ above 1,000
        assert r["repeat_fault"] is (r["length"] == 2000), r
        assert r["repeat_answer"] and r["outcome"] == ("wrong" if r["length"] == 2000 else "correct")
    # the server's own log of the 32 scored-or-repeated requests: repeat's second and warm's
    # trials reused everything, repeat's first requests only the instruction every prompt opens
    # with, cold trials not even that (their nonce comes first)
    log = [e for e in httpx.get(f"http://127.0.0.1:{server.port}/cache", timeout=10).json() if e["max_tokens"] != 1]
    assert len(log) == 32
    assert sum(e["cached_tokens"] >= e["prompt_tokens"] - 1 for e in log) == 16
    assert sum(8 < e["cached_tokens"] < 100 for e in log) == 8
    assert sum(e["cached_tokens"] <= 8 for e in log) == 8
    # a cold prompt holds its nonce and is still exactly its length
    assert all(abs(r["prompt_tokens"] - r["length"]) <= 4 for r in states["cold"])
    shas = {r["prompt_sha256"] for r in states["cold"]} & {r["prompt_sha256"] for r in states["warm"]}
    assert not shas

    rep = niah("report", tmp_path / "run")
    assert rep.returncode == 0, rep.stderr
    summary = (tmp_path / "run" / "report" / "summary.md").read_text()
    assert "| `default` | cold | 1.00 (4/4) | 1.00 (4/4) |" in summary
    assert "| `default` | warm | 1.00 (4/4) | 0.00 (0/4) |" in summary
    assert "| `default` | 0 of 4 | ⚠ 4 of 4 |" in summary  # repeat faults per length


def test_usage_counter_cannot_promise_cold(oracle, tmp_path):
    r = niah("sweep", "--endpoint", oracle.url, "--lengths", "600", "--tokenizer", "usage", "--cache-state",
             "cold", "--out", tmp_path / "run", "--quiet")
    assert r.returncode == 2 and "cannot be promised with the usage counter" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
    bad = niah("sweep", "--endpoint", oracle.url, "--cache-state", "hot", "--out", tmp_path / "x", "--quiet")
    assert bad.returncode == 2 and "unknown --cache-state" in bad.stderr


def test_default_is_unchanged_and_says_the_usage_counter_warmed_it(oracle, tmp_path):
    manifest, recs = _sweep(oracle, tmp_path / "run", "--tokenizer", "usage")
    assert all(r["cache_state"] is None for r in recs)
    assert manifest["configs"]["default"]["tokenizer_cost"]["warms_prefix_cache"] is True
    # the counter's probes sent each prompt before its trial: the server reused all of it
    assert all(r["cached_tokens"] >= r["prompt_tokens"] - 1 for r in recs)
    assert niah("report", tmp_path / "run").returncode == 0
    summary = (tmp_path / "run" / "report" / "summary.md").read_text()
    assert "Not controlled: the usage counter sent every prompt before its trial" in summary


def test_gate_and_compare_pair_within_a_cache_state(oracle_factory, tmp_path):
    good, bad = oracle_factory(), oracle_factory("--corrupt-cached-above", "1000")
    _sweep(good, tmp_path / "base", "--cache-state", "cold,warm", "--trials", "6")
    _sweep(bad, tmp_path / "cand", "--cache-state", "cold,warm", "--trials", "6")
    g = niah("gate", "--baseline", tmp_path / "base", "--candidate", tmp_path / "cand", "--json")
    assert g.returncode == 1, g.stdout + g.stderr
    res = json.loads(g.stdout)
    status = {(c["config"], str(c["length"])): c["status"] for c in res["cases"]}
    assert status[("default [cache cold]", "2000")] == "pass"  # cold never reuses: nothing corrupted
    assert status[("default [cache warm]", "2000")] == "regression"
    assert status[("default [cache warm]", "600")] == "pass"
    c = niah("compare", tmp_path / "base", tmp_path / "cand")
    assert c.returncode == 0, c.stderr
    assert "| ('warm', 2000) | paired (prompt+seed) | 100.0% (12/12) | 0.0% (0/12) |" in c.stdout
    assert "| ('cold', 2000) | paired (prompt+seed) | 100.0% (12/12) | 100.0% (12/12) |" in c.stdout
    # a candidate without the baseline's warm state is an outage there, never a pass
    _sweep(bad, tmp_path / "cold-only", "--cache-state", "cold", "--trials", "6")
    g2 = niah("gate", "--baseline", tmp_path / "base", "--candidate", tmp_path / "cold-only", "--json")
    assert g2.returncode == 1
    cases = json.loads(g2.stdout)["cases"]
    assert any(x["config"] == "default [cache warm]" and x["status"] == "outage" for x in cases)
