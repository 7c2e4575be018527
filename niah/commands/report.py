"""`niah report` (figures + summary.md of a run) and `niah compare` (A vs B, paired)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from niah.cli import app


@app.command("report")
def report_cmd(
    run: Path = typer.Argument(..., help="Run folder (manifest.json + trials.jsonl)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output folder [default: RUN/report]."),
    svg: bool = typer.Option(False, "--svg", help="Write SVG instead of PNG."),
    alpha: float = typer.Option(0.05, help="Significance level of the difference heatmaps."),
    baseline: Optional[Path] = typer.Option(None, "--baseline",
                                            help="A baseline (exported .json or run folder): the headline gives each "
                                                 "configuration PASS / REGRESSION / OUTAGE against it, as niah gate "
                                                 "would [default: against the run's dense control, where it has one]."),
) -> None:
    """Draw a run's heatmaps, comparisons, summary.md and index.html into RUN/report/.

    One heatmap per configuration and a grid of all on a shared scale, difference heatmaps
    (B - A) for configurations differing in one axis, recall vs length with 95% Wilson
    intervals, the indexer panels where probed, and summary.md with every table behind
    them, the failure taxonomy, latency/TTFT medians and the length check. index.html is
    all of it in one self-contained page (figures inside, no network), with the attestation
    of each configuration and a table of every trial to filter: open it in any browser.
    Both open with a headline per configuration: recall by length, where it drops, and
    PASS / REGRESSION / OUTAGE against --baseline or the run's dense control.
    """
    from niah.report.render import render_report

    rep = render_report(run, out, svg=svg, alpha=alpha, baseline=baseline)
    if rep.problems:
        typer.echo(f"WARNING: {run} has {len(rep.problems)} integrity problem(s); compare and gate refuse it:")
    for line in rep.problems:
        typer.echo(f"  - {line}")
    for line in rep.notes:
        typer.echo(f"note: {line}")
    typer.echo(f"{rep.trials} trials, {rep.configs} configuration(s): {len(rep.figures)} figures in {rep.out}")
    typer.echo(f"summary: {rep.summary}")
    typer.echo(f"page: {rep.page}")
    from niah.attestation import INVALID, UNATTESTED, counts
    from niah.runs.integrity import manifest_problems
    from niah.runs.manifest import read_manifest

    manifest, _ = manifest_problems(read_manifest(run))  # unreadable readings: INVALID, listed above
    by_state = counts(manifest, list(manifest.get("configs") or {}))
    for state, what in ((INVALID, "INVALID (compare and gate refuse them)"),
                        (UNATTESTED, "unattested (compare and gate need --accept-unattested)")):
        if by_state[state]:
            typer.echo(f"attestation: {', '.join(by_state[state])} {what}; see the summary's Attestation section")


def _pick(names: list[str], want: Optional[str], where: str, flag: str) -> str:
    from niah.errors import BadInput

    if want:
        if want not in names:
            raise BadInput(f"{where} has no configuration {want!r}; it has {names}")
        return want
    if len(names) == 1:
        return names[0]
    raise BadInput(f"{where} has configurations {names}; choose one with {flag}")


def config_order(manifest: dict, frame) -> list[str]:
    """Configurations in a stable order: the matrix file's, else the manifest's (the order
    they were set up), never the order their trials happened to finish."""
    present = set(frame["config"])
    order = list((manifest.get("matrix") or {}).get("configs") or []) + list(manifest.get("configs") or {})
    order += sorted(present)
    return [n for n in dict.fromkeys(order) if n in present]


def rank_section(da, db, name_a: str, name_b: str, alpha: float) -> str:
    """The paired needle-rank comparison (niah/report/ranks.py) as Markdown."""
    from niah.report.ranks import fidelity_row, rank_compare, rank_markdown, rank_pairs

    rows = rank_compare(da, db, alpha)
    head = "\n## Needle rank / k (indexer): does B's needle sit deeper than A's?\n\n"
    if not any(r.n for r in rows):
        return head + ("No pair has a needle rank on both sides (no indexer probe, or no prompt longer "
                       "than k).\n")
    f = fidelity_row(rank_pairs(da, db))
    fid = ("" if not f.n else
           f"\nFidelity (top-k overlap with exact fp32 keys), paired: {name_a} {f.mean_a:.3f}, "
           f"{name_b} {f.mean_b:.3f}; "
           f"B lower in {f.lower}, higher in {f.higher} of {f.n} pairs; Wilcoxon p = {f.p:.2g}, r = {f.r:+.2f}.\n")
    return head + ("Per trial: geometric mean over layers and probed steps of the worst needle-value token's rank / k "
                   "(> 1: below the cut). Paired on identical prompts; Wilcoxon signed-rank on log2(rank_B / rank_A) "
                   f"decides at alpha = {alpha:g}; sign test shown; r = rank-biserial (> 0: B deeper).\n\n"
                   + rank_markdown(rows, name_a, name_b) + fid)


@app.command("compare")
def compare_cmd(
    run_a: Path = typer.Argument(..., help="Run folder (or baseline file) A."),
    run_b: Optional[Path] = typer.Argument(None, help="Run folder B [default: A again, with --a/--b]."),
    a: Optional[str] = typer.Option(None, "--a", help="Configuration of A."),
    b: Optional[str] = typer.Option(None, "--b", help="Configuration of B."),
    alpha: float = typer.Option(0.05, help="Significance level."),
    by_depth: bool = typer.Option(False, "--by-depth", help="Also compare every (length, depth) cell."),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Also write the tables to this file."),
    json_out: bool = typer.Option(False, "--json",
                                  help="Print one JSON object (schema niah.compare/1, docs/json.md) instead of the "
                                       "tables; --markdown still writes them."),
    accept_unattested: bool = typer.Option(False, "--accept-unattested",
                                           help="Compare configurations whose labels (index_dtype, kernels, attention, "
                                                "index_topk, window) their server does not attest, on the labels' word "
                                                "(external / command servers); the output says so. An INVALID "
                                                "configuration is refused regardless."),
) -> None:
    """Compare two runs, or two configurations of one run (--a, --b), per length.

    Within one run, A and B default to the first and second configuration in the matrix
    file's order (or the order the run set them up); B - A is reported.

    Per length and overall: recall of each side, B - A, McNemar's exact test on trials
    that saw the same prompt, and a verdict. Runs whose prompts do not pair are compared
    unpaired (two-proportion) and the output says so. With --json: the same as one JSON
    object whose `verdict` is the overall row's (B worse, B better, no significant
    difference, no data).
    """
    from niah.errors import BadInput
    from niah.report.baseline import load_side
    from niah.report.compare import compare, rows_markdown

    ma, fa, wa = load_side(run_a)
    mb = ma
    if run_b is None:
        fb, wb = fa, wa
        names = config_order(ma, fa)
        if not (a and b):
            if len(names) != 2:
                raise BadInput(f"{run_a} has configurations {names}; name the two to compare with --a and --b")
            if a is None and b is None:
                a, b = names
            elif a is None:
                a = next(n for n in names if n != b)
            else:
                b = next(n for n in names if n != a)
        ca = _pick(names, a, str(run_a), "--a")
        cb = _pick(names, b, str(run_a), "--b")
        if ca == cb:
            raise BadInput("--a and --b name the same configuration")
    else:
        mb, fb, wb = load_side(run_b)
        ca = _pick(list(dict.fromkeys(fa["config"])), a, str(run_a), "--a")
        cb = _pick(list(dict.fromkeys(fb["config"])), b, str(run_b), "--b")
    from niah.attestation import check_configs

    # INVALID (attestation missing or contradicting its label) or unattested labels: exit 2
    notes = check_configs(ma, [ca], str(run_a), accept_unattested)
    notes += check_configs(mb, [cb], str(run_b or run_a), accept_unattested)
    da, db = fa[fa["config"] == ca], fb[fb["config"] == cb]
    from niah.report.compare import check_pairable

    check_pairable(da, db, f"A ({ca})", f"B ({cb})")
    from niah.report.cache_report import controlled

    by_cache = ["cache_state"] if controlled(da) or controlled(db) else []  # a cell is length x depth x state
    rows, method = compare(da, db, [*by_cache, "length"], alpha)
    name_a = f"A: {ca}" if run_b is None else f"A: {run_a.name}/{ca}"
    name_b = f"B: {cb}" if run_b is None else f"B: {run_b.name}/{cb}"
    basis = {"prompt": "paired by prompt hash (McNemar exact on discordant pairs)",
             "seed": "paired by (length, depth, trial, seed) (McNemar exact on discordant pairs)",
             "prompt+seed": "paired within each cache state, by prompt hash or by (length, depth, trial, seed) "
                            "(McNemar exact on discordant pairs)",
             None: "UNPAIRED: no trials saw the same prompt; two-proportion comparison "
                   "(Newcombe interval decides, pooled z-test p shown)"}[method]
    text = f"# {name_b} vs {name_a}\n\n{basis}; alpha = {alpha:g}\n\n"
    text += "".join(f"- attestation: {n}\n" for n in notes) + ("\n" if notes else "")
    text += rows_markdown(rows, name_a, name_b, "cache state, length" if by_cache else "length")
    text += rank_section(da, db, name_a, name_b, alpha)
    cells = None
    if by_depth:
        cells, _ = compare(da, db, [*by_cache, "length", "depth"], alpha, overall=False)
        text += "\n## per cell (length, depth)\n\n" + rows_markdown(cells, name_a, name_b, "cell")
    if json_out:
        from niah.report import jsonout
        from niah.report.ranks import fidelity_row, rank_compare, rank_pairs

        ranks = rank_compare(da, db, alpha)
        fid = fidelity_row(rank_pairs(da, db)) if any(r.n for r in ranks) else None
        typer.echo(jsonout.dumps(jsonout.compare_json(
            {"run": str(run_a), "config": ca}, {"run": str(run_b or run_a), "config": cb}, alpha, method, notes,
            rows, ranks, fid, cells)))
    else:
        typer.echo(text)
    if markdown:
        from niah.errors import write_output

        write_output(markdown, text)
