"""What an attestation must show for a configuration to count: `status(entry)`.

Per segment (one invocation's readings at the start and end of its sweep). A segment
with no end reading (niah killed, SIGKILL; its server unreachable, an outage) is closed by
the next segment's start reading (the `--resume` that followed) when the server attests
the same thing there (same arm, same facts): then its start and that reading are judged,
but not its counters' growth (the server may have restarted: counters reset by a restart
between segments are not "counters went down"). A server that comes back different (at
a bridge, or between one segment's end and the next one's start) is INVALID, naming what
changed (`index_dtype fp8 -> bf16`). Every label is compared with EVERY reading, start
and end, of every segment.

- launched `sglang` and `embedded` configurations must prove what they ran: both readings
  answered; otherwise INVALID (a server that died, a /server_info that errors or is
  missing).
  - SGLang, kernels "stock": the plugin did NOT run: every reading shows SGLang's
    `internal_states` and none carries niah_attestation. The index dtype is proven from
    SGLang's own arguments in the same /server_info: fp4 needs
    `enable_deepseek_v4_fp4_indexer` true in every reading (absent: INVALID), fp8 is
    INVALID where a reading shows it true. SGLang's own kernels are unattested beyond that.
  - every other arm (and the embedded server): every scheduler reports niah_attestation
    at start and end, same arm at both, counters that only grew, index dtype, kernels and
    reported facts (attention, index_topk, window) as labelled, and:
    - bf16: every store / logits call ran a niah kernel on bf16 keys (no fp8 path, not
      even captured), SGLang's pool holds a bf16 row (256 B/token on V3.2, 264 on V4),
      and bf16 keys were stored AND read during the sweep (end minus start > 0; warm-up
      and CUDA-graph capture happen before the start reading);
    - kernels "niah" with fp8 keys: every logits call ran a niah kernel, and niah's fp8
      logits ran during the sweep; the pool is not a bf16 one.
    The "during the sweep" proof (bf16 keys stored and read, niah's fp8 logits ran) must
    come from a segment that has BOTH its own readings (a segment closed by the next
    one's start proves nothing about growth); a segment with both readings in which no
    indexer call ran at all (a resume with nothing left to ask) needs none, so long as
    another one proves it.
  - the serving paths (page_size, prefill_chunk, prefix_cache, index_compress): a server
    that states one (null included: it ran without it) must state what the label says,
    else INVALID; one that does not state it leaves the label UNATTESTED.
  - a label the server never reports is UNATTESTED, launched or not: SGLang's plugin
    reports index_dtype, kernels and the facts rotation / query / store (attention dsa
    follows from an index dtype), not index_topk or window; the embedded server reports
    attention, index_topk, window and rotation as well.
- `external` and `command` configurations: what their server reports is judged as above
  (a contradiction is INVALID); labels it does not report (index_dtype, kernels,
  attention, index_topk, window) are UNATTESTED. kernels "stock" is attested by an SGLang
  /server_info with no niah_attestation. No labels: valid.
- a configuration absent from the manifest (`status(None)`: trials under a name no sweep
  of the run recorded) is INVALID.

What each recorded engine name implies (must it prove its label, does it list SGLang
schedulers, which labels its launcher defaults) is data in niah.attestation.engines.

`status(entry)` is the one place that judges a manifest `configs.<name>` entry: VALID,
INVALID or UNATTESTED, and why; report, compare and gate all use it. Pure functions.
"""

from __future__ import annotations

from niah.attestation.calls import (KEY_PATHS, bf16_grown, bf16_paths, fp8_niah_grown, fp8_niah_paths, kernel_calls,
                                    ran_summary)
from niah.attestation.engines import facts
from niah.attestation.format import MEASURED_FACTS, add_calls
from niah.axes import PATH_KEYS, stated_labels
from niah.kernels import forms

VALID, INVALID, UNATTESTED = "valid", "INVALID", "unattested"


def labels(entry: dict) -> dict:
    """The label keys a configuration states (settings, then axes)."""
    return stated_labels(entry)


def status(entry: dict | None) -> tuple[str, str]:
    """(state, reason) of one manifest `configs.<name>` entry (or baseline configuration):
    state is VALID, INVALID or UNATTESTED (module doc). None (no such entry) is INVALID."""
    if entry is None:
        return INVALID, "absent from the manifest: its trials were not written by a sweep of this run"
    return judge(entry)


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
    """The stated labels, with what the engine's launcher defaults to (niah.attestation.engines)."""
    return facts(entry.get("engine")).label_defaults(labels(entry))


def _fmt(lab: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in lab.items())


def _segments(entry: dict) -> list[dict]:
    rec = entry.get("attestation")
    if isinstance(rec, dict) and "segments" not in rec:  # an older niah: one flat record at the end
        return [{"start": None, "end": {"error": None, "attestation": {**rec, "legacy": True}}}]
    return [s for s in ((rec or {}).get("segments") or []) if isinstance(s, dict)]


def judge(entry: dict) -> tuple[str, str]:
    """(state, reason) of one configuration: the worst of its segments (module doc)."""
    engine = entry.get("engine")
    segments = _segments(entry)
    if not segments:
        if facts(engine).must_prove:
            how = (f" ({entry['status']}: {entry.get('cause') or 'no cause recorded'})"
                   if entry.get("status") not in (None, "done") else "")
            return INVALID, f"no attestation was read from its {engine} server{how}"
        if labels(entry):
            return UNATTESTED, f"labels {_fmt(labels(entry))} are not attested: no attestation was read from its server"
        return VALID, "no labels to attest"
    n = len(segments)
    where = (lambda i: f"segment {i + 1} of {n}: ") if n > 1 else (lambda i: "")
    changed = came_back_different(segments)
    if changed:
        i, what = changed
        return INVALID, where(i) + what
    results, growth = [], []
    for i, seg in enumerate(segments):
        nxt = segments[i + 1].get("start") if i + 1 < n else None
        state, reason, proof = _segment(seg, engine, _label(entry), labels(entry), nxt)
        results.append((state, reason))
        growth.append(proof)
    for i, (s, reason) in enumerate(results):
        if s == INVALID:
            return s, where(i) + reason
    judged = [(i, g) for i, g in enumerate(growth) if g is not None]
    failed = [(i, why) for i, (kind, why) in judged if kind == "failed"]
    if not failed and judged and not any(kind == "proved" for _, (kind, _) in judged):
        failed = [(i, why) for i, (_, why) in judged[:1]]  # only idle segments: the first one's why
    if failed:
        return INVALID, where(failed[0][0]) + failed[0][1]
    for i, (s, reason) in enumerate(results):
        if s == UNATTESTED:
            return s, where(i) + reason
    return VALID, results[-1][1]


def _problem(r: dict | None, when: str) -> str | None:
    if r is None:
        return f"no /server_info reading at the {when} of the sweep"
    if r.get("error"):
        return f"/server_info at the {when} of the sweep: {r['error']}"
    return None


def _identity(a: dict) -> dict:
    """What a reading's attestation says the server is (compared across readings)."""
    out = {"index_dtype": a.get("index_dtype"), "kernels": a.get("kernels")}
    if a.get("pool_bytes_per_token") is not None:  # known once a key was stored
        out["pool_bytes_per_token"] = a["pool_bytes_per_token"]
    for k, v in (a.get("facts") or {}).items():
        if k not in MEASURED_FACTS:
            out.setdefault(k, v)
    return out


def _changes(a0: dict, a1: dict) -> list[str]:
    """"key old -> new" for what two attestations state differently (keys both state)."""
    i0, i1 = _identity(a0), _identity(a1)
    return [f"{k} {i0[k]} -> {i1[k]}" for k in i0 if k in i1 and i0[k] != i1[k]
            and not (k == "pool_bytes_per_token" and (i0[k] is None or i1[k] is None))]


def _usable(r: dict | None) -> bool:
    return bool(r) and not r.get("error")


def came_back_different(segments: list[dict]) -> tuple[int, str] | None:
    """(segment index, why) when a resumed segment's server attests something else than
    the one before it did (its end reading, else its start)."""
    for i in range(1, len(segments)):
        prev, start = segments[i - 1], segments[i].get("start")
        before = next((r for r in (prev.get("end"), prev.get("start")) if _usable(r) and r.get("attestation")), None)
        if before is None or not _usable(start) or not start.get("attestation"):
            continue
        diff = _changes(before["attestation"], start["attestation"])
        if diff:
            return i, f"the server came back different when the sweep resumed: {', '.join(diff)}"
    return None


def _segment(seg: dict, engine: str | None, label: dict, stated: dict,
             nxt: dict | None) -> tuple[str, str, tuple | None]:
    """(state, reason, growth): growth is None (no proof needed, or none judged) or
    (kind, why): kind "proved", "failed", or "idle" (no indexer call at all, a resume with
    nothing to ask: needs none if another segment proves it)."""
    S, E = seg.get("start"), seg.get("end")
    bridged = not _usable(E) and _usable(nxt) and S is not None
    if bridged:
        E = nxt  # closed by the resumed sweep's start reading (module doc)
    problem = _problem(E, "end") or _problem(S, "start")
    attested = any(r and r.get("attestation") for r in (S, E))
    if facts(engine).must_prove or attested:
        if problem:
            return INVALID, problem, None
        if facts(engine).stock_arm and label.get("kernels") == "stock":
            return (*_stock(S, E, label.get("index_dtype", forms.DEFAULT)), None)
        for r, when in ((S, "start"), (E, "end")):
            bad = _coverage(r, when, engine)
            if bad:
                return INVALID, bad, None
        state, reason, growth, rest = _attested(S["attestation"], E["attestation"], label, bridged)
        if state != VALID:
            return state, reason, None
        rest = {k: v for k, v in stated.items() if k in rest}
        if rest:
            return UNATTESTED, f"labels {_fmt(rest)} are not reported by its server ({reason})", growth
        return VALID, reason, growth
    if stated.get("kernels") == "stock" and not problem and _absent(S) and _absent(E):
        rest = {k: v for k, v in stated.items() if k != "kernels"}
        why = f"niah's plugin absent in all {E['internal_states']} SGLang scheduler(s)"
        return ((UNATTESTED, f"labels {_fmt(rest)} are not attested ({why} attests kernels=stock only)", None) if rest
                else (VALID, why, None))
    if stated:
        return UNATTESTED, (f"labels {_fmt(stated)} are not attested: its server reports no niah_attestation"
                            + (f" ({problem})" if problem else "")), None
    return VALID, "no labels to attest" + (f" ({problem})" if problem else ""), None


def _absent(r: dict) -> bool:
    return bool(r.get("internal_states")) and not r.get("attested_states")


def _stock(S: dict, E: dict, index_dtype: str = forms.DEFAULT) -> tuple[str, str]:
    """SGLang's stock arm: the plugin must not have run; its index dtype as SGLang's own
    arguments report it: a form SGLang turns on by its own argument (the table's
    `sglang_field`; fp4: enable_deepseek_v4_fp4_indexer) needs it on in every reading, and
    no other form's argument may be on (fp8: the fp4 indexer never on)."""
    for r, when in ((S, "start"), (E, "end")):
        if r.get("internal_states") is None:
            return INVALID, (f"/server_info at the {when} has no internal_states: not SGLang's, so it cannot "
                             "show that niah's plugin was absent")
        if not r["internal_states"]:
            return INVALID, f"/server_info at the {when} lists no scheduler (internal_states is empty)"
        if r.get("attested_states"):
            return INVALID, (f"niah's plugin ran in the stock arm ({r['attested_states']} of "
                             f"{r['internal_states']} scheduler(s) report niah_attestation at the {when})")
    own = forms.get(index_dtype)
    field = own.sglang_field if own is not None else None
    for form in forms.forms():
        if form.sglang_field is None or form.sglang_field == field:
            continue
        for r, when in ((S, "start"), (E, "end")):
            if (r.get("server_args") or {}).get(form.sglang_field) is True:
                return INVALID, (f"labelled index_dtype {index_dtype} but its SGLang reports {form.sglang_field}=true "
                                 f"in its own arguments at the {when} ({form.name} index keys)")
    if field is None:
        return VALID, (f"SGLang's own paths: niah's plugin absent in all {E['internal_states']} scheduler(s) at "
                       f"start and end{_shown_args(S, E)} (its kernels are SGLang's, unattested beyond that)")
    for r, when in ((S, "start"), (E, "end")):
        on = (r.get("server_args") or {}).get(field)
        if on is not True:
            shown = "does not report it" if on is None else f"reports {field}={on!r}"
            return INVALID, (f"labelled index_dtype {index_dtype} but its SGLang {shown} in its own arguments at the "
                             f"{when} (/server_info; {index_dtype} keys need {field} true)")
    return VALID, (f"SGLang's own paths: niah's plugin absent in all {E['internal_states']} scheduler(s) at "
                   f"start and end{_shown_args(S, E, field)} (its {index_dtype} index keys and kernels are "
                   "SGLang's, unattested beyond that)")


def _shown_args(S: dict, E: dict, field: str | None = None) -> str:
    """"; <field>=<end value> in SGLang's own arguments at start and end" when both readings
    report the form's argument (a form without one: the first argument of the table's
    forms that both report, as SGLang 0.5.23 reports the fp4 indexer's off in an fp8 arm)."""
    fields = [field] if field else [f.sglang_field for f in forms.forms() if f.sglang_field]
    for name in fields:
        start, end = ((r.get("server_args") or {}).get(name) for r in (S, E))
        if start is not None and end is not None:
            return f"; {name}={str(end).lower()} in SGLang's own arguments at start and end"
    return ""


def _coverage(r: dict, when: str, engine: str | None) -> str | None:
    """Every scheduler must carry the attestation."""
    n, k = r.get("internal_states"), r.get("attested_states") or 0
    if not r.get("attestation"):
        if facts(engine).schedulers or n:
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
    if key == "index_query_dtype":  # stated as the fact `query` (SGLang's plugin: "fp8")
        return facts.get("query")
    return facts.get(key)


def label_contradiction(entry: dict, a: dict) -> str | None:
    """What in attestation `a` (a start reading's) contradicts the entry's labels, or None."""
    bad, _ = _check_label(a, _label(entry), "start")
    return bad if bad and "but the server ran" in bad else None


def _check_label(a: dict, label: dict, when: str) -> tuple[str | None, set]:
    """(contradiction or None, label keys this reading does not report)."""
    dense = label.get("attention") == "dense"
    unreported = set()
    at = "" if when == "end" else f" at the {when} of the sweep"
    for key, want in label.items():
        if dense and key in ("index_dtype", "index_rotation", "index_query_dtype", "rescore_factor", "index_topk",
                             "window", "kernels", "index_compress"):
            continue
        got = _reports(a, key)
        if key in PATH_KEYS and key in (a.get("facts") or {}):  # stated, null included: the path ran as it says
            if got != want:
                return f"labelled {key} {want} but the server ran {'none' if got is None else got}{at}", unreported
            continue
        if got is None and (key in ("index_dtype", "kernels", "attention")
                            or (key == "index_rotation" and want != "none")):
            return f"labelled {key} {want} but its server attests none{at}", unreported
        if got is None:
            unreported.add(key)
        elif got != want:
            return f"labelled {key} {want} but the server ran {got}{at}", unreported
    return None, unreported


def _attested(A0: dict, A1: dict, label: dict, bridged: bool = False) -> tuple[str, str, tuple | None, set]:
    """(state, reason, growth, unreported label keys) of a segment's two attestations
    (A1 is the next segment's start when `bridged`)."""
    for a, when in ((A0, "start"), (A1, "end")):
        if a.get("disagree"):
            return INVALID, f"the schedulers disagree on {', '.join(a['disagree'])} at the {when}", None, set()
        if a.get("legacy"):
            return INVALID, ("its attestation names no kernels and has no reading at the start of the sweep "
                             "(written by an older niah); sweep it again"), None, set()
    arm0 = (A0.get("index_dtype"), A0.get("kernels"))
    arm1 = (A1.get("index_dtype"), A1.get("kernels"))
    if bridged and _changes(A0, A1):
        return INVALID, ("the sweep stopped without a reading at its end and the server came back different: "
                         + ", ".join(_changes(A0, A1))), None, set()
    if arm0 != arm1:
        return (INVALID, f"the server's arm changed during the sweep ({'/'.join(map(str, arm0))} -> "
                         f"{'/'.join(map(str, arm1))})", None, set())
    if _changes(A0, A1):
        return INVALID, f"the server changed during the sweep: {', '.join(_changes(A0, A1))}", None, set()
    unreported: set = set()
    for a, when in ((A1, "end"), (A0, "start")):
        bad, missing = _check_label(a, label, when)
        if bad:
            return INVALID, bad, None, set()
        unreported |= missing
    grown = add_calls(A1.get("calls") or {}, A0.get("calls") or {}, sign=-1)
    if bridged:
        grown = {}  # the counters of a segment closed by the next start prove nothing (module doc)
    elif any(v < 0 for _, _, _, n in kernel_calls(grown, (*KEY_PATHS, "topk")) for v in n.values()):
        return INVALID, "its counters went down during the sweep (the server restarted?)", None, set()
    dtype, kernels = arm1
    growth = None
    proof = _proof(dtype, kernels)
    if proof is not None:
        for a in (A0, A1):  # what ran up to each reading
            bad = bf16_paths(a) if proof == "niah-keys" else fp8_niah_paths(a)
            if bad:
                return INVALID, bad, None, set()
        if not bridged:
            idle = not any(int(n.get("eager", 0)) + int(n.get("replayed", 0))
                           for _, _, _, n in kernel_calls(grown, (*KEY_PATHS, "topk")))
            why = bf16_grown(A1, grown) if proof == "niah-keys" else fp8_niah_grown(grown)
            growth = ("proved", None) if why is None else ("idle" if idle else "failed", why)
    reason = ran_summary(A1, grown) + (" (closed by the resumed sweep's start reading)" if bridged else "")
    return VALID, reason, growth, unreported


def _proof(dtype: str | None, kernels: str | None) -> str | None:
    """What the arm's form asks of its counters (niah.kernels.forms: `proof`): "niah-keys"
    (bf16: niah's kernels on its keys, stored and read during the sweep), "niah-reads" with
    kernels niah (fp8: niah's logits read them during the sweep), or None."""
    form = forms.get(dtype) if isinstance(dtype, str) else None
    if form is None or form.proof is None:
        return None
    if form.proof == "niah-reads" and kernels != forms.NIAH:
        return None
    return form.proof
