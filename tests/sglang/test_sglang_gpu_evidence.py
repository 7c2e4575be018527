"""The GPU evidence script (benchmarks/sglang_gpu_evidence.py) in its --smoke form: tiny
shapes on CPU under TRITON_INTERPRET=1, SGLang's functions lifted from the real wheel, so
the script the H200 ran keeps working and keeps checking what it claims."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_evidence_smoke_runs_every_check_on_cpu(tmp_path):
    from sglang_source import sglang_wheel

    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sglang_gpu_evidence.py"), "--smoke",
                        "--sglang-src", str(sglang_wheel()), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, env=os.environ | {"TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert len(res["checks"]) == 11 and all(res["checks"].values()), res["checks"]
    assert res["store"]["attested_pool_bytes_per_token"] == {"bf16": 256, "fp8": 132}
    dec = res["decode_next_n1"]
    # bf16 keys score closer to the unquantised keys than fp8 keys, on identical inputs
    assert dec["bf16/niah"]["vs_unquantised_fp64"] < dec["fp8/niah"]["vs_unquantised_fp64"]
    assert res["cuda_graph"] == "skipped: no CUDA"
