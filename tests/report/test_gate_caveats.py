"""Every verdict carries what weakens it: an incomplete run (N of M planned trials, the
lengths with no trial, the command that finishes it), approximate or drifting lengths, a
server that changed, a sample too small to see the tolerance, and "n/a" for a server that
attests nothing. Said in the gate's Markdown, JUnit and --json, and on the report's first
screen (summary.md's headline, index.html's cards). An incomplete candidate is an outage
(exit 1), never bad input (exit 2)."""

from __future__ import annotations

import json
import shlex
import xml.etree.ElementTree as ET

from cli_inproc import niah
from report_runs import make_run

GRID = ("--lengths", "300,600", "--depths", "0,50,100", "--trials", "2", "--seed", "0")


def _sweep(url, out, *extra):
    r = niah("sweep", "--endpoint", url, *GRID, "--out", out, "--quiet", *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def _cut(run, keep: int):
    """What a kill leaves: the first `keep` trial lines."""
    p = run / "trials.jsonl"
    p.write_text("".join(p.read_text().splitlines(keepends=True)[:keep]))
    return run


def _gate(tmp_path, base, cand, *extra):
    r = niah("gate", "--baseline", base, "--candidate", cand, "--junit", tmp_path / "j.xml",
             "--summary", tmp_path / "s.md", "--json", *extra)
    doc = json.loads(r.stdout) if r.stdout.strip().startswith("{") else None
    return r, doc


def _junit_caveats(path):
    return [p.get("value") for p in ET.parse(path).getroot().iter("property") if p.get("name") == "caveat"]


def test_a_cut_candidate_is_an_outage_that_says_how_to_finish_it_and_the_command_does(oracle, tmp_path):
    base = _sweep(oracle.url, tmp_path / "base")
    cand = _cut(_sweep(oracle.url, tmp_path / "cand"), 6)  # length 300 only: 600 never ran
    r, doc = _gate(tmp_path, base, cand)
    assert r.returncode == 1, r.stdout + r.stderr
    md = (tmp_path / "s.md").read_text()
    assert "### What weakens this verdict" in md
    assert "6 of 12 planned trials measured; no measured trial at length 600" in md
    inc = [c for c in doc["caveats"] if c["kind"] == "incomplete"]
    assert len(inc) == 1 and inc[0]["config"] == "default"
    assert any(n.startswith("caveat: ") and "6 of 12 planned" in n for n in doc["notes"])
    assert any("6 of 12 planned" in v for v in _junit_caveats(tmp_path / "j.xml"))
    case = next(c for c in doc["cases"] if c["length"] == 600)
    assert case["status"] == "outage"
    assert "the candidate run is incomplete: finish it with `niah sweep" in case["message"]

    # the command it names finishes the run, and the finished run passes
    finish = inc[0]["text"].rsplit("finish it with `", 1)[1].rstrip("`")
    assert "--resume" in finish and str(cand) in finish
    args = shlex.split(finish)
    assert args[0] == "niah"
    assert niah(*args[1:]).returncode == 0
    r, doc = _gate(tmp_path, base, cand)
    assert r.returncode == 0 and not [c for c in doc["caveats"] if c["kind"] == "incomplete"], r.stdout


def test_a_candidate_stopped_before_any_baseline_length_is_an_outage_not_bad_input(oracle, tmp_path):
    full = _sweep(oracle.url, tmp_path / "full")
    assert niah("baseline", "export", full, "-o", tmp_path / "b.json", "--config", "default").returncode == 0
    b = json.loads((tmp_path / "b.json").read_text())  # a baseline of length 600 only
    b["configs"]["default"]["trials"] = [t for t in b["configs"]["default"]["trials"] if t["length"] == 600]
    (tmp_path / "b600.json").write_text(json.dumps(b))

    cand = _cut(_sweep(oracle.url, tmp_path / "cand"), 6)  # stopped after length 300
    r, doc = _gate(tmp_path, tmp_path / "b600.json", cand)
    assert r.returncode == 1 and doc["verdict"] == "OUTAGE", r.stdout + r.stderr
    assert "finish it with `niah sweep" in doc["cases"][0]["message"]

    empty = _cut(_sweep(oracle.url, tmp_path / "empty"), 0)  # stopped before its first trial
    r, doc = _gate(tmp_path, tmp_path / "b600.json", empty)
    assert r.returncode == 1 and doc["verdict"] == "OUTAGE", r.stdout + r.stderr
    assert "0 of 12 planned trials measured" in (tmp_path / "s.md").read_text()


def test_a_changed_server_approximate_lengths_and_a_small_sample_are_said(oracle, oracle_factory, tmp_path):
    base = _sweep(oracle.url, tmp_path / "base")
    other = oracle_factory("--max-model-len", "32768")
    cand = _sweep(other.url, tmp_path / "cand", "--approximate-lengths")
    r, doc = _gate(tmp_path, base, cand)
    assert r.returncode == 0, r.stdout + r.stderr
    kinds = {c["kind"]: c["text"] for c in doc["caveats"]}
    assert "max_model_len 65536 -> 32768" in kinds["changed"]
    assert "--approximate-lengths" in kinds["lengths"]
    # 6 pairs per length; `niah plan` says how many a 5-point drop from 100% takes
    plan = json.loads(niah("plan", "--recall", "1", "--drop", "0.05", "--json").stdout)
    need = next(d["trials_per_side"] for d in plan["designs"] if "independent" in d["design"])
    assert "6 pairs at length 300 (the thinnest)" in kinds["sample"] and f"takes about {need} " in kinds["sample"]
    assert "`niah plan --recall 1 --drop 0.05 --alpha 0.05`" in kinds["sample"]
    md = (tmp_path / "s.md").read_text()
    assert all(t in md for t in kinds.values())
    assert "attestation: n/a" in md and doc["configs"]["default"]["attestation"] == "n/a"


def test_a_sample_large_enough_and_a_complete_run_say_nothing(tmp_path):
    base = make_run(tmp_path / "b", lengths=(1024,), depths=(0.0, 50.0, 100.0), trials=53)  # 159 pairs: 157 needed
    r, doc = _gate(tmp_path, base, base)
    assert r.returncode == 0 and doc["caveats"] == [], r.stdout


def test_lengths_off_by_more_than_the_allowance_are_said(tmp_path):
    base = make_run(tmp_path / "b", lengths=(1024, 2048), depths=(0.0, 100.0), trials=3)
    cand = make_run(tmp_path / "c", lengths=(1024, 2048), depths=(0.0, 100.0), trials=3)
    p = cand / "trials.jsonl"
    lines = [json.loads(x) for x in p.read_text().splitlines()]
    lines[-1]["prompt_tokens"] = 2048 + 40  # beyond max(4, 0.5%) = 10.24
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r, doc = _gate(tmp_path, base, cand)
    text = next(c["text"] for c in doc["caveats"] if c["kind"] == "lengths")
    assert "1 trial(s) off their length by more than max(4 tokens, 0.5%) (worst: 2048 asked, 2088 counted" in text


def test_the_report_first_screen_says_incomplete_and_na(oracle, tmp_path):
    run = _cut(_sweep(oracle.url, tmp_path / "run"), 6)
    r = niah("report", run)
    assert r.returncode == 0, r.stdout + r.stderr
    head = (run / "report" / "summary.md").read_text().split("## Headline", 1)[1].split("\n## ", 1)[0]
    assert "6 of 12 planned trials measured; no measured trial at length 600" in head
    assert "--resume" in head and "attestation: n/a" in head
    page = (run / "report" / "index.html").read_text()
    card = page.split('data-config="default"', 1)[1].split("</article>", 1)[0]
    assert 'class="caveat"' in card and "6 of 12 planned trials" in card
    assert ">n/a</span>" in card and "state-valid" not in card
