"""Two-stage selection (fp8 scores, bf16 re-score of the candidates) side by side with the
one-stage reads it replaces, one process:

    python benchmarks/kernels/two_stage.py --out two_stage.json           # CUDA
    python benchmarks/kernels/two_stage.py --tiny --out two_stage.json    # CPU, TRITON_INTERPRET=1: the wiring only

One decode step of the indexer (H=64, D=128, next_n=1, top-k 2,048 as DeepSeek-V3.2 selects)
at B=1 x 131,072 and at B=64 with lengths uniform in 1..65,536 (ragged), on the same keys
stored both ways (the store keeps both forms of every token). Timed (triton.testing.do_bench
medians, L2 flushed):
  - DeepGEMM's `fp8_paged_mqa_logits` (clean_logits=False, SGLang's call), when `import
    deep_gemm` works, alone and followed by the top-k (niah's `topk_indices`: SGLang's own
    top-k kernel is not on this machine);
  - niah's fp8 and bf16 paged logits, each followed by the same top-k (one-stage selection);
  - `fp8_bf16_two_stage_topk` at candidate factors c = 2, 4, 8 (fp8 logits over every key,
    the c*k candidates, `bf16_paged_rescore` of those rows only, the final top-k), and the
    re-score kernel alone at c = 4.
Ratios: two-stage / DeepGEMM fp8 logits (goal <= 1.2), / DeepGEMM fp8 logits + top-k, and /
niah bf16 logits + top-k. Checked first on the same inputs: the re-scores equal niah's bf16
logits at the candidates (calc_diff), and two-stage with c*k >= the length selects what the
bf16 one-stage top-k selects.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if "--tiny" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from measure import deep_gemm, fp8_pages, has_cuda, timeit, write_results  # noqa: E402

HEADS, DIM = 64, 128


def inputs(dev, batch, ctx_len, ragged, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    per = (ctx_len + 63) // 64
    table = torch.randperm(batch * per, device=dev, generator=g).reshape(batch, per).int()
    keys = torch.randn(batch * per, 64, DIM, device=dev, generator=g)
    fp8 = fp8_pages(keys)
    bf16 = keys.bfloat16().reshape(batch * per, 64, 1, DIM)
    del keys
    q = torch.randn(batch, HEADS, DIM, device=dev, generator=g)
    w = torch.rand(batch, HEADS, device=dev, generator=g) * HEADS**-0.5
    ctx = (torch.randint(1, ctx_len + 1, (batch,), device=dev, generator=g, dtype=torch.int32) if ragged
           else torch.full((batch,), ctx_len, dtype=torch.int32, device=dev))
    return table, fp8, bf16, q, w, ctx


def check(results, case, dev, tiny) -> None:
    """The re-scores against the bf16 logits at the candidates; two-stage = bf16 top-k when c*k covers."""
    from niah.kernels import bf16_paged_mqa_logits, bf16_paged_rescore, fp8_bf16_two_stage_topk, topk_indices
    from niah.kernels._common import calc_diff
    from niah.kernels.quant import quantize_fp8

    batch, ctx_len, k = (2, 300, 32) if tiny else (4, 4096, 256)
    table, fp8, bf16, q, w, ctx = inputs(dev, batch, ctx_len, ragged=True, seed=1)
    q8, s8 = quantize_fp8(q)
    w8 = w * s8.reshape(batch, HEADS)
    logits = bf16_paged_mqa_logits(q.bfloat16()[:, None], bf16, w, ctx, table, None, ctx_len, clean_logits=True)
    cand = topk_indices(logits, 4 * k, ctx)
    resc = bf16_paged_rescore(q.bfloat16(), bf16, w, table, cand)
    ok = cand >= 0
    diff = float(calc_diff(resc[ok].double(), logits.gather(1, cand.clamp(min=0).long())[ok].double()))
    picked = fp8_bf16_two_stage_topk(q8, fp8, w8, q.bfloat16(), bf16, w, ctx, table, ctx_len, k,
                                     factor=(ctx_len + k - 1) // k)
    one = topk_indices(logits, k, ctx)
    same = float(sum(len(set(a[a >= 0].tolist()) & set(b[b >= 0].tolist())) for a, b in zip(picked, one))
                 / max(1, int((one >= 0).sum())))
    results.append({"case": case, "impl": "check", "rescore_vs_bf16_logits_calc_diff": diff,
                    "two_stage_covering_equals_bf16_topk": same})
    print(f"{case}: re-score vs bf16 logits calc_diff {diff:.2e}; two-stage (c*k >= length) keeps "
          f"{same:.4f} of bf16's top-{k}")


def decode_case(results, dev, batch, ctx_len, ragged, dg, tiny):
    from niah.kernels import (bf16_paged_mqa_logits, bf16_paged_rescore, fp8_bf16_two_stage_topk,
                              fp8_paged_mqa_logits, topk_indices)
    from niah.kernels.quant import quantize_fp8

    k = 32 if tiny else 2048
    table, fp8, bf16, q, w, ctx = inputs(dev, batch, ctx_len, ragged)
    q8, s8 = quantize_fp8(q)
    w8 = w * s8.reshape(batch, HEADS)
    q16 = q.bfloat16()
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
    timed = {}
    for impl, fn in calls.items():
        timed[impl] = ms = timeit(fn)
        results.append({"case": case, "impl": impl, "ms": ms})
        print(f"{case}: {impl}: {ms:.4f} ms")
    for base in ("DeepGEMM fp8 logits", "DeepGEMM fp8 logits + top-k", "niah bf16 logits + top-k"):
        if base not in timed:
            continue
        for c in (2, 4, 8):
            ratio = timed[f"two-stage c={c}"] / timed[base]
            row = {"case": case, "impl": f"two-stage c={c} / {base}", "ratio": ratio}
            if base == "DeepGEMM fp8 logits":
                row["goal"] = 1.2
            results.append(row)
            print(f"{case}: two-stage c={c} / {base} = {ratio:.3f}" + (" (goal <= 1.2)" if "goal" in row else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tiny", action="store_true", help="CPU, interpreter, tiny shapes: the wiring only")
    a = p.parse_args()
    dev = "cuda" if has_cuda() else "cpu"
    if dev == "cpu" and not a.tiny:
        sys.exit("two_stage.py: no CUDA device; pass --tiny to check the wiring on CPU")
    results: list = []
    env = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)",
           "torch": torch.__version__}
    dg = None if a.tiny else deep_gemm()
    if dg is not None:
        env["deep_gemm"] = getattr(dg, "__version__", "importable")
    check(results, "check", dev, a.tiny)
    cases = [(1, 200, False)] if a.tiny else [(1, 131072, False), (64, 65536, True)]
    for batch, ctx_len, ragged in cases:
        decode_case(results, dev, batch, ctx_len, ragged, dg, a.tiny)
        write_results(a.out, env, results)
    write_results(a.out, env, results)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
