"""A server's attestation (what its indexer really ran) against a configuration's label.

Servers report `niah.serving.sglang.attest.snapshot()`: SGLang with niah's plugin in
`/server_info` -> `internal_states[i]["niah_attestation"]` (one per data-parallel
scheduler), the embedded server at `/server_info` -> `niah_attestation`. niah reads it
when a configuration ends and writes it into the manifest (`configs.<name>.attestation`).
`verdict` is the one place that decides whether it contradicts the label; report,
compare and gate all use it.
"""

from __future__ import annotations

from typing import Any

from niah.errors import BadInput

FIELD = "niah_attestation"


def from_server_info(info: Any) -> dict | None:
    """The attestation in a /server_info body, or None. Several schedulers (DP ranks):
    their counts are summed, the rest must agree (else the first one's is kept and
    `disagree` lists the fields)."""
    if not isinstance(info, dict):
        return None
    found = [info[FIELD]] if isinstance(info.get(FIELD), dict) else []
    for st in info.get("internal_states") or []:
        if isinstance(st, dict) and isinstance(st.get(FIELD), dict):
            found.append(st[FIELD])
    if not found:
        return None
    out = {k: v for k, v in found[0].items() if k not in ("counts", "fp8_reads_while_bf16")}
    counts: dict[str, int] = {}
    fp8 = 0
    for a in found:
        for k, v in (a.get("counts") or {}).items():
            counts[k] = counts.get(k, 0) + int(v)
        fp8 += int(a.get("fp8_reads_while_bf16") or 0)
    disagree = sorted({k for a in found[1:] for k in out if a.get(k) != out[k]})
    out.update(counts=counts, fp8_reads_while_bf16=fp8, schedulers=len(found))
    if disagree:
        out["disagree"] = disagree
    return out


def verdict(attestation: dict | None, label: dict) -> tuple[bool, str]:
    """(valid, reason) of one configuration. `label`: its settings and axes (index_dtype,
    kernels). No attestation: valid, "not attested" (the server does not report one)."""
    if not attestation:
        return True, "not attested"
    counts = attestation.get("counts") or {}
    want = label.get("index_dtype")
    got = attestation.get("index_dtype")
    if want and got and want != got:
        return False, f"labelled index_dtype {want} but the server ran {got}"
    rotation = rotation_contradiction(attestation, label)
    if rotation:
        return False, rotation
    kernels = label.get("kernels")
    if kernels and attestation.get("kernels") and kernels != attestation["kernels"]:
        return False, f"labelled kernels {kernels} but the server ran {attestation['kernels']}"
    if attestation.get("disagree"):
        return False, f"schedulers disagree on {', '.join(attestation['disagree'])}"
    fp8 = int(attestation.get("fp8_reads_while_bf16") or 0)
    if fp8:
        return False, f"{fp8} fp8 index-key path call(s) while bf16 was configured"
    if (want or got) == "bf16" and not counts.get("store.bf16"):
        return False, "bf16 configured but no bf16 key was stored"
    ran = ", ".join(f"{k} {v}" for k, v in counts.items()) or "no indexer calls"
    return True, ran


def rotation_contradiction(attestation: dict, label: dict) -> str | None:
    """Why the server's index rotation contradicts the label's `index_rotation`, or None.
    The server states it as the fact `rotation` (attest.set_facts); a label that asks for
    a rotation from a server that states none is a contradiction too (fail closed), a
    label that says nothing is not checked (as for index_dtype)."""
    want = label.get("index_rotation")
    got = (attestation.get("facts") or {}).get("rotation")
    if want is None or got == want:
        return None
    if got is None:
        return None if want == "none" else f"labelled index_rotation {want} but the server reports no rotation"
    return f"labelled index_rotation {want} but the server ran rotation {got}"


def record_from_server(out, name: str, label: dict, endpoint: str) -> tuple[bool, str] | None:
    """At a configuration's end: read the server's attestation (GET /server_info) and
    write it, with its verdict, into the manifest's configs[name]. None when the server
    reports none (or does not answer)."""
    import httpx

    from niah.sweep import record_config
    from niah.tokenize import root_url

    try:
        r = httpx.get(root_url(endpoint) + "/server_info", timeout=10.0)
        info = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        info = None
    attestation = from_server_info(info)
    if attestation is None:
        return None
    valid, reason = verdict(attestation, label)
    record_config(out, name, {"attestation": attestation, "attestation_verdict": {"valid": valid, "reason": reason}})
    return valid, reason


def label_of(config_entry: dict) -> dict:
    """The label of a manifest `configs.<name>` entry: its settings, then its axes."""
    return {**(config_entry.get("settings") or {}), **(config_entry.get("axes") or {})}


def check_configs(manifest: dict, names, where: str) -> None:
    """BadInput (exit 2, one line) if any named configuration's attestation contradicts
    its label (compare and gate call this first)."""
    configs = manifest.get("configs") or {}
    for name in names:
        entry = configs.get(name) or {}
        ok, reason = verdict(entry.get("attestation"), label_of(entry))
        if not ok:
            raise BadInput(f"{where}: configuration {name!r} is invalid: its server's attestation "
                           f"contradicts its label ({reason})")


def report_section(manifest: dict, names) -> str | None:
    """Markdown for `niah report`: each attested configuration, valid or INVALID, and
    what its server ran. None when no configuration was attested."""
    configs = manifest.get("configs") or {}
    rows = []
    for name in names:
        entry = configs.get(name) or {}
        a = entry.get("attestation")
        if not a:
            continue
        ok, reason = verdict(a, label_of(entry))
        arm = f"{a.get('index_dtype')}/{a.get('kernels')}"
        rows.append(f"| `{name}` | {'valid' if ok else '**INVALID**'} | {arm} | "
                    f"{a.get('pool_bytes_per_token')} | {reason} |")
    if not rows:
        return None
    head = ("## Attestation: what each server's indexer ran\n\n"
            "An INVALID configuration's server contradicts its label (compare and gate refuse it).\n\n"
            "| config | verdict | ran (index dtype/kernels) | pool bytes/token | calls / reason |\n"
            "|---|---|---|---|---|\n")
    return head + "\n".join(rows) + "\n"
