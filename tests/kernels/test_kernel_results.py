"""The fp4, two-stage and top-k figures docs/kernels.md quotes from its one-H100 runs read so from
the committed files (docs/results/h100-bench-fp4-fp8-mma.json, h100-bench-two-stage-fp8-mma.json,
and the later run's h100-bench-fp4-fp8-mma-packed.json, h100-bench-two-stage-sglang-topk.json,
h100-topk-sample-warps.json): the ratios to DeepGEMM fp8 and to DeepGEMM fp8 + SGLang's top-k,
the fp8 path's forms against the unpack path, both exact on the GPU, the sample select's
launches. No GPU needed: the files and the docs only."""

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


def test_the_packed_fp8_path_is_level_at_one_request_and_slower_at_64():
    ms = {(r["case"], r["impl"]): r["ms"] for r in _rows("h100-bench-fp4-fp8-mma-packed.json") if "ms" in r}
    ratios = {}
    for case in ("decode B=1 x131072", "decode B=64 ragged<=65536"):
        dg = ms[(case, "DeepGEMM fp8")]
        ratios[case] = tuple(round(ms[(case, impl)] / dg, 2) for impl in (
            "niah fp4 (unpack, fp4 query)", "niah fp4 (fp8 MMA, fp4 query)"))
    assert ratios == {"decode B=1 x131072": (1.64, 1.65), "decode B=64 ragged<=65536": (1.91, 2.21)}
    text = (ROOT / "docs" / "kernels.md").read_text()
    assert "24.1 us (1.65x)" in text and "0.244 ms (2.21x)" in text and "0.211 ms (1.91x)" in text


def test_the_two_stage_against_sglangs_top_k_is_the_committed_run():
    rows = _rows("h100-bench-two-stage-sglang-topk.json")
    kept = [r["sglang_topk_keeps_niah_topk"] for r in rows if "sglang_topk_keeps_niah_topk" in r]
    assert kept == [1.0, 1.0]
    ms = {(r["case"].split(" top-k")[0], r["impl"]): r["ms"] for r in rows if "ms" in r}
    b64, b1 = "decode B=64 ragged<=65536", "decode B=1 x131072"
    base = {case: ms[(case, "DeepGEMM fp8 logits + SGLang top-k")] for case in (b64, b1)}
    best = {case: min(ms[(case, f"two-stage c={c}")] for c in (2, 4, 8)) / base[case] for case in (b64, b1)}
    assert (round(best[b64], 2), round(best[b1], 1)) == (2.86, 12.4)
    assert round(ms[(b64, "niah top-k alone (on DeepGEMM's logits)")]
                 / ms[(b64, "SGLang top-k alone (on DeepGEMM's logits)")], 1) == 6.4
    text = (ROOT / "docs" / "kernels.md").read_text()
    assert "**2.86x** (c = 4)" in text and "**12.4x** (c = 8)" in text and "172.7 us (6.4x SGLang's)" in text


def test_the_sample_select_launches_are_the_committed_sweep():
    rows = json.loads((RESULTS / "h100-topk-sample-warps.json").read_text())["results"]
    assert all(r["correct"] for r in rows) and len(rows) == 16
    ms = {(r["case"].split("k=")[1], r["config"]["tile"], r["config"]["num_warps"]): r["ms"] for r in rows}
    assert min(ms, key=ms.get) == ("512", 256, 1)
    assert {k: round(ms[(k, 2048, 8)] / ms[(k, 256, 1)], 2) for k in ("1024", "512")} == {"1024": 1.13, "512": 1.29}
    assert "**0.633 (1.13x)**" in (ROOT / "docs" / "kernels.md").read_text()
