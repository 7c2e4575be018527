"""The report's headline: per configuration, what the run found, before any detail.

One `Headline` per configuration, in the report's order:

- **recall by length**: correct / answered at each length (error trials left out, counted
  apart), shortest first;
- **where it drops**: the first length whose recall is DROP (10 points) or more below the
  recall at the shortest length; else "holds" up to the longest;
- **a verdict**: PASS, REGRESSION or OUTAGE by niah gate's rule (niah.report.gate.answer_cases:
  a regression is a drop of more than `tolerance` that is significant at `alpha`; an outage
  an error share above `max_error_rate`, or nothing answered, at some length), against a
  baseline where there is one: `niah report --baseline FILE` (the gate itself, per
  configuration), else the run's own dense control (a sparse configuration against the
  dense one, as the paired comparisons pair them). The control itself, and a configuration
  with neither, gets no verdict ("no baseline") unless it is an outage on its own;
- **lengths at or below k**: a sparse configuration's lengths no longer than its index_topk
  keep every token, so they do not exercise the indexer; the card marks them, and says so
  when every length is one;
- **small sample**: when the fewest answered trials at any length is below what detecting
  a 10-point drop from 95% recall needs (niah.report.stats.trials_needed, paired with
  independent errors, at `alpha` and 80% power), a flag with the `niah plan` command to run;
- **caveats** (niah.report.caveats): the run incomplete (N of M planned trials, the lengths
  with no trial, the `--resume` command that finishes it), lengths approximate or off by
  more than the allowance, and against a baseline the gate's own (the server changed, a
  sample too small to see the tolerance);
- **attestation**: as niah.attestation.shown_state says it ("n/a" for a server that
  attests nothing, never "valid").

Pure: frames and results in, dataclasses out; html.py and summary.md draw them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from niah.errors import BadInput
from niah.report import caveats as cv
from niah.regime import Regime, as_regime
from niah.report import style
from niah.report.compare import ALL
from niah.report.gate import OUTAGE, REGRESSION, answer_cases, run_gate, verdict_of
from niah.report.stats import trials_needed

DROP = 0.10  # a length this far below the shortest length's recall is where it drops
PLAN_RECALL, PLAN_DROP, PLAN_POWER = 0.95, 0.10, 0.8  # the sample the small-sample flag measures against
TOLERANCE, MAX_ERROR_RATE = 0.05, 0.1  # niah gate's defaults


@dataclass
class LengthRecall:
    length: int
    correct: int
    answered: int
    errors: int

    @property
    def recall(self) -> float:
        return self.correct / self.answered if self.answered else float("nan")


@dataclass
class Headline:
    config: str
    lengths: list[LengthRecall]
    drop: str  # "holds ... up to 4K" / "drops at 8K: ..." / "no answered trial"
    verdict: str | None = None  # PASS | REGRESSION | OUTAGE | None (no baseline)
    against: str = ""  # what the verdict is against ("dense control `dense`", "baseline base.json")
    failing: list[str] = field(default_factory=list)  # "4K: recall 100% -> 50% ..." per failed length
    small: str | None = None  # the small-sample flag
    attestation: str = ""  # valid | INVALID | unattested | n/a
    topk: Regime | int | None = None  # the configuration's regime or index_topk (None: dense or unknown)
    caveats: list[str] = field(default_factory=list)  # what weakens what the card says

    @property
    def below_k(self) -> str | None:
        """A word on the lengths at or below k, or None."""
        regime = as_regime(self.topk)
        if not regime:
            return None
        low = [x.length for x in self.lengths if regime.dense(x.length)]
        if not low:
            return None
        limit = f"k = {regime.k}" if regime.plain else regime.words()
        if len(low) == len(self.lengths):
            return f"every length is at or below {limit}: every token is kept, the indexer is not tested"
        return (f"{', '.join(style.fmt_len(L) for L in low)} at or below {limit}: every token kept there, "
                "the indexer not tested")

    def dense(self, length: int) -> bool:
        """No selection at this length (the card marks it)."""
        regime = as_regime(self.topk)
        return bool(regime) and regime.dense(length)


def _pct(x: float) -> str:
    return "—" if x != x else f"{100 * x:.0f}%"


def recall_lengths(df) -> list[LengthRecall]:
    out = []
    for L in sorted(int(x) for x in set(df["length"])):
        d = df[df["length"] == L]
        out.append(LengthRecall(L, int(d["correct"].sum()), int(d["answered"].sum()), int(d["is_error"].sum())))
    return out


def where_it_drops(lengths: list[LengthRecall]) -> str:
    answered = [x for x in lengths if x.answered]
    if not answered:
        return "no answered trial at any length"
    ref = answered[0]
    for x in answered[1:]:
        if x.recall <= ref.recall - DROP:
            return (f"drops at {style.fmt_len(x.length)}: {_pct(ref.recall)} at {style.fmt_len(ref.length)}, "
                    f"{_pct(x.recall)} at {style.fmt_len(x.length)}")
    if len(answered) == 1:
        return f"{_pct(ref.recall)} at the one length measured ({style.fmt_len(ref.length)})"
    return (f"holds: within {100 * DROP:g} points of {_pct(ref.recall)} from {style.fmt_len(ref.length)} "
            f"up to {style.fmt_len(answered[-1].length)}")


def needed_trials(alpha: float) -> int:
    """Trials per length to detect a PLAN_DROP drop from PLAN_RECALL (paired, independent errors)."""
    plans = trials_needed(PLAN_RECALL, PLAN_RECALL - PLAN_DROP, alpha, PLAN_POWER)
    return next(p.n for p in plans if "independent" in p.design)


def small_sample(lengths: list[LengthRecall], depths: int, alpha: float) -> str | None:
    fewest = min((x.answered for x in lengths), default=0)
    need = needed_trials(alpha)
    if fewest >= need:
        return None
    return (f"small sample: {fewest} answered trial(s) at its thinnest length; seeing a {100 * PLAN_DROP:g}-point "
            f"drop from {100 * PLAN_RECALL:g}% takes about {need} ({100 * PLAN_POWER:g}% power). How many to run: "
            f"`niah plan --recall {PLAN_RECALL:g} --drop {PLAN_DROP:g} --depths {max(1, depths)}`")


def _verdict(cases) -> tuple[str, list[str]]:
    bad = [c for c in cases if c.status in (REGRESSION, OUTAGE)]
    verdict = verdict_of(cases)
    failing = []
    for c in bad:
        where = "all lengths" if c.length == ALL else style.fmt_len(int(c.length))
        failing.append(f"{where}: {c.status}: {c.message}")
    return verdict, failing


def own_outage(df, max_error_rate: float = MAX_ERROR_RATE) -> list[str]:
    """Lengths where the configuration itself could not be measured (the gate's outage rule)."""
    out = []
    for L in sorted(int(x) for x in set(df["length"])):
        d = df[df["length"] == L]
        if len(d) and (d["is_error"].mean() > max_error_rate or not d["answered"].any()):
            out.append(f"{style.fmt_len(L)}: outage: {int(d['is_error'].sum())}/{len(d)} trials errored")
    return out


def headlines(df, infos: dict, pairs: list[tuple[str, str, str]], states: dict[str, str], depths: int,
              alpha: float, baseline=None, run=None, topks: dict | None = None, manifest: dict | None = None,
              records: list | None = None) -> tuple[list[Headline], list[str]]:
    """The headline of each configuration in `infos`, and notes (a baseline that could not be
    used, and why). `pairs`: niah.report.data.one_axis_pairs (the dense controls); `states`:
    config -> attestation state; `baseline` (a path) with `run` (this run's folder): gate
    each configuration against it; `manifest` and `records` (the run's): its caveats."""
    notes: list[str] = []
    gated: dict[str, tuple[str, list[str]]] = {}
    cavs: list[cv.Caveat] = []
    if manifest is not None and records is not None:
        cavs += cv.incomplete(manifest, records, str(run) if run is not None else "the run", list(infos))
        cavs += cv.lengths(manifest, records, "the run", list(infos))
    if baseline is not None:
        try:
            res = run_gate(baseline, run, alpha=alpha, accept_unattested=True)
        except BadInput as e:
            notes.append(f"the baseline {baseline} was not used: {e}")
        else:
            for cname in res.config_map:
                mine = [c for c in res.cases if c.config == cname or c.config.startswith(f"{cname} (vs baseline ")]
                gated[cname] = _verdict(mine)
            notes += [f"gate against {baseline}: {n}" for n in res.notes]
            labels = {(n if n == b else f"{n} (vs baseline {b})"): n for n, b in res.config_map.items()}
            cavs += [cv.Caveat(c.kind, labels.get(c.config, c.config), c.text) for c in res.caveats
                     if c.kind in (cv.CHANGED, cv.SAMPLE)]
    controls = {b: a for a, b, label in pairs if label.startswith("dense control")}
    is_control = set(controls.values())
    out = []
    for name in infos:
        d = df[df["config"] == name]
        lengths = recall_lengths(d)
        h = Headline(name, lengths, where_it_drops(lengths), attestation=states.get(name, ""),
                     small=small_sample(lengths, depths, alpha), topk=(topks or {}).get(name),
                     caveats=[c.text for c in cavs if c.config in (None, name)])
        if name in gated:
            h.verdict, h.failing = gated[name]
            h.against = f"baseline `{baseline}`"
        elif name in controls:
            ctrl = controls[name]
            base = df[df["config"] == ctrl]
            common = sorted(set(base["length"]) & set(d["length"]))
            cases, _ = answer_cases(name, base[base["length"].isin(common)], d[d["length"].isin(common)],
                                    TOLERANCE, alpha, MAX_ERROR_RATE)
            h.verdict, h.failing = _verdict(cases)
            h.against = f"dense control `{ctrl}` (same run, same prompts)"
        elif (bad := own_outage(d)):
            h.verdict, h.failing, h.against = OUTAGE.upper(), bad, "its own error rate"
        elif name in is_control:
            h.against = "the dense control: the sparse configurations are judged against it"
        out.append(h)
    return out, notes


RULE = (f"PASS / REGRESSION / OUTAGE follow `niah gate`: a regression is a drop of more than "
        f"{100 * TOLERANCE:g} points that is also statistically significant (McNemar's exact test on identical "
        f"prompts); an outage is a length where more than {100 * MAX_ERROR_RATE:g}% of trials got no answer.")


def markdown(items: list[Headline], notes: list[str]) -> str:
    """The headline as Markdown (the head of summary.md)."""
    out = ["## Headline\n"]
    for h in items:
        verdict = f"**{h.verdict}** against {h.against}" if h.verdict else (h.against or "no baseline")
        recall = ", ".join(f"{style.fmt_len(x.length)} {_pct(x.recall)} ({x.correct}/{x.answered})"
                           for x in h.lengths)
        out.append(f"- `{h.config}`: {verdict}. Recall {recall}; {h.drop}.")
        out += [f"  - {f}" for f in h.failing]
        if h.below_k:
            out.append(f"  - {h.below_k}")
        if h.small:
            out.append(f"  - ⚠ {h.small}")
        out += [f"  - ⚠ {c}" for c in h.caveats]
        if h.attestation:
            out.append(f"  - attestation: {h.attestation}")
    out += [f"- note: {n}" for n in notes]
    out.append(f"\n{RULE}\n")
    return "\n".join(out) + "\n"


def depth_count(df) -> int:
    return max(1, len(set(df["depth"])))

