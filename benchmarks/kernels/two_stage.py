"""Two-stage selection (fp8 or fp4 scores, bf16 re-score of the candidates) side by side with the
one-stage reads it replaces, one process:

    python benchmarks/kernels/two_stage.py --out two_stage.json           # CUDA
    python benchmarks/kernels/two_stage.py --tiny --out two_stage.json    # CPU, TRITON_INTERPRET=1: the wiring only

One decode step of the indexer (H=64, D=128, next_n=1, top-k 2,048 as DeepSeek-V3.2 selects)
at B=64 with lengths uniform in 1..65,536 (ragged) and at B=1 x 131,072, on the same keys
stored three ways (fp8, fp4 and bf16; the store keeps the coarse and the bf16 form of every
token). Timed (triton.testing.do_bench medians, L2 flushed):
  - DeepGEMM's `fp8_paged_mqa_logits` (clean_logits=False, SGLang's call), when `import
    deep_gemm` works, alone and followed by a top-k: niah's `topk_indices`, and SGLang's own
    topk_v2 as its DSA decode backend calls it (`_topk_transform_v2_paged`: the top-k and the
    page-table transform, the plan made once per step outside the timing) where SGLANG_TOPK_BUILD
    (benchmarks/sglang_jit_build.py's output, topk_v2 built) and SGLANG_SRC (its source tree) are
    set: `SGLANG_TOPK=1` in gpu_check.sh; each top-k also alone on DeepGEMM's logits;
  - niah's fp8 and bf16 paged logits, each followed by the same top-k (one-stage selection);
  - `fp8_bf16_two_stage_topk` at candidate factors c = 2, 4, 8 (fp8 logits over every key,
    the c*k candidates, `bf16_paged_rescore` of those rows only, the final top-k by
    `topk_indices`), at c = 2 with the final top-k by torch.topk (its first version), and the
    re-score kernel alone at c = 4;
  - niah's fp4 paged logits (`fp4_paged_mqa_logits`, MXFP4 query as SGLang's fp4 path, and a
    bf16 query), alone and followed by the top-k (one-stage fp4 selection), and
    `fp4_bf16_two_stage_topk` at c = 2, 4, 8 (fp4 query; c = 4 with the bf16 query too); where
    the GPU has fp8 MMA, the fp4 logits and c = 2 again with mma="fp8";
  - the decode cases again with the few-rows top-k by the segmented select (`topk_indices`'s
    method "segmented", kernels/topk/segment_kernel.py): alone on DeepGEMM's logits, after
    DeepGEMM's and niah's fp8 logits, and in the two-stage selection at c = 2, 4, 8;
  - the goals' arms (GRAPH_ARMS) again replayed in a CUDA graph, as SGLang replays decode
    (`graph_ms`, and `graph_ratio` beside each ratio where both arms have one): the host's
    launch cost out of the number; one copy of the inputs, so the replays find them in L2
    where they fit (B=1: 17-33 MB of keys and logits) while the eager timings flush it.
Ratios: two-stage and fp4 / DeepGEMM fp8 logits (fp4 logits: goal <= 1.0), / DeepGEMM fp8
logits + SGLang's top-k (fp8+bf16 two-stage: goal <= 1.5) and + niah's top-k, and / niah bf16 logits + top-k.
Checked first on the same inputs: the re-scores equal niah's bf16 logits at the candidates (calc_diff), both
two-stage forms with c*k >= the length select what the bf16 one-stage top-k selects, and (decode
cases) SGLang's top-k keeps what niah's keeps on DeepGEMM's logits (the share of slots in common).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

if "--tiny" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from measure import bench_cli, deep_gemm, fp8_pages, timeit, timeit_graph, write_results  # noqa: E402

HEADS, DIM = 64, 128
PAGE = 64


def sglang_topk():
    """SGLang's topk_v2 as its DSA decode backend calls it, or None (said on one line): a function
    (logits, lengths, k, table) -> a callable returning int32 [B, k] KV slots (table[b, p // 64] * 64
    + p % 64, -1 padded), its plan made once (SGLang makes it once a forward, for every layer)."""
    build, src = os.environ.get("SGLANG_TOPK_BUILD"), os.environ.get("SGLANG_SRC")
    if not build or not src:
        print("SGLang top-k: not built (SGLANG_TOPK=1 in gpu_check.sh builds it)")
        return None
    try:
        import json
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from sglang_jit_build import load_module
        from sglang_jit_ops import Ops

        entry = json.loads((Path(build) / "manifest.json").read_text())["topk_v2"]
        if not entry.get("ok"):
            raise RuntimeError(entry.get("error", "build failed")[-300:])
        ops = Ops(Path(src), {"topk_v2": load_module(entry)})
    except Exception as e:  # noqa: BLE001 - a benchmark arm: said, and the others run
        print(f"SGLang top-k: not available ({type(e).__name__}: {str(e)[:300]})")
        return None

    def bind(logits, lengths, k, table):
        meta = type("DSAMetadata", (), {})()
        meta.real_page_table, meta.page_size, meta.topk_v2_plan = table, PAGE, ops.plan_topk_v2(lengths)
        return lambda lg=logits: ops.topk_paged(lg, lengths, k, meta)
    return bind


# the arms timed again in a CUDA graph: the goals' numerators and denominators, and the top-k alone
GRAPH_ARMS = ("DeepGEMM fp8 logits", "DeepGEMM fp8 logits + SGLang top-k", "DeepGEMM fp8 logits + top-k",
              "SGLang top-k alone (on DeepGEMM's logits)", "niah top-k alone (on DeepGEMM's logits)",
              "niah segmented top-k alone (on DeepGEMM's logits)", "niah fp8 logits + top-k",
              "niah fp4 logits (fp4 query)", "niah fp4 logits (bf16 query)", "niah fp4 logits (fp4 query, fp8 MMA)",
              "fp4 two-stage c=2", "fp4 two-stage c=4", "fp4 two-stage c=8", "two-stage c=2",
              "two-stage c=4", "two-stage c=8", "two-stage c=2 (segmented top-k)", "two-stage c=4 (segmented top-k)",
              "two-stage c=8 (segmented top-k)")


def wrapper_default() -> str:
    from niah.kernels.topk import wrapper

    return wrapper.FEW_ROWS_METHOD


@contextmanager
def few_rows_method(method: str):
    """topk_indices' default for few rows (decode) set to `method` while the block runs."""
    from niah.kernels.topk import wrapper

    before = wrapper.FEW_ROWS_METHOD
    wrapper.FEW_ROWS_METHOD = method
    try:
        yield
    finally:
        wrapper.FEW_ROWS_METHOD = before


def slots_of(pos: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Positions within each request -> KV slots through its page table (-1 stays -1)."""
    p = pos.long().clamp(min=0)
    return torch.where(pos >= 0, table.long().gather(1, p // PAGE) * PAGE + p % PAGE, -1)


def fp4_pages(keys: torch.Tensor) -> torch.Tensor:
    """keys [pages, 64, D] -> uint8 [pages, 64 * (D/2 + D/32)] (SGLang's fp4 page): the store kernel
    on CUDA, its torch reference on CPU (the interpreter would spend seconds on it)."""
    from niah.kernels import store_fp4_index_keys
    from niah.kernels.fp4_store.reference import ref_store_fp4_index_keys

    pages, bkv, d = keys.shape
    cache = torch.zeros(pages, bkv * (d // 2 + d // 32), dtype=torch.uint8, device=keys.device)
    slots = torch.arange(pages * bkv, device=keys.device)
    store = store_fp4_index_keys if keys.is_cuda else ref_store_fp4_index_keys
    return store(keys.reshape(-1, d), cache, slots)


def inputs(dev, batch, ctx_len, ragged, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    per = (ctx_len + 63) // 64
    table = torch.randperm(batch * per, device=dev, generator=g).reshape(batch, per).int()
    keys = torch.randn(batch * per, 64, DIM, device=dev, generator=g)
    fp8 = fp8_pages(keys)
    fp4 = fp4_pages(keys)
    bf16 = keys.bfloat16().reshape(batch * per, 64, 1, DIM)
    del keys
    q = torch.randn(batch, HEADS, DIM, device=dev, generator=g)
    w = torch.rand(batch, HEADS, device=dev, generator=g) * HEADS**-0.5
    ctx = (torch.randint(1, ctx_len + 1, (batch,), device=dev, generator=g, dtype=torch.int32) if ragged
           else torch.full((batch,), ctx_len, dtype=torch.int32, device=dev))
    return table, fp8, fp4, bf16, q, w, ctx


def check(results, case, dev, tiny) -> None:
    """The re-scores against the bf16 logits at the candidates; two-stage = bf16 top-k when c*k covers."""
    from niah.kernels import (bf16_paged_mqa_logits, bf16_paged_rescore, fp4_bf16_two_stage_topk,
                              fp8_bf16_two_stage_topk, topk_indices)
    from niah.kernels._common import calc_diff
    from niah.kernels.quant import quantize_fp4, quantize_fp8

    batch, ctx_len, k = (2, 300, 32) if tiny else (4, 4096, 256)
    table, fp8, fp4, bf16, q, w, ctx = inputs(dev, batch, ctx_len, ragged=True, seed=1)
    q8, s8 = quantize_fp8(q)
    w8 = w * s8.reshape(batch, HEADS)
    logits = bf16_paged_mqa_logits(q.bfloat16()[:, None], bf16, w, ctx, table, None, ctx_len, clean_logits=True)
    cand = topk_indices(logits, 4 * k, ctx)
    resc = bf16_paged_rescore(q.bfloat16(), bf16, w, table, cand)
    ok = cand >= 0
    diff = float(calc_diff(resc[ok].double(), logits.gather(1, cand.clamp(min=0).long())[ok].double()))
    picked = fp8_bf16_two_stage_topk(q8, fp8, w8, q.bfloat16(), bf16, w, ctx, table, ctx_len, k,
                                     factor=(ctx_len + k - 1) // k)
    picked4 = fp4_bf16_two_stage_topk(quantize_fp4(q), fp4, w, q.bfloat16(), bf16, w, ctx, table, ctx_len, k,
                                      factor=(ctx_len + k - 1) // k)
    one = topk_indices(logits, k, ctx)

    def kept(sel):
        return float(sum(len(set(a[a >= 0].tolist()) & set(b[b >= 0].tolist())) for a, b in zip(sel, one))
                     / max(1, int((one >= 0).sum())))

    same, same4 = kept(picked), kept(picked4)
    results.append({"case": case, "impl": "check", "rescore_vs_bf16_logits_calc_diff": diff,
                    "two_stage_covering_equals_bf16_topk": same, "fp4_two_stage_covering_equals_bf16_topk": same4})
    print(f"{case}: re-score vs bf16 logits calc_diff {diff:.2e}; two-stage (c*k >= length) keeps "
          f"{same:.4f} (fp8+bf16) and {same4:.4f} (fp4+bf16) of bf16's top-{k}")


def decode_case(results, dev, batch, ctx_len, ragged, dg, tiny, sgl=None):
    from niah.kernels import (bf16_paged_mqa_logits, bf16_paged_rescore, fp4_bf16_two_stage_topk,
                              fp4_paged_mqa_logits, fp8_bf16_two_stage_topk, fp8_paged_mqa_logits, topk_indices)
    from niah.kernels.fp4_paged_logits.wrapper import has_fp8_mma
    from niah.kernels.quant import quantize_fp4, quantize_fp8

    k = 32 if tiny else 2048
    table, fp8, fp4, bf16, q, w, ctx = inputs(dev, batch, ctx_len, ragged)
    q8, s8 = quantize_fp8(q)
    w8 = w * s8.reshape(batch, HEADS)
    q16 = q.bfloat16()
    q4 = quantize_fp4(q)                                     # MXFP4 query (codes, exponents), SGLang's fp4 path
    q4n = tuple(t[:, None] for t in q4)
    case = f"decode B={batch} {'ragged<=' if ragged else 'x'}{ctx_len} top-k {k}"
    cand4 = topk_indices(fp8_paged_mqa_logits(q8[:, None], fp8, w8, ctx, table, None, ctx_len), min(4 * k, ctx_len),
                         ctx)
    calls = {
        "niah fp8 logits + top-k": lambda: topk_indices(
            fp8_paged_mqa_logits(q8[:, None], fp8, w8, ctx, table, None, ctx_len), k, ctx),
        "niah bf16 logits + top-k": lambda: topk_indices(
            bf16_paged_mqa_logits(q16[:, None], bf16, w, ctx, table, None, ctx_len), k, ctx),
        "niah bf16 logits": lambda: bf16_paged_mqa_logits(q16[:, None], bf16, w, ctx, table, None, ctx_len,
                                                          clean_logits=False),
        "niah re-score alone (c=4)": lambda: bf16_paged_rescore(q16, bf16, w, table, cand4),
    }
    for c in (2, 4, 8):
        calls[f"two-stage c={c}"] = (lambda c=c: fp8_bf16_two_stage_topk(q8, fp8, w8, q16, bf16, w, ctx, table,
                                                                          ctx_len, k, factor=c))
    calls["two-stage c=2 (final torch.topk)"] = lambda: fp8_bf16_two_stage_topk(
        q8, fp8, w8, q16, bf16, w, ctx, table, ctx_len, k, factor=2, final_topk="torch")
    calls.update({
        "niah fp4 logits (fp4 query)": lambda: fp4_paged_mqa_logits(q4n, fp4, w, ctx, table, None, ctx_len),
        "niah fp4 logits (bf16 query)": lambda: fp4_paged_mqa_logits(q16[:, None], fp4, w, ctx, table, None, ctx_len),
        "niah fp4 logits + top-k": lambda: topk_indices(
            fp4_paged_mqa_logits(q4n, fp4, w, ctx, table, None, ctx_len), k, ctx),
    })
    for c in (2, 4, 8):
        calls[f"fp4 two-stage c={c}"] = (lambda c=c: fp4_bf16_two_stage_topk(q4, fp4, w, q16, bf16, w, ctx, table,
                                                                              ctx_len, k, factor=c))
    calls["fp4 two-stage c=4 (bf16 query)"] = lambda: fp4_bf16_two_stage_topk(q16, fp4, w, q16, bf16, w, ctx, table,
                                                                              ctx_len, k, factor=4)
    fp8_arms = []
    if has_fp8_mma(fp4):   # the fp4 logits on the fp8 tensor cores (mma="fp8"), alone and as the coarse stage
        calls["niah fp4 logits (fp4 query, fp8 MMA)"] = lambda: fp4_paged_mqa_logits(q4n, fp4, w, ctx, table, None,
                                                                                     ctx_len, mma="fp8")
        calls["fp4 two-stage c=2 (fp8 MMA)"] = lambda: fp4_bf16_two_stage_topk(q4, fp4, w, q16, bf16, w, ctx, table,
                                                                               ctx_len, k, factor=2, mma="fp8")
        fp8_arms = ["niah fp4 logits (fp4 query, fp8 MMA)", "fp4 two-stage c=2 (fp8 MMA)"]
    if dg is not None:
        ctx2 = ctx.view(-1, 1)
        meta = dg.get_paged_mqa_logits_metadata(ctx2, 64, dg.get_num_sms())
        q8d = q8[:, None]

        def dg_logits():
            return dg.fp8_paged_mqa_logits(q8d, fp8, w8, ctx2, table, meta, ctx_len, clean_logits=False)

        def dg_topk():
            logits = dg.fp8_paged_mqa_logits(q8d, fp8, w8, ctx2, table, meta, ctx_len, clean_logits=False)
            return topk_indices(logits, k, ctx)

        calls["DeepGEMM fp8 logits"] = dg_logits
        calls["DeepGEMM fp8 logits + top-k"] = dg_topk
        dg_out = dg_logits()
        calls["niah top-k alone (on DeepGEMM's logits)"] = lambda: topk_indices(dg_out, k, ctx)
        if sgl is not None:
            sgl_sel = sgl(dg_out, ctx, k, table)
            calls["SGLang top-k alone (on DeepGEMM's logits)"] = sgl_sel

            def dg_sgl():
                return sgl_sel(dg_logits())

            calls["DeepGEMM fp8 logits + SGLang top-k"] = dg_sgl
            mine, theirs = slots_of(topk_indices(dg_out, k, ctx), table), sgl_sel().long()
            common = sum(len(set(a[a >= 0].tolist()) & set(b[b >= 0].tolist())) for a, b in zip(mine, theirs))
            share = common / max(1, int((mine >= 0).sum()))
            results.append({"case": case, "impl": "check", "sglang_topk_keeps_niah_topk": share})
            print(f"{case}: SGLang's top-k keeps {share:.4f} of niah's on DeepGEMM's logits")
    # the few-rows top-k by the segmented select (topk.wrapper.FEW_ROWS_METHOD): alone, after
    # DeepGEMM's logits, and in the two-stage selection (both of its top-k calls)
    seg_calls = {"two-stage c={c} (segmented top-k)".format(c=c): calls[f"two-stage c={c}"] for c in (2, 4, 8)}
    seg_calls["niah fp8 logits + segmented top-k"] = calls["niah fp8 logits + top-k"]
    if dg is not None:
        alone = calls["niah top-k alone (on DeepGEMM's logits)"]
        seg_calls["niah segmented top-k alone (on DeepGEMM's logits)"] = alone
        seg_calls["DeepGEMM fp8 logits + niah segmented top-k"] = calls["DeepGEMM fp8 logits + top-k"]
        want = topk_indices(dg_out, k, ctx).sort(1).values          # the default method's set
        with few_rows_method("segmented"):
            same = torch.equal(alone().sort(1).values, want)
        results.append({"case": case, "impl": "check", "segmented_topk_keeps_niah_topk": same})
    timed = {}
    for impl, fn in calls.items():
        timed[impl] = ms = timeit(fn)
        results.append({"case": case, "impl": impl, "ms": ms})
        print(f"{case}: {impl}: {ms:.4f} ms")
    with few_rows_method("segmented"):
        for impl, fn in seg_calls.items():
            timed[impl] = ms = timeit(fn)
            results.append({"case": case, "impl": impl, "ms": ms})
            print(f"{case}: {impl}: {ms:.4f} ms")
    # the goal's arms again replayed in a CUDA graph (as SGLang replays its decode step): GPU time
    # alone, without the host's launch cost, which dominates the eager B=1 numbers
    graphed = {}
    for impl in GRAPH_ARMS:
        if impl in calls or impl in seg_calls:
            with few_rows_method("segmented" if impl in seg_calls else wrapper_default()):
                graphed[impl] = ms = timeit_graph([seg_calls.get(impl) or calls[impl]])
            if ms is not None:
                results.append({"case": case, "impl": impl, "graph_ms": ms})
                print(f"{case}: {impl}: {ms:.4f} ms in a CUDA graph")
    # goals: the whole two-stage selection <= 1.5x DeepGEMM fp8 logits + SGLang's top-k (where it was
    # built; else niah's stands in, said by the row's name), fp4 logits <= 1.0x DeepGEMM fp8 logits
    top = "DeepGEMM fp8 logits + SGLang top-k" if "DeepGEMM fp8 logits + SGLang top-k" in timed else \
        "DeepGEMM fp8 logits + top-k"
    goals = {("two-stage", top): 1.5, ("niah fp4 logits", "DeepGEMM fp8 logits"): 1.0}
    arms = [f"{a} c={c}" for a in ("two-stage", "fp4 two-stage") for c in (2, 4, 8)]
    arms += [f"two-stage c={c} (segmented top-k)" for c in (2, 4, 8)]
    arms += ["two-stage c=2 (final torch.topk)", "fp4 two-stage c=4 (bf16 query)", "niah fp4 logits + top-k",
             "niah fp4 logits (fp4 query)", "niah fp4 logits (bf16 query)"] + fp8_arms
    for base in ("DeepGEMM fp8 logits", "DeepGEMM fp8 logits + SGLang top-k", "DeepGEMM fp8 logits + top-k",
                 "niah bf16 logits + top-k"):
        if base not in timed:
            continue
        for arm in arms:
            ratio = timed[arm] / timed[base]
            row = {"case": case, "impl": f"{arm} / {base}", "ratio": ratio}
            goal = goals.get((arm.split(" c=")[0].split(" (")[0], base))
            if goal is not None:
                row["goal"] = goal
            if graphed.get(arm) and graphed.get(base):
                row["graph_ratio"] = graphed[arm] / graphed[base]
            results.append(row)
            print(f"{case}: {arm} / {base} = {ratio:.3f}" + (f" (goal <= {goal})" if goal else "")
                  + (f"; in a CUDA graph {row['graph_ratio']:.3f}" if "graph_ratio" in row else ""))


def main() -> None:
    a, dev, env = bench_cli(__doc__, "two_stage.py")
    results: list = []
    dg = None if a.tiny else deep_gemm()
    if dg is not None:
        env["deep_gemm"] = getattr(dg, "__version__", "importable")
    sgl = None if a.tiny or dg is None else sglang_topk()
    if sgl is not None:
        env["sglang_topk"] = "topk_v2 (SGLang 0.5.23 source, built by sglang_jit_build.py)"
    check(results, "check", dev, a.tiny)
    cases = [(1, 200, False)] if a.tiny else [(64, 65536, True), (1, 131072, False)]
    for batch, ctx_len, ragged in cases:
        decode_case(results, dev, batch, ctx_len, ragged, dg, a.tiny, sgl)
        write_results(a.out, env, results)
    write_results(a.out, env, results)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
