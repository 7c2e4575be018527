"""GPU memory: what a request peaked at, and the naive bf16 read's arithmetic.

`gather_bytes` is the size of the seed's per-query gather: every page of the sequence's
index keys copied once per query of a prefill chunk,

    queries x ceil(ceil(context / compress) / page) x page x head_dim x bytes x key_heads

(`compress`: tokens per index key; DeepSeek-V4's C4 indexer keeps one key per 4 tokens).
SHAPES holds this server's (SmolLM2: 3 kv heads of 64 dims, gathered one kv head at a time,
so key_heads 1 per live copy) and DeepSeek-V4's indexer (one shared 128-dim key, page 64).

`PeakLog` keeps, per prompt length, the largest torch.cuda.max_memory_allocated seen over
a request's prefill (the peak is reset before it) and publishes it as the attestation fact
`peak_gpu_bytes` ({"<prompt tokens>": bytes}), beside `base_gpu_bytes` (allocated before
the latest prefill: weights, caches, pools and the decode graphs captured so far, which grow
over a run) and `work_gpu_bytes` ({"<prompt tokens>": bytes}, the largest peak minus what
was allocated just before that prefill: the request's own working memory, apart from the
pools and graphs).
"""

from __future__ import annotations

import threading

from niah.serving.sglang import attest

SHAPES = {
    "smollm2-embedded": {"head_dim": 64, "elem_bytes": 2, "page": 64, "compress": 1, "key_heads": 1},
    "deepseek-v4-indexer": {"head_dim": 128, "elem_bytes": 2, "page": 64, "compress": 4, "key_heads": 1},
}


def gather_bytes(queries: int, context: int, head_dim: int, elem_bytes: int = 2, page: int = 64,
                 compress: int = 1, key_heads: int = 1) -> int:
    keys = -(-context // compress)
    pages = -(-keys // page)
    return queries * pages * page * head_dim * elem_bytes * key_heads


def _by_length(d: dict[str, int]) -> dict[str, int]:
    return dict(sorted(d.items(), key=lambda kv: int(kv[0])))


class PeakLog:
    def __init__(self):
        self._lock = threading.Lock()
        self.peaks: dict[str, int] = {}
        self.work: dict[str, int] = {}
        self.base = 0

    def begin(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats()
        self.base = torch.cuda.memory_allocated()

    def end(self, tokens: int) -> int:
        import torch

        peak = int(torch.cuda.max_memory_allocated())
        with self._lock:
            key = str(int(tokens))
            self.peaks[key] = max(self.peaks.get(key, 0), peak)
            self.work[key] = max(self.work.get(key, 0), peak - int(self.base))
            attest.set_facts(peak_gpu_bytes=_by_length(self.peaks), work_gpu_bytes=_by_length(self.work),
                             base_gpu_bytes=int(self.base))
        return peak


PEAKS = PeakLog()      # the server's one model thread writes it
