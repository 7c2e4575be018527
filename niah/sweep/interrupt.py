"""SIGTERM and SIGHUP as Ctrl-C: `with terminate_as_interrupt(): ...`.

Within the block, SIGTERM and SIGHUP to niah raise `KeyboardInterrupt(signal name)`, so
the same clean-up as Ctrl-C runs: answered trials are kept, the end reading is taken
while the server still answers, launched servers are stopped. The caller maps the name
to its exit code (`EXIT_ON_SIGNAL`: 128 + the signal's number). Main thread only
(elsewhere the block changes nothing).

The signal lands wherever Python is at that moment; inside an anyio task group (httpx
connecting) the KeyboardInterrupt comes out wrapped in an exception group. `run_async`
runs a coroutine and unwraps it, so the caller's `except KeyboardInterrupt` sees every
interrupt, however deep it was raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from typing import Any, Coroutine, Iterator

EXIT_ON_SIGNAL = {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129}


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """The block with SIGTERM / SIGHUP raising KeyboardInterrupt (module doc)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for s in old:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def interrupt_within(error: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt `error` is or holds (exception groups walked depth first), or None."""
    if isinstance(error, KeyboardInterrupt):
        return error
    for inner in getattr(error, "exceptions", None) or ():
        found = interrupt_within(inner)
        if found is not None:
            return found
    return None


def run_async(coro: Coroutine[Any, Any, Any]) -> Any:
    """asyncio.run(coro), with an interrupt wrapped in an exception group raised as itself."""
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        raise
    except BaseException as error:
        stop = interrupt_within(error)
        if stop is None:
            raise
        raise stop from None
