"""Verdicts on a run's configurations, for the commands: refuse, summarise, say.

`check_configs` is what compare and gate call first (BadInput for an INVALID or, without
--accept-unattested, an unattested configuration); `check_baseline` is the gate's refusal of
a baseline whose server attests planted faults (the fact `faults`, `niah serve --fault`);
`report_section` is the table of `niah report`; `counts` and `say_state` are one-line
summaries; `shown_state` is the state a page shows: "n/a", not "valid", for a server that
attested nothing (nothing was proven, nothing contradicted); the manifest records the same
state (niah.attestation.readings), so a run folder and its pages use one name for it. The judging itself is
niah.attestation.rules.status. Pure functions (say_state prints through the caller's `say`).
"""

from __future__ import annotations

from niah.attestation.engines import facts
from niah.attestation.rules import INVALID, UNATTESTED, VALID, labels, last_attestation, status
from niah.errors import BadInput

ACCEPT_FLAG = "--accept-unattested"
NOT_ATTESTED = "n/a"


def shown_state(entry: dict | None) -> tuple[str, str]:
    """(state, reason) as a page shows it: `status`'s, except NOT_ATTESTED ("n/a") for a
    valid configuration whose server attested nothing: no reading holds niah's attestation
    or the engine's own report of what ran (SGLang's schedulers, from which a stock arm is
    proven to run SGLang's own paths)."""
    state, reason = status(entry)
    if state == VALID and not last_attestation(entry or {}) and not _engine_report(entry or {}):
        return NOT_ATTESTED, f"its server attests nothing ({reason})"
    return state, reason


def _engine_report(entry: dict) -> bool:
    """Whether a reading of this configuration holds the engine's own scheduler states."""
    rec = entry.get("attestation")
    segments = rec.get("segments") if isinstance(rec, dict) else None
    return any(isinstance(r, dict) and bool(r.get("internal_states"))
               for seg in segments or [] if isinstance(seg, dict) for r in (seg.get("start"), seg.get("end")))


def say_state(name: str, state: str, reason: str, say) -> None:
    """One line about a configuration that is not valid (`say`: the caller's printer)."""
    if state == INVALID:
        say(f"{name}: INVALID configuration: {reason}")
    elif state == UNATTESTED:
        say(f"{name}: unattested: {reason} (compare/gate need {ACCEPT_FLAG})")


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


def planted_faults(entry: dict | None) -> list[str]:
    """The planted faults (the fact `faults`) any reading of a configuration attests, in order."""
    rec = (entry or {}).get("attestation")
    readings = [rec] if isinstance(rec, dict) and "segments" not in rec else [
        (r or {}).get("attestation") for seg in ((rec or {}).get("segments") or []) if isinstance(seg, dict)
        for r in (seg.get("start"), seg.get("end"))]
    out: list[str] = []
    for a in readings:
        for f in ((a or {}).get("facts") or {}).get("faults") or []:
            if f not in out:
                out.append(f)
    return out


def check_baseline(manifest: dict, names, where: str) -> None:
    """BadInput (exit 2, one line) when a baseline configuration's server ran planted faults:
    a baseline is what the gate holds a candidate to, and a faulted one proves nothing."""
    configs = manifest.get("configs") or {}
    for name in names:
        got = planted_faults(configs.get(name))
        if got:
            raise BadInput(f"{where}: configuration {name!r} was served with planted faults ({', '.join(got)}): "
                           "a baseline must come from a fault-free server")


def _shown(entry: dict | None) -> bool:
    return entry is None or bool(facts(entry.get("engine")).must_prove or labels(entry) or last_attestation(entry))


def report_section(manifest: dict, names) -> str | None:
    """Markdown for `niah report`: each configuration's state (valid, **INVALID**,
    unattested, n/a: nothing attested, nothing to attest) and why. None when no
    configuration is launched, labelled or attested."""
    configs = manifest.get("configs") or {}
    entries = {n: configs.get(n) for n in names}  # None: absent from the manifest (INVALID)
    if not any(_shown(e) for e in entries.values()):
        return None
    rows = []
    for name, entry in entries.items():
        state, reason = shown_state(entry)
        entry = entry or {}
        end = last_attestation(entry) or {}
        arm = "/".join(str(end.get(k)) for k in ("index_dtype", "kernels")) if end else "—"
        mark = {INVALID: "**INVALID**", UNATTESTED: "*unattested*"}.get(state, state)
        rows.append(f"| `{name}` | {entry.get('engine') or '?'} | {mark} | {arm} | "
                    f"{end.get('pool_bytes_per_token') or '—'} | {reason.replace('|', '/')} |")
    head = ("## Attestation: what each server proved it ran\n\n"
            "INVALID: a launched server's attestation is missing, unreadable or contradicts its label; "
            f"unattested: labels its server does not report; n/a: a server that attests nothing, with no "
            f"label to attest. `compare` and `gate` refuse both "
            f"(unattested ones are accepted with `{ACCEPT_FLAG}`).\n\n"
            "| config | engine | state | ran (index dtype/kernels) | pool bytes/token | why |\n"
            "|---|---|---|---|---|---|\n")
    return head + "\n".join(rows) + "\n"


def counts(manifest: dict, names) -> dict[str, list[str]]:
    """{state: [names]} (for a one-line summary)."""
    out: dict[str, list[str]] = {VALID: [], INVALID: [], UNATTESTED: []}
    for n in names:
        out[status((manifest.get("configs") or {}).get(n))[0]].append(n)
    return out
