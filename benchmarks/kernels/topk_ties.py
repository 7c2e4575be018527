"""The sample select (kernels/topk/sample_kernel.py) on the GPU server's prefill score-call
shape, 742 causal rows over 22,600 keys, on rows like an indexer's after ReLU (a few hundred
or thousand keys above 0, the rest exact zeros) and on tie-free rows, beside another version
of the kernel (--before: a sample_kernel.py file, e.g. an earlier commit's, `git show
COMMIT:kernels/topk/sample_kernel.py > before.py`); each launch checked by value and the two
kept sets compared.

    python benchmarks/kernels/topk_ties.py [--before before.py] [--radix-bits 1,2,4] --out topk_ties.json

--radix-bits: this kernel's searches at 1 (binary), 2 and 4 bits a step (RADIX_BITS), each
timed and its kept sets compared with the first variant's. This kernel runs the wrapper's launch
for 742 rows (topk.wrapper.sample_launch: one warp, tiles of 256, the scratch in pieces, its
narrow search); the --before kernel the 8-warp, 2,048-key launch of before the rule by rows.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

import torch

ROWS, WIDTH = 742, 22600   # a 64 MiB score call at 22,600 keys (serving/embedded/cuda/indexer.py score_rows)
KINDS = ("relu-300-above-zero", "relu-3000-above-zero", "all-above-zero", "normal")


def make_rows(kind: str, g: torch.Generator, dev: str) -> torch.Tensor:
    """[ROWS, WIDTH] fp32, row i causal up to key WIDTH - ROWS + i (-inf past it, as clean logits)."""
    if kind.startswith("relu-"):
        above = int(kind.split("-")[1])
        pick = torch.rand(ROWS, WIDTH, device=dev, generator=g) < above / WIDTH
        x = torch.where(pick, torch.rand(ROWS, WIDTH, device=dev, generator=g) + 0.01, 0.0)
    elif kind == "all-above-zero":
        x = torch.randn(ROWS, WIDTH, device=dev, generator=g).abs() + 1e-3
    else:
        x = torch.randn(ROWS, WIDTH, device=dev, generator=g)
    last = torch.arange(WIDTH - ROWS, WIDTH, device=dev)[:, None]
    return x.masked_fill(torch.arange(WIDTH, device=dev)[None, :] > last, float("-inf"))


def main(argv: list[str] | None = None) -> None:
    import triton

    from niah.kernels._common import next_pow2
    from niah.kernels.topk.reference import check_topk_fast
    from niah.kernels.topk.sample_kernel import sample_topk_kernel
    from niah.kernels.topk.wrapper import (SAMPLE_STRIDE, SAMPLE_TILE, SAMPLE_WARPS, SCRATCH_KEYS_A_THREAD,
                                           SCRATCH_NARROW, sample_brackets, sample_launch)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=None, help="another sample_kernel.py to time beside this one")
    ap.add_argument("--radix-bits", default="1,2,4", help="this kernel's search widths to time (RADIX_BITS)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("topk_ties.py: needs a CUDA GPU", file=sys.stderr)
        raise SystemExit(2)
    variants = [(f"radix{b}", sample_topk_kernel, int(b)) for b in a.radix_bits.split(",")]
    if a.before:
        spec = importlib.util.spec_from_file_location("before_sample_kernel", a.before)
        before = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(before)
        variants.insert(0, ("before", before.sample_topk_kernel, None))
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    out = []
    for kind in KINDS:
        x = make_rows(kind, g, dev)
        for k in (512, 1024):
            r_hi, r_lo = sample_brackets(k, SAMPLE_STRIDE)
            res, kept = {}, {}
            for name, kern, bits in variants:
                o = torch.empty(ROWS, k, dtype=torch.int32, device=dev)
                sc = torch.empty(2, ROWS, 4096, dtype=torch.int32, device=dev)
                # this kernel: the wrapper's launch for these rows; --before: the 8-warp launch of before
                warps, tile = (SAMPLE_WARPS, SAMPLE_TILE) if bits is None else sample_launch(ROWS)
                extra = {} if bits is None else {
                    "RADIX_BITS": bits, "NARROW": SCRATCH_NARROW,
                    "SCRATCH_TILE": 0 if 4096 <= SCRATCH_KEYS_A_THREAD * 32 * warps else tile}

                def go(kern=kern, o=o, sc=sc, k=k, r_hi=r_hi, r_lo=r_lo, extra=extra, warps=warps, tile=tile):
                    kern[(ROWS,)](x, x, o, sc[0], sc[1], WIDTH, k, x.stride(0), r_hi, r_lo, TILE=tile,
                                  NS=max(16, next_pow2(-(-WIDTH // SAMPLE_STRIDE))), STRIDE=SAMPLE_STRIDE,
                                  CAP=4096, HAS_LEN=False, K_PAD=next_pow2(k), W_CONST=0, num_warps=warps,
                                  **extra)

                go()
                torch.cuda.synchronize()
                res[name + "_ok"] = check_topk_fast(x, o, k, None) is None
                res[name + "_ms"] = round(triton.testing.do_bench(go, warmup=5, rep=50), 4)
                kept[name] = o.sort(1).values
            first = variants[0][0]
            row = {"rows": kind, "shape": [ROWS, WIDTH], "k": k, **res,
                   "ratios_vs_" + first: {n: round(res[first + "_ms"] / res[n + "_ms"], 2) for n, _, _ in variants},
                   "same_kept_sets": all(torch.equal(kept[first], kept[n]) for n, _, _ in variants)}
            print(json.dumps(row), flush=True)
            out.append(row)
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "results": out}, f, indent=1)


if __name__ == "__main__":
    main()
