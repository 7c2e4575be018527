"""The run folders committed under results/ read as the docs say they do: clean, attested,
and with the paired verdicts docs/embedded-server.md and the README quote.

results/precision-k32/ is the embedded server at top-k 32 on 2K-4K prompts, where index-key
precision costs answers; these checks fail if the folder is edited, a trial lost, or the
compare statistics change what they conclude from it.
"""

from __future__ import annotations

import json
from pathlib import Path

from cli_inproc import niah

from niah.attestation import VALID, status
from niah.runs.integrity import load_checked

ROOT = Path(__file__).resolve().parents[2]
K32 = ROOT / "results" / "precision-k32"


def _compare(a: str, b: str) -> dict:
    r = niah("compare", str(K32), "--a", a, "--b", b, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_top_k_32_run_is_clean_attested_and_identical_prompts_across_arms():
    checked = load_checked(K32)
    assert checked.problems == []
    configs = checked.manifest["configs"]
    assert list(configs) == ["fp4", "fp8", "bf16", "fp8-bf16-c4"]
    for name, entry in configs.items():
        assert status(entry)[0] == VALID, (name, status(entry))
    prompts = {}
    for r in checked.records:
        assert r["outcome"] in {"correct", "wrong"}, r  # every trial answered: no outage
        prompts.setdefault(r["config"], set()).add(r["prompt_sha256"])
    assert len(prompts["bf16"]) == 30 and all(p == prompts["bf16"] for p in prompts.values())


def test_the_top_k_32_run_shows_precision_costing_answers():
    fp4 = _compare("fp4", "bf16")
    (whole,) = [row for row in fp4["rows"] if row["group"] == "all"]
    assert fp4["verdict"] == "B better" and (whole["losses"], whole["wins"]) == (0, 6)
    fp8 = _compare("fp8", "bf16")
    (whole,) = [row for row in fp8["rows"] if row["group"] == "all"]
    assert fp8["verdict"] == "no significant difference" and (whole["losses"], whole["wins"]) == (0, 4)
    two_stage = _compare("bf16", "fp8-bf16-c4")
    (whole,) = [row for row in two_stage["rows"] if row["group"] == "all"]
    assert (whole["losses"], whole["wins"], whole["k_a"], whole["k_b"]) == (0, 0, 21, 21)
