"""The run folders committed under results/ read as the docs say they do: clean, attested,
and with the paired verdicts docs/embedded-server.md and the README quote.

results/precision-k32/ is the embedded server at top-k 32 on 2K-4K prompts, where index-key
precision costs answers; these checks fail if the folder is edited, a trial lost, or the
compare statistics change what they conclude from it. results/h200-seed-sweep/ is the GPU
server's seed matrix on one H200 (and device/repeat/ the same command run again): the
lengths, arms, kernels, memory and reproduction docs/embedded-server.md reports.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from cli_inproc import niah

from niah.attestation import VALID, status
from niah.runs.integrity import load_checked

ROOT = Path(__file__).resolve().parents[2]
K32 = ROOT / "results" / "precision-k32"
H200 = ROOT / "results" / "h200-seed-sweep"


def job_seconds(run: Path) -> dict:
    """Each matrix job's start-to-end seconds from its status file (every job exited 0)."""
    import datetime as dt

    took = {}
    for part in (run / "parts").iterdir():
        st = json.loads((part / "job.status.json").read_text())
        assert st["exit"] == 0
        took[part.name] = int((dt.datetime.fromisoformat(st["ended"])
                               - dt.datetime.fromisoformat(st["started"])).total_seconds())
    return took


def _compare(a: str, b: str) -> dict:
    r = niah("compare", str(K32), "--a", a, "--b", b, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_top_k_32_run_is_clean_attested_and_identical_prompts_across_arms():
    checked = load_checked(K32)
    assert checked.problems == []
    configs = checked.manifest["configs"]
    assert list(configs) == ["fp4", "fp8", "bf16", "fp8-bf16-c4"]
    for name, entry in configs.items():
        assert status(entry)[0] == VALID, (name, status(entry))
    prompts = {}
    for r in checked.records:
        assert r["outcome"] in {"correct", "wrong"}, r  # every trial answered: no outage
        prompts.setdefault(r["config"], set()).add(r["prompt_sha256"])
    assert len(prompts["bf16"]) == 30 and all(p == prompts["bf16"] for p in prompts.values())


def test_the_top_k_32_run_shows_precision_costing_answers():
    fp4 = _compare("fp4", "bf16")
    (whole,) = [row for row in fp4["rows"] if row["group"] == "all"]
    assert fp4["verdict"] == "B better" and (whole["losses"], whole["wins"]) == (0, 6)
    fp8 = _compare("fp8", "bf16")
    (whole,) = [row for row in fp8["rows"] if row["group"] == "all"]
    assert fp8["verdict"] == "no significant difference" and (whole["losses"], whole["wins"]) == (0, 4)
    two_stage = _compare("bf16", "fp8-bf16-c4")
    (whole,) = [row for row in two_stage["rows"] if row["group"] == "all"]
    assert (whole["losses"], whole["wins"], whole["k_a"], whole["k_b"]) == (0, 0, 21, 21)


def _work_gib(entry: dict, length: int) -> float:
    from niah.attestation import last_attestation

    work = last_attestation(entry)["facts"]["work_gpu_bytes"]
    return max(v for k, v in work.items() if abs(int(k) - length) <= 4) / 2**30


def test_the_h200_seed_sweep_holds_what_the_docs_report():
    checked = load_checked(H200)
    assert checked.problems == []
    configs = checked.manifest["configs"]
    assert set(configs) == {"dense", "fp8-k512", "fp8-k1024", "bf16-k512", "bf16-k1024", "bf16-gather-k512"}
    assert max(r["length"] for r in checked.records) == 22600 and len(checked.records) == 720
    from niah.attestation import last_attestation

    for name, entry in configs.items():
        assert status(entry)[0] == VALID, (name, status(entry))
        att = last_attestation(entry)
        assert att["facts"]["device"] == "cuda"
        if name != "dense":
            assert att["kernels"] == "niah-cuda" and att["facts"]["prefill_chunk"] == 4096
    # the gather read's working memory grows with length; the fused reads' levels off at the score budget
    for name in ("fp8-k512", "fp8-k1024", "bf16-k512", "bf16-k1024"):
        assert _work_gib(configs[name], 22600) < 0.35 and _work_gib(configs[name], 22600) / _work_gib(
            configs[name], 12189) < 1.1, name
    gather = configs["bf16-gather-k512"]
    assert _work_gib(gather, 22600) > 10 and _work_gib(gather, 22600) / _work_gib(gather, 6574) > 4
    # the report's memory table reads the same facts: the gather's row grows, a fused row levels off
    from niah.report.summary import memory_section

    table = memory_section(checked.manifest, list(configs), [6574, 12189, 22600])
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| `")}
    assert set(rows) == {f"`{n}`" for n in configs}
    assert "| 2.26 / 4.89 | 6.50 / 9.19 | 11.14 / 13.89 |" in rows["`bf16-gather-k512`"]
    assert "| 0.24 / 2.70 | 0.29 / 2.82 | 0.30 / 2.89 |" in rows["`fp8-k512`"]
    assert memory_section({"configs": {"x": {}}}, ["x"], [300]) is None
    # the whole matrix within 10 minutes on the one H200, both times
    for log in (H200 / "sweep.log", H200 / "device" / "repeat" / "sweep.log"):
        assert int(re.search(r"sweep rc=0 wall_s=(\d+)", log.read_text()).group(1)) <= 600
    # the same command again on the H200: the same outcome and answer in every trial
    again = {(r["config"], r["length"], r["depth"], r["trial"]): r
             for r in map(json.loads, (H200 / "device" / "repeat" / "trials.jsonl").read_text().splitlines())}
    assert len(again) == 720
    for r in checked.records:
        other = again[(r["config"], r["length"], r["depth"], r["trial"])]
        assert (other["outcome"], other["answer"]) == (r["outcome"], r["answer"])
    # and its 22,600-token trials one arm at a time: the same prompts, the same answers
    alone = [json.loads(x) for x in (H200 / "device" / "one-arm-at-a-time" / "trials.jsonl").read_text().splitlines()]
    assert len(alone) == 90 and {r["length"] for r in alone} == {22600}
    mine = {(r["config"], r["depth"], r["trial"]): r for r in checked.records if r["length"] == 22600}
    for r in alone:
        m = mine[(r["config"], r["depth"], r["trial"])]
        assert (r["prompt_sha256"], r["answer"]) == (m["prompt_sha256"], m["answer"])


def test_the_one_arm_runs_after_the_glue_changes_keep_the_prompts_and_what_they_say():
    """device/one-arm-12k-22k(-before-accumulate)/: the matrix's 12,189- and 22,600-token trials,
    one arm at a time, after the sparse prefill's launch, probe and score-input changes; the
    second run adds the kernel's kv-head accumulation, which sums the same fp32 values in the
    same order: every answer of the two runs is the same; both use the matrix's prompts; the
    dense control (none of the changes touch it) answers as in the matrix."""
    dev = H200 / "device"
    runs = [{(r["config"], r["length"], r["depth"], r["trial"]): r
             for r in map(json.loads, (dev / name / "trials.jsonl").read_text().splitlines())}
            for name in ("one-arm-12k-22k-before-accumulate", "one-arm-12k-22k")]
    matrix = {(r["config"], r["length"], r["depth"], r["trial"]): r
              for r in map(json.loads, (H200 / "trials.jsonl").read_text().splitlines())}
    before, after = runs
    assert len(after) == 180 and before.keys() == after.keys() and {k[1] for k in after} == {12189, 22600}
    for key, r in after.items():
        assert r["answer"] == before[key]["answer"] and r["prompt_sha256"] == matrix[key]["prompt_sha256"]
        if key[0] == "dense":
            assert r["answer"] == matrix[key]["answer"]


def test_the_one_arm_run_after_the_logits_kernel_moves_only_the_arms_that_use_it():
    """device/one-arm-12k-22k-logits/: the same trials after the prefill's scores moved to
    indexer_logits (the kv heads summed inside one kernel, in another order than the per-kv-head
    kernel's). Every prompt is the matrix's; the arms whose prefill scores did not change
    (dense, the gather arm) answer as the run before; every other sparse arm attests
    niah.indexer_logits for its prefill; what changed answers only there."""
    dev = H200 / "device"
    before, after = [{(r["config"], r["length"], r["depth"], r["trial"]): r
                      for r in map(json.loads, (dev / name / "trials.jsonl").read_text().splitlines())}
                     for name in ("one-arm-12k-22k", "one-arm-12k-22k-logits")]
    assert len(after) == 180 and before.keys() == after.keys()
    configs = json.loads((dev / "one-arm-12k-22k-logits" / "manifest.json").read_text())["configs"]
    moved = {name for name, c in configs.items() if "niah.indexer_logits" in json.dumps(c["attestation"])}
    assert moved == {"fp8-k512", "fp8-k1024", "bf16-k512", "bf16-k1024"}
    changed = {key[0] for key, r in after.items() if r["answer"] != before[key]["answer"]}
    assert changed and changed <= moved
    assert all(r["prompt_sha256"] == before[key]["prompt_sha256"] for key, r in after.items())


def test_the_one_arm_run_after_the_binary_search_answers_as_the_run_before():
    """device/one-arm-12k-22k-radix/: the same trials after both top-k kernels' searches went to
    1 bit a step. The k-th score is unique, so the width of a search step cannot change what is
    kept: every one of the 180 answers is the logits round's, on the same prompts."""
    dev = H200 / "device"
    before, after = [{(r["config"], r["length"], r["depth"], r["trial"]): r
                      for r in map(json.loads, (dev / name / "trials.jsonl").read_text().splitlines())}
                     for name in ("one-arm-12k-22k-logits", "one-arm-12k-22k-radix")]
    assert len(after) == 180 and before.keys() == after.keys()
    for key, r in after.items():
        assert (r["prompt_sha256"], r["answer"]) == (before[key]["prompt_sha256"], before[key]["answer"])


def test_the_committed_field_set_and_its_baseline_agree_and_gate_by_residue():
    """results/baselines/field-prompts.jsonl (built with --coverage field against the embedded
    server) names its residue plan on every line; field-embedded.json is its sweep (cache state
    warm) exported: every trial is one of the set's prompts, carries its residue, and the
    baseline gates against itself with one case per residue."""
    base = ROOT / "results" / "baselines"
    rows = [json.loads(x) for x in (base / "field-prompts.jsonl").read_text().splitlines()]
    assert len(rows) == 60 and {r["residues"] for r in rows} == {"4:0,1,2,3"}
    assert {r["length"] // 4 * 4 for r in rows} == {256, 516, 1032, 2064, 4128}
    data = json.loads((base / "field-embedded.json").read_text())
    trials = data["configs"]["default"]["trials"]
    assert data["source"]["args"]["residues"] == "4:0,1,2,3"
    assert {t["prompt_sha256"] for t in trials} <= {r["prompt_sha256"] for r in rows} and len(trials) == 60
    assert all(t["cache_state"] == "warm" and t["residue"] in (0, 1, 2, 3) for t in trials)
    # what `niah gate --metric both` judges: the probe's three measures on every prompt (all past k = 128)
    assert all(t.get(m) is not None for t in trials for m in ("rank", "kept", "fidelity"))
    r = niah("gate", "--baseline", str(base / "field-embedded.json"), "--candidate", str(base / "field-embedded.json"),
             "--json")
    assert r.returncode == 0, r.stderr
    residues = {c["residue"] for c in json.loads(r.stdout)["cases"] if "residue" in c}
    assert residues == {"0 mod 4", "1 mod 4", "2 mod 4", "3 mod 4"}


def test_the_h100_runs_answer_as_the_h200_runs_with_the_same_kernels():
    """device/h100-one-arm-12k-22k/ and device/h100-matrix/: the one-arm trials and the whole
    matrix on one H100 after the probe's rows, the one-launch query quantisation and the
    per-head decode attention. The one-arm answers are the radix round's (an H200, one change of
    card and three of code: none moves a kept key or a sum); the matrix's 12,189- and
    22,600-token answers are the one-arm run's (six servers on the card at once change no
    answer); its prompts are the committed matrix's, and the dense control answers as there."""
    dev = H200 / "device"
    radix, alone, matrix = [{(r["config"], r["length"], r["depth"], r["trial"]): r
                             for r in map(json.loads, (dev / name / "trials.jsonl").read_text().splitlines())}
                            for name in ("one-arm-12k-22k-radix", "h100-one-arm-12k-22k", "h100-matrix")]
    committed = {(r["config"], r["length"], r["depth"], r["trial"]): r
                 for r in map(json.loads, (H200 / "trials.jsonl").read_text().splitlines())}
    assert len(alone) == 180 and alone.keys() == radix.keys()
    assert len(matrix) == 720 and matrix.keys() == committed.keys()
    for key, r in alone.items():
        assert (r["prompt_sha256"], r["answer"]) == (radix[key]["prompt_sha256"], radix[key]["answer"])
        assert matrix[key]["answer"] == r["answer"]
    for key, r in matrix.items():
        assert r["prompt_sha256"] == committed[key]["prompt_sha256"]
        if key[0] == "dense":
            assert r["answer"] == committed[key]["answer"]


def test_the_h200_runs_after_split_k_answer_as_the_runs_before():
    """device/h200-one-arm-12k-22k/ and device/h200-matrix/: the one-arm trials and the whole
    matrix on one H200 after the decode step's split-K attention and 4,096-wide top-k chunks.
    Neither moves a kept key, and split-K moves a decode sum by fp32 rounding only: every answer
    is the H100 runs' (and the one-arm run's the radix round's), on the committed prompts, with
    every arm's attestation valid, and the six jobs' times from their status files as the docs
    quote them."""

    dev = H200 / "device"
    runs = {name: {(r["config"], r["length"], r["depth"], r["trial"]): r
                   for r in map(json.loads, (dev / name / "trials.jsonl").read_text().splitlines())}
            for name in ("one-arm-12k-22k-radix", "h100-one-arm-12k-22k", "h200-one-arm-12k-22k",
                         "h100-matrix", "h200-matrix")}
    alone, matrix = runs["h200-one-arm-12k-22k"], runs["h200-matrix"]
    assert len(alone) == 180 and len(matrix) == 720
    for key, r in alone.items():
        for before in ("one-arm-12k-22k-radix", "h100-one-arm-12k-22k"):
            other = runs[before][key]
            assert (r["prompt_sha256"], r["answer"]) == (other["prompt_sha256"], other["answer"])
    for key, r in matrix.items():
        assert (r["prompt_sha256"], r["answer"]) == (runs["h100-matrix"][key]["prompt_sha256"],
                                                     runs["h100-matrix"][key]["answer"])
    checked = load_checked(dev / "h200-matrix")
    assert checked.problems == []
    for name, entry in checked.manifest["configs"].items():
        assert status(entry)[0] == VALID, (name, status(entry))
    assert int(re.search(r"sweep rc=0 wall_s=(\d+)", (dev / "h200-matrix" / "sweep.log").read_text()).group(1)) <= 600
    took = job_seconds(dev / "h200-matrix")
    # the jobs' times docs/embedded-server.md quotes: every fused arm's still above dense's
    assert took == {"dense": 173, "bf16-k512": 181, "fp8-k512": 186, "bf16-k1024": 194, "fp8-k1024": 195,
                    "bf16-gather-k512": 255}


def test_the_h200_runs_after_the_dense_first_rows_move_only_sparse_sums():
    """device/h200-one-arm-12k-22k-rows/ and device/h200-matrix-rows/: the same trials on one
    H200 after a prompt's first K rows attend densely (and one wait a decode step, one counting
    node a decode graph, direct launches). Those rows keep the same keys, summed in SDPA's
    order: the dense arm answers as before in every trial, the sparse arms in all but the few
    the docs count; prompts are the committed matrix's, attestations valid, and the jobs' times
    from their status files as the docs quote them (three fused arms' at or below dense's)."""

    dev = H200 / "device"
    runs = {name: {(r["config"], r["length"], r["depth"], r["trial"]): r
                   for r in map(json.loads, (dev / name / "trials.jsonl").read_text().splitlines())}
            for name in ("h200-one-arm-12k-22k", "h200-one-arm-12k-22k-rows", "h200-matrix", "h200-matrix-rows")}
    moved = {}
    for before, after in (("h200-one-arm-12k-22k", "h200-one-arm-12k-22k-rows"), ("h200-matrix", "h200-matrix-rows")):
        assert runs[after].keys() == runs[before].keys()
        for key, r in runs[after].items():
            assert r["prompt_sha256"] == runs[before][key]["prompt_sha256"] and r["error"] is None
            if r["answer"] != runs[before][key]["answer"]:
                assert key[0] != "dense", key
                moved.setdefault(after, []).append(key)
    assert {name: len(keys) for name, keys in moved.items()} == {"h200-one-arm-12k-22k-rows": 15,
                                                                 "h200-matrix-rows": 20}
    checked = load_checked(dev / "h200-matrix-rows")
    assert checked.problems == []
    for name, entry in checked.manifest["configs"].items():
        assert status(entry)[0] == VALID, (name, status(entry))
    took = job_seconds(dev / "h200-matrix-rows")
    assert took == {"dense": 187, "bf16-k512": 176, "fp8-k512": 179, "bf16-k1024": 185, "fp8-k1024": 189,
                    "bf16-gather-k512": 248}


def test_the_h100_runs_with_the_union_by_default_move_only_sparse_sums_and_finish_before_dense():
    """device/h100-one-arm-12k-22k-union/ and device/h100-matrix-union/: the seed's arms with
    union_attention by default (tiles of 4, the bitmap build), on one H100. The same prompts as
    the H200's rows round; the dense arm answers as there in every trial, the sparse arms in all
    but the docs' 15 alone and 19 in the matrix (sums in position order); attestations valid;
    every fused arm's matrix job ends before dense's; the one-arm medians the docs quote."""
    import statistics

    from niah.serving.embedded.cuda import attend

    assert (attend.PREFILL_SHARE, attend.UNION_BUILD) == (4, "bitmap")
    dev = H200 / "device"
    load = lambda name: {(r["config"], r["length"], r["depth"], r["trial"]): r  # noqa: E731
                         for r in map(json.loads, (dev / name / "trials.jsonl").read_text().splitlines())}
    for before, after, moved in (("h200-one-arm-12k-22k-rows", "h100-one-arm-12k-22k-union", 15),
                                 ("h200-matrix-rows", "h100-matrix-union", 19)):
        old, new = load(before), load(after)
        assert new.keys() == old.keys()
        assert all(r["prompt_sha256"] == old[key]["prompt_sha256"] and r["error"] is None for key, r in new.items())
        differ = [key for key, r in new.items() if r["answer"] != old[key]["answer"]]
        assert len(differ) == moved and all(key[0] != "dense" for key in differ), after
        checked = load_checked(dev / after)
        assert checked.problems == []
        assert all(status(entry)[0] == VALID for entry in checked.manifest["configs"].values())
    took = job_seconds(dev / "h100-matrix-union")
    assert took == {"dense": 185, "bf16-k512": 172, "fp8-k512": 177, "bf16-k1024": 180, "fp8-k1024": 182,
                    "bf16-gather-k512": 260}
    assert all(took[arm] <= took["dense"] for arm in ("fp8-k512", "bf16-k512", "fp8-k1024", "bf16-k1024"))
    alone = load("h100-one-arm-12k-22k-union").values()
    median = {(arm, n): statistics.median(r["latency_s"] for r in alone if (r["config"], r["length"]) == (arm, n))
              for arm in ("dense", "fp8-k1024", "bf16-k1024") for n in (12189, 22600)}
    assert {key: round(v / median[("dense", key[1])], 2) for key, v in median.items() if key[0] != "dense"} == {
        ("fp8-k1024", 12189): 1.05, ("bf16-k1024", 12189): 0.96, ("fp8-k1024", 22600): 0.85,
        ("bf16-k1024", 22600): 0.83}


def test_the_h100_run_with_the_pages_logits_answers_as_the_tile_form_and_every_fused_arm_is_below_dense():
    """device/h100-one-arm-12k-22k-pages/: the seed's arms one at a time, indexer_logits' page-walking
    form by default, on one H100. Its scores are the tile form's bit for bit (the kernel benchmark
    on the same card: docs/results/h100-indexer-logits-pages.jsonl), so every one of the 180
    answers is the union run's; attestations valid; every fused arm's median trial below dense's
    at both lengths, the docs' ratios."""
    import statistics

    from niah.kernels.fused_indexer import wrapper

    assert wrapper.LOGITS_FORM == "pages"
    dev = H200 / "device"
    load = lambda name: {(r["config"], r["length"], r["depth"], r["trial"]): r  # noqa: E731
                         for r in map(json.loads, (dev / name / "trials.jsonl").read_text().splitlines())}
    old, new = load("h100-one-arm-12k-22k-union"), load("h100-one-arm-12k-22k-pages")
    assert new.keys() == old.keys() and len(new) == 180
    assert all(r["prompt_sha256"] == old[key]["prompt_sha256"] and r["error"] is None for key, r in new.items())
    assert all(r["answer"] == old[key]["answer"] for key, r in new.items())
    checked = load_checked(dev / "h100-one-arm-12k-22k-pages")
    assert checked.problems == []
    assert all(status(entry)[0] == VALID for entry in checked.manifest["configs"].values())
    arms = ("fp8-k512", "bf16-k512", "fp8-k1024", "bf16-k1024")
    median = {(arm, n): statistics.median(r["latency_s"] for r in new.values()
                                          if (r["config"], r["length"]) == (arm, n))
              for arm in ("dense", *arms) for n in (12189, 22600)}
    ratio = {key: round(v / median[("dense", key[1])], 2) for key, v in median.items() if key[0] != "dense"}
    assert ratio == {("fp8-k512", 12189): 0.85, ("bf16-k512", 12189): 0.83, ("fp8-k1024", 12189): 0.9,
                     ("bf16-k1024", 12189): 0.94, ("fp8-k512", 22600): 0.66, ("bf16-k512", 22600): 0.68,
                     ("fp8-k1024", 22600): 0.75, ("bf16-k1024", 22600): 0.76}
    rows = [json.loads(line) for line in (ROOT / "docs" / "results" / "h100-indexer-logits-pages.jsonl")
            .read_text().splitlines()]
    assert all(r["pages_vs_tile"]["bitwise_equal"] and r["pages_vs_tile"]["inf_mismatch"] == 0 for r in rows)
    assert {(r["dtype"], r["tokens"]): r["pages_over_tile"] for r in rows} == {
        ("fp8", 12189): 0.491, ("fp8", 22600): 0.341, ("bf16", 12189): 0.631, ("bf16", 22600): 0.54}


def test_the_union_build_timing_kept_the_sort_out_of_the_prefill():
    """device/union_attention-tile-kernel-h100.jsonl: union_attention with tile_union's kernel
    against the gather kernel, its CUDA tests passed first. On the rows that share keys as the
    model's do (tiles of 4, 2 warps) the union with its build is the docs' 1.11x / 0.97x at
    k 1,024 and 1.08x / 0.95x at k 512 (12,189 / 22,600 tokens), the build 0.41-0.43 ms at
    k 1,024: too little for the prefill, so the sort's build never became the default."""
    from niah.serving.embedded.cuda import attend

    path = H200 / "device" / "union_attention-tile-kernel-h100.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert all(r["max_abs_diff"] < 1e-6 for r in rows) and len(rows) == 48
    shared = {(r["end"], r["topk"]): r for r in rows
              if r["selection"] == "clustered" and r["block_q"] == 4 and r["num_warps"] == 2}
    assert {key: round(r["gather_ms"] / r["union_ms"], 2) for key, r in shared.items()} == {
        (12189, 1024): 1.11, (22600, 1024): 0.97, (12189, 512): 1.08, (22600, 512): 0.95}
    assert all(0.41 <= shared[(end, 1024)]["tile_union_ms"] <= 0.43 for end in (12189, 22600))
    saved = 90 * (shared[(12189, 1024)]["gather_ms"] - shared[(12189, 1024)]["union_ms"])
    assert 12 < saved < 14 and attend.UNION_BUILD != "sort"


def test_the_bitmap_build_timing_is_the_docs():
    """device/union_attention-bitmap-h100.jsonl: the same benchmark with tile_union_bitmap
    beside the sort, on one H100. Its entries equal the sort's in every case on the GPU; on
    the shared rows (tiles of 4, 2 warps) the union with it is the docs' 1.40x / 1.17x at
    k 1,024 and 1.15x / 1.02x at k 512, the build 2.3-2.6x faster than the sort at k 1,024;
    about 36 ms off a 12,189-token prefill. Kernel times only: the request-level run below made
    it the default."""

    path = H200 / "device" / "union_attention-bitmap-h100.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(rows) == 48 and all(r["bitmap_same"] and r["max_abs_diff"] < 1e-6 for r in rows)
    shared = {(r["end"], r["topk"]): r for r in rows
              if r["selection"] == "clustered" and r["block_q"] == 4 and r["num_warps"] == 2}
    assert {key: round(r["gather_ms"] / r["union_bitmap_ms"], 2) for key, r in shared.items()} == {
        (12189, 1024): 1.40, (22600, 1024): 1.17, (12189, 512): 1.15, (22600, 512): 1.02}
    assert all(2.3 <= shared[(end, 1024)]["tile_union_ms"] / shared[(end, 1024)]["tile_union_bitmap_ms"] <= 2.7
               for end in (12189, 22600))
    saved = 90 * (shared[(12189, 1024)]["gather_ms"] - shared[(12189, 1024)]["union_bitmap_ms"])
    assert 35 < saved < 37
