"""The committed live-SGLang run (results/sglang-live-h200/): real SGLang 0.5.16 servers on one
H200, launched by `niah sweep --matrix` from benchmarks/sglang_live/ on the shrunk DeepSeek-V3.2
(dummy weights). These checks hold the folder to what benchmarks/sglang_live/README.md and the
README say of it: which SGLang answered, at which lengths, how exactly, what the bf16 arm's
server attested, and that its report regenerates. They fail if the folder is edited or a trial lost."""

from __future__ import annotations

import shutil
from pathlib import Path

from cli_inproc import niah

from niah.runs.integrity import load_checked

ROOT = Path(__file__).resolve().parents[2]
LIVE = ROOT / "results" / "sglang-live-h200"
LENGTHS = {300, 2000, 8000, 22600}


def test_the_live_sglang_run_is_sglang_0_5_16_serving_both_arms_to_22_6k():
    checked = load_checked(LIVE)
    assert checked.problems == []
    configs = checked.manifest["configs"]
    assert list(configs) == ["fp8-k2048", "bf16-k2048"]
    stock, ours = configs["fp8-k2048"], configs["bf16-k2048"]
    assert stock["engine"] == ours["engine"] == "sglang"
    assert stock["command"][:3] == ["python3", "-m", "sglang.launch_server"]      # the stock arm: plain SGLang
    assert ours["command"][:5] == ["python3", "-m", "niah.serving.sglang", "--niah-index-dtype", "bf16"]
    for cfg in (stock, ours):
        info = cfg["server"]["server_info"]
        assert info["version"] == "0.5.16" and info["load_format"] == "dummy"
        assert info["json_model_override_args"] == '{"index_topk": 2048}'  # the server's own record of its top-k
        assert (info["dsa_prefill_backend"], info["dsa_decode_backend"]) == ("flashmla_sparse", "flashmla_sparse")
    for name in configs:
        answered = [r for r in checked.records if r["config"] == name]
        assert len(answered) == 12 and {r["length"] for r in answered} == LENGTHS
        assert all(r["outcome"] != "error" and r["answer"] for r in answered)  # every prompt got an answer
        assert max(abs(r["prompt_tokens"] - r["length"]) for r in answered) <= 1  # SGLang's own count


def test_the_bf16_arm_is_attested_by_the_running_server_with_niahs_kernels_counted():
    checked = load_checked(LIVE)
    ours = checked.manifest["configs"]["bf16-k2048"]
    assert ours["attestation_verdict"]["state"] == "valid"
    start, end = (ours["attestation"]["segments"][0][k]["attestation"] for k in ("start", "end"))
    assert (end["index_dtype"], end["kernels"], end["facts"]["index_topk"]) == ("bf16", "niah", 2048)
    assert end["fp8_reads_while_bf16"] == 0
    grew = {op: end["counts"][op] - start["counts"][op] for op in end["counts"]}
    # the sweep's own prompts went through niah's store, prefill and decode kernels inside SGLang
    assert grew["store.bf16"] > 0 and grew["prefill_logits.bf16"] > 0 and grew["decode_logits.bf16"] > 0
    assert set(end["kernel_calls"]["prefill_logits"]) == {"niah.bf16_mqa_logits"}
    assert set(end["kernel_calls"]["decode_logits"]) == {"niah.bf16_paged_mqa_logits"}
    stock = checked.manifest["configs"]["fp8-k2048"]
    assert "niah's plugin absent" in stock["attestation_verdict"]["reason"]   # the stock arm ran SGLang's own paths
    # one name for its state: what the manifest recorded is what a page shows
    from niah.attestation.verdict import shown_state
    for cfg in (stock, ours):
        assert shown_state(cfg) == (cfg["attestation_verdict"]["state"], cfg["attestation_verdict"]["reason"])


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
    assert "| `fp8-k2048` | sglang | valid |" in summary                        # proven stock, not "n/a"
