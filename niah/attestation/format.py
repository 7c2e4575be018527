"""The attestation record: what a server reports about what its indexer ran (the format).

The harness owns the format; servers produce it (niah.serving.sglang.attest counts the
calls and reports `snapshot()`, which uses `derive` from here). A record:

    {"index_dtype", "kernels", "pool_bytes_per_token", "facts": {...},
     "calls": {path: {dtype: {kernel: {"eager", "captured", "replayed"}}}},
     "counts", "kernel_calls", "fp8_reads_while_bf16" (derived from calls), "replay_counters"}

- path: one of PATHS; dtype: what it handled ("bf16", "fp8" keys; "fp32" logits);
- kernel: who ran it, "<owner>.<function>" with owner one of KERNEL_OWNERS;
- what ran is eager + replayed (a CUDA graph's captured call is counted once at capture).

Servers report it under FIELD: SGLang with niah's plugin in `/server_info` ->
`internal_states[i]["niah_attestation"]` (one per data-parallel scheduler), the embedded
server at `/server_info` -> `niah_attestation`. `from_server_info` merges the schedulers'
records into one. Pure functions; imports nothing of niah.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

PATHS = ("store", "prefill_logits", "decode_logits", "topk")
KERNEL_OWNERS = ("niah", "sglang", "deep_gemm", "torch", "flashinfer")
FIELD = "niah_attestation"  # the key under which servers report their record
FP8_PATHS = ("store", "prefill_logits", "decode_logits")
KINDS = ("eager", "captured", "replayed")  # how a call was seen
# Facts that are measurements, not what the server is: they change between readings by
# nature (peak GPU memory per prompt length, a request's working memory, the memory taken before a request),
# so they are never compared across readings (niah.attestation.rules).
MEASURED_FACTS = ("peak_gpu_bytes", "work_gpu_bytes", "base_gpu_bytes")


def derive(calls: dict, index_dtype: str | None) -> dict:
    """What `calls` ({path: {dtype: {kernel: {eager, captured, replayed}}}}) says ran:
    counts by "path.dtype" and kernel_calls by path then kernel (eager + replayed), and
    fp8_reads_while_bf16 (fp8 key-path calls of any kind while bf16 is configured)."""
    counts: Counter = Counter()
    kernel_calls: dict[str, Counter] = {}
    fp8 = 0
    for path, by_dtype in calls.items():
        for dtype, by_kernel in by_dtype.items():
            for kernel, n in by_kernel.items():
                ran = int(n.get("eager", 0)) + int(n.get("replayed", 0))
                counts[f"{path}.{dtype}"] += ran
                kernel_calls.setdefault(path, Counter())[kernel] += ran
                if index_dtype == "bf16" and dtype == "fp8" and path in FP8_PATHS:
                    fp8 += ran + int(n.get("captured", 0))
    return {"counts": dict(sorted(counts.items())),
            "kernel_calls": {p: dict(sorted(k.items())) for p, k in sorted(kernel_calls.items())},
            "fp8_reads_while_bf16": fp8}


def from_server_info(info: Any) -> dict | None:
    """The attestation in a /server_info body, or None. Several schedulers (DP ranks):
    their calls are summed, the rest must agree (else the first one's is kept and
    `disagree` lists the fields); counts and kernel_calls are derived from the sum."""
    if not isinstance(info, dict):
        return None
    found = [info[FIELD]] if isinstance(info.get(FIELD), dict) else []
    for st in info.get("internal_states") or []:
        if isinstance(st, dict) and isinstance(st.get(FIELD), dict):
            found.append(st[FIELD])
    if not found:
        return None
    summed = ("calls", "counts", "kernel_calls", "fp8_reads_while_bf16", "replay_counters")
    same = {k: v for k, v in found[0].items() if k not in summed}
    disagree = sorted({k for a in found[1:] for k in same if a.get(k) != same[k]})
    calls = add_calls(*(a.get("calls") or {} for a in found))
    out = {**same, "calls": calls, **derive(calls, same.get("index_dtype")), "schedulers": len(found),
           "replay_counters": sum(int(a.get("replay_counters") or 0) for a in found)}
    if not any(a.get("calls") for a in found) and any(a.get("counts") for a in found):
        out["legacy"] = True  # an older plugin: counts without kernel names
    if disagree:
        out["disagree"] = disagree
    return out


def add_calls(*many: dict, sign: int = 1) -> dict:
    """Sum `calls` records ({path: {dtype: {kernel: {eager, captured, replayed}}}}); with
    sign=-1 the later ones are subtracted (end minus start)."""
    out: dict = {}
    for i, calls in enumerate(many):
        s = 1 if i == 0 else sign
        for path, by_dtype in (calls or {}).items():
            for dtype, by_kernel in (by_dtype or {}).items():
                for kernel, n in (by_kernel or {}).items():
                    cell = out.setdefault(path, {}).setdefault(dtype, {}).setdefault(
                        kernel, {"eager": 0, "captured": 0, "replayed": 0})
                    for kind in cell:
                        cell[kind] += s * int((n or {}).get(kind, 0))
    return out
