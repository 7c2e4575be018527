"""What the kernels' call counters show of an arm: which kernels ran on which keys, and what
ran during a sweep (a segment's end reading minus its start). Pure functions over one
attestation (`a`: a reading's niah_attestation) and its counters' growth (`grown`: calls
by path, dtype and kernel); each check returns the problem in one line, or None. The rules
(niah/attestation/rules.py) decide from them whether a configuration proved its label.
"""

from __future__ import annotations

BF16_POOL_BYTES = {256: "DeepSeek-V3.2", 264: "DeepSeek-V4"}  # serving/sglang bf16_cache, v4
KEY_PATHS = ("store", "prefill_logits", "decode_logits")
READ_PATHS = ("decode_logits", "prefill_logits")


def calls_total(calls: dict, paths, dtype: str, owner: str | None = None) -> int:
    return sum(int(n.get("eager", 0)) + int(n.get("replayed", 0))
               for p in paths for k, n in ((calls.get(p) or {}).get(dtype) or {}).items()
               if owner is None or k.split(".", 1)[0] == owner)


def kernel_calls(calls: dict, paths):
    for p in paths:
        for dtype, by_kernel in (calls.get(p) or {}).items():
            for kernel, n in by_kernel.items():
                yield p, dtype, kernel, n


def bf16_paths(a: dict) -> str | None:
    if a.get("fp8_reads_while_bf16"):
        return f"{a['fp8_reads_while_bf16']} fp8 index-key path call(s) while bf16 was configured"
    for path, dtype, kernel, _ in kernel_calls(a.get("calls") or {}, KEY_PATHS):
        if dtype != "bf16" or kernel.split(".", 1)[0] != "niah":
            return f"bf16 configured but {path} ran {kernel} on {dtype} keys"
    pool = a.get("pool_bytes_per_token")
    if a.get("kernels") == "niah" and pool not in BF16_POOL_BYTES:
        return f"bf16 configured but the pool holds {pool} B/token/layer, not a bf16 row (256 on V3.2, 264 on V4)"
    return None


def bf16_grown(a: dict, grown: dict) -> str | None:
    if not calls_total(grown, ("store",), "bf16"):
        return "bf16 configured but no bf16 key was stored during the sweep"
    if not calls_total(grown, READ_PATHS, "bf16"):
        before = calls_total(a.get("calls") or {}, READ_PATHS, "bf16") - calls_total(grown, READ_PATHS, "bf16")
        return ("no bf16 index-key read during the sweep (decode/prefill logits: "
                f"{before} before, "
                "none more after; a store at warm-up does not count)")
    return None


def fp8_niah_paths(a: dict) -> str | None:
    for path, _, kernel, _ in kernel_calls(a.get("calls") or {}, READ_PATHS):
        if kernel.split(".", 1)[0] != "niah":
            return f"labelled kernels niah but {path} ran {kernel}"
    if a.get("pool_bytes_per_token") in BF16_POOL_BYTES:
        return f"fp8 configured but the pool holds a bf16 row ({a['pool_bytes_per_token']} B/token/layer)"
    return None


def fp8_niah_grown(grown: dict) -> str | None:
    if not calls_total(grown, READ_PATHS, "fp8", owner="niah"):
        return "labelled kernels niah but niah's fp8 logits kernels did not run during the sweep"
    return None


def ran_summary(a: dict, grown: dict) -> str:
    """What ran during the sweep, per path: calls (eager + CUDA-graph replays) by kernel."""
    if not a.get("index_dtype"):
        return f"attention {(a.get('facts') or {}).get('attention') or 'dense'}: no indexer configured"
    arm = f"{a.get('index_dtype')}/{a.get('kernels')}"
    if a.get("pool_bytes_per_token"):
        arm += f", {a['pool_bytes_per_token']} B/token"
    parts = []
    for path in (*KEY_PATHS, "topk"):
        by_kernel: dict[str, int] = {}
        for _, _, kernel, n in kernel_calls(grown, (path,)):
            by_kernel[kernel] = by_kernel.get(kernel, 0) + int(n.get("eager", 0)) + int(n.get("replayed", 0))
        ran = {k: v for k, v in by_kernel.items() if v}
        if ran:
            parts.append(f"{path} +{sum(ran.values())} ({', '.join(sorted(ran))})")
    return arm + "; during the sweep: " + ("; ".join(parts) if parts else "no indexer call")
