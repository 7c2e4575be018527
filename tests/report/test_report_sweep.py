"""Report, baseline export and gate on real sweeps (niah sweep against the oracle server
of tests/servers/oracle.py, a real OpenAI-compatible process on loopback)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

SWEEP = ["--lengths", "500,1k,2k", "--depths", "0,50,100", "--trials", "2", "--seed", "3", "-q"]


def _niah(*args):
    from cli_inproc import niah  # the entry point in this process (tests/cli_inproc.py)

    return niah(*args)


def _sweep(server, out):
    r = _niah("sweep", "--endpoint", server.url, *SWEEP, "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_sweep_report_export_gate(oracle_factory, tmp_path):
    good = oracle_factory("--needle-span")
    bad = oracle_factory("--needle-span", "--wrong-above", "1500")  # loses every needle beyond 1500 tokens
    base = _sweep(good, tmp_path / "base")
    again = _sweep(good, tmp_path / "again")
    worse = _sweep(bad, tmp_path / "worse")

    r = _niah("report", base)
    assert r.returncode == 0, r.stderr
    md = (base / "report" / "summary.md").read_text()
    assert (base / "report" / "heatmap_default.png").exists() and (base / "report" / "recall_vs_length.png").exists()
    assert ("| `default` | 100.0% [61–100] (6/6) | 100.0% [61–100] (6/6) | 100.0% [61–100] (6/6) "
            "| 100.0% [82–100] (18/18) |" in md)
    assert "Last-prompt-token selection recall" in md  # the oracle returns selection_recall
    assert "Every reported length is within max(4 tokens, 0.5%) of the request." in md

    baseline = tmp_path / "baselines" / "oracle.json"
    assert _niah("baseline", "export", base, "-o", baseline).returncode == 0

    r = _niah("gate", "--baseline", baseline, "--candidate", again)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "paired by prompt hash" in r.stdout

    r = _niah("gate", "--baseline", baseline, "--candidate", worse, "--junit", tmp_path / "j.xml")
    assert r.returncode == 1, r.stdout + r.stderr
    failing = {tc.get("name") for tc in ET.parse(tmp_path / "j.xml").getroot().iter("testcase")
               if tc.find("failure") is not None}
    assert failing == {"length 2000", "all lengths"}

    r = _niah("compare", base, worse)
    assert r.returncode == 0 and (
        "| 2,000 | paired (prompt) | 100.0% (6/6) | 0.0% (0/6) | -100.0 pp | 6 / 0 | 0.031 | B worse |" in r.stdout)
