"""SIGTERM and SIGHUP as Ctrl-C: `with terminate_as_interrupt(): ...`.

Within the block, SIGTERM and SIGHUP to niah raise `KeyboardInterrupt(signal name)`, so
the same clean-up as Ctrl-C runs: answered trials are kept, the end reading is taken
while the server still answers, launched servers are stopped. The caller maps the name
to its exit code (`EXIT_ON_SIGNAL`: 128 + the signal's number). Main thread only
(elsewhere the block changes nothing).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

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
