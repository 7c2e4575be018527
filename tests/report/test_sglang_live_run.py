"""The committed live-SGLang run (results/sglang-live-h200/): real SGLang 0.5.16 servers on one
H200, launched by `niah sweep --matrix` from benchmarks/sglang_live/ on the shrunk DeepSeek-V3.2
(dummy weights). These checks hold the folder to what benchmarks/sglang_live/README.md and the
README say of it: which SGLang answered, at which lengths, how exactly, what the top-k 512 arm
met, and that its report regenerates. They fail if the folder is edited or a trial lost."""

from __future__ import annotations

import shutil
from pathlib import Path

from cli_inproc import niah

from niah.runs.integrity import load_checked

ROOT = Path(__file__).resolve().parents[2]
LIVE = ROOT / "results" / "sglang-live-h200"
LENGTHS = {300, 2000, 8000, 22600}


def test_the_live_sglang_run_is_sglang_0_5_16_serving_the_stock_fp8_arm_to_22_6k():
    checked = load_checked(LIVE)
    assert checked.problems == []
    configs = checked.manifest["configs"]
    assert list(configs) == ["fp8-k2048", "fp8-k512"]
    stock = configs["fp8-k2048"]
    assert stock["engine"] == "sglang" and stock["command"][:3] == ["python3", "-m", "sglang.launch_server"]
    info = stock["server"]["server_info"]
    assert info["version"] == "0.5.16" and info["load_format"] == "dummy"
    assert info["json_model_override_args"] == '{"index_topk": 2048}'  # the server's own record of its top-k
    assert (info["dsa_prefill_backend"], info["dsa_decode_backend"]) == ("flashmla_sparse", "flashmla_sparse")
    answered = [r for r in checked.records if r["config"] == "fp8-k2048"]
    assert len(answered) == 12 and {r["length"] for r in answered} == LENGTHS
    assert all(r["outcome"] != "error" and r["answer"] for r in answered)  # every prompt got an answer
    assert max(abs(r["prompt_tokens"] - r["length"]) for r in answered) <= 1  # SGLang's own count


def test_top_k_512_stopped_in_sglang_0_5_16_own_assertion_and_every_trial_says_so():
    checked = load_checked(LIVE)
    small = [r for r in checked.records if r["config"] == "fp8-k512"]
    assert len(small) == 12 and all(r["outcome"] == "error" for r in small)
    assert {r["error"] for r in small} == {"server failed to start: exited during start-up: AssertionError "
                                           "(killed by SIGKILL)"}
    log = (LIVE / "logs" / "fp8-k512.log").read_text()
    assert "assert topk_indices.shape[1] == 2048" in log  # the flashmla_sparse prefill's page-table transform


def test_the_live_run_names_no_machine_path_and_its_report_regenerates(tmp_path):
    logs = sorted((LIVE / "logs").glob("*.log"))
    for f in [LIVE / "manifest.json", LIVE / "trials.jsonl", LIVE / "sweep.log", *logs]:
        text = f.read_text()
        assert "/tmp/" not in text and "/root/" not in text, f.name
    run = tmp_path / "live"
    shutil.copytree(LIVE, run, ignore=shutil.ignore_patterns("report"))
    r = niah("report", str(run))
    assert r.returncode == 0, r.stderr
    summary = (run / "report" / "summary.md").read_text()
    assert "`fp8-k2048`" in summary and "22.6k" in summary
