"""The CI regression gate: does the candidate hold the baseline's recall?

Per configuration, per length present on both sides, and over all of them:

- **regression** when the candidate's recall is below the baseline's by more than
  `tolerance` (absolute, e.g. 0.05 = 5 points) *and* the drop is significant at `alpha`:
  McNemar's exact two-sided test on the pairs where both sides saw the same prompt; when
  nothing pairs, the Newcombe hybrid Wilson-score interval of the difference (level
  1 - alpha) lies entirely below zero. A raw drop without the evidence passes; so does a
  significant drop within the tolerance.
- **outage** when the candidate could not answer: no answered trial at that length, or a
  share of `error` trials above `max_error_rate`. Errors are never counted as misses, but
  a gate cannot pass a candidate it could not measure.
- **outage** too when the candidate does not cover the baseline: every baseline trial
  must have its counterpart in the candidate (the same prompt when the sides pair by
  prompt hash, else the same (length, depth, trial)), and every (length, depth) cell the
  baseline answered must have an answered candidate trial. A length, a depth or a trial
  the candidate lacks (a missing length, a line cut short, a sweep stopped early) is
  named in the case's message: the gate never passes what it did not see.
- per **cache state** (niah.sweep.cache_state) when either side swept with `--cache-state`:
  each state the baseline has is gated on its own (cases named `CONFIG [cache STATE]`,
  pairs only within the state); a state the candidate lacks is an outage, one only the
  candidate has is named in a note.
- **skipped** for a length where the baseline itself answered nothing (its outage is not
  the candidate's fault).
- with `metric` "rank" or "both", the **needle rank** (niah/report/ranks.py) per length and
  overall: a regression when, on identical prompts, the candidate's needle sits deeper
  in the index scores (median ratio of rank / k above 1 + `rank_tolerance`, Wilcoxon
  signed-rank p < alpha): the needle moved toward the cut before any answer flipped.
  "rank" alone keeps the answer metric's outage checks. Beside it, over all lengths, its
  two companions from the same probe (niah.report.ranks.index_rows), judged with the same
  tolerance: **needle kept** (a regression when the candidate keeps a smaller share of the
  needle's tokens: ratio below 1 - tolerance, B lower, p < alpha) and **selection fidelity**
  (when its selection misses more of the exact-key top-k: miss ratio above 1 + tolerance,
  B lower, p < alpha). A top-k that keeps fewer keys than attested leaves the scores, and
  so the rank, where they were; a selection that reads slightly wrong keys can move no
  answer on a small sample; each shows in one of these first.
- with `--residues` runs on both sides, one case per length residue too, pooled over the
  common lengths (niah.report.residues): a residue that regresses fails the gate.
- lengths at or below a configuration's index_topk are named in a note: every key is
  kept there, so those lengths do not exercise the indexer.
- a configuration is gated only when its attestation holds (niah/attestation/): an
  INVALID one is bad input (exit 2), an unattested one too unless `accept_unattested`
  (then a note says so); a baseline whose server attests planted faults (`niah serve
  --fault`) is bad input too.
- **caveats** (niah.report.caveats) say what weakens the verdict: a side's run incomplete
  (N of M planned trials, the lengths with no trial, the `--resume` command), lengths
  approximate or off by more than the allowance, the model or server changed between
  baseline and candidate, a sample too small to see the tolerance. An incomplete candidate
  run is an outage, never bad input: one stopped before its first trial, or before any
  length the baseline has, fails with exit 1 and the command that finishes it.

Both sides are read through niah.runs.integrity (niah.report.baseline.read_side): a side
with duplicated trial keys, unreadable lines or fields, or trials outside its prompt set
is bad input.

Exit codes (niah gate): 0 holds, 1 regression or outage, 2 bad input (missing files, no
overlap that an incomplete candidate does not explain, schema mismatch, a side that fails
its integrity check). niah.report.gate_output writes the Markdown and JUnit. Each test is at level
alpha with no multiplicity correction; the overall row pools every common length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from niah.attestation import check_baseline, check_configs, shown_state
from niah.report import caveats as cv
from niah.errors import BadInput
from niah.report.baseline import read_side
from niah.report.cache_report import by_state
from niah.report.data import trials_frame
from niah.report.compare import ALL, Row, check_pairable, compare
from niah.report.coverage import uncovered
from niah.report.ranks import (FIDELITY, KEPT, index_is_regression, index_rows, rank_compare, rank_is_regression,
                               rank_pairs)
from niah.regime import as_regime
from niah.report.residues import has_residues, modulus_of
from niah.regime import at_or_below_k, config_regime

PASS, REGRESSION, OUTAGE, SKIPPED = "pass", "regression", "outage", "skipped"


@dataclass
class Case:
    config: str
    length: int | str  # a length or "all"
    status: str
    row: Row | None
    message: str
    metric: str = "answer"  # "answer" (recall), "rank" (the needle's rank / k), "kept" or "fidelity" (INDEX_NAMES)
    residue: str | None = None  # "3 mod 4": pooled over the lengths at one residue (niah.report.residues)

    @property
    def name(self) -> str:
        where = "all lengths" if self.length == ALL else f"length {self.length}"
        where = f"residue {self.residue}" if self.residue else where
        return where + (f" {INDEX_NAMES[self.metric]}" if self.metric in INDEX_NAMES else "")


INDEX_NAMES = {"rank": "needle rank", KEPT: "needle kept", FIDELITY: "selection fidelity"}  # the probe's cases


@dataclass
class GateResult:
    baseline: str
    candidate: str
    tolerance: float
    alpha: float
    max_error_rate: float
    cases: list[Case] = field(default_factory=list)
    pairing: dict[str, str | None] = field(default_factory=dict)  # config -> method
    config_map: dict[str, str] = field(default_factory=dict)  # candidate config -> baseline config
    notes: list[str] = field(default_factory=list)
    metric: str = "answer"          # answer, rank or both
    rank_tolerance: float = 0.10    # the rank metric's tolerance
    caveats: list[cv.Caveat] = field(default_factory=list)  # what weakens the verdict
    attestation: dict[str, str] = field(default_factory=dict)  # config -> shown state (valid, n/a, unattested)

    @property
    def failed(self) -> list[Case]:
        return [c for c in self.cases if c.status in (REGRESSION, OUTAGE)]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    @property
    def verdict(self) -> str:
        return verdict_of(self.cases)


def verdict_of(cases) -> str:
    """The one verdict of some cases (a gate's, or one configuration's): PASS, REGRESSION,
    OUTAGE, or REGRESSION + OUTAGE where both kinds failed. Gate, its JSON and the report's
    headline all say it through this."""
    kinds = {c.status for c in cases} & {REGRESSION, OUTAGE}
    return " + ".join(k.upper() for k in (REGRESSION, OUTAGE) if k in kinds) or PASS.upper()


def _match_configs(base, cand, config: str | None, planned=()) -> dict[str, str]:
    """candidate config -> baseline config; `planned`: the candidate manifest's
    configurations (a planned one without trials is matched, and found incomplete)."""
    bn = list(dict.fromkeys(base["config"]))
    cn = list(dict.fromkeys([*cand["config"], *planned]))
    if config:
        if config not in bn:
            raise BadInput(f"baseline has no configuration {config!r}; it has {bn}")
        if config not in cn:
            raise BadInput(f"candidate has no configuration {config!r}; it has {cn}")
        return {config: config}
    common = [c for c in cn if c in bn]
    if common:
        return {c: c for c in common}
    if len(bn) == 1 and len(cn) == 1:
        return {cn[0]: bn[0]}
    if not cn:  # nothing planned, nothing run: every baseline configuration is missing
        return {}
    raise BadInput(f"no configuration in common (baseline {bn}, candidate {cn}); pass --config")


def fmt_pct(x: float) -> str:
    return "—" if x != x else f"{100 * x:.1f}%"


def _message(row: Row, tolerance: float, alpha: float) -> str:
    ev = (f"McNemar exact p={row.p:.3g} ({row.losses} lost / {row.wins} gained)" if row.basis.startswith("paired")
          else f"unpaired, {100 * (1 - alpha):g}% Newcombe interval [{100 * row.lo:+.1f}, {100 * row.hi:+.1f}] pp")
    return (f"recall {fmt_pct(row.recall_a)} -> {fmt_pct(row.recall_b)} ({100 * row.diff:+.1f} pp, tolerance "
            f"{100 * tolerance:g} pp); {ev}")


def _rank_cases(label: str, b, c, alpha: float, tolerance: float) -> list[Case]:
    """The needle-rank cases of one configuration (baseline b = A, candidate c = B)."""
    cases = []
    for r in rank_compare(b, c, alpha):
        if r.n == 0:
            cases.append(Case(label, r.group, SKIPPED, None, "no pair with a needle rank on both sides "
                              "(no indexer probe, or the prompt is not longer than k)", "rank"))
            continue
        msg = (f"rank/k {r.median_a:.3g} -> {r.median_b:.3g}, median ratio {r.ratio:.3g} (tolerance "
               f"{1 + tolerance:.3g}), Wilcoxon p={r.p:.3g}, sign p={r.sign_p:.3g}, r={r.r:+.2f}, "
               f"{r.deeper} deeper / {r.shallower} higher of {r.n} pairs")
        cases.append(Case(label, r.group, REGRESSION if rank_is_regression(r, tolerance) else PASS, None, msg, "rank"))
    probed = any(x.status != SKIPPED for x in cases)
    for r in index_rows(rank_pairs(b, c), alpha):
        if r.n == 0:
            if probed:                    # no probe at all: the rank's skipped cases already say so
                cases.append(Case(label, ALL, SKIPPED, None, f"no pair with a {INDEX_NAMES[r.measure]} on both sides "
                                  "(a baseline exported before niah recorded it: export it again)", r.measure))
            continue
        what = ("share of the needle kept" if r.measure == KEPT else "fidelity")
        bound = (f"ratio {r.ratio:.3g} (tolerance {1 - tolerance:.3g})" if r.measure == KEPT
                 else f"miss ratio {r.ratio:.3g} (tolerance {1 + tolerance:.3g})")
        msg = (f"{what} {r.mean_a:.4g} -> {r.mean_b:.4g}, {bound}, Wilcoxon p={r.p:.3g}, r={r.r:+.2f}, "
               f"{r.lower} lower / {r.higher} higher of {r.n} pairs")
        cases.append(Case(label, ALL, REGRESSION if index_is_regression(r, tolerance) else PASS, None, msg,
                          r.measure))
    return cases


def _below_k_note(label: str, manifest: dict, name: str, df, lengths: list[int]) -> str | None:
    k = config_regime((manifest.get("configs") or {}).get(name))
    if k is None:
        ks = [v.get("k") for v in df["indexer"] if isinstance(v, dict) and v.get("k")]
        k = as_regime(ks[0]) if ks else None
    low = at_or_below_k(lengths, k)
    if not low:
        return None
    return (f"`{label}`: lengths {', '.join(map(str, low))} are at or below {k.words()}: every key is kept "
            "there, so they do not exercise the indexer")


def _status(row, sub, tolerance: float, alpha: float, max_error_rate: float, where: str) -> tuple[str, str]:
    """The gate's rule for one compared group (`row`) whose candidate trials are `sub`."""
    if (float(sub["is_error"].mean()) if len(sub) else 1.0) > max_error_rate:
        return OUTAGE, (f"candidate outage: {int(sub['is_error'].sum())}/{len(sub)} trials errored "
                        f"(max error rate {100 * max_error_rate:g}%)")
    if row.n_a == 0:
        return SKIPPED, f"baseline has no answered trials {where}"
    if row.n_b == 0:
        return OUTAGE, f"candidate has no answered trials {where}"
    if row.diff < -tolerance and row.significant:
        return REGRESSION, _message(row, tolerance, alpha)
    return PASS, _message(row, tolerance, alpha)


def answer_cases(label: str, b, c, tolerance: float, alpha: float,
                 max_error_rate: float) -> tuple[list[Case], str | None]:
    """The answer metric's cases of candidate trials `c` against baseline trials `b` (one
    configuration each, their common lengths), per length and overall, and the pairing
    method: the gate's rule (the module's docstring). The report's headline uses it too."""
    rows, method = compare(b, c, ["length"], alpha)
    gaps = uncovered(b, c, method)
    cases = []
    for row in rows:
        sub = c if row.group == ALL else c[c["length"] == row.group]
        status, msg = _status(row, sub, tolerance, alpha, max_error_rate, "here")
        if row.group in gaps:  # not seen is not a pass
            msg = gaps[row.group] + (f"; {msg}" if status == OUTAGE else "")
            status = OUTAGE
        cases.append(Case(label, row.group, status, row, msg))
    return cases, method


def _residue_cases(label: str, b, c, modulus: int | None, tolerance: float, alpha: float,
                   max_error_rate: float) -> list[Case]:
    """One case per length residue when both sides carry residues (niah.report.residues)."""
    if not (has_residues(b) and has_residues(c)):
        return []
    rows, _ = compare(b[b["residue"].notna()], c[c["residue"].notna()], ["residue"], alpha, overall=False)
    cases = []
    for row in rows:
        status, msg = _status(row, c[c["residue"] == row.group], tolerance, alpha, max_error_rate,
                              "at this residue")
        where = f"{int(row.group)} mod {modulus}" if modulus else str(int(row.group))
        cases.append(Case(label, ALL, status, row, msg, residue=where))
    return cases


def run_gate(baseline: Path | str, candidate: Path | str, config: str | None = None, tolerance: float = 0.05,
             alpha: float = 0.05, max_error_rate: float = 0.1, metric: str = "answer",
             rank_tolerance: float = 0.10, accept_unattested: bool = False) -> GateResult:
    """Gate CANDIDATE (run folder or baseline file) against BASELINE (either). BadInput
    when a side fails its integrity check (niah.runs.integrity), or a gated configuration
    is INVALID, or unattested without `accept_unattested`."""
    if metric not in ("answer", "rank", "both"):
        raise BadInput(f"--metric must be answer, rank or both, not {metric!r}")
    if not rank_tolerance >= 0:
        raise BadInput(f"--rank-tolerance must be >= 0, got {rank_tolerance}")

    if not 0 <= tolerance < 1:
        raise BadInput(f"--tolerance must be in [0, 1), got {tolerance}")
    if not 0 < alpha < 1:
        raise BadInput(f"--alpha must be in (0, 1), got {alpha}")
    if not 0 <= max_error_rate <= 1:
        raise BadInput(f"--max-error-rate must be in [0, 1], got {max_error_rate}")
    bside, cside = read_side(baseline), read_side(candidate, empty_ok=True)
    bman, base, bwhat = bside.manifest, trials_frame(bside.records), bside.what
    cman, cand, cwhat = cside.manifest, trials_frame(cside.records), cside.what
    res = GateResult(bwhat, cwhat, tolerance, alpha, max_error_rate, metric=metric, rank_tolerance=rank_tolerance)
    res.notes += [f"{side.what}: {n}" for side in (bside, cside) for n in side.notes]
    res.config_map = _match_configs(base, cand, config, list(cman.get("configs") or {}))
    check_pairable(base, cand, bwhat, cwhat)  # --decode-first, --multi-turn: part of the prompt, never paired across
    # attestation missing / contradicting its label, or unattested labels: exit 2
    res.notes += check_configs(bman, res.config_map.values(), bwhat, accept_unattested)
    check_baseline(bman, res.config_map.values(), bwhat)  # a server with planted faults is no baseline
    res.notes += check_configs(cman, res.config_map.keys(), cwhat, accept_unattested)
    cut = _side_caveats(res, bside, cside)  # the candidate's incomplete configurations -> why
    overlap_any = False
    for cname, bname in res.config_map.items():
        parts, extra_states = by_state(base[base["config"] == bname], cand[cand["config"] == cname])
        if extra_states:
            res.notes.append(f"`{cname}`: cache state(s) {', '.join(extra_states)} are not in the baseline "
                             "(not gated)")
        for state, b, c in parts:
            overlap_any |= _gate_config(res, cname, bname, b, c, state, bman, cman, cut, metric,
                                         rank_tolerance)
    if config is None:
        for bname in dict.fromkeys(base["config"]):
            if bname not in res.config_map.values():
                res.cases.append(Case(bname, ALL, OUTAGE, None,
                                      "configuration is in the baseline but not in the candidate"
                                      + (f"; {cut[None]}" if None in cut else "")))
    if not overlap_any and not _explains(cut, cman, base):
        raise BadInput(f"{bwhat} and {cwhat} do not overlap (no length in common for {list(res.config_map)})")
    return res


def _gate_config(res: GateResult, cname: str, bname: str, b, c, state: str | None, bman: dict, cman: dict,
                 cut: dict, metric: str, rank_tolerance: float) -> bool:
    """Gate one configuration's trials `c` against the baseline's `b` in one cache state
    (None: not controlled on either side); adds its cases and notes to `res`. Returns
    whether the two sides share a length."""
    tolerance, alpha, max_error_rate = res.tolerance, res.alpha, res.max_error_rate
    bl, cl = set(b["length"]), set(c["length"])
    common = sorted(bl & cl)
    why = f"; {cut[cname]}" if cname in cut else ""
    suffix = f" [cache {state}]" if state else ""
    if not common:
        res.cases.append(Case(cname + suffix, ALL, OUTAGE, None,
                              "no length in common with the baseline: nothing measured to gate" + why))
        return False
    label = (cname if cname == bname else f"{cname} (vs baseline {bname})") + suffix
    b_all = b
    b, c = b[b["length"].isin(common)], c[c["length"].isin(common)]
    cases, method = answer_cases(label, b, c, tolerance, alpha, max_error_rate)
    cases += _residue_cases(label, b, c, modulus_of(cman) or modulus_of(bman), tolerance, alpha, max_error_rate)
    res.pairing[label] = method
    res.attestation[label] = shown_state((cman.get("configs") or {}).get(cname))[0]
    res.caveats += cv.changed((bman.get("configs") or {}).get(bname), (cman.get("configs") or {}).get(cname),
                              label)
    res.caveats += cv.sample(label, [x.row for x in cases if x.row is not None], tolerance, alpha)
    if method is None:
        res.notes.append(f"`{label}`: no trials pair up (different prompts/seeds); compared unpaired "
                         "with Wilson-score (Newcombe) intervals")
    if cname in cut:
        cases = [x if x.status != OUTAGE else Case(x.config, x.length, x.status, x.row, x.message + why, x.metric)
                 for x in cases]
    res.cases += cases
    if metric == "rank":
        res.cases = [x for x in res.cases if x.config != label or x.status in (OUTAGE, SKIPPED)]
    if metric in ("rank", "both"):
        res.cases += _rank_cases(label, b, c, alpha, rank_tolerance)
    note = _below_k_note(label, cman, cname, c, common)
    if note:
        res.notes.append(note)
    for L in sorted(bl - cl):
        n = int((b_all["length"] == L).sum())
        res.cases.append(Case(label, int(L), OUTAGE, None,
                              f"length not in the candidate: none of the baseline's {n} trial(s) here was "
                              "measured" + why))
    extra = sorted(cl - bl)
    if extra:
        res.notes.append(f"`{label}`: lengths {', '.join(map(str, extra))} are not in the baseline (not gated)")
    return True


def _side_caveats(res: GateResult, bside, cside) -> dict[str | None, str]:
    """Add each side's incomplete-run and length caveats to `res`; returns the candidate's
    incomplete configurations (None: the whole run) -> the reason an outage names."""
    cut: dict[str | None, str] = {}
    for side, names in ((bside, list(res.config_map.values())), (cside, list(res.config_map))):
        if not side.what.startswith("run "):
            continue
        where = side.what[len("run "):]
        found = cv.incomplete(side.manifest, side.records, where, names or None)
        res.caveats += found + cv.lengths(side.manifest, side.records, side.what, names)
        if side is cside:
            finish = cv.resume_command(side.manifest, where)
            for c in found:
                cut[c.config] = f"the candidate run is incomplete: finish it with `{finish}`"
    return cut


def _explains(cut: dict, cman: dict, base) -> bool:
    """An incomplete candidate explains a missing overlap when it planned a length the
    baseline has (or its plan is unknown): an outage then, not bad input."""
    if not cut:
        return False
    plan = cv.planned(cman)
    return plan is None or bool(set(plan[0]) & set(int(x) for x in base["length"]))
