"""The plugin's logits replacements driving niah's real Triton kernels (TRITON_INTERPRET=1,
in a subprocess so the interpreter setting cannot leak into other tests), compared with
SGLang 0.5.23's own torch fallback and with exact fp64 arithmetic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/: the worker script and the shared helpers


@pytest.fixture(scope="module")
def results():
    from sglang_source import sglang_wheel

    sglang_wheel()  # fail clearly (make setup) before spawning
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)  # keep this checkout first
    env = os.environ | {"TRITON_INTERPRET": "1", "PYTHONPATH": path}
    r = subprocess.run([sys.executable, str(HERE / "sglang_interp_worker.py")], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_fp8_route_matches_sglang_torch_fallback(results):
    # SGLang's fallback multiplies in bf16; niah accumulates in fp32: DeepGEMM's 1e-3 bar
    assert results["fp8_vs_sglang_torch"] < 1e-3
    assert results["fp8_resolver_equal"]


def test_bf16_keys_read_exactly(results):
    assert results["bf16_paged_vs_exact"] < 5e-6
    assert results["bf16_prefill_vs_exact"] < 5e-6


def test_bf16_keys_are_closer_to_unquantised_scores_than_fp8(results):
    assert results["bf16_err"] < results["fp8_err"]


def test_bundled_store_kernel_writes_what_the_torch_path_writes(results):
    assert results["store_kernel_changed_buffer"]
    assert results["store_kernel_equals_torch"]


def test_plugin_topk_selects_what_sglang_unfused_topk_selects(results):
    assert results["topk_equal_sglang"] and results["topk_equal_sglang_row_starts"]
