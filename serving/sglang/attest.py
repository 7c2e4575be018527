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
`niah_attestation`). niah's harness (niah/attestation/) owns the record's format and
decides validity.

CUDA graphs: a Python-level counter sees a captured call once, when the graph is
captured, and never again however often the graph is replayed. So a call made while the
current stream is capturing is counted as `captured`, and also leaves one node in the
graph, `slots[i] += 1` on a small per-device int64 tensor (ReplayCounter): every replay
then counts itself on the GPU. `snapshot()` reads those tensors (one small device-to-host
copy) and reports per (path, dtype, kernel) `eager`, `captured` and `replayed` calls; what
ran is eager + replayed. A graph its owner captures whole (the embedded server's decode
graphs) can instead take ONE node: captured inside `graph_tally(counter)`, its calls are
tallied on the host and the graph counts its own replays in a graph slot of the counter;
replayed = tally x replays (a decode step's ~90 per-call nodes become one). An eager call
does no GPU work (the first one on a device allocates its counter, once). Pure Python
unless the process already uses CUDA; one counter per process (SGLang runs the plugin, and
so this counter, in every scheduler).
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from contextlib import contextmanager

# The record's format (paths, owners, the field servers report it under, `derive`) is the
# harness's: niah.attestation.format.
from niah.attestation.format import FIELD, FP8_PATHS, KERNEL_OWNERS, KINDS, PATHS, derive  # noqa: F401

_lock = threading.Lock()
_eager: Counter = Counter()     # (path, dtype, kernel) -> calls run eagerly
_captured: Counter = Counter()  # (path, dtype, kernel) -> calls recorded into a CUDA graph
_slots: dict[tuple[str, str, str], int] = {}  # key -> its slot in every ReplayCounter
_counters: dict = {}            # device -> ReplayCounter
_graphs: list = []              # (counter, graph slot, Counter of key -> calls a replay makes), graph_tally's
_open = threading.local()       # .tally: this thread's open graph_tally Counter, if any
_state: dict = {"index_dtype": None, "kernels": None, "pool_bytes_per_token": None}
_facts: dict = {}


class ReplayCounter:
    """Per-device int64 slots counting CUDA-graph replays: a captured call adds the node
    `slots[slot] += 1` to the graph being captured, so each replay increments it."""

    SLOTS = 64
    GRAPH_SLOTS = 4096     # graphs captured under graph_tally, a slot each (their replays)

    def __init__(self, device):
        import torch

        self.slots = torch.zeros(self.SLOTS, dtype=torch.int64, device=device)  # [SLOTS]
        self.graphs = torch.zeros(self.GRAPH_SLOTS, dtype=torch.int64, device=device)
        self.n_graphs = 0

    def count(self, slot: int) -> None:
        """One tiny kernel on the current stream (inside a capture: one graph node)."""
        self.slots.narrow(0, slot, 1).add_(1)

    def count_graph(self, slot: int) -> None:
        """The same for a graph slot: one node that counts its graph's replays."""
        self.graphs.narrow(0, slot, 1).add_(1)

    def read(self) -> list[int]:
        """The slots on the host (one small device-to-host copy)."""
        return self.slots.tolist()

    def read_graphs(self) -> list[int]:
        return self.graphs[:self.n_graphs].tolist()


def _cuda():
    """torch.cuda when this process has initialised CUDA, else None (never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda


def _key(path: str, dtype: str, kernel: str) -> tuple[str, str, str]:
    if path not in PATHS:
        raise ValueError(f"attest.record: unknown path {path!r} (paths: {', '.join(PATHS)})")
    owner = kernel.split(".", 1)[0]
    if owner not in KERNEL_OWNERS or "." not in kernel:
        raise ValueError(f"attest.record: kernel {kernel!r} is not '<owner>.<function>' "
                         f"(owners: {', '.join(KERNEL_OWNERS)})")
    return path, dtype, kernel


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
    key = _key(path, dtype, kernel)
    tally = getattr(_open, "tally", None)
    if tally is not None:           # inside graph_tally: the graph's one node counts it
        with _lock:
            tally[key] += 1
            _captured[key] += 1
        return
    cuda = _cuda()
    if cuda is not None and cuda.is_current_stream_capturing():
        record_captured(key, _counters.get(cuda.current_device()))
        return
    with _lock:
        _eager[key] += 1
    if cuda is not None:
        device = cuda.current_device()
        if device not in _counters:  # once per device, before any capture can need it
            _counters[device] = ReplayCounter(f"cuda:{device}")
            cuda.current_stream().synchronize()


def record_captured(key: tuple[str, str, str], counter: ReplayCounter | None) -> None:
    """A call made while a CUDA graph is being captured: counted once as captured, and
    `counter`'s slot for `key` gets an increment node in the graph (one per replay)."""
    if counter is None:
        raise RuntimeError(f"niah attestation: {'/'.join(key)} was captured into a CUDA graph before any "
                           "eager call on this device allocated the replay counter; its replays could not be counted")
    with _lock:
        slot = _slots.setdefault(key, len(_slots))
        if slot >= ReplayCounter.SLOTS:
            del _slots[key]
            raise RuntimeError(f"niah attestation: more than {ReplayCounter.SLOTS} (path, dtype, kernel) "
                               "keys captured into CUDA graphs")
        _captured[key] += 1
    counter.count(slot)


@contextmanager
def graph_tally(counter: ReplayCounter | None):
    """Around the whole body of a CUDA-graph capture (inside `torch.cuda.graph(...)`): the
    calls recorded in it are counted as captured and tallied for this graph, and on leaving
    the graph gets one node, `counter.graphs[g] += 1`: each replay then counts the whole
    tally. `counter`: the device's (`current_counter`); None is refused, as record_captured
    refuses it, once the graph has recorded a call. On CPU (no capture) the node runs at
    once, as record_captured's does."""
    if getattr(_open, "tally", None) is not None:
        raise RuntimeError("niah attestation: graph_tally does not nest")
    tally: Counter = Counter()
    _open.tally = tally
    try:
        yield tally
    finally:
        _open.tally = None
    if not tally:                   # a graph that records nothing (a dense step) needs no node
        return
    if counter is None:
        raise RuntimeError("niah attestation: a graph was captured before any eager call on its device allocated "
                           "the replay counter; its replays could not be counted")
    with _lock:
        if counter.n_graphs >= ReplayCounter.GRAPH_SLOTS:
            raise RuntimeError(f"niah attestation: more than {ReplayCounter.GRAPH_SLOTS} graphs captured on one "
                               "device")
        slot = counter.n_graphs
        counter.n_graphs += 1
        _graphs.append((counter, slot, tally))
    counter.count_graph(slot)


def current_counter() -> ReplayCounter | None:
    """The current CUDA device's replay counter (made by its first eager record), or None."""
    cuda = _cuda()
    return None if cuda is None else _counters.get(cuda.current_device())


def reset() -> None:
    with _lock:
        _eager.clear()
        _captured.clear()
        _slots.clear()
        _counters.clear()
        _graphs.clear()
        _facts.clear()
        _state.update(index_dtype=None, kernels=None, pool_bytes_per_token=None)


def _replayed(slots: dict, counters: list, graphs: list) -> Counter:
    """key -> replayed calls, summed over the devices' counters: per-call slots, and each
    tallied graph's replays times its tally (skipped mid-capture: a device-to-host copy is
    not allowed then)."""
    out: Counter = Counter()
    cuda = _cuda()
    if cuda is not None and cuda.is_current_stream_capturing():
        return out
    for c in counters if slots else ():
        values = c.read()
        for key, slot in slots.items():
            out[key] += int(values[slot])
    replays = {id(c): c.read_graphs() for c in {id(c): c for c, _, _ in graphs}.values()}
    for c, slot, tally in graphs:
        n = int(replays[id(c)][slot])
        for key, calls in tally.items():
            out[key] += calls * n
    return out


def snapshot() -> dict:
    """{"index_dtype", "kernels", "pool_bytes_per_token", "facts", "calls", "counts",
    "kernel_calls", "fp8_reads_while_bf16", "replay_counters"}: `calls` by path, dtype,
    kernel, then eager/captured/replayed; the rest derived from it (`derive`);
    replay_counters: devices whose CUDA-graph replays are counted."""
    with _lock:
        eager, captured = dict(_eager), dict(_captured)
        slots, counters, graphs = dict(_slots), list(_counters.values()), list(_graphs)
        state, facts = dict(_state), dict(_facts)
    replayed = _replayed(slots, counters, graphs)
    calls: dict = {}
    for key in sorted(set(eager) | set(captured) | set(replayed)):
        path, dtype, kernel = key
        calls.setdefault(path, {}).setdefault(dtype, {})[kernel] = {
            "eager": eager.get(key, 0), "captured": captured.get(key, 0), "replayed": replayed.get(key, 0)}
    return {**state, "facts": facts, "calls": calls, **derive(calls, state["index_dtype"]),
            "replay_counters": len(counters)}
