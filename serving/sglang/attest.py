"""What a scheduler process ran: counts of each patched path per dtype, and the pool's
configuration. Minimal form (the SGLang A/B work owns the full module and its reporting).

    record(path, dtype)     counts["<path>.<dtype>"] += 1; path in store, prefill_logits,
                            decode_logits, topk
    configure(index_dtype, kernels, pool_bytes_per_token)
    snapshot() -> dict
"""

from __future__ import annotations

import threading

PATHS = ("store", "prefill_logits", "decode_logits", "topk")

_lock = threading.Lock()
_counts: dict[str, int] = {}
_config: dict[str, object] = {}


def record(path: str, dtype: str) -> None:
    if path not in PATHS:
        raise ValueError(f"attest.record: unknown path {path!r}; expected one of {', '.join(PATHS)}")
    key = f"{path}.{dtype}"
    with _lock:
        _counts[key] = _counts.get(key, 0) + 1


def configure(index_dtype: str, kernels: str, pool_bytes_per_token: int | None) -> None:
    with _lock:
        _config.update(index_dtype=index_dtype, kernels=kernels, pool_bytes_per_token=pool_bytes_per_token)


def snapshot() -> dict:
    with _lock:
        return {"counts": dict(_counts), **_config}
