"""The fp4, two-stage and top-k figures docs/kernels.md quotes from its one-H100 runs read so from
the committed files (docs/results/h100-bench-fp4-fp8-mma.json, h100-bench-two-stage-fp8-mma.json,
and the later run's h100-bench-fp4-fp8-mma-packed.json, h100-bench-two-stage-sglang-topk.json,
h100-topk-sample-warps.json): the ratios to DeepGEMM fp8 and to DeepGEMM fp8 + SGLang's top-k,
the fp8 path's forms against the unpack path, both exact on the GPU, the sample select's
launches; the page loop's three changes timed (h100-bench-fp4-f16.json, h100-bench-fp4-launch.json),
ncu's reading of the two decode kernels (h100-ncu-decode-logits.json), the goals' chains in a CUDA
graph (h100-bench-two-stage-graph.json) and the decode top-k's methods (h100-topk-decode.json).
No GPU needed: the files and the docs only."""

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


def test_the_page_loops_changes_timed_are_the_committed_runs():
    """Every decoding equal to the first bit for bit on the GPU; the default's ratio to DeepGEMM
    fp8 at B=64 before (8 pages) and after (16 pages) the launch change, the sweep's best."""
    text = (ROOT / "docs" / "kernels.md").read_text()
    ratios = {}
    for name in ("h100-bench-fp4-f16.json", "h100-bench-fp4-launch.json"):
        rows = _rows(name)
        bitwise = [r["bitwise_equal"] for r in rows if "bitwise_equal" in r]
        assert len(bitwise) == 6 and all(bitwise), name
        ms = {(r["case"], r["impl"]): r["ms"] for r in rows if "ms" in r}
        b64 = "decode B=64 ragged<=65536"
        ratios[name] = {impl: round(ms[(b64, impl)] / ms[(b64, "DeepGEMM fp8")], 2) for impl in (
            "niah fp4 (unpack first decoding, fp4 query)", "niah fp4 (unpack packed bf16 product, fp4 query)",
            "niah fp4 (unpack, fp4 query)", "niah fp4 (unpack, fp4 query) best launch")}
    assert ratios["h100-bench-fp4-f16.json"] == {
        "niah fp4 (unpack first decoding, fp4 query)": 2.10, "niah fp4 (unpack packed bf16 product, fp4 query)": 1.47,
        "niah fp4 (unpack, fp4 query)": 1.37, "niah fp4 (unpack, fp4 query) best launch": 1.28}
    assert ratios["h100-bench-fp4-launch.json"]["niah fp4 (unpack, fp4 query)"] == 1.28
    assert ratios["h100-bench-fp4-launch.json"]["niah fp4 (unpack, fp4 query) best launch"] == 1.25
    assert "0.149 ms (**1.37x**)" in text and "0.139-0.140 ms (**1.28x**)" in text and "0.229 ms (2.10x)" in text
    from niah.kernels.fp4_paged_logits.wrapper import _pages_per_split

    assert _pages_per_split(64, 1024, 132) == 16 and _pages_per_split(1, 2048, 132) == 4   # the launches timed


def test_ncu_reads_the_fp4_kernel_as_occupancy_bound_and_fp8_as_memory_bound():
    k = json.loads((RESULTS / "h100-ncu-decode-logits.json").read_text())["kernels"]
    assert (k["fp8"]["Registers Per Thread (register/thread)"], k["fp8"]["Theoretical Occupancy (%)"]) == (64, 50)
    assert (k["fp4"]["Registers Per Thread (register/thread)"], k["fp4"]["Theoretical Occupancy (%)"]) == (128, 25)
    assert k["fp8"]["DRAM Throughput (%)"] > 80 > 35 > k["fp4"]["DRAM Throughput (%)"]


def test_the_goals_chains_in_a_cuda_graph_are_the_committed_run():
    rows = _rows("h100-bench-two-stage-graph.json")
    assert [r["sglang_topk_keeps_niah_topk"] for r in rows if "sglang_topk_keeps_niah_topk" in r] == [1.0, 1.0]
    assert all(r["segmented_topk_keeps_niah_topk"] for r in rows if "segmented_topk_keeps_niah_topk" in r)
    graph = {(r["case"].split(" top-k")[0], r["impl"]): r["graph_ms"] for r in rows if r.get("graph_ms")}
    best = {}
    for case in ("decode B=64 ragged<=65536", "decode B=1 x131072"):
        chains = {impl: v for (c, impl), v in graph.items() if c == case and impl.startswith("two-stage")}
        impl = min(chains, key=chains.get)
        best[case] = (impl, round(chains[impl] / graph[(case, "DeepGEMM fp8 logits + SGLang top-k")], 2))
    assert best == {"decode B=64 ragged<=65536": ("two-stage c=2 (segmented top-k)", 2.28),
                    "decode B=1 x131072": ("two-stage c=2 (segmented top-k)", 5.03)}
    assert "graph **2.28x** (c = 2, segmented)" in (ROOT / "docs" / "kernels.md").read_text()


def test_the_decode_top_k_methods_and_the_wide_chunks_are_the_committed_run():
    rows = [r for r in json.loads((RESULTS / "h100-topk-decode.json").read_text())["results"] if "graph_ms" in r]
    assert rows and all(r["same_set_as_search"] for r in rows)
    g = {(r["case"], r["method"]): r["graph_ms"] * 1e3 for r in rows}
    b64 = "topk B=64 ragged<=65536 k="
    assert (round(g[(b64 + "2048", "search")], 1), round(g[(b64 + "2048", "search, chunks of 16384")], 1)) == (
        126.3, 83.5)
    assert (round(g[(b64 + "4096", "search, chunks of 8192")], 1),   # the default then at k 4,096
            round(g[(b64 + "4096", "search, chunks of 16384")], 1)) == (146.7, 98.7)
    assert "83.5 us with 16,384-wide chunks against 126.3" in (ROOT / "docs" / "kernels.md").read_text()
