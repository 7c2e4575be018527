"""A server's attestation (what its indexer really ran) against a configuration's label.

Servers report `niah.serving.sglang.attest.snapshot()`: SGLang with niah's plugin in
`/server_info` -> `internal_states[i]["niah_attestation"]` (one per data-parallel
scheduler), the embedded server at `/server_info` -> `niah_attestation`. niah reads
`/server_info` when a configuration's sweep starts (its server ready and probed) and when
it ends (before teardown), and stores both readings in the manifest:

    configs.<name>.attestation = {"segments": [{"start": READING, "end": READING}, ...]}
    READING = {"error": None | why it could not be read, "version", "internal_states":
               SGLang schedulers (None: not SGLang-shaped), "attested_states": how many of
               them carry niah_attestation, "attestation": from_server_info(...) | None}

One segment per invocation that ran trials (`--resume` adds one). `status(entry)` is the
one place that judges a manifest entry: "valid", "INVALID" (a launched configuration whose
attestation is missing, unreadable or contradicts its label; anything a server reports
that contradicts its label) or "unattested" (labels on an external or command
configuration that its server does not report). The rules are in
niah/attestation_rules.py; report, compare and gate all use `status`.
"""

from __future__ import annotations

from typing import Any

from niah.errors import BadInput

FIELD = "niah_attestation"
VALID, INVALID, UNATTESTED = "valid", "INVALID", "unattested"
ACCEPT_FLAG = "--accept-unattested"


# -- reading a server ----------------------------------------------------------------------
def from_server_info(info: Any) -> dict | None:
    """The attestation in a /server_info body, or None. Several schedulers (DP ranks):
    their calls are summed, the rest must agree (else the first one's is kept and
    `disagree` lists the fields); counts and kernel_calls are derived from the sum."""
    from niah.serving.sglang.attest import derive

    if not isinstance(info, dict):
        return None
    found = [info[FIELD]] if isinstance(info.get(FIELD), dict) else []
    for st in info.get("internal_states") or []:
        if isinstance(st, dict) and isinstance(st.get(FIELD), dict):
            found.append(st[FIELD])
    if not found:
        return None
    summed = ("calls", "counts", "kernel_calls", "fp8_reads_while_bf16", "replay_counters")
    same = {k: v for k, v in found[0].items() if k not in summed}
    disagree = sorted({k for a in found[1:] for k in same if a.get(k) != same[k]})
    calls = add_calls(*(a.get("calls") or {} for a in found))
    out = {**same, "calls": calls, **derive(calls, same.get("index_dtype")), "schedulers": len(found),
           "replay_counters": sum(int(a.get("replay_counters") or 0) for a in found)}
    if not any(a.get("calls") for a in found) and any(a.get("counts") for a in found):
        out["legacy"] = True  # an older plugin: counts without kernel names
    if disagree:
        out["disagree"] = disagree
    return out


def add_calls(*many: dict, sign: int = 1) -> dict:
    """Sum `calls` records ({path: {dtype: {kernel: {eager, captured, replayed}}}}); with
    sign=-1 the later ones are subtracted (end minus start)."""
    out: dict = {}
    for i, calls in enumerate(many):
        s = 1 if i == 0 else sign
        for path, by_dtype in (calls or {}).items():
            for dtype, by_kernel in (by_dtype or {}).items():
                for kernel, n in (by_kernel or {}).items():
                    cell = out.setdefault(path, {}).setdefault(dtype, {}).setdefault(
                        kernel, {"eager": 0, "captured": 0, "replayed": 0})
                    for kind in cell:
                        cell[kind] += s * int((n or {}).get(kind, 0))
    return out


def reading_of(info: Any) -> dict:
    """A READING of a /server_info body (module doc)."""
    if not isinstance(info, dict):
        return {"error": "/server_info did not answer a JSON object"}
    states = info.get("internal_states")
    states = [s for s in states if isinstance(s, dict)] if isinstance(states, list) else None
    return {"error": None, "version": info.get("version"),
            "internal_states": None if states is None else len(states),
            "attested_states": sum(isinstance(s.get(FIELD), dict) for s in states or []),
            "attestation": from_server_info(info)}


def read_server(endpoint: str, api_key: str | None = None) -> dict:
    """GET /server_info (else SGLang's older /get_server_info) as a READING; never raises."""
    import httpx

    from niah.tokenize import root_url

    base = root_url(endpoint)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(timeout=10.0, headers=headers) as client:
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


# -- recording it in the manifest ------------------------------------------------------------
def _update(out, name: str, change) -> dict:
    """Apply `change(segments)` to configs[name]'s attestation, store the new verdict."""
    from niah.runfolder import update_config

    def fn(entry: dict) -> dict:
        rec = entry.get("attestation")
        segments = list(rec["segments"]) if isinstance(rec, dict) and isinstance(rec.get("segments"), list) else []
        change(segments)
        new = {**entry, "attestation": {"segments": segments}}
        state, reason = status(new)
        return {"attestation": {"segments": segments}, "attestation_verdict": {"state": state, "reason": reason}}

    return update_config(out, name, fn)


def begin_segment(out, name: str, reading: dict) -> None:
    """The reading when a configuration's sweep starts: a new segment."""
    _update(out, name, lambda segs: segs.append({"start": reading, "end": None}))


def end_segment(out, name: str, reading: dict) -> tuple[str, str]:
    """The reading when it ends (or {"error": why} when the server cannot be asked):
    closes the last segment; returns the configuration's (state, reason)."""

    def close(segs: list) -> None:
        if not segs or segs[-1].get("end") is not None:
            segs.append({"start": None, "end": None})
        segs[-1] = {**segs[-1], "end": reading}

    entry = _update(out, name, close)
    v = entry["attestation_verdict"]
    return v["state"], v["reason"]


def read_target(prepared) -> dict:
    """A READING of a prepared target's server (niah.targets.PreparedTarget); a launched
    one that died is not asked."""
    life = prepared.target.lifecycle
    cause = life.dead() if life is not None else None
    if cause:
        return {"error": f"the server died before it was asked: {cause}"}
    return read_server(prepared.endpoint, prepared.target.api_key)


def say_state(name: str, state: str, reason: str, say) -> None:
    """One line about a configuration that is not valid (`say`: the caller's printer)."""
    if state == INVALID:
        say(f"{name}: INVALID configuration: {reason}")
    elif state == UNATTESTED:
        say(f"{name}: unattested: {reason} (compare/gate need {ACCEPT_FLAG})")


# -- judging it ------------------------------------------------------------------------------
def label_of(config_entry: dict) -> dict:
    """The label of a manifest `configs.<name>` entry: its settings, then its axes."""
    return {**(config_entry.get("settings") or {}), **(config_entry.get("axes") or {})}


def status(entry: dict | None) -> tuple[str, str]:
    """(state, reason) of one manifest `configs.<name>` entry (or baseline configuration):
    state is VALID, INVALID or UNATTESTED (module doc)."""
    from niah.attestation_rules import judge

    return judge(entry or {})


def check_configs(manifest: dict, names, where: str, accept_unattested: bool = False) -> list[str]:
    """BadInput (exit 2, one line) for the first named configuration that is INVALID, or
    unattested without `accept_unattested`; returns notes on the unattested ones accepted
    (compare and gate call this first)."""
    configs = manifest.get("configs") or {}
    notes = []
    for name in names:
        state, reason = status(configs.get(name))
        if state == INVALID:
            raise BadInput(f"{where}: configuration {name!r} is INVALID: {reason}")
        if state == UNATTESTED:
            if not accept_unattested:
                raise BadInput(f"{where}: configuration {name!r} is unattested: {reason}; "
                               f"pass {ACCEPT_FLAG} to compare it on its labels' word")
            notes.append(f"`{name}` ({where}) is unattested, accepted with {ACCEPT_FLAG}: {reason}")
    return notes


def _shown(entry: dict) -> bool:
    from niah.attestation_rules import LAUNCHED, labels

    return bool(entry.get("engine") in LAUNCHED or labels(entry) or last_attestation(entry))


def report_section(manifest: dict, names) -> str | None:
    """Markdown for `niah report`: each configuration's state (valid, **INVALID**,
    unattested) and why. None when no configuration is launched, labelled or attested."""
    configs = manifest.get("configs") or {}
    entries = {n: configs.get(n) or {} for n in names}
    if not any(_shown(e) for e in entries.values()):
        return None
    rows = []
    for name, entry in entries.items():
        state, reason = status(entry)
        end = last_attestation(entry) or {}
        arm = "/".join(str(end.get(k)) for k in ("index_dtype", "kernels")) if end else "—"
        mark = {INVALID: "**INVALID**", UNATTESTED: "*unattested*"}.get(state, state)
        rows.append(f"| `{name}` | {entry.get('engine') or '?'} | {mark} | {arm} | "
                    f"{end.get('pool_bytes_per_token') or '—'} | {reason.replace('|', '/')} |")
    head = ("## Attestation: what each server proved it ran\n\n"
            "INVALID: a launched server's attestation is missing, unreadable or contradicts its label; "
            f"unattested: labels its server does not report. `compare` and `gate` refuse both "
            f"(unattested ones are accepted with `{ACCEPT_FLAG}`).\n\n"
            "| config | engine | state | ran (index dtype/kernels) | pool bytes/token | why |\n"
            "|---|---|---|---|---|---|\n")
    return head + "\n".join(rows) + "\n"


def last_attestation(entry: dict) -> dict | None:
    """The newest attestation a reading of this configuration holds (None: none read)."""
    rec = entry.get("attestation")
    if isinstance(rec, dict) and "segments" not in rec:
        return rec  # written by an older niah: one flat attestation
    for seg in reversed((rec or {}).get("segments") or []):
        for r in (seg.get("end"), seg.get("start")):
            if r and r.get("attestation"):
                return r["attestation"]
    return None


def counts(manifest: dict, names) -> dict[str, list[str]]:
    """{state: [names]} (for a one-line summary)."""
    out: dict[str, list[str]] = {VALID: [], INVALID: [], UNATTESTED: []}
    for n in names:
        out[status((manifest.get("configs") or {}).get(n))[0]].append(n)
    return out
