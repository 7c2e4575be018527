"""`niah doctor`: SGLang version, plugin contract (against the 0.5.23 wheel), torch/Triton facts."""

from __future__ import annotations

import subprocess
import sys

from sglang_source import sglang_wheel


def _doctor(*args):
    return subprocess.run([sys.executable, "-m", "niah", "doctor", *args], capture_output=True, text=True,
                          timeout=120)


def test_doctor_reports_contract_against_the_wheel():
    wheel = sglang_wheel()
    r = _doctor("--sglang-source", str(wheel))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "plugin contract OK: sglang 0.5.23" in out
    assert "sglang installed" in out and "torch " in out and "triton" in out and "GPU" in out
    assert "plugin supports sglang  0.5.23" in out


def test_doctor_bf16_only_points_and_bad_inputs(tmp_path):
    wheel = sglang_wheel()
    r = _doctor("--sglang-source", str(wheel), "--index-dtype", "bf16", "--points")
    assert r.returncode == 0 and "plugin contract OK" in r.stdout
    assert "replace bf16   sglang.srt.mem_cache.index_key_cache.IndexKeyCache._buffer_shape" in r.stdout
    r = _doctor("--sglang-source", str(tmp_path / "nope.whl"))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "not found" in r.stderr
    r = _doctor("--index-dtype", "fp16")
    assert r.returncode == 2 and "fp8 or bf16" in r.stderr


def test_doctor_fails_on_a_mismatched_source(tmp_path):
    from niah.serving.sglang.contract import PATCH_POINTS
    from sglang_source import extract_tree

    tree = extract_tree(sglang_wheel(), tmp_path, sorted({p.module for p in PATCH_POINTS}))
    f = tree / "sglang/srt/mem_cache/index_key_cache.py"
    f.write_text(f.read_text().replace("def get_k_and_scale(", "def get_keys_and_scales("))
    r = _doctor("--sglang-source", str(tree))
    assert r.returncode == 1
    assert "missing symbol sglang.srt.mem_cache.index_key_cache.IndexKeyCache.get_k_and_scale" in r.stdout
