"""`--decode-first N` through the real CLI against the oracle server (tests/servers/oracle.py
--wrong-after-decode M: the value comes back wrong once more than M tokens were generated
before it): a plain sweep misses that fault, a decode-first sweep catches it; lengths stay
exact; the run, report, compare and gate carry the option."""

import json
import urllib.request

from niah.runs.trials import load_run


def niah(*args, **kw):
    from cli_inproc import niah as run  # the entry point in this process (tests/cli_inproc.py)

    return run(*args, **kw)


def _sweep(server, out, *extra):
    r = niah("sweep", "--endpoint", server.url, "--lengths", "600,2000", "--depths", "0,100", "--trials", "2",
             "--out", out, "--quiet", *extra)
    assert r.returncode == 0, r.stderr
    return load_run(out)


def test_decode_first_catches_a_fault_a_plain_sweep_misses(oracle_factory, tmp_path):
    server = oracle_factory("--wrong-after-decode", "100")
    plain_manifest, plain = _sweep(server, tmp_path / "plain")
    assert all(r["outcome"] == "correct" for r in plain)
    assert "decode_first" not in plain_manifest["args"] and all("decode_first" not in r for r in plain)

    short_manifest, short = _sweep(server, tmp_path / "short", "--decode-first", "64")
    assert short_manifest["args"]["decode_first"] == 64
    for r in short:
        assert r["outcome"] == "correct" and r["prompt_tokens"] == r["length"], r
        assert r["decode_first"] == 64 and 64 <= r["decode_tokens"] <= 80, r
        assert r["answer"].startswith("1 2 3 ")

    manifest, recs = _sweep(server, tmp_path / "long", "--decode-first", "256")
    assert manifest["args"]["decode_first"] == 256
    for r in recs:
        assert r["outcome"] == "wrong" and r["prompt_tokens"] == r["length"], r
        assert r["decode_first"] == 256 and r["decode_tokens"] >= 256, r
    seen = json.loads(urllib.request.urlopen(server.url.rsplit("/v1", 1)[0] + "/seen").read())
    asked = [e["body"]["max_tokens"] for e in seen if e["path"].endswith("/completions")
             and e["body"].get("max_tokens") != 1]
    assert max(asked) > 256 + 32  # room for the count, then the answer

    assert niah("report", tmp_path / "long").returncode == 0
    summary = (tmp_path / "long" / "report" / "summary.md").read_text()
    assert "## Recall after decoding (--decode-first 256)" in summary
    assert "| `default` | 0/4, " in summary
    assert niah("report", tmp_path / "plain").returncode == 0
    assert "Recall after decoding" not in (tmp_path / "plain" / "report" / "summary.md").read_text()


def test_compare_and_gate_refuse_sides_of_another_decode_first(oracle_factory, tmp_path):
    server = oracle_factory()
    _sweep(server, tmp_path / "a", "--decode-first", "32")
    _sweep(server, tmp_path / "b")
    r = niah("compare", tmp_path / "a", tmp_path / "b")
    assert r.returncode == 2 and "--decode-first 32" in r.stderr and "with none" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = niah("gate", "--baseline", tmp_path / "a", "--candidate", tmp_path / "b", "--accept-unattested")
    assert r.returncode == 2 and "--decode-first" in r.stderr, r.stderr
    exported = niah("baseline", "export", tmp_path / "a", "--out", tmp_path / "base.json")
    assert exported.returncode == 0, exported.stderr
    r = niah("gate", "--baseline", tmp_path / "base.json", "--candidate", tmp_path / "b", "--accept-unattested")
    assert r.returncode == 2 and "--decode-first" in r.stderr, r.stderr
    r = niah("gate", "--baseline", tmp_path / "base.json", "--candidate", tmp_path / "a", "--accept-unattested")
    assert r.returncode == 0, r.stdout + r.stderr


def test_bad_decode_first_is_refused_in_one_line(oracle, tmp_path):
    for bad in ("0", "40000"):
        r = niah("sweep", "--endpoint", oracle.url, "--decode-first", bad, "--out", tmp_path / "x", "--quiet")
        assert r.returncode == 2 and "--decode-first must be" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    built = niah("prompts", "build", "--endpoint", oracle.url, "--lengths", "600", "--depths", "50", "--trials", "1",
                 "--out", tmp_path / "set.jsonl")
    assert built.returncode == 0, built.stderr
    r = niah("sweep", "--endpoint", oracle.url, "--prompts", tmp_path / "set.jsonl", "--decode-first", "64",
             "--out", tmp_path / "run", "--quiet")
    assert r.returncode == 2 and "not with --prompts" in r.stderr
