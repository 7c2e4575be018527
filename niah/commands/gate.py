"""`niah gate` (CI regression gate), `niah plan` (trials needed) and `niah baseline export`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from niah.cli import app, baseline_app


@app.command("gate")
def gate_cmd(
    baseline: Path = typer.Option(..., "--baseline", help="Baseline: run folder or exported baseline .json."),
    candidate: Path = typer.Option(..., "--candidate", help="Candidate: run folder (or baseline file)."),
    config: Optional[str] = typer.Option(None, "--config",
                                         help="Gate only this configuration [default: all in common]."),
    tolerance: float = typer.Option(0.05, help="Drop (absolute recall) that is allowed before it can fail."),
    alpha: float = typer.Option(0.05, help="Significance level a drop must reach to fail."),
    max_error_rate: float = typer.Option(0.1, help="Largest share of error trials per length before it is an outage."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Write JUnit XML here (one test case per length)."),
    summary: Optional[Path] = typer.Option(None, "--summary", help="Write the Markdown summary here."),
    metric: str = typer.Option("answer", "--metric",
                               help="answer (recall), rank (the indexer probe: the needle's rank / k in the index "
                                    "scores, the share of it kept and the selection's fidelity, paired "
                                    "Wilcoxon; keeps outage checks) or both."),
    rank_tolerance: float = typer.Option(0.10, "--rank-tolerance",
                                         help="With --metric rank/both: allowed median increase of the needle's rank "
                                              "(0.10 = 10% deeper), drop of its kept share (10% less) and rise "
                                              "of the selection's miss (10% more)."),
    json_out: bool = typer.Option(False, "--json",
                                  help="Print one JSON object (schema niah.gate/1, docs/json.md: verdict, "
                                       "exit_code, every case) instead of the Markdown; --summary and --junit still "
                                       "write theirs."),
    accept_unattested: bool = typer.Option(False, "--accept-unattested",
                                           help="Gate configurations whose labels their server does not attest "
                                                "(external / command servers, baselines exported before attestation), "
                                                "on the labels' word; the summary says so. An INVALID configuration is "
                                                "refused regardless."),
) -> None:
    """CI regression gate: exit 0 holds, 1 regression or outage, 2 bad input.

    Exit 2 too when a gated configuration is INVALID (its server's attestation is missing,
    unreadable or contradicts its label) or unattested (see --accept-unattested).

    A regression is a drop larger than --tolerance that is significant at --alpha (McNemar
    exact on paired prompts, else Wilson-score bounds), per length and overall. Writes
    Markdown (also appended to $GITHUB_STEP_SUMMARY when set) and JUnit XML (--junit).
    With --json the exit codes are the same; bad input is still one line on stderr.
    """
    from niah.report.gate import run_gate
    from niah.report.gate_output import write_outputs

    res = run_gate(baseline, candidate, config, tolerance, alpha, max_error_rate, metric, rank_tolerance,
                   accept_unattested)
    md = write_outputs(res, junit, summary)
    if json_out:
        from niah.report import jsonout

        typer.echo(jsonout.dumps(jsonout.gate_json(res)))
    else:
        typer.echo(md)
    if res.exit_code:
        raise typer.Exit(res.exit_code)


@app.command("plan")
def plan_cmd(
    recall: float = typer.Option(0.95, "--recall", help="Baseline recall."),
    drop: float = typer.Option(0.10, "--drop", help="Drop in recall that must be detectable (absolute)."),
    alpha: float = typer.Option(0.05, help="Two-sided significance level (as the gate uses)."),
    power: float = typer.Option(0.8, help="Probability of detecting a drop of that size."),
    depths: int = typer.Option(1, "--depths",
                               help="Depths per length: also say trials per cell for a per-length test."),
    run: Optional[Path] = typer.Option(None, "--run",
                                       help="Instead: resample the paired trials of this run (--a vs --b) and say how "
                                            "many pairs the needle-rank and the answer metric each need."),
    a: Optional[str] = typer.Option(None, "--a", help="With --run: configuration A (the reference)."),
    b: Optional[str] = typer.Option(None, "--b", help="With --run: configuration B."),
    reps: int = typer.Option(400, "--reps", help="With --run: bootstrap resamples per n."),
    json_out: bool = typer.Option(False, "--json",
                                  help="Print one JSON object (schema niah.plan/1, docs/json.md) instead of the "
                                       "table."),
) -> None:
    """How many trials a comparison needs for a drop in recall to be detectable.

    Paired (exact McNemar; exact power, bracketed by nested and independent errors) and
    unpaired (two-proportion, Fleiss). See docs/reports.md for the method.
    """
    import math

    from niah.errors import BadInput
    from niah.report.stats import trials_needed

    if run is not None:
        return _plan_from_run(run, a, b, alpha, power, reps, json_out)
    target = recall - drop
    if depths < 1:
        raise BadInput("--depths must be >= 1")
    try:
        plans = trials_needed(recall, target, alpha, power)
    except ValueError as e:
        raise BadInput(str(e)) from None
    if json_out:
        from niah.report import jsonout

        typer.echo(jsonout.dumps(jsonout.plan_json(recall, target, alpha, power, depths, plans)))
        return
    typer.echo(f"detect recall {recall:.3f} -> {target:.3f} (drop {100 * drop:g} pp), two-sided alpha={alpha:g}, "
               f"power {100 * power:g}%\n")
    cell = f" {'per cell*':>10}" if depths > 1 else ""
    typer.echo(f"{'design':<30} {'trials/side':>11}{cell} {'power':>7}  method")
    for p in plans:
        pw = "—" if p.power != p.power else f"{p.power:.3f}"
        cell = f" {math.ceil(p.n / depths):>10}" if depths > 1 else ""
        typer.echo(f"{p.design:<30} {p.n:>11}{cell} {pw:>7}  {p.method}")
    if depths > 1:
        typer.echo(f"\n* trials per (length, depth) cell when a length's {depths} depths are pooled into one "
                   "test (as the gate does); one cell tested alone needs the full count.")
    typer.echo("\nTrials/side = prompts per comparison (a length, or a cell).\n"
               "Paired designs need fewer trials the more the two sides fail on the same prompts; "
               "'nested' assumes B fails wherever A does (fewest), 'independent' that failures are unrelated.")


def _plan_from_run(run: Path, a: Optional[str], b: Optional[str], alpha: float, power: float, reps: int,
                   json_out: bool = False) -> None:
    """Bootstrap: resample RUN's A/B pairs with selection on both sides, find the n at which
    each metric's test (one direction: B worse) reaches the power."""
    from niah.errors import BadInput
    from niah.report.baseline import load_side
    from niah.report.ranks import rank_pairs, trials_needed_bootstrap

    if not (a and b):
        raise BadInput("--run needs --a and --b (the two configurations to compare)")
    _, df, _ = load_side(run)
    names = list(dict.fromkeys(df["config"]))
    for n in (a, b):
        if n not in names:
            raise BadInput(f"{run} has no configuration {n!r}; it has {names}")
    pairs = rank_pairs(df[df["config"] == a], df[df["config"] == b]).dropna(subset=["rank_a", "rank_b"])
    if pairs.empty:
        raise BadInput(f"{run}: no pair of {a!r} and {b!r} has a needle rank on both sides")
    import math

    d = sorted(math.log2(y / x) for x, y in zip(pairs["rank_a"], pairs["rank_b"]))
    disc = int((pairs["correct_a"] != pairs["correct_b"]).sum())
    if json_out:
        from niah.report import jsonout

        observed = {"pairs": len(pairs), "median_rank_ratio": 2 ** d[len(d) // 2], "deeper": sum(x > 0 for x in d),
                    "shallower": sum(x < 0 for x in d), "answers_differ": disc}
        results = trials_needed_bootstrap(pairs, alpha, power, reps=reps)
        typer.echo(jsonout.dumps(jsonout.plan_run_json(str(run), a, b, alpha, power, reps, observed, results)))
        return
    typer.echo(f"{len(pairs)} observed pairs ({b} vs {a}, selection on both sides): median rank ratio B/A "
               f"{2 ** d[len(d) // 2]:.3g}, B deeper in {sum(x > 0 for x in d)}, higher in {sum(x < 0 for x in d)}; "
               f"answers differ in {disc}")
    typer.echo(f"bootstrap: {reps} resamples of n pairs per n; a resample counts when the two-sided test is "
               f"significant at alpha={alpha:g} with B worse; target power {100 * power:g}%\n")
    for r in trials_needed_bootstrap(pairs, alpha, power, reps=reps):
        typer.echo(f"{r.metric:<38} paired trials needed: {_need(r, 'rank' in r.metric)}")


def _need(r, rank: bool) -> str:
    if r.n:
        return str(r.n)
    if r.power_at_max or r.tried:
        return f"more than 1000 (power {r.power_at_max:.2f} there: the pairs show no effect in that direction)"
    return "never: " + ("no pair's needle rank differs" if rank else "no pair's answers differ") + " in the data"


@baseline_app.command("export")
def baseline_export_cmd(
    run: Path = typer.Argument(..., help="Run folder to export."),
    out: Path = typer.Option(..., "--out", "-o", help="Baseline file to write, e.g. results/baselines/NAME.json."),
    config: Optional[List[str]] = typer.Option(None, "--config", help="Only these configurations (repeatable)."),
) -> None:
    """Write a small baseline of RUN for `niah gate`.

    Keeps per-trial outcomes keyed by prompt hash (so the gate pairs against it) and a
    per-length summary.
    """
    from niah.report.baseline import export_baseline

    data = export_baseline(run, out, config or None)
    for name, c in data["configs"].items():
        s = c["summary"].get("all", {})
        rec = "—" if s.get("recall") is None else f"{100 * s['recall']:.1f}%"
        typer.echo(f"{name}: {len(c['trials'])} trials, recall {rec}")
    typer.echo(f"wrote {out}")
