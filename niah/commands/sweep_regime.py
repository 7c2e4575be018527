"""The sweep's regime and residue options: where selection starts, and which lengths.

`read_topks` gives {config: Regime (niah.regime) or None} and the model's context: from a
matrix file (its loader: index_topk alone, V3.2's rule), or, for one endpoint, from
GET /v1/models and /server_info (index_topk, index_compression, index_window) with the
command line's --index-compression / --index-window under the server's word (a
contradiction is refused). `pick_auto_lengths` is `--lengths auto` over those regimes;
`geometry_given` the command line's geometry (recorded as the configuration's manifest
`geometry`); `RESIDUES_HELP` and friends the options' help. Bad input: BadInput, one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from niah.errors import BadInput

COMPRESSION_HELP = ("Index keys per compressed index key, for a server that does not attest it (DeepSeek-V4: 4; "
                    "V3.2: 1). Selection starts when (length - index window) / compression exceeds k; recorded "
                    "in the manifest.")
WINDOW_HELP = ("Raw recent tokens the indexer never selects over, for a server that does not attest it "
               "(DeepSeek-V4: 128); recorded in the manifest.")
RESIDUES_HELP = ("Lengths at chosen residues around each length: modM (every residue 0..M-1, e.g. mod4) or "
                 "M:v,v (e.g. 4:0,3). A length's block (it rounded down to a multiple of M) plus each residue; "
                 "one seed per block. Recorded per trial; the report has recall by residue.")


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


def read_topks(matrix: Optional[Path], endpoint: str, model: Optional[str], api_key: Optional[str],
               auto: bool = False, timeout: float = 30.0, geometry: Optional[dict] = None
               ) -> tuple[dict, Optional[int]]:
    """{config: Regime or None} and the model's context (None: unknown) (module doc)."""
    if matrix is not None:
        if geometry:
            raise BadInput("--index-compression / --index-window are for one endpoint; with --matrix the "
                           "servers say their geometry")
        from niah.regime import as_regime
        from niah.serving.matrix import matrix_topks

        topks, context = matrix_topks(matrix, context_too=auto)
        return {n: as_regime(k) for n, k in topks.items()}, context
    import httpx

    from niah.client import api_url, request_headers, root_url
    from niah.sweep.indexer import config_regime, geometry_conflict

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
    from niah.sweep.indexer import auto_lengths

    ks = [k for k in topks.values() if k]
    if not ks:
        raise BadInput("--lengths auto needs an index_topk (a sparse configuration in the matrix, or a server "
                       "whose /v1/models reports index_topk); none found")
    if not context:
        raise BadInput("--lengths auto needs the model's context (max_model_len); the server did not report it")
    return auto_lengths(ks, context, max_tokens)
