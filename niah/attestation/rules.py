"""What an attestation must show for a configuration to count: `status(entry)`.

Per segment (one invocation's readings at the start and end of its sweep):

- launched `sglang` and `embedded` configurations must prove what they ran: both readings
  answered; otherwise INVALID (a server that died, a /server_info that errors or is
  missing).
  - SGLang, kernels "stock": the plugin did NOT run: every reading shows SGLang's
    `internal_states` and none carries niah_attestation. SGLang's own kernels are
    unattested beyond that.
  - every other arm (and the embedded server): every scheduler reports niah_attestation
    at start and end, same arm at both, counters that only grew, index dtype, kernels and
    reported facts (attention, index_topk, window) as labelled, and:
    - bf16: every store / logits call ran a niah kernel on bf16 keys (no fp8 path, not
      even captured), SGLang's pool holds a bf16 row (256 B/token on V3.2, 264 on V4),
      and bf16 keys were stored AND read during the sweep (end minus start > 0; warm-up
      and CUDA-graph capture happen before the start reading);
    - kernels "niah" with fp8 keys: every logits call ran a niah kernel, and niah's fp8
      logits ran during the sweep; the pool is not a bf16 one.
- `external` and `command` configurations: what their server reports is judged as above
  (a contradiction is INVALID); labels it does not report (index_dtype, kernels,
  attention, index_topk, window) are UNATTESTED. kernels "stock" is attested by an SGLang
  /server_info with no niah_attestation. No labels: valid.

`status(entry)` is the one place that judges a manifest `configs.<name>` entry: VALID,
INVALID or UNATTESTED, and why; report, compare and gate all use it. Pure functions.
"""

from __future__ import annotations

from niah.attestation.format import add_calls
from niah.axes import stated_labels

VALID, INVALID, UNATTESTED = "valid", "INVALID", "unattested"
LAUNCHED = ("sglang", "embedded")  # niah launches them: they must prove their label
BF16_POOL_BYTES = {256: "DeepSeek-V3.2", 264: "DeepSeek-V4"}  # serving/sglang bf16_cache, v4
KEY_PATHS = ("store", "prefill_logits", "decode_logits")
READ_PATHS = ("decode_logits", "prefill_logits")


def labels(entry: dict) -> dict:
    """The label keys a configuration states (settings, then axes)."""
    return stated_labels(entry)


def status(entry: dict | None) -> tuple[str, str]:
    """(state, reason) of one manifest `configs.<name>` entry (or baseline configuration):
    state is VALID, INVALID or UNATTESTED (module doc)."""
    return judge(entry or {})


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


def _label(entry: dict) -> dict:
    """The stated labels, with what niah's SGLang launcher defaults to."""
    lab = labels(entry)
    if entry.get("engine") == "sglang":
        lab.setdefault("index_dtype", "fp8")
        lab.setdefault("kernels", "niah" if lab["index_dtype"] == "bf16" else "stock")
    return lab


def _fmt(lab: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in lab.items())


def _segments(entry: dict) -> list[dict]:
    rec = entry.get("attestation")
    if isinstance(rec, dict) and "segments" not in rec:  # an older niah: one flat record at the end
        return [{"start": None, "end": {"error": None, "attestation": {**rec, "legacy": True}}}]
    return [s for s in ((rec or {}).get("segments") or []) if isinstance(s, dict)]


def judge(entry: dict) -> tuple[str, str]:
    """(state, reason) of one configuration: the worst of its segments."""
    engine = entry.get("engine")
    segments = _segments(entry)
    if not segments:
        if engine in LAUNCHED:
            how = f" ({entry['status']}: {entry.get('cause') or 'no cause recorded'})" if entry.get("status") not in (None, "done") else ""
            return INVALID, f"no attestation was read from its {engine} server{how}"
        if labels(entry):
            return UNATTESTED, f"labels {_fmt(labels(entry))} are not attested: no attestation was read from its server"
        return VALID, "no labels to attest"
    results = [_segment(s, engine, _label(entry), labels(entry)) for s in segments]
    for state in (INVALID, UNATTESTED):
        for i, (s, reason) in enumerate(results):
            if s == state:
                return s, (f"segment {i + 1} of {len(results)}: " if len(results) > 1 else "") + reason
    return VALID, results[-1][1]


def _problem(r: dict | None, when: str) -> str | None:
    if r is None:
        return f"no /server_info reading at the {when} of the sweep"
    if r.get("error"):
        return f"/server_info at the {when} of the sweep: {r['error']}"
    return None


def _segment(seg: dict, engine: str | None, label: dict, stated: dict) -> tuple[str, str]:
    S, E = seg.get("start"), seg.get("end")
    problem = _problem(E, "end") or _problem(S, "start")
    attested = any(r and r.get("attestation") for r in (S, E))
    if engine in LAUNCHED or attested:
        if problem:
            return INVALID, problem
        if engine == "sglang" and label.get("kernels") == "stock":
            return _stock(S, E)
        for r, when in ((S, "start"), (E, "end")):
            bad = _coverage(r, when, engine)
            if bad:
                return INVALID, bad
        state, reason = _attested(S["attestation"], E["attestation"], label)
        if state != VALID or engine in LAUNCHED:
            return state, reason
        rest = {k: v for k, v in stated.items() if not _reports(E["attestation"], k)}
        if rest:
            return UNATTESTED, f"labels {_fmt(rest)} are not reported by its server ({reason})"
        return VALID, reason
    if stated.get("kernels") == "stock" and not problem and _absent(S) and _absent(E):
        rest = {k: v for k, v in stated.items() if k != "kernels"}
        why = f"niah's plugin absent in all {E['internal_states']} SGLang scheduler(s)"
        return (UNATTESTED, f"labels {_fmt(rest)} are not attested ({why} attests kernels=stock only)") if rest \
            else (VALID, why)
    if stated:
        return UNATTESTED, (f"labels {_fmt(stated)} are not attested: its server reports no niah_attestation"
                            + (f" ({problem})" if problem else ""))
    return VALID, "no labels to attest" + (f" ({problem})" if problem else "")


def _absent(r: dict) -> bool:
    return bool(r.get("internal_states")) and not r.get("attested_states")


def _stock(S: dict, E: dict) -> tuple[str, str]:
    """SGLang's stock arm: the plugin must not have run."""
    for r, when in ((S, "start"), (E, "end")):
        if r.get("internal_states") is None:
            return INVALID, (f"/server_info at the {when} has no internal_states: not SGLang's, so it cannot "
                             "show that niah's plugin was absent")
        if not r["internal_states"]:
            return INVALID, f"/server_info at the {when} lists no scheduler (internal_states is empty)"
        if r.get("attested_states"):
            return INVALID, (f"niah's plugin ran in the stock arm ({r['attested_states']} of "
                             f"{r['internal_states']} scheduler(s) report niah_attestation at the {when})")
    return VALID, (f"SGLang's own paths: niah's plugin absent in all {E['internal_states']} scheduler(s) at "
                   "start and end (its kernels are SGLang's, unattested beyond that)")


def _coverage(r: dict, when: str, engine: str | None) -> str | None:
    """Every scheduler must carry the attestation."""
    n, k = r.get("internal_states"), r.get("attested_states") or 0
    if not r.get("attestation"):
        if engine == "sglang" or n:
            return (f"no niah_attestation in /server_info at the {when}: niah's plugin did not run in SGLang's "
                    "scheduler processes (SGLANG_PLUGINS set without niah?)")
        return f"its server reported no niah_attestation at the {when}"
    if n and k < n:
        return f"niah_attestation in only {k} of {n} SGLang scheduler(s) at the {when}"
    return None


def _reports(a: dict, key: str):
    """The value the attestation states for a label key, or None."""
    facts = a.get("facts") or {}
    if key in ("index_dtype", "kernels"):
        return a.get(key)
    if key == "attention":
        return facts.get("attention") or ("dsa" if a.get("index_dtype") else None)
    if key == "index_rotation":  # stated as the fact `rotation` (attest.set_facts)
        return facts.get("rotation")
    return facts.get(key)


def _total(calls: dict, paths, dtype: str, owner: str | None = None) -> int:
    return sum(int(n.get("eager", 0)) + int(n.get("replayed", 0))
               for p in paths for k, n in ((calls.get(p) or {}).get(dtype) or {}).items()
               if owner is None or k.split(".", 1)[0] == owner)


def _kernels(calls: dict, paths):
    for p in paths:
        for dtype, by_kernel in (calls.get(p) or {}).items():
            for kernel, n in by_kernel.items():
                yield p, dtype, kernel, n


def _attested(A0: dict, A1: dict, label: dict) -> tuple[str, str]:
    for a, when in ((A0, "start"), (A1, "end")):
        if a.get("disagree"):
            return INVALID, f"the schedulers disagree on {', '.join(a['disagree'])} at the {when}"
        if a.get("legacy"):
            return INVALID, ("its attestation names no kernels and has no reading at the start of the sweep "
                             "(written by an older niah); sweep it again")
    arm0 = (A0.get("index_dtype"), A0.get("kernels"))
    arm1 = (A1.get("index_dtype"), A1.get("kernels"))
    if arm0 != arm1:
        return INVALID, f"the server's arm changed during the sweep ({'/'.join(map(str, arm0))} -> {'/'.join(map(str, arm1))})"
    dense = label.get("attention") == "dense"
    for key, want in label.items():
        if dense and key in ("index_dtype", "index_rotation", "index_topk", "window", "kernels"):
            continue
        got = _reports(A1, key)
        if got is None and (key in ("index_dtype", "kernels", "attention")
                            or (key == "index_rotation" and want != "none")):
            return INVALID, f"labelled {key} {want} but its server attests none"
        if got is not None and got != want:
            return INVALID, f"labelled {key} {want} but the server ran {got}"
    grown = add_calls(A1.get("calls") or {}, A0.get("calls") or {}, sign=-1)
    if any(v < 0 for _, _, _, n in _kernels(grown, (*KEY_PATHS, "topk")) for v in n.values()):
        return INVALID, "its counters went down during the sweep (the server restarted?)"
    dtype, kernels = arm1
    if dtype == "bf16":
        bad = _bf16(A1, grown)
        if bad:
            return INVALID, bad
    elif dtype == "fp8" and kernels == "niah":
        bad = _fp8_niah(A1, grown)
        if bad:
            return INVALID, bad
    return VALID, _ran(A1, grown)


def _bf16(a: dict, grown: dict) -> str | None:
    if a.get("fp8_reads_while_bf16"):
        return f"{a['fp8_reads_while_bf16']} fp8 index-key path call(s) while bf16 was configured"
    for path, dtype, kernel, _ in _kernels(a.get("calls") or {}, KEY_PATHS):
        if dtype != "bf16" or kernel.split(".", 1)[0] != "niah":
            return f"bf16 configured but {path} ran {kernel} on {dtype} keys"
    pool = a.get("pool_bytes_per_token")
    if a.get("kernels") == "niah" and pool not in BF16_POOL_BYTES:
        return f"bf16 configured but the pool holds {pool} B/token/layer, not a bf16 row (256 on V3.2, 264 on V4)"
    if not _total(grown, ("store",), "bf16"):
        return "bf16 configured but no bf16 key was stored during the sweep"
    if not _total(grown, READ_PATHS, "bf16"):
        return ("no bf16 index-key read during the sweep (decode/prefill logits: "
                f"{_total(a.get('calls') or {}, READ_PATHS, 'bf16') - _total(grown, READ_PATHS, 'bf16')} before, "
                "none more after; a store at warm-up does not count)")
    return None


def _fp8_niah(a: dict, grown: dict) -> str | None:
    for path, _, kernel, _ in _kernels(a.get("calls") or {}, READ_PATHS):
        if kernel.split(".", 1)[0] != "niah":
            return f"labelled kernels niah but {path} ran {kernel}"
    if a.get("pool_bytes_per_token") in BF16_POOL_BYTES:
        return f"fp8 configured but the pool holds a bf16 row ({a['pool_bytes_per_token']} B/token/layer)"
    if not _total(grown, READ_PATHS, "fp8", owner="niah"):
        return "labelled kernels niah but niah's fp8 logits kernels did not run during the sweep"
    return None


def _ran(a: dict, grown: dict) -> str:
    """What ran during the sweep, per path: calls (eager + CUDA-graph replays) by kernel."""
    if not a.get("index_dtype"):
        return f"attention {(a.get('facts') or {}).get('attention') or 'dense'}: no indexer configured"
    arm = f"{a.get('index_dtype')}/{a.get('kernels')}"
    if a.get("pool_bytes_per_token"):
        arm += f", {a['pool_bytes_per_token']} B/token"
    parts = []
    for path in (*KEY_PATHS, "topk"):
        by_kernel: dict[str, int] = {}
        for _, _, kernel, n in _kernels(grown, (path,)):
            by_kernel[kernel] = by_kernel.get(kernel, 0) + int(n.get("eager", 0)) + int(n.get("replayed", 0))
        ran = {k: v for k, v in by_kernel.items() if v}
        if ran:
            parts.append(f"{path} +{sum(ran.values())} ({', '.join(sorted(ran))})")
    return arm + "; during the sweep: " + ("; ".join(parts) if parts else "no indexer call")
