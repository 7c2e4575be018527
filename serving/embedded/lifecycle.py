"""The embedded server's request lifecycle: queued -> prefill -> decode -> completed | cancelled.

A Job is one generation request: its cancel flag and how far it got. The server sets the
flag when the client goes away (the ASGI `http.disconnect` message, streaming or not).
Generation checks it between decode steps (generate's `cancelled` callback) and, during a
forward pass, before every transformer layer (a forward pre-hook raising Cancelled), so a
cancelled request hands the model back within one layer's work, and a request whose
client left while it was queued never runs.

A cancelled request leaves nothing the next one reads: every request prefills from
position 0 (with a prefix cache, from the end of the pages it restored: prefix.py saves a
prompt only after its prefill completed), overwriting the KV and index caches up to its own
length, and attention reads only positions below that length; per-call stats and the probe
are per request.

Jobs keeps the counts /server_info reports under `requests`: completed, cancelled, waiting
(for the model), the running job and the last cancelled one.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Callable


class Cancelled(Exception):
    """The client went away; raised inside a forward pass, before a layer runs."""


@dataclass
class Job:
    prompt_tokens: int
    max_tokens: int
    stream: bool
    flag: threading.Event = field(default_factory=threading.Event)
    stage: str = "queued"            # queued -> prefill -> decode -> completed | cancelled
    prefill_layers: int = 0          # layer passes the prefill ran (30 a chunk where the prefill is chunked)
    completion_tokens: int = 0

    def cancel(self) -> None:
        self.flag.set()

    @property
    def cancelled(self) -> bool:
        return self.flag.is_set()

    def step(self) -> bool:
        """generate's per-decode-step callback: count the token, say whether to stop."""
        self.stage = "decode"
        self.completion_tokens += 1
        return self.flag.is_set()

    def describe(self) -> dict:
        return {"stage": self.stage, "stream": self.stream, "prompt_tokens": self.prompt_tokens,
                "max_tokens": self.max_tokens, "prefill_layers": self.prefill_layers,
                "completion_tokens": self.completion_tokens}


class Jobs:
    """The jobs of one model; installs the per-layer cancellation check on it."""

    def __init__(self, model):
        self.current: Job | None = None            # the job in the worker thread
        self.waiting = 0
        self.completed = 0
        self.cancelled = 0
        self.last_cancelled: dict | None = None
        for layer in model.layers:
            layer.register_forward_pre_hook(self._before_layer)

    def _before_layer(self, _module, _args) -> None:
        job = self.current
        if job is None:
            return
        if job.flag.is_set():
            raise Cancelled()
        if job.stage == "prefill":
            job.prefill_layers += 1

    def run(self, job: Job, generate: Callable[[Callable[[], bool]], object]):
        """In the worker thread: generate(cancelled) for the job, or None when it was
        cancelled before or during its prefill."""
        if job.flag.is_set():
            return None
        job.stage = "prefill"
        self.current = job
        try:
            return generate(job.step)
        except Cancelled:
            return None
        finally:
            self.current = None

    def finish(self, job: Job, g) -> bool:
        """Record how the job ended (g: its Generation, or None); -> whether it was cancelled.
        A generation cut short by the flag is cancelled; one that reached an end token, a
        stop string or max_tokens is completed even if the client left at that moment."""
        if g is not None:
            job.completion_tokens = g.completion_tokens
        cut = g is None or (job.flag.is_set() and g.finish_reason == "length" and g.completion_tokens < job.max_tokens)
        if not cut:
            job.stage = "completed"
            self.completed += 1
            return False
        at = job.stage
        job.stage = "cancelled"
        self.cancelled += 1
        self.last_cancelled = {**job.describe(), "cancelled_at": at}
        print(f"niah serve: client gone, request cancelled at {at} ({job.completion_tokens} of "
              f"{job.max_tokens} tokens generated)", file=sys.stderr, flush=True)
        return True

    def describe(self) -> dict:
        cur = self.current
        return {"completed": self.completed, "cancelled": self.cancelled, "waiting": self.waiting,
                "running": cur.describe() if cur is not None else None, "last_cancelled": self.last_cancelled}
