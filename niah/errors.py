"""Domain errors. Library code raises these; the CLI turns them into one line at the edge.

`BadInput` (and subclasses) mean the user asked for something that cannot work:
the CLI prints one clear line and exits with code 2. `Unwritable` is the BadInput of an
output the user named (a file where a folder is wanted, a directory, a read-only place);
code that writes such an output wraps the writing in `writing(path)`, which turns the
OSError into it where it happens (an OSError anywhere else stays a bug, with its traceback).
`one_line(text)` is how any foreign text (a server's reply body) enters a message.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class NiahError(Exception):
    """Base class of every error niah raises on purpose."""

    exit_code = 1


class BadInput(NiahError):
    """The user's input is wrong (arguments, files, unreachable endpoint): exit code 2."""

    exit_code = 2


class Unwritable(BadInput):
    """An output the user named cannot be written: exit code 2."""


class ServerError(NiahError):
    """A server we talk to or launched misbehaved (died, never became ready)."""

    exit_code = 1


class LengthDrift(NiahError):
    """A trial's server-counted length is not what was asked: the counter is not exact for
    this server. The sweep stops (exit 2) unless --approximate-lengths."""

    exit_code = 2


@contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """Around the writing of a user-named output: an OSError becomes Unwritable naming `path`."""
    try:
        yield
    except OSError as e:
        raise Unwritable(f"cannot write {path}: {_why(e, path)}") from None


def _why(e: OSError, path: Path | str) -> str:
    where = str(e.filename) if e.filename is not None else str(path)
    if isinstance(e, FileExistsError):  # a folder wanted where a file is
        return f"{where} is a file, not a folder"
    if isinstance(e, NotADirectoryError):
        return "part of its path is a file, not a folder"
    return e.strerror or str(e) if where == str(path) else f"{e.strerror or e}: {where}"


def write_output(path: Path | str, text: str) -> Path:
    """Write `text` to the user-named file `path` (its folder made); Unwritable on failure."""
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return path


def one_line(text: str, limit: int = 200) -> str:
    """`text` on one line (runs of whitespace become one space), at most `limit` characters
    (an ellipsis and the count of what was cut say so)."""
    flat = re.sub(r"\s+", " ", str(text)).strip()
    if len(flat) <= limit:
        return flat
    return f"{flat[:limit].rstrip()}... ({len(flat) - limit} more characters)"
