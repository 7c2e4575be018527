"""One server's sparse regime, read before a sweep: where selection starts, and which lengths.

`server_regime` gives {"default": Regime (niah.regime) or None} and the model's context
from GET /v1/models and /server_info (index_topk, index_compression, index_window), with
the command line's --index-compression / --index-window (`geometry_given`) under the
server's word (a contradiction is refused). `pick_auto_lengths` is `--lengths auto` over
such regimes (a matrix's come from its file, niah.serving.matrix). Bad input: BadInput,
one line, before any trial.
"""

from __future__ import annotations

from typing import Optional

import httpx

from niah.client import api_url, request_headers, root_url
from niah.errors import BadInput
from niah.sweep.indexer import auto_lengths, config_regime, geometry_conflict


def geometry_given(index_compression: Optional[int], index_window: Optional[int]) -> dict:
    """{index_compression, index_window} as given (each only when given), checked."""
    out = {}
    if index_compression is not None:
        if index_compression < 1:
            raise BadInput(f"--index-compression must be at least 1 (got {index_compression})")
        out["index_compression"] = index_compression
    if index_window is not None:
        if index_window < 0:
            raise BadInput(f"--index-window must be 0 or more (got {index_window})")
        out["index_window"] = index_window
    return out


def server_regime(endpoint: str, model: Optional[str], api_key: Optional[str], timeout: float = 30.0,
                  geometry: Optional[dict] = None) -> tuple[dict, Optional[int]]:
    """{"default": Regime or None} and the model's context (None: unknown) (module doc)."""
    headers = request_headers(api_key)
    try:
        models = httpx.get(api_url(endpoint) + "/models", timeout=min(30.0, timeout), headers=headers).json()
    except (httpx.HTTPError, ValueError) as e:
        raise BadInput(f"cannot read {endpoint}/models: {e}") from None
    entries = [m for m in models.get("data") or [] if isinstance(m, dict)]
    entry = next((m for m in entries if not model or m.get("id") == model), {})
    info = None
    try:
        r = httpx.get(root_url(api_url(endpoint)) + "/server_info", timeout=min(30.0, timeout), headers=headers)
        info = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        pass
    info = info if isinstance(info, dict) else {}
    if conflict := geometry_conflict(geometry or {}, [entry, info]):
        raise BadInput(conflict)
    regime = config_regime({"geometry": geometry or {}, "server": {"models": {"data": [entry]}, "server_info": info}})
    return {"default": regime}, entry.get("max_model_len") or info.get("max_model_len")


def pick_auto_lengths(topks: dict, context: Optional[int], max_tokens: int) -> list[int]:
    """s/2, s, 2s, ... of every regime's scale (niah.sweep.indexer.auto_lengths)."""
    ks = [k for k in topks.values() if k]
    if not ks:
        raise BadInput("--lengths auto needs an index_topk (a sparse configuration in the matrix, or a server "
                       "whose /v1/models reports index_topk); none found")
    if not context:
        raise BadInput("--lengths auto needs the model's context (max_model_len); the server did not report it")
    return auto_lengths(ks, context, max_tokens)
