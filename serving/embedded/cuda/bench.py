"""Time the GPU path on the real model, no HTTP: per arm and prompt length, one prefill (the
server's: generate.prefill, chunked for the sparse arms) and N greedy decode steps, with the
peak GPU memory of the prefill and its working memory (the peak over what was allocated
before it). One JSON line each. An arm's first prompt of a shape includes Triton's compiles:
time a shape twice before quoting it.

    python -m niah.serving.embedded.cuda.bench --lengths 4096,22600 --arms dense,fp8-k512,bf16-gather-k512

Arms: "dense", or "<fp8|bf16|fp32>-k<K>", or "bf16-gather-k<K>" (the naive read), or
"<fp8|bf16>-fused-k<K>" (prefill through the fused indexer + top-k, `--topk fused`), or
"<fp8|bf16>-union-k<K>" (the prefill's attention by union_attention, tiles of 4 queries:
attend.PREFILL_SHARE for that arm only, `arm_kernels`; "-union8-" / "-union16-": tiles of 8 or 16;
"-union0-": the gather kernel; "-bitmap-" / "-sort-": union_attention's build, attend.UNION_BUILD;
an arm naming neither keeps attend's defaults, tiles of 4 and the bitmap build); "-sample1-",
"-sample2-", "-sample4-", "-sample8-": the sample-bracketed top-k launched with 1, 2, 4 or 8 warps
a row and a pass tile of 256 keys a warp at every row count (topk.wrapper.SAMPLE_WARPS /
SAMPLE_TILE and SAMPLE_MANY_WARPS / SAMPLE_MANY_TILE; by default the prefill's score calls, 512
rows or more, take 1 warp and 256 keys, fewer rows 8 warps and 2048: "-sample8-" is the launch
before that rule); "-segmented-": the decode step's top-k (one row) by the segmented select
(topk.wrapper.FEW_ROWS_METHOD, "search" by default); "-narrow-" / "-wide-": the sample and
segmented selects' scratch searched over the bracket alone (the default) or over all 32 bits
(topk.wrapper.SCRATCH_NARROW); "-pages-" / "-tile-": the prefill's score calls by indexer_logits'
page-walking form (the default) or its first, tile form (fused_indexer.wrapper.LOGITS_FORM).
Prompts are random token ids (timing and memory only; recall is the sweep's business).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager

from niah.serving.embedded import weights
from niah.serving.embedded.device import build_model, warm_up
from niah.serving.embedded.server import ServeConfig


ARM_WORDS = ("gather", "fused", "bitmap", "sort", "segmented", "narrow", "wide", "pages", "tile")  # + unionN, sampleN


def arm_config(arm: str, device: str):
    """The arm's server config; an arm of an unknown shape or word is refused (ValueError), so a
    misspelt arm never runs the defaults under its name."""
    base = dict(device=device, rope_scaling="yarn", rope_factor=4.0, query_chunk=4096)
    if arm == "dense":
        return ServeConfig(attention="dense", **base)
    parts = arm.split("-")
    bad = [p for p in parts[1:-1] if p not in ARM_WORDS and not p.startswith(("union", "sample"))]
    if len(parts) < 2 or parts[0] not in ("fp8", "bf16", "fp32") or not parts[-1][1:].isdigit() \
            or not parts[-1].startswith("k") or bad:
        raise ValueError(f"arm {arm!r}: not 'dense' or '<fp8|bf16|fp32>[-word...]-k<K>' with words from "
                         f"{', '.join(ARM_WORDS)}, unionN, sampleN" + (f" (unknown: {', '.join(bad)})" if bad else ""))
    gather = "gather" in parts
    return ServeConfig(attention="dsa", index_dtype=parts[0], index_topk=int(parts[-1].lstrip("k")),
                       bf16_read="gather" if gather else "fused", topk_impl="fused" if "fused" in parts else "niah",
                       **base)


@contextmanager
def arm_kernels(arm: str):
    """While an arm runs: attend.PREFILL_SHARE = UNION_BLOCK_Q for a "-union-" arm (N for
    "-unionN-", 0: the gather kernel), attend.UNION_BUILD = "bitmap" / "sort" for a "-bitmap-" /
    "-sort-" one, and the sample select's warps and tile for a "-sampleN-" one (N warps, 256 N
    keys a step, at every row count), the few-rows top-k's method for a "-segmented-" one and the scratch's
    narrow search for a "-narrow-" one (its 32-bit search for "-wide-"), the score calls'
    page-walking form for a "-pages-" one (the tile form for "-tile-"), else the defaults;
    restored after. "-narrow-" with "-wide-", or "-pages-" with "-tile-", in one arm is refused.
    """
    from niah.kernels.fused_indexer import wrapper as logits  # noqa: PLC0415 (imports torch)
    from niah.kernels.topk import wrapper  # noqa: PLC0415 (imports torch)
    from niah.serving.embedded.cuda import attend  # noqa: PLC0415 (imports torch)

    parts = arm.split("-")
    before = (attend.PREFILL_SHARE, attend.UNION_BUILD, wrapper.SAMPLE_WARPS, wrapper.SAMPLE_TILE,
              wrapper.SAMPLE_MANY_WARPS, wrapper.SAMPLE_MANY_TILE, wrapper.FEW_ROWS_METHOD, wrapper.SCRATCH_NARROW,
              logits.LOGITS_FORM)
    tiles = [p[len("union"):] for p in parts if p.startswith("union")]
    if tiles and tiles[0] not in ("", "0", "4", "8", "16"):
        raise ValueError(f"arm {arm!r}: a union tile of 4, 8 or 16 queries, or 0 for the gather kernel "
                         "(-union-, -union8-, -union16-, -union0-)")
    warps = [p[len("sample"):] for p in parts if p.startswith("sample")]
    if warps and warps[0] not in ("1", "2", "4", "8"):
        raise ValueError(f"arm {arm!r}: the sample select at 1, 2, 4 or 8 warps (-sample1-, -sample2-, -sample4-, "
                         "-sample8-)")
    for a, b in (("narrow", "wide"), ("pages", "tile")):
        if a in parts and b in parts:
            raise ValueError(f"arm {arm!r}: -{a}- and -{b}- are opposites; name one")
    attend.PREFILL_SHARE = (int(tiles[0] or attend.UNION_BLOCK_Q)) if tiles else before[0]
    attend.UNION_BUILD = "bitmap" if "bitmap" in parts else "sort" if "sort" in parts else before[1]
    if warps:   # at every row count
        n = int(warps[0])
        wrapper.SAMPLE_WARPS, wrapper.SAMPLE_TILE = wrapper.SAMPLE_MANY_WARPS, wrapper.SAMPLE_MANY_TILE = n, 256 * n
    if "segmented" in parts:
        wrapper.FEW_ROWS_METHOD = "segmented"
    if "narrow" in parts or "wide" in parts:
        wrapper.SCRATCH_NARROW = "narrow" in parts
    if "pages" in parts or "tile" in parts:
        logits.LOGITS_FORM = "pages" if "pages" in parts else "tile"
    try:
        yield
    finally:
        (attend.PREFILL_SHARE, attend.UNION_BUILD, wrapper.SAMPLE_WARPS, wrapper.SAMPLE_TILE,
         wrapper.SAMPLE_MANY_WARPS, wrapper.SAMPLE_MANY_TILE, wrapper.FEW_ROWS_METHOD, wrapper.SCRATCH_NARROW,
         logits.LOGITS_FORM) = before


def check_arms(arms: list[str], device: str) -> None:
    """Every arm's config and kernel words checked before any weights load: a bad arm exits 2
    with its one-line reason."""
    try:
        for arm in arms:
            arm_config(arm, device)
            with arm_kernels(arm):
                pass
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> None:
    import torch

    from niah.serving.embedded.generate import decode_one, prefill  # noqa: PLC0415 (imports torch, as above)

    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="4096,22600")
    ap.add_argument("--arms", default="dense,fp8-k512,bf16-k512,bf16-gather-k512")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    arms = a.arms.split(",")
    check_arms(arms, a.device)
    loaded = weights.load()
    for arm in arms:
        with arm_kernels(arm):
            cfg = arm_config(arm, a.device)
            t0 = time.perf_counter()
            model = build_model(cfg, loaded)
            warm_up(model, cfg.index_topk)
            ready = time.perf_counter() - t0
            for n in (int(x) for x in a.lengths.split(",")):
                ids = torch.randint(0, model.args.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                t1 = time.perf_counter()
                logits, _ = prefill(model, ids[0].tolist())
                tok = int(logits.argmax())
                t2 = time.perf_counter()
                peak = torch.cuda.max_memory_allocated()
                for i in range(a.decode):
                    tok = int(decode_one(model, tok, n + i).argmax())       # a graph replay where graphs serve it
                t3 = time.perf_counter()
                print(json.dumps({"arm": arm, "tokens": n, "prefill_s": round(t2 - t1, 4),
                                  "decode_ms_per_token": round(1000 * (t3 - t2) / max(1, a.decode), 2),
                                  "trial_s_estimate": round(t3 - t1, 3), "peak_gpu_bytes": int(peak),
                                  "base_gpu_bytes": int(base), "work_gpu_bytes": int(peak - base),
                                  "peak_over_base_gib": round((peak - base) / 2**30, 3),
                                  "ready_s": round(ready, 2),
                                  "fused_calls": dict(getattr(model.layers[0].attention.attend, "fused_calls", {}))}),
                      flush=True)
            del model
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
