"""What a matrix file may say: the engines, the keys each accepts and how each is checked.

`ENGINE_KEYS[engine][key](value)` returns None for a good value, else what is wrong (the
parser, serving/matrix/parse.py, names the line). `REQUIRED`, the default health paths
and readiness timeouts, and the flags niah sets itself (`args` may not repeat them) are
here too. Pure data and checks.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from niah.kernels import forms
from niah.kernels.rotation import ROTATIONS
from niah.serving.embedded import precision

ENGINES = ("embedded", "sglang", "external", "command")
PORT_PLACEHOLDER = "$PORT"  # what the dry run prints: the real port is chosen at launch


# -- key checks ---------------------------------------------------------------------------
def _choice(*allowed: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if v not in allowed:
            return f"must be one of {', '.join(repr(a) for a in allowed)}, not {v!r}"
        return None

    return check


def _choice_of(allowed: Callable[[], tuple[str, ...]]) -> Callable[[Any], str | None]:
    """A choice among what `allowed()` returns when the value is checked (the index-key
    forms' table, niah.kernels.forms: a form registered later is accepted too)."""
    return lambda v: _choice(*allowed())(v)


def _int_range(lo: int, hi: int | None = None) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
            bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
            return f"must be an integer {bound}, not {v!r}"
        return None

    return check


def _positive_number(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        return f"must be a positive number, not {v!r}"
    return None


def _string(v: Any) -> str | None:
    return None if isinstance(v, str) and v else f"must be a non-empty string, not {v!r}"


def _url(v: Any) -> str | None:
    if not isinstance(v, str) or not re.match(r"^https?://[^/\s]+", v):
        return f"must be an http(s):// URL, not {v!r}"
    return None


def _string_list(v: Any) -> str | None:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        return f"must be a list of strings, e.g. [\"--mem-fraction-static\", \"0.8\"], not {v!r}"
    return None


def _env_table(v: Any) -> str | None:
    if not isinstance(v, dict) or not all(isinstance(x, (str, int, float, bool)) for x in v.values()):
        return f"must be a table of NAME = \"value\", e.g. {{ SGLANG_DSA_FUSE_TOPK = \"false\" }}, not {v!r}"
    for k in v:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
            return f"has an invalid variable name {k!r}"
    return None


_COMMON = {"args": _string_list, "env": _env_table, "ready_timeout_s": _positive_number}

# What each engine accepts. `attention`, `index_dtype`, `index_topk` on an `external`
# engine are labels only (recorded in the manifest so reports can group by them).
ENGINE_KEYS: dict[str, dict[str, Callable[[Any], str | None]]] = {
    "embedded": {
        **_COMMON,
        "attention": _choice("dense", "dsa"),
        "index_dtype": _choice_of(precision.index_dtypes),
        "index_query_dtype": _choice_of(precision.query_dtypes),
        "rescore_factor": _int_range(1),
        "index_rotation": _choice(*ROTATIONS),
        "index_topk": _int_range(1),
        "window": _int_range(0),
        "python": _string,
    },
    "sglang": {
        **_COMMON,
        "model_path": _string,
        "tp": _int_range(1),
        "index_dtype": _choice_of(forms.sglang_arm_names),  # fp4: SGLang's own arm (stock only)
        "kernels": _choice("stock", "niah"),
        "index_topk": _int_range(1, 2048),
        "python": _string,
        "model": _string,
        "index_query_dtype": _choice("fp8"),  # a label: every SGLang arm keeps SGLang's fp8 query
    },
    "command": {  # any OpenAI-compatible server: argv with {port} (and {axis} keys) filled in
        "command": _string_list,
        "env": _env_table,
        "ready_timeout_s": _positive_number,
        "health_paths": _string_list,
        "model": _string,
        "attention": _string,
        "index_dtype": _string,
        "index_rotation": _choice(*ROTATIONS),
        "index_topk": _int_range(1),
        "window": _int_range(0),
        "tp": _int_range(1),
    },
    "external": {
        "endpoint": _url,
        "model": _string,
        "api_key_env": _string,
        "attention": _choice("dense", "dsa"),
        "index_dtype": _choice_of(lambda: forms.names(forms.EXTERNAL)),
        "index_rotation": _choice(*ROTATIONS),
        "index_topk": _int_range(1),
    },
}
REQUIRED = {"sglang": ("model_path",), "external": ("endpoint",), "embedded": (), "command": ("command",)}

# Default health checks, tried in order on each poll (404 = not served, try the next).
HEALTH_PATHS = {
    "sglang": ("/health_generate", "/health", "/v1/models"),
    "embedded": ("/health", "/v1/models"),
}
DEFAULT_READY_TIMEOUT_S = {"sglang": 1800.0, "embedded": 300.0}
# Flags niah sets itself; `args` may not repeat them.
RESERVED_FLAGS = {
    "--port": "niah chooses a free port", "--host": "launched servers listen on 127.0.0.1",
    "--model-path": "use model_path", "--tp-size": "use tp", "--tp": "use tp",
    "--json-model-override-args": "use index_topk", "--niah-index-dtype": "use index_dtype",
    "--attention": "use attention", "--index-dtype": "use index_dtype",
    "--index-topk": "use index_topk", "--window": "use window", "--niah-kernels": "use kernels",
    "--index-rotation": "use index_rotation", "--index-query-dtype": "use index_query_dtype",
    "--rescore-factor": "use rescore_factor",
}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
