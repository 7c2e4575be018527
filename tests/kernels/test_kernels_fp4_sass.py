"""The fp4 decode logits' packed decoding compiles for sm_90a here, without a GPU, to fewer
instructions in its page loop than the first decoding (benchmarks/kernels/sass.py: Triton's
PTX through the bundled ptxas and nvdisasm, in a process of its own, the interpreter unset):
the inline PTX that packs four codes a register is in the compiled code, the x 64 a value
is gone, the decoded keys reach the tensor cores' shared memory by wide stores, not one value a
store, and the f16 product needs no fp32 round trip. Instruction counts, not times."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels" / "sass.py"


def test_the_packed_decoding_compiles_to_fewer_instructions_a_page(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "sass.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--only", "unpack", "--json", str(out)], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    k = json.loads(out.read_text())["kernels"]
    for query in ("fp4", "bf16"):
        first, packed = k[f"fp4 unpack, {query} query"], k[f"fp4 unpack packed, {query} query"]
        assert packed["instructions"] < 0.8 * first["instructions"], (query, packed, first)
        # the same tensor-core products, fewer multiplies (no x 64 a value), the codes placed four a register
        assert packed["by class"]["tensor core"] == first["by class"]["tensor core"]
        assert packed["top opcodes"].get("FMUL", 0) < first["top opcodes"]["FMUL"]
        assert packed["by class"]["integer"] < first["by class"]["integer"]
        # the page read as [D/2, keys]: the decoded keys reach the tensor cores by 16-byte stores
        assert packed["top opcodes"].get("STS.U16", 0) == 0 and packed["by class"]["shared memory"] <= 32
    # the f16 product (an fp4 query): no fp32 round trip of the conversion, two values a multiply
    f16, packed = k["fp4 unpack packed f16, fp4 query"], k["fp4 unpack packed, fp4 query"]
    assert f16["instructions"] < 0.8 * packed["instructions"]
    assert "HADD2.F32" not in f16["top opcodes"] and f16["top opcodes"]["HMUL2"] > 0
