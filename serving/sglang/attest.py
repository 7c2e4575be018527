"""Attestation: what a server's indexer really ran, counted where it runs.

Every patched path calls `record(path, dtype)`: path is one of PATHS ("store",
"prefill_logits", "decode_logits", "topk"), dtype what it handled ("bf16", "fp8" keys;
"niah" / "torch" for the top-k implementation; "fp32" on the embedded server).
`configure(index_dtype, kernels, pool_bytes_per_token)` states what the process was
asked to run; `snapshot()` is the record a server reports (SGLang: in
`/server_info` -> `internal_states[i]["niah_attestation"]`; the embedded server:
`/server_info` -> `niah_attestation`). Any fp8 path reached while bf16 is configured is
counted in `fp8_reads_while_bf16`; niah's harness (niah/attestation.py) marks such a
configuration invalid.

Counts are Python-level calls: inside a CUDA graph a path is counted when the graph is
captured, not on each replay. Pure Python; one counter per process (SGLang runs the
plugin, and so this counter, in every scheduler process).
"""

from __future__ import annotations

import threading
from collections import Counter

PATHS = ("store", "prefill_logits", "decode_logits", "topk")
FIELD = "niah_attestation"  # the key under which servers report snapshot()
FP8_PATHS = ("store", "prefill_logits", "decode_logits")

_lock = threading.Lock()
_counts: Counter = Counter()
_state: dict = {"index_dtype": None, "kernels": None, "pool_bytes_per_token": None}


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


def record(path: str, dtype: str) -> None:
    """One call of a patched path."""
    if path not in PATHS:
        raise ValueError(f"attest.record: unknown path {path!r} (paths: {', '.join(PATHS)})")
    with _lock:
        _counts[f"{path}.{dtype}"] += 1


def reset() -> None:
    with _lock:
        _counts.clear()
        _state.update(index_dtype=None, kernels=None, pool_bytes_per_token=None)


def snapshot() -> dict:
    """{"index_dtype", "kernels", "pool_bytes_per_token", "counts", "fp8_reads_while_bf16"}."""
    with _lock:
        counts = dict(sorted(_counts.items()))
        state = dict(_state)
    fp8 = sum(counts.get(f"{p}.fp8", 0) for p in FP8_PATHS) if state["index_dtype"] == "bf16" else 0
    return {**state, "counts": counts, "fp8_reads_while_bf16": fp8}
