"""What weakens a verdict: the caveats `niah gate` (Markdown, JUnit, --json) and the
report's headline (summary.md, index.html) carry beside it, one line each.

- **incomplete** (`incomplete`): a run folder holds fewer measured trials of a
  configuration than its manifest planned (the sweep's lengths x depths x trials, which a
  frozen prompt set fixes too, x the cache states of `--cache-state`; a trial recorded as
  `error` is not measured, and `--resume` runs it again): "N of M planned trials", the
  planned lengths with no measured trial, and the command that finishes it (the sweep's
  own recorded command line with `--resume`).
- **lengths** (`lengths`): the sweep ran with `--approximate-lengths`, or trials whose
  server-counted prompt_tokens is off the requested length by more than the allowance
  (niah.tokens.length_tolerance: max(4 tokens, 0.5%)).
- **changed** (`changed`): between baseline and candidate, the model, the engine or what
  the server says of itself in /v1/models (root, owner, max_model_len) differs.
- **sample** (`sample`): fewer pairs (unpaired: trials per side) at a gated length than
  seeing a drop of the tolerance from the baseline's recall takes at alpha with 80% power
  (niah.report.stats.trials_needed, the count `niah plan` prints), with that command.

Pure: manifests, records and frames in, caveats out.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from niah.report.stats import trials_needed
from niah.tokens import length_tolerance

INCOMPLETE, LENGTHS, CHANGED, SAMPLE = "incomplete", "lengths", "changed", "sample"
SAMPLE_POWER = 0.8
_SERVER_KEYS = ("root", "owned_by", "max_model_len")


@dataclass
class Caveat:
    kind: str
    config: str | None  # None: the whole side
    text: str


def planned(manifest: dict) -> tuple[list[int], int] | None:
    """(planned lengths, trials per configuration) from the manifest's args, or None."""
    args = manifest.get("args") or {}
    try:
        lengths = sorted({int(x) for x in args.get("lengths") or []})
        cells = len(args.get("depths") or []) * int(args.get("trials") or 0) * len(args.get("cache_states") or [0])
    except (TypeError, ValueError):
        return None
    return (lengths, len(lengths) * cells) if lengths and cells else None


def resume_command(manifest: dict, run: str) -> str:
    """The command that finishes the run: its recorded sweep command with --resume."""
    cmd = [str(x) for x in manifest.get("command") or []]
    if len(cmd) >= 2 and cmd[1] == "sweep":
        cmd = ["niah", *cmd[1:]] + ([] if "--resume" in cmd else ["--resume"])
        return shlex.join(cmd)
    return f"niah sweep --resume --out {shlex.quote(run)} (with the run's own options)"


def incomplete(manifest: dict, records: list[dict[str, Any]], run: str,
               configs=None) -> list[Caveat]:
    """A caveat per configuration (all of the manifest's, or `configs`) with fewer measured
    trials than planned."""
    plan = planned(manifest)
    if plan is None:
        return []
    lengths, total = plan
    names = list(configs) if configs is not None else list(manifest.get("configs") or {})
    if not names and not any(not r.get("control") for r in records):
        return [Caveat(INCOMPLETE, None, f"{run} is incomplete: no trial measured of the {total} planned per "
                                         f"configuration; finish it with `{resume_command(manifest, run)}`")]
    measured: dict[str, set] = {n: set() for n in names}
    for r in records:
        if r.get("control") or r.get("outcome") == "error" or r.get("config") not in measured:
            continue
        try:
            key = (int(r["length"]), float(r["depth"]), int(r["trial"]), r.get("cache_state"))
        except (KeyError, TypeError, ValueError):
            continue
        if key[0] in lengths:
            measured[r["config"]].add(key)
    out = []
    for name in names:
        done = measured[name]
        if len(done) >= total:
            continue
        empty = [L for L in lengths if not any(k[0] == L for k in done)]
        where = f"; no measured trial at length {', '.join(map(str, empty))}" if empty else ""
        out.append(Caveat(INCOMPLETE, name, f"`{name}` ({run}) is incomplete: {len(done)} of {total} planned "
                                            f"trials measured{where}; finish it with "
                                            f"`{resume_command(manifest, run)}`"))
    return out


def lengths(manifest: dict, records: list[dict[str, Any]], where: str, configs=None) -> list[Caveat]:
    """Approximate lengths, and trials off their length by more than the allowance."""
    out = []
    if (manifest.get("args") or {}).get("approximate_lengths"):
        out.append(Caveat(LENGTHS, None, f"{where} ran with --approximate-lengths: its prompt lengths are the "
                                         "counter's estimate, not the server's exact count"))
    names = list(configs) if configs is not None else None
    off: dict[str, list[tuple[int, int]]] = {}
    for r in records:
        pt, L = r.get("prompt_tokens"), r.get("length")
        if r.get("control") or not isinstance(pt, int) or not isinstance(L, int) or isinstance(pt, bool):
            continue
        if (names is None or r.get("config") in names) and abs(pt - L) > length_tolerance(L):
            off.setdefault(str(r.get("config")), []).append((L, pt))
    for name, bad in off.items():
        L, pt = max(bad, key=lambda x: abs(x[1] - x[0]) / x[0])
        out.append(Caveat(LENGTHS, name, f"`{name}` ({where}): {len(bad)} trial(s) off their length by more than "
                                         f"max(4 tokens, 0.5%) (worst: {L} asked, {pt} counted by the server)"))
    return out


def server_identity(entry: dict | None) -> dict[str, Any]:
    """What a configuration's server says of itself: model, engine and its /v1/models entry's
    root, owner and max_model_len (a baseline file keeps it as `server_identity`)."""
    entry = entry or {}
    if isinstance(entry.get("server_identity"), dict):
        return dict(entry["server_identity"])
    out: dict[str, Any] = {"model": entry.get("model"), "engine": entry.get("engine")}
    data = ((entry.get("server") or {}).get("models") or {}).get("data") if isinstance(entry.get("server"), dict) \
        else None
    models = [m for m in data or [] if isinstance(m, dict)]
    mine = next((m for m in models if m.get("id") == entry.get("model")), models[0] if models else None)
    for k in _SERVER_KEYS:
        if mine and mine.get(k) is not None:
            out[k] = mine[k]
    return out


def changed(bentry: dict | None, centry: dict | None, label: str) -> list[Caveat]:
    """A caveat when the model or server differs between baseline and candidate (a key
    either side does not report is not compared)."""
    b, c = server_identity(bentry), server_identity(centry)
    diff = [f"{k} {b[k]!r} -> {c[k]!r}" for k in ("model", "engine", *_SERVER_KEYS)
            if b.get(k) is not None and c.get(k) is not None and b[k] != c[k]]
    if not diff:
        return []
    return [Caveat(CHANGED, label, f"`{label}`: the server changed between baseline and candidate "
                                   f"({', '.join(diff)}): a difference may be the server's, not the change's")]


def sample(label: str, rows, tolerance: float, alpha: float) -> list[Caveat]:
    """A caveat when the thinnest gated length has fewer pairs (unpaired: trials per side)
    than seeing a drop of `tolerance` from the baseline's recall takes."""
    per_length = [r for r in rows if r.group != "all" and r.n_a and r.n_b]
    overall = next((r for r in rows if r.group == "all" and r.n_a), None)
    if not per_length or overall is None or tolerance <= 0:
        return []
    recall = round(float(overall.recall_a), 3)
    if recall - tolerance < 0:
        return []
    paired = overall.basis.startswith("paired")
    try:
        plans = trials_needed(recall, recall - tolerance, alpha, SAMPLE_POWER)
    except ValueError:
        return []
    need = next(p.n for p in plans if ("independent" in p.design if paired else p.design == "unpaired"))
    thin = min(per_length, key=lambda r: min(r.n_a, r.n_b))
    have = min(thin.n_a, thin.n_b)
    if have >= need:
        return []
    what = "pairs" if paired else "trials per side"
    return [Caveat(SAMPLE, label, f"`{label}`: the sample is too small to see the tolerance: {have} {what} at length "
                                  f"{thin.group} (the thinnest); seeing a {100 * tolerance:g}-point drop from "
                                  f"{100 * recall:g}% takes about {need} ({100 * SAMPLE_POWER:g}% power): "
                                  f"`niah plan --recall {recall:g} --drop {tolerance:g} --alpha {alpha:g}`; "
                                  "a drop this sample cannot see passes")]
