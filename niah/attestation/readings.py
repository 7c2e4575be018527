"""Readings of a server's attestation, and the manifest changes they make. Pure of writes.

niah reads `/server_info` when a configuration's sweep starts (its server ready and
probed) and when it ends (before teardown); both readings go in the manifest:

    configs.<name>.attestation = {"segments": [{"start": READING, "end": READING}, ...]}
    READING = {"error": None | why it could not be read, "version", "internal_states":
               SGLang schedulers (None: not SGLang-shaped), "attested_states": how many of
               them carry niah_attestation, "attestation": from_server_info(...) | None,
               "server_args": {name: value} of SERVER_ARGS that an SGLang-shaped body
               reports at its top level (SGLang's own resolved arguments)}

One segment per invocation that ran trials (`--resume` adds one). `begin_segment(entry,
reading)` and `end_segment(entry, reading)` return the changes to a manifest
`configs.<name>` entry (the segments and the new `attestation_verdict`); the run folder
(niah.runs.manifest.update_config) writes them. `read_server` asks a server (HTTP GET,
never raises).
"""

from __future__ import annotations

from typing import Any

import httpx

from niah.attestation.format import FIELD, from_server_info
from niah.attestation.rules import came_back_different, label_contradiction
from niah.attestation.verdict import shown_state
from niah.client import request_headers, root_url


# SGLang's own arguments a reading keeps: what proves a stock arm's index dtype (rules.py).
SERVER_ARGS = ("enable_deepseek_v4_fp4_indexer",)


def reading_of(info: Any) -> dict:
    """A READING of a /server_info body (module doc)."""
    if not isinstance(info, dict):
        return {"error": "/server_info did not answer a JSON object"}
    states = info.get("internal_states")
    states = [s for s in states if isinstance(s, dict)] if isinstance(states, list) else None
    reading = {"error": None, "version": info.get("version"),
               "internal_states": None if states is None else len(states),
               "attested_states": sum(isinstance(s.get(FIELD), dict) for s in states or []),
               "attestation": from_server_info(info)}
    if states is not None:
        reading["server_args"] = {k: info[k] for k in SERVER_ARGS if k in info}
    return reading


def read_server(endpoint: str, api_key: str | None = None, timeout: float = 10.0) -> dict:
    """GET /server_info (else SGLang's older /get_server_info) as a READING, each request
    bounded by `timeout` seconds; never raises."""
    base = root_url(endpoint)
    try:
        with httpx.Client(timeout=timeout, headers=request_headers(api_key)) as client:
            r = client.get(base + "/server_info")
            if r.status_code == 404:
                r = client.get(base + "/get_server_info")
    except httpx.HTTPError as e:
        return {"error": f"{base}/server_info could not be read ({type(e).__name__})"}
    if r.status_code != 200:
        return {"error": f"{base}/server_info answered HTTP {r.status_code}"}
    try:
        return reading_of(r.json())
    except ValueError:
        return {"error": f"{base}/server_info did not answer JSON"}


def _changes(entry: dict, change) -> dict:
    """`change(segments)` applied to a configs entry's attestation: the new segments and verdict."""
    rec = entry.get("attestation")
    segments = list(rec["segments"]) if isinstance(rec, dict) and isinstance(rec.get("segments"), list) else []
    change(segments)
    state, reason = shown_state({**entry, "attestation": {"segments": segments}})
    return {"attestation": {"segments": segments}, "attestation_verdict": {"state": state, "reason": reason}}


def begin_segment(entry: dict, reading: dict) -> dict:
    """The changes when a configuration's sweep starts: a new segment opened by `reading`."""
    return _changes(entry, lambda segs: segs.append({"start": reading, "end": None}))


def end_segment(entry: dict, reading: dict) -> dict:
    """The changes when it ends (`reading` may be {"error": why} when the server cannot be
    asked): the last segment closed; the verdict is under "attestation_verdict"."""

    def close(segs: list) -> None:
        if not segs or segs[-1].get("end") is not None:
            segs.append({"start": None, "end": None})
        segs[-1] = {**segs[-1], "end": reading}

    return _changes(entry, close)


def open_segment(entry: dict) -> bool:
    """Whether a configs entry's last segment has no end reading (niah was killed)."""
    rec = entry.get("attestation")
    segs = rec.get("segments") if isinstance(rec, dict) else None
    return bool(segs) and isinstance(segs[-1], dict) and segs[-1].get("end") is None


def start_contradiction(entry: dict) -> str | None:
    """Why the start reading of a configs entry's newest segment refuses the sweep: the
    server came back different from the reading before it, or it contradicts a label
    (naming the axis); None when it does not."""
    segs = (entry.get("attestation") or {}).get("segments") or []
    if not segs or not isinstance(segs[-1], dict):
        return None
    start = segs[-1].get("start") or {}
    if len(segs) > 1:
        changed = came_back_different(segs[-2:])
        if changed:
            return changed[1]
    if start.get("error") or not start.get("attestation"):
        return None
    return label_contradiction(entry, start["attestation"])
