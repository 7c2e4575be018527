"""What `niah gate` writes: the Markdown summary (stdout, `--summary`, $GITHUB_STEP_SUMMARY)
and the JUnit XML (`--junit`) of a niah.report.gate.GateResult.

Both carry the verdict's caveats (niah.report.caveats: an incomplete run and how to finish
it, approximate or drifting lengths, a server that changed, a sample too small to see the
tolerance): the Markdown under "What weakens this verdict", the JUnit file as `caveat`
properties and the system-out of each configuration's test suite they concern. The
Markdown names each configuration's attestation as a page shows it ("n/a" for a server
that attests nothing). An unwritable output is bad input (exit 2), never a regression.
"""

from __future__ import annotations

import os
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from niah.errors import BadInput
from niah.report.compare import ALL
from niah.report.gate import INDEX_NAMES, OUTAGE, PASS, REGRESSION, SKIPPED, GateResult, fmt_pct

_ICON = {PASS: "✅ pass", REGRESSION: "❌ regression", OUTAGE: "⚠️ outage", SKIPPED: "➖ skipped"}


def markdown(res: GateResult) -> str:
    """The gate's Markdown summary (CI step summary, PR comment)."""
    out = [f"## niah gate: {res.verdict}\n",
           f"- baseline: {res.baseline}\n- candidate: {res.candidate}\n"
           f"- rule: regression = drop > {100 * res.tolerance:g} pp **and** significant at alpha = {res.alpha:g} "
           f"(paired: McNemar exact; unpaired: Newcombe/Wilson interval); outage = error rate > "
           f"{100 * res.max_error_rate:g}% or nothing answered, or a baseline length, depth or trial the candidate "
           "lacks\n"]
    if any(c.metric == "rank" for c in res.cases):
        out.append("- needle rank: regression = on identical prompts the candidate's needle sits deeper in the "
                   "index scores (median rank ratio above tolerance, Wilcoxon signed-rank p < alpha); needle kept "
                   "and selection fidelity: the candidate keeps less of the needle, or misses more of the exact-key "
                   "top-k (ratio beyond the same tolerance, p < alpha)\n")
    for n in res.notes:
        out.append(f"- note: {n}\n")
    if res.caveats:
        out.append("\n### What weakens this verdict\n\n")
        out += [f"- ⚠ {c.text}\n" for c in res.caveats]
    for cfg in dict.fromkeys(c.config for c in res.cases):
        basis = res.pairing.get(cfg)
        att = f"; attestation: {res.attestation[cfg]}" if cfg in res.attestation else ""
        out.append(f"\n### `{cfg}` ("
                   f"{'paired by ' + ('prompt hash' if basis == 'prompt' else 'seed') if basis else 'unpaired'}"
                   f"{att})\n\n")
        out.append("| length | baseline | candidate | diff | evidence | status |\n|---|---|---|---|---|---|\n")
        for c in (x for x in res.cases if x.config == cfg):
            r = c.row
            name = "**all**" if c.length == ALL else f"{c.length:,}"
            name = f"residue {c.residue}" if c.residue else name
            name += f" ({INDEX_NAMES[c.metric]})" if c.metric in INDEX_NAMES else ""
            if r is None:
                out.append(f"| {name} | | | | {c.message} | {_ICON[c.status]} |\n")
                continue
            ev = (f"{r.losses} lost / {r.wins} gained, p={r.p:.3g}" if r.basis.startswith("paired")
                  else f"diff CI [{100 * r.lo:+.1f}, {100 * r.hi:+.1f}] pp")
            if c.status == OUTAGE:
                ev = c.message
            err = f" ⚠{r.errors_b} err" if r.errors_b else ""
            diff = "—" if r.diff != r.diff else f"{100 * r.diff:+.1f} pp"
            out.append(f"| {name} | {fmt_pct(r.recall_a)} ({r.k_a}/{r.n_a}) | {fmt_pct(r.recall_b)} "
                       f"({r.k_b}/{r.n_b}){err} | {diff} | {ev} | {_ICON[c.status]} |\n")
    if res.failed:
        out.append("\nFailing: " + ", ".join(f"`{c.config}` {c.name} ({c.status})" for c in res.failed) + "\n")
    return "".join(out)


def junit(res: GateResult) -> str:
    """JUnit XML: one test suite per configuration, one test case per length (+ overall)."""
    lines = ['<?xml version="1.0" encoding="UTF-8"?>']
    fails = sum(c.status == REGRESSION for c in res.cases)
    errs = sum(c.status == OUTAGE for c in res.cases)
    lines.append(f'<testsuites name="niah gate" tests="{len(res.cases)}" failures="{fails}" errors="{errs}">')
    for cfg in dict.fromkeys(c.config for c in res.cases):
        cases = [c for c in res.cases if c.config == cfg]
        lines.append(
            f'  <testsuite name={quoteattr("niah gate: " + cfg)} tests="{len(cases)}" '
            f'failures="{sum(c.status == REGRESSION for c in cases)}" '
            f'errors="{sum(c.status == OUTAGE for c in cases)}" '
            f'skipped="{sum(c.status == SKIPPED for c in cases)}">')
        mine = [c.text for c in res.caveats if c.config in (None, cfg)]
        if mine:
            lines.append("    <properties>" + "".join(f'<property name="caveat" value={quoteattr(t)}/>' for t in mine)
                         + "</properties>")
        for c in cases:
            head = f'    <testcase classname={quoteattr("niah.gate." + cfg)} name={quoteattr(c.name)} time="0"'
            if c.status == PASS:
                lines.append(head + f"><system-out>{escape(c.message)}</system-out></testcase>")
            elif c.status == REGRESSION:
                lines.append(head + f"><failure message={quoteattr(f'{cfg} {c.name}: regression: ' + c.message)} "
                             f'type="regression">{escape(c.message)}</failure></testcase>')
            elif c.status == OUTAGE:
                lines.append(head + f"><error message={quoteattr(f'{cfg} {c.name}: ' + c.message)} "
                             f'type="outage">{escape(c.message)}</error></testcase>')
            else:
                lines.append(head + f"><skipped message={quoteattr(c.message)}/></testcase>")
        if mine:
            lines.append("    <system-out>" + escape("\n".join(f"caveat: {t}" for t in mine)) + "</system-out>")
        lines.append("  </testsuite>")
    lines.append("</testsuites>")
    return "\n".join(lines) + "\n"


def write_outputs(res: GateResult, junit_path: Path | str | None, summary_path: Path | str | None) -> str:
    """Write JUnit and Markdown where asked, append Markdown to $GITHUB_STEP_SUMMARY when set;
    returns the Markdown."""
    md = markdown(res)
    for path, text in ((junit_path, junit(res) if junit_path else ""), (summary_path, md)):
        if not path:
            continue
        p = Path(path)
        try:  # exit 2, not 1: CI must not read an unwritable path as a regression
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
        except OSError as e:
            raise BadInput(f"cannot write {p}: {e.strerror or e}") from None
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    if step:
        try:  # an I/O failure is exit 2 too, never read as a regression
            with open(step, "a", encoding="utf-8") as f:
                f.write(md + "\n")
        except OSError as e:
            raise BadInput(f"cannot append to $GITHUB_STEP_SUMMARY ({step}): {e.strerror or e}") from None
    return md
