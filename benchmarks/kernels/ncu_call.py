"""One call of a kernel, for a profiler (ncu) to capture:

    python benchmarks/kernels/ncu_call.py topk ROWS WIDTH K [METHOD]
    python benchmarks/kernels/ncu_call.py paged-ragged fp8|bf16|fp4  # B=64, lengths uniform in 1..65,536

fp4: the fp4 pool of the same keys (`store_fp4_index_keys`) and the MXFP4 query (SGLang's fp4
path), `fp4_paged_mqa_logits` at its defaults (the f16 product on Hopper).

The inputs are the benchmark's (bench.py, decode.py); a warm-up call compiles first, so a
profiler filtering on the kernel name with --launch-skip 1 sees a warm launch.
"""

from __future__ import annotations

import sys

import torch


def main(argv=None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("topk", "paged-ragged"):
        raise SystemExit("usage: ncu_call.py topk ROWS WIDTH K [METHOD] | paged-ragged fp8|bf16|fp4")
    if args[0] == "topk":
        from niah.kernels import topk_indices

        rows, width, k = map(int, args[1:4])
        method = args[4] if len(args) > 4 else None
        x = torch.randn(rows, width, device="cuda", generator=torch.Generator(device="cuda").manual_seed(2))
        lens = torch.full((rows,), width, dtype=torch.int32, device="cuda")
        call = lambda: topk_indices(x, k, lens, method=method)  # noqa: E731
    else:
        from niah.kernels import bf16_paged_mqa_logits, fp8_paged_mqa_logits, get_paged_mqa_logits_metadata
        from decode import make_decode_inputs

        kind = args[1]
        q, kv, w, ctx, bt = make_decode_inputs("cuda", "bf16" if kind == "fp4" else kind, 64, 65536, 64, 128, 1, True)
        fn = fp8_paged_mqa_logits if kind == "fp8" else bf16_paged_mqa_logits
        if kind == "fp4":   # fp4.py's pools of the same keys: its fp4 pool
            from fp4 import pages_of

            from niah.kernels import fp4_paged_mqa_logits
            from niah.kernels.quant import quantize_fp4

            kv = pages_of(kv.reshape(-1, 128).float())[0]
            q, fn = quantize_fp4(q.float()), fp4_paged_mqa_logits
        meta = get_paged_mqa_logits_metadata(ctx, 64, 132)
        call = lambda: fn(q, kv, w, ctx, bt, meta, 65536, clean_logits=True)  # noqa: E731
    call()
    torch.cuda.synchronize()
    call()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
