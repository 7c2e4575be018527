"""Attestation: the counter the plugin and the embedded server keep, the verdict against a
configuration's label, and the harness refusing a contradicting configuration end to end
(a real matrix run against tests/servers/tiny_server.py on loopback, which reports an
attestation the way SGLang's /server_info does)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from lifecycle_helpers import tiny_command, toml_list
from niah.attestation import check_configs, from_server_info, verdict
from niah.errors import BadInput
from niah.serving.sglang import attest

ROOT = Path(__file__).resolve().parents[1]

BAD_BF16 = {"index_dtype": "bf16", "kernels": "niah", "pool_bytes_per_token": 256,
            "counts": {"store.bf16": 40, "decode_logits.bf16": 9, "prefill_logits.fp8": 2},
            "fp8_reads_while_bf16": 2}
GOOD_BF16 = {"index_dtype": "bf16", "kernels": "niah", "pool_bytes_per_token": 256,
             "counts": {"store.bf16": 40, "decode_logits.bf16": 9, "prefill_logits.bf16": 2, "topk.fp32": 11},
             "fp8_reads_while_bf16": 0}
GOOD_FP8 = {"index_dtype": "fp8", "kernels": "stock", "pool_bytes_per_token": 132,
            "counts": {"store.fp8": 40, "decode_logits.fp8": 9, "prefill_logits.fp8": 2, "topk.fp32": 11},
            "fp8_reads_while_bf16": 0}


@pytest.fixture()
def fresh_counter():
    attest.reset()
    yield
    attest.reset()


def test_counter_flags_fp8_paths_reached_while_bf16_is_configured(fresh_counter):
    from niah.serving.sglang import replacements

    attest.configure("bf16", "niah")
    buf = torch.zeros(2, 64 * 256, dtype=torch.uint8)
    replacements.store_bf16_keys(buf, torch.arange(3), torch.randn(3, 128), use_kernel=False)
    with pytest.raises(RuntimeError, match="store_quantized"):
        replacements.index_key_cache_store_quantized(None, 0, None, None, None)
    snap = attest.snapshot()
    assert snap["counts"] == {"store.bf16": 1, "store.fp8": 1} and snap["fp8_reads_while_bf16"] == 1
    assert verdict(snap, {"index_dtype": "bf16"}) == (False, "1 fp8 index-key path call(s) while bf16 was configured")
    with pytest.raises(ValueError, match="unknown path"):
        attest.record("logits", "bf16", "niah.x")


def test_stock_counters_pass_calls_through_and_attestation_reaches_internal_state(fresh_counter):
    from niah.serving.sglang import replacements

    attest.configure("fp8", "stock")
    resolver = replacements.counting("decode_logits", "fp8", "sglang.resolve_fp8_paged_mqa_logits_fn")(lambda: "deep_gemm.fp8_paged_mqa_logits")
    assert resolver() == "deep_gemm.fp8_paged_mqa_logits" and resolver() == "deep_gemm.fp8_paged_mqa_logits"
    controller_out = types.SimpleNamespace(internal_state={"tp_size": 8})
    get_state = replacements.wrap_internal_state(lambda self, req: controller_out)
    state = get_state(None, None).internal_state
    assert state["tp_size"] == 8
    assert state["niah_attestation"]["counts"] == {"decode_logits.fp8": 2}
    assert from_server_info({"internal_states": [state]})["kernels"] == "stock"


def test_verdict_rules():
    assert verdict(GOOD_BF16, {"index_dtype": "bf16"})[0]
    assert verdict(GOOD_FP8, {"index_dtype": "fp8", "kernels": "stock"})[0]
    assert verdict(None, {"index_dtype": "bf16"}) == (True, "not attested")
    assert verdict(BAD_BF16, {"index_dtype": "bf16"}) == (
        False, "2 fp8 index-key path call(s) while bf16 was configured")
    no_store = {**GOOD_BF16, "counts": {"decode_logits.bf16": 3}}
    assert verdict(no_store, {"index_dtype": "bf16"}) == (False, "bf16 configured but no bf16 key was stored")
    assert verdict(GOOD_FP8, {"index_dtype": "bf16"}) == (False, "labelled index_dtype bf16 but the server ran fp8")
    assert verdict(GOOD_FP8, {"index_dtype": "fp8", "kernels": "niah"})[0] is False


def test_server_info_of_several_schedulers_is_summed():
    info = {"internal_states": [{"niah_attestation": GOOD_BF16}, {"niah_attestation": BAD_BF16}, {"x": 1}]}
    a = from_server_info(info)
    assert a["schedulers"] == 2 and a["counts"]["store.bf16"] == 80 and a["fp8_reads_while_bf16"] == 2
    assert from_server_info({"niah_attestation": GOOD_FP8})["counts"]["store.fp8"] == 40
    assert from_server_info({"version": "0.5.23"}) is None and from_server_info(None) is None


def test_embedded_indexer_attests_what_it_stored(fresh_counter):
    from niah.serving.embedded.dsa import DSA, attestation
    from niah.serving.embedded.model import LayerCache

    assert attestation() is None  # nothing configured: a dense server reports none
    for dtype in ("bf16", "fp8"):
        attest.reset()
        dsa = DSA(dtype, topk=4, dense_when_short=False)
        cache = LayerCache(k=torch.zeros(1, 3, 16, 64), v=torch.zeros(1, 3, 16, 64), idx_k=torch.zeros(3, 16, 64))
        dsa.store(cache, torch.randn(1, 3, 8, 64), 0)
        dsa.keep_mask(torch.randn(1, 9, 8, 64), cache.idx_k[:, :8], 0)
        a = attestation()
        assert a["counts"] == {f"store.{dtype}": 1, f"prefill_logits.{dtype}": 1, "topk.fp32": 1}
        assert a["pool_bytes_per_token"] == 3 * (128 if dtype == "bf16" else 68)
        assert verdict(a, {"index_dtype": dtype})[0]
        assert not verdict(a, {"index_dtype": "bf16" if dtype == "fp8" else "fp8"})[0]


def _niah(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "niah", *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_contradicting_attestation_is_recorded_and_refused_by_compare_and_gate(tmp_path):
    """A real matrix: three servers on loopback report attestations in /server_info; niah
    writes them into the manifest at teardown; the bf16 one that read fp8 keys is invalid."""
    from niah.serving.matrix import run_matrix
    from niah.store import read_manifest
    from niah.sweep import SweepSpec

    def config(name: str, dtype: str, a: dict) -> str:
        cmd = tiny_command("--attestation", json.dumps(a))
        return f'\n[[config]]\nname = "{name}"\nindex_dtype = "{dtype}"\ncommand = {toml_list(cmd)}\n'

    matrix = tmp_path / "m.toml"
    matrix.write_text('engine = "command"\n' + config("fp8", "fp8", GOOD_FP8) + config("bf16", "bf16", GOOD_BF16)
                      + config("bf16-bad", "bf16", BAD_BF16))
    run = tmp_path / "run"
    run_matrix(matrix, SweepSpec(lengths=[200], depths=[0.0, 100.0], trials=1), run)
    configs = read_manifest(run)["configs"]
    assert configs["bf16-bad"]["attestation"]["fp8_reads_while_bf16"] == 2
    assert configs["bf16-bad"]["attestation_verdict"]["valid"] is False
    assert configs["bf16"]["attestation_verdict"]["valid"] and configs["fp8"]["attestation_verdict"]["valid"]
    with pytest.raises(BadInput, match="'bf16-bad' is invalid"):
        check_configs(read_manifest(run), ["bf16-bad"], str(run))

    ok = _niah("compare", str(run), "--a", "fp8", "--b", "bf16")
    assert ok.returncode == 0, ok.stderr
    why = ("configuration 'bf16-bad' is invalid: its server's attestation "
           "contradicts its label (2 fp8 index-key path call(s) while bf16 was configured)")
    for r, where in ((_niah("compare", str(run), "--a", "fp8", "--b", "bf16-bad"), f"{run}"),
                     (_niah("gate", "--baseline", str(run), "--candidate", str(run), "--config", "bf16-bad"),
                      f"run {run}")):
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.strip().splitlines() == [f"niah: error: {where}: {why}"]
    good = _niah("gate", "--baseline", str(run), "--candidate", str(run), "--config", "bf16")
    assert good.returncode == 0, good.stdout + good.stderr
    rep = _niah("report", str(run))
    assert rep.returncode == 0, rep.stderr
    summary = (run / "report" / "summary.md").read_text()
    assert "| `bf16-bad` | **INVALID** | bf16/niah | 256 |" in summary and "| `bf16` | valid |" in summary
