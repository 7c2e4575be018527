"""Evidence on the H200 against SGLang 0.5.23's own JIT CUDA kernels.

    python benchmarks/sglang_jit_evidence.py --sglang-src TREE --build DIR --out DIR [--smoke]

TREE holds SGLang's files (`sglang/...`, benchmarks/prepare_carry.sh puts them in
.carry/sglang-src); DIR is what benchmarks/sglang_jit_build.py compiled there (manifest.json
and one .so per module, loaded with tvm_ffi.load_module). On identical inputs:
  v32_store   niah's V3.2 key store (niah.kernels.store_v32_index_keys) vs SGLang's
              FusedKIndexerNormRopeKernel (bf16, pre-quantisation) and
              FusedKIndexerNormRopeStoreKernel (the production fp8 page): ulps, bytes, e4m3 steps
  v32_query   SGLang's fused fp8 query vs the bf16 query niah's bf16 arm uses
  v4_store    niah's store_v4_index_keys vs SGLang's fused_norm_rope_v2 (prefill and decode plans)
  selection   top-k overlap with the float64 selection per arm (sglang_jit_selection.py), decode
              (topk_v2's cluster and register paths) and prefill (ragged) at top-k 512/1024/2048,
              3 seeds; topk_v2 on fp32 copies of the float64 logits, and on niah's bf16 logits vs
              float64 logits of the same stored keys and query
  timing      the V3.2 key stores at 4,096 tokens, eager (CUDA events, median)
The store, query and timing sections live in sglang_jit_stores.py, the arms in
sglang_jit_selection.py, SGLang's wrappers in sglang_jit_ops.py, its build in sglang_jit_build.py.
Writes OUT/<name>.json (figures and pass/fail checks) and prints a readable log.
--smoke: CPU, tiny shapes, TRITON_INTERPRET=1; SGLang's compiled modules are replaced by torch
stand-ins (sglang_jit_ops.StandIns): it checks this script's plumbing, not SGLang.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

SMOKE = "--smoke" in sys.argv
if SMOKE or not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import sglang_jit_selection as sel  # noqa: E402
from sglang_jit_build import MODULES, load_module  # noqa: E402
from sglang_jit_ops import Ops, StandIns  # noqa: E402
from sglang_jit_stores import niah_v32_store, timing, v4_store, v32_query, v32_store  # noqa: E402

PAGE = sel.PAGE


class Results:
    def __init__(self, path: Path, meta: dict):
        self.path, self.data = path, {"meta": meta, "checks": {}}

    def put(self, section: str, value, quiet: bool = False) -> None:
        self.data[section] = value
        if not quiet:
            print(f"[{section}] {json.dumps(value)}", flush=True)
        self.flush()

    def check(self, name: str, ok: bool) -> None:
        self.data["checks"][name] = bool(ok)
        print(f"  check {name}: {'PASS' if ok else 'FAIL'}", flush=True)
        self.flush()

    def flush(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=1) + "\n")


GPU_SHAPES = {  # name -> (context lengths, prefill rows per request (0: decode, one row per request))
    "decode B=4, 40k-64k tokens (topk_v2 cluster path)": ([65536, 40000, 52223, 61000], 0),
    "decode B=32, 4k-16k tokens (topk_v2 register paths)": ([4096 + 379 * i for i in range(32)], 0),
    "prefill 2 requests of 12,288 and 20,480 tokens, last 256 rows each (topk_v2 ragged)": ([12288, 20480], 256),
}
SMOKE_SHAPES = {"decode B=2": ([300, 200], 0), "prefill 2 requests, last 16 rows": ([256, 192], 16)}


def kernel_layout(b, ref: torch.Tensor) -> torch.Tensor:
    """fp32 copies of float64 logits laid out as the arm kernels return them (paged: by position,
    ragged: by flattened key column), -inf elsewhere."""
    if not b.prefill_rows:
        out = torch.full((ref.shape[0], b.table.shape[1] * PAGE), float("-inf"), device=ref.device)
        out[:, : ref.shape[1]] = ref.float()
        return out
    out = torch.full((ref.shape[0], -(-b.n // 256) * 256), float("-inf"), device=ref.device)
    p = torch.arange(ref.shape[1], device=ref.device)[None, :]
    col = (b.ks[:, None] + p).clamp_max(b.n - 1).long()
    vis = p < b.visible[:, None]
    out.scatter_(1, torch.where(vis, col, out.shape[1] - 1), torch.where(vis, ref.float(), float("-inf")))
    return out


def selection_seed(b, ops, store, ks) -> dict:
    from niah.kernels import calc_diff

    ref = sel.reference(b)
    arms = sel.Arms(b, ops, store)
    vis = b.visible
    refz = torch.where(ref.isinf(), 0.0, ref)
    got = {"keys16_written_by": arms.keys16_by}
    for arm in sel.ARMS:
        logits = arms.logits(arm)
        pos = arms.positions(logits)
        row = {"calc_diff": calc_diff(pos, refz), "topk": {}}
        if arm == "bf16_q16":
            same = arms.stored_float64(arm)
            torch_view = torch.where(ref.isinf(), float("-inf"), pos)  # torch.topk on these fp32 values
        for k in ks:
            s = arms.select(logits, k)
            row["topk"][k] = {"overlap": sel.overlap(s, ref, vis, k), "valid": sel.valid_selection(s, vis, k)}
            if arm == "bf16_q16":
                row["topk"][k]["same_inputs_float64"] = sel.overlap(s, same, vis, k)
                row["topk"][k]["torch_topk_same_logits"] = sel.overlap(s, torch_view, vis, k)
        got[arm] = row
    got["control"] = {k: sel.overlap(arms.select(kernel_layout(b, ref), k), ref, vis, k) for k in ks}
    return got


def _fmt(v: dict) -> str:
    return "trivial" if "mean" not in v else f"{v['mean']:.4f} [{v['min_seed_mean']:.4f}, {v['max_seed_mean']:.4f}]"


def print_shape(name: str, shape: dict, ks) -> None:
    """One readable table per shape: per arm, calc_diff and the overlap at each k (mean [range])."""
    print(f"== {name}: {shape['seconds']} s, bf16 keys by {shape['keys16_written_by']}", flush=True)
    print(f"   {'arm':<14}{'calc_diff':>11}  " + "".join(f"{'top-' + str(k) + ' mean [seed range]':<28}" for k in ks))
    for arm in sel.ARMS:
        row = shape[arm]
        print(f"   {arm:<14}{row['logits_calc_diff_vs_float64']:>11.3e}  "
              + "".join(f"{_fmt(row['topk_overlap_with_float64'][k]):<28}" for k in ks))
    for key, per_k in shape["topk_v2_fidelity"].items():
        print(f"   {key.replace('_', ' ')}: " + ", ".join(f"{k}: {_fmt(v)}" for k, v in per_k.items()), flush=True)


def selection(ops: Ops, device: str, smoke: bool, res: Results) -> None:
    shapes, ks = (SMOKE_SHAPES, (32, 64)) if smoke else (GPU_SHAPES, (512, 1024, 2048))
    seeds = (0,) if smoke else (0, 1, 2)
    store = niah_v32_store()
    out = {"inputs_and_arms": sel.__doc__, "overlap": "|topk_v2 selection & float64 top-k| / k per query row "
           "with more than k visible keys; per seed the mean over rows; below: mean and range over seeds",
           "heads": sel.HEADS, "seeds": list(seeds), "shapes": {}}
    for name, (lens, rows) in shapes.items():
        t = time.time()
        per_seed = [selection_seed(sel.Batch(lens, rows, device, s), ops, store, ks) for s in seeds]
        shape = {"lens": lens, "prefill_rows_per_request": rows, "keys16_written_by": per_seed[0]["keys16_written_by"]}
        for arm in sel.ARMS:
            shape[arm] = {"logits_calc_diff_vs_float64": sum(p[arm]["calc_diff"] for p in per_seed) / len(seeds),
                          "topk_overlap_with_float64": {k: sel.summarize([p[arm]["topk"][k]["overlap"]
                                                                          for p in per_seed]) for k in ks}}
        fid = {"topk_v2_on_fp32_copies_of_float64_logits": {k: sel.summarize([p["control"][k] for p in per_seed])
                                                            for k in ks},
               "topk_v2_on_niah_bf16_logits_vs_float64_of_same_stored_keys_and_query": {
                   k: sel.summarize([p["bf16_q16"]["topk"][k]["same_inputs_float64"] for p in per_seed]) for k in ks},
               "topk_v2_vs_torch_topk_on_identical_fp32_logits": {
                   k: sel.summarize([p["bf16_q16"]["topk"][k]["torch_topk_same_logits"] for p in per_seed])
                   for k in ks}}
        shape["topk_v2_fidelity"], shape["seconds"] = fid, round(time.time() - t, 1)
        out["shapes"][name] = shape
        res.put("selection", out, quiet=True)
        print_shape(name, shape, ks)
        valid = all(p[a]["topk"][k]["valid"] for p in per_seed for a in sel.ARMS for k in ks)
        res.check(f"{name}: topk_v2 returns min(k, length) distinct in-range positions in every arm", valid)
        for key, floor in (("topk_v2_on_fp32_copies_of_float64_logits", 0.999),
                           ("topk_v2_on_niah_bf16_logits_vs_float64_of_same_stored_keys_and_query", 0.995),
                           ("topk_v2_vs_torch_topk_on_identical_fp32_logits", 0.999)):
            vals = [v["min_seed_mean"] for v in fid[key].values() if "mean" in v]
            res.check(f"{name}: {key.replace('_', ' ')} (every k, every seed >= {floor})",
                      bool(vals) and min(vals) >= floor)


def load_modules(build: Path, res: Results) -> dict:
    manifest = json.loads((build / "manifest.json").read_text())
    modules, info = {}, {}
    for name in MODULES:
        entry = manifest.get(name, {"ok": False, "error": "not built"})
        info[name] = {k: entry.get(k) for k in ("module_name", "ok", "seconds", "cluster_probe") if k in entry}
        try:
            modules[name] = load_module(entry) if entry.get("ok") else None
        except Exception as e:  # noqa: BLE001
            info[name]["load_error"] = f"{type(e).__name__}: {e}"[:500]
        if not entry.get("ok"):
            info[name]["build_error"] = entry.get("error", "")[-1500:]
        res.check(f"SGLang JIT module {name} built with nvcc and loaded through tvm-ffi", modules.get(name) is not None)
    res.put("jit_modules", info)
    return {k: v for k, v in modules.items() if v is not None}


def run_section(res: Results, name: str, fn, *args) -> None:
    t = time.time()
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - one broken section must not hide the others
        import traceback

        traceback.print_exc()
        res.data.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[:2000]
        res.check(f"section {name} ran", False)
    print(f"  ({name}: {time.time() - t:.1f} s)", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sglang-src", required=True, type=Path, help="a tree holding SGLang 0.5.23's sglang/...")
    ap.add_argument("--build", type=Path, help="sglang_jit_build.py's output folder (manifest.json)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--name", default="sglang-jit-evidence")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    device = "cpu" if a.smoke or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and not a.smoke:
        print("no CUDA device: run with --smoke for the CPU plumbing check", file=sys.stderr)
        return 2
    if not a.smoke and a.build is None:
        print("--build is required (the folder sglang_jit_build.py wrote)", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    import triton

    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (TRITON_INTERPRET=1)",
            "torch": torch.__version__, "triton": triton.__version__, "smoke": a.smoke, "sglang": "0.5.23",
            "sglang_kernels": "torch stand-ins (smoke: not SGLang)" if a.smoke else "SGLang's JIT CUDA kernels"}
    if not a.smoke:
        import tvm_ffi

        meta["tvm_ffi"] = getattr(tvm_ffi, "__version__", "?")
    res = Results(a.out / f"{a.name}{'-smoke' if a.smoke else ''}.json", meta)
    t0 = time.time()
    modules = StandIns.modules() if a.smoke else load_modules(a.build, res)
    ops = Ops(a.sglang_src, modules, smoke=a.smoke)
    small = a.smoke
    run_section(res, "v32_store", v32_store, ops, 200 if small else 4096, device, res)
    run_section(res, "v32_query", v32_query, ops, 4 if small else 256, device, res)
    run_section(res, "v4_store", v4_store, ops, 300 if small else 5649, device, res)
    run_section(res, "selection", selection, ops, device, small, res)
    if device == "cuda":
        run_section(res, "timing", timing, ops, 4096, device, res)
    failed = [k for k, v in res.data["checks"].items() if not v]
    res.data["meta"]["seconds"] = round(time.time() - t0, 1)
    res.flush()
    print(f"{len(res.data['checks']) - len(failed)}/{len(res.data['checks'])} checks pass"
          + (f"; failed: {failed}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
