"""Attestation: what a server's indexer really ran, counted where it runs.

Every patched path calls `record(path, dtype, kernel)`:
- path: one of PATHS ("store", "prefill_logits", "decode_logits", "topk");
- dtype: what it handled ("bf16", "fp8" keys; "fp32" logits for top-k and on the
  embedded server);
- kernel: who ran it, by name, "<owner>.<function>" with owner one of KERNEL_OWNERS
  (e.g. "niah.bf16_paged_mqa_logits", "sglang.fused_k_indexer_norm_rope_store",
  "deep_gemm.fp8_paged_mqa_logits", "torch.topk").
`configure(index_dtype, kernels, pool_bytes_per_token)` states what the process was
asked to run, `set_facts(**facts)` adds facts of the arm (e.g. the query's precision, a
rotation); `snapshot()` is the record a server reports (SGLang: in `/server_info` ->
`internal_states[i]["niah_attestation"]`; the embedded server: `/server_info` ->
`niah_attestation`). Any fp8 path reached while bf16 is configured is counted in
`fp8_reads_while_bf16`; niah's harness (niah/attestation.py) decides validity.

Counts are Python-level calls: inside a CUDA graph a path is counted when the graph is
captured, not on each replay (see niah/attestation.py and docs/sglang-plugin.md for how
replays are counted). Pure Python; one counter per process (SGLang runs the plugin, and
so this counter, in every scheduler process).
"""

from __future__ import annotations

import threading
from collections import Counter

PATHS = ("store", "prefill_logits", "decode_logits", "topk")
KERNEL_OWNERS = ("niah", "sglang", "deep_gemm", "torch", "flashinfer")
FIELD = "niah_attestation"  # the key under which servers report snapshot()
FP8_PATHS = ("store", "prefill_logits", "decode_logits")

_lock = threading.Lock()
_counts: Counter = Counter()
_kernels: Counter = Counter()
_state: dict = {"index_dtype": None, "kernels": None, "pool_bytes_per_token": None}
_facts: dict = {}


def configure(index_dtype: str | None, kernels: str | None, pool_bytes_per_token: int | None = None) -> None:
    """What this process was asked to run (pool bytes may come later, see set_pool_bytes)."""
    with _lock:
        _state.update(index_dtype=index_dtype, kernels=kernels)
        if pool_bytes_per_token is not None:
            _state["pool_bytes_per_token"] = int(pool_bytes_per_token)


def set_pool_bytes(pool_bytes_per_token: int) -> None:
    """Index-key bytes per token per layer of the allocated pool (fp8 132, bf16 256)."""
    with _lock:
        _state["pool_bytes_per_token"] = int(pool_bytes_per_token)


def set_facts(**facts) -> None:
    """Facts about the arm that the label may state (JSON values), e.g. query="fp8"."""
    with _lock:
        _facts.update(facts)


def record(path: str, dtype: str, kernel: str) -> None:
    """One call of a patched path, by the kernel (`owner.function`) that ran it."""
    if path not in PATHS:
        raise ValueError(f"attest.record: unknown path {path!r} (paths: {', '.join(PATHS)})")
    owner = kernel.split(".", 1)[0]
    if owner not in KERNEL_OWNERS or "." not in kernel:
        raise ValueError(f"attest.record: kernel {kernel!r} is not '<owner>.<function>' "
                         f"(owners: {', '.join(KERNEL_OWNERS)})")
    with _lock:
        _counts[f"{path}.{dtype}"] += 1
        _kernels[f"{path}:{kernel}"] += 1


def reset() -> None:
    with _lock:
        _counts.clear()
        _kernels.clear()
        _facts.clear()
        _state.update(index_dtype=None, kernels=None, pool_bytes_per_token=None)


def snapshot() -> dict:
    """{"index_dtype", "kernels", "pool_bytes_per_token", "facts", "counts",
    "kernel_calls", "fp8_reads_while_bf16"}: counts by "path.dtype", kernel_calls by
    path then kernel name."""
    with _lock:
        counts = dict(sorted(_counts.items()))
        by_kernel = dict(sorted(_kernels.items()))
        state = dict(_state)
        facts = dict(_facts)
    kernel_calls: dict[str, dict[str, int]] = {}
    for key, n in by_kernel.items():
        path, name = key.split(":", 1)
        kernel_calls.setdefault(path, {})[name] = n
    fp8 = sum(counts.get(f"{p}.fp8", 0) for p in FP8_PATHS) if state["index_dtype"] == "bf16" else 0
    return {**state, "facts": facts, "counts": counts, "kernel_calls": kernel_calls, "fp8_reads_while_bf16": fp8}
