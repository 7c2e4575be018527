"""What a matrix file's keys may hold: the value checks every engine builds its keys from.

Each check takes a value and returns None for a good one, else what is wrong (the parser,
serving/matrix/parse.py, names the line). The keys each engine accepts are its own module's
(serving/matrix/engines/); `COMMON` are the keys every launched engine shares. The flags niah
sets itself (`args` may not repeat them), the configuration name's pattern and the dry run's
port placeholder are here too. Pure data and checks.
"""

from __future__ import annotations

import re
from typing import Any, Callable

PORT_PLACEHOLDER = "$PORT"  # what the dry run prints: the real port is chosen at launch


# -- key checks ---------------------------------------------------------------------------
def choice(*allowed: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if v not in allowed:
            return f"must be one of {', '.join(repr(a) for a in allowed)}, not {v!r}"
        return None

    return check


def choice_of(allowed: Callable[[], tuple[str, ...]]) -> Callable[[Any], str | None]:
    """A choice among what `allowed()` returns when the value is checked (the index-key
    forms' table, niah.kernels.forms: a form registered later is accepted too)."""
    return lambda v: choice(*allowed())(v)


def int_range(lo: int, hi: int | None = None) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
            bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
            return f"must be an integer {bound}, not {v!r}"
        return None

    return check


def positive_number(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        return f"must be a positive number, not {v!r}"
    return None


def string(v: Any) -> str | None:
    return None if isinstance(v, str) and v else f"must be a non-empty string, not {v!r}"


def url(v: Any) -> str | None:
    if not isinstance(v, str) or not re.match(r"^https?://[^/\s]+", v):
        return f"must be an http(s):// URL, not {v!r}"
    return None


def string_list(v: Any) -> str | None:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        return f"must be a list of strings, e.g. [\"--mem-fraction-static\", \"0.8\"], not {v!r}"
    return None


def env_table(v: Any) -> str | None:
    if not isinstance(v, dict) or not all(isinstance(x, (str, int, float, bool)) for x in v.values()):
        return f"must be a table of NAME = \"value\", e.g. {{ SGLANG_DSA_FUSE_TOPK = \"false\" }}, not {v!r}"
    for k in v:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
            return f"has an invalid variable name {k!r}"
    return None


COMMON = {"args": string_list, "env": env_table, "ready_timeout_s": positive_number}

# Flags niah sets itself; `args` may not repeat them.
RESERVED_FLAGS = {
    "--port": "niah chooses a free port", "--host": "launched servers listen on 127.0.0.1",
    "--model-path": "use model_path", "--tp-size": "use tp", "--tp": "use tp",
    "--json-model-override-args": "use index_topk", "--niah-index-dtype": "use index_dtype",
    "--attention": "use attention", "--index-dtype": "use index_dtype",
    "--index-topk": "use index_topk", "--window": "use window", "--niah-kernels": "use kernels",
    "--index-rotation": "use index_rotation", "--index-query-dtype": "use index_query_dtype",
    "--rescore-factor": "use rescore_factor", "--page-size": "use page_size", "--prefill-chunk": "use prefill_chunk",
    "--prefix-cache": "use prefix_cache", "--index-compress": "use index_compress",
}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
