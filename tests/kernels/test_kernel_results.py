"""The fp4 and two-stage figures docs/kernels.md quotes from its one-H100 run read so from the
committed files (docs/results/h100-bench-fp4-fp8-mma.json, h100-bench-two-stage-fp8-mma.json):
the ratios to DeepGEMM fp8, the fp8 path's first form slower than the unpack path, both exact
on the GPU. No GPU needed: the files and the docs only."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def _rows(name: str) -> list[dict]:
    return json.loads((RESULTS / name).read_text())["results"]


def test_the_fp4_figures_are_the_committed_runs():
    rows = _rows("h100-bench-fp4-fp8-mma.json")
    ms = {(r["case"], r["impl"]): r["ms"] for r in rows if "ms" in r}
    checks = [r["calc_diff"] for r in rows if r["impl"].startswith("check:")]
    assert len(checks) == 2 and all(d < 1e-12 for d in checks)     # unpack and the fp8 path, on CUDA
    ratios = {}
    for case in ("decode B=1 x131072", "decode B=64 ragged<=65536"):
        dg = ms[(case, "DeepGEMM fp8")]
        ratios[case] = tuple(round(ms[(case, impl)] / dg, 2) for impl in (
            "niah fp4 (unpack, bf16 query)", "niah fp4 (unpack, fp4 query)", "niah fp4 (fp8 MMA, fp4 query)"))
        assert ms[(case, "niah fp4 (fp8 MMA, fp4 query)")] > 1.8 * ms[(case, "niah fp4 (unpack, fp4 query)")]
    assert ratios == {"decode B=1 x131072": (2.56, 1.48, 2.77), "decode B=64 ragged<=65536": (3.15, 1.9, 4.21)}
    text = (ROOT / "docs" / "kernels.md").read_text()
    assert "21.5 us (**1.48x**)" in text and "0.211 ms (**1.90x**)" in text and "0.468 ms (4.21x)" in text


def test_the_two_stage_figure_is_the_committed_run():
    ms = {r["impl"]: r["ms"] for r in _rows("h100-bench-two-stage-fp8-mma.json")
          if "ms" in r and r["case"].startswith("decode B=64")}
    assert round(ms["two-stage c=2"] / ms["DeepGEMM fp8 logits + top-k"], 2) == 1.43
    assert "**1.43x**" in (ROOT / "docs" / "kernels.md").read_text()
