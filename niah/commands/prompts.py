"""`niah prompt` (one trial's prompt), `niah prompts build` (freeze a prompt set) and `niah rescore`
(score stored answers again): option declarations and one library call each (niah.sweep.preview,
niah.sweep.plan with niah.prompts.sets, niah.sweep.rescore)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from niah.cli import app, prompts_app
from niah.commands.options import (DEFAULT_ENDPOINT, DEPTHS_HELP, LENGTHS_HELP, RESIDUES_HELP, TOKENIZER_HELP, given,
                                   needle_options, server_options)
from niah.commands.request_options import request_options
from niah.sweep.coverage import COVERAGE_HELP


@app.command()
@request_options
@needle_options
@server_options()
def prompt(
    length: str = typer.Option("1k", help="Whole-prompt length in tokens (1k, 943, 128ki)."),
    depth: float = typer.Option(50.0, help="Needle depth, percent."),
    trial: int = typer.Option(0, help="Trial index."),
    seed: int = typer.Option(0, help="Base seed."),
    mode: str = typer.Option("chat", help="chat or completion."),
    tokenizer: Optional[str] = typer.Option(None, help=TOKENIZER_HELP),
    endpoint: Optional[str] = None,
    model: Optional[str] = None,
    api_key: Optional[str] = None,
    approximate_lengths: bool = typer.Option(False, "--approximate-lengths", help="Allow a counter that is not exact."),
    json_out: bool = typer.Option(False, "--json", help="Print the prompt and its facts as JSON."),
    **kinds,
) -> None:
    """Print the prompt one sweep trial would send (same counter, same seed, same bytes)."""
    from niah.sweep.preview import preview_prompt, show_prompt

    p = preview_prompt(length, depth, trial, seed, mode, tokenizer, endpoint or DEFAULT_ENDPOINT, model, api_key,
                       approximate_lengths, **kinds)
    show_prompt(p, depth, trial, seed, json_out)


@prompts_app.command("build")
@request_options
@needle_options
@server_options()
def build_cmd(
    ctx: typer.Context,
    out: Path = typer.Option(..., "--out", "-o", help="The set file to write (JSONL, one line per trial)."),
    endpoint: Optional[str] = None,
    model: Optional[str] = None,
    api_key: Optional[str] = None,
    lengths: str = typer.Option("300,1k,4k", help=LENGTHS_HELP),
    depths: str = typer.Option("0,25,50,75,100", help=DEPTHS_HELP),
    trials: int = typer.Option(3, help="Trials per (length, depth) cell."),
    seed: int = typer.Option(0, help="Base seed."),
    mode: str = typer.Option("chat", help="chat or completion."),
    tokenizer: Optional[str] = typer.Option(None, help=TOKENIZER_HELP),
    approximate_lengths: bool = typer.Option(False, "--approximate-lengths", help="Allow a counter that is not exact."),
    timeout: float = typer.Option(600.0, help="Bounds every request niah makes (token counts, probes), seconds."),
    residues: Optional[str] = typer.Option(None, "--residues", help=RESIDUES_HELP),
    coverage: Optional[str] = typer.Option(None, "--coverage",
                                           help=COVERAGE_HELP + " A prompt set holds no cache state."),
    **kinds,
) -> None:
    """Build every trial's prompt and write them to a set file; run it with `niah sweep --prompts`.

    Deterministic: the same options and counter give the same bytes. Each line holds the
    messages or prompt text, every inserted fact, the asked keys, the expected values,
    the counter and its count, and a schema version. Ctrl-C (SIGINT) or SIGTERM stops it
    with one line and exit 130 / 143; no file is written (the set is written at the end,
    atomically).
    """
    from niah.prompts.sets import build_set, write_set
    from niah.sweep import Target, prepare_target
    from niah.sweep.interrupt import EXIT_ON_SIGNAL, terminate_as_interrupt
    from niah.sweep.plan import COVERED, plan_spec

    endpoint = endpoint or DEFAULT_ENDPOINT
    values = dict(lengths=lengths, depths=depths, trials=trials, seed=seed, max_tokens=32, mode=mode,
                  tokenizer=tokenizer, timeout=timeout, approximate_lengths=approximate_lengths, residues=residues,
                  **kinds)
    spec = plan_spec(values, given(ctx, COVERED), endpoint=endpoint, model=model, api_key=api_key,
                     coverage=coverage, build=True)
    try:
        with terminate_as_interrupt():
            prepared = prepare_target(Target(endpoint, model=model, api_key=api_key), spec)
            entries = build_set(prepared.tokenizer, spec)
            write_set(out, entries)
    except KeyboardInterrupt as e:
        name = str(e.args[0]) if e.args else "SIGINT"
        typer.echo(f"niah: interrupted ({name}): no prompt set written to {out}", err=True)
        raise typer.Exit(EXIT_ON_SIGNAL.get(name, 130)) from None
    cost = getattr(prepared.tokenizer, "cost", None)
    typer.echo(f"{len(entries)} prompts counted with {prepared.tokenizer.spec}"
               + (f" ({cost['requests']} usage probes)" if cost else "") + f": {out}")


@app.command("rescore")
def rescore_cmd(
    run: Path = typer.Argument(..., help="A run folder."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only report what would change."),
) -> None:
    """Score a run's stored answers again with the current scorer (rewrites trials.jsonl)."""
    from niah.sweep.rescore import rescore_run

    res = rescore_run(run, write=not dry_run)
    typer.echo(f"{res.total} trials re-scored: {len(res.changed)} outcome(s) changed"
               + (" (written)" if res.written and res.changed else ""))
    for key, old, new in res.changed[:50]:
        typer.echo(f"  {key}: {old} -> {new}")
    if res.no_distractors:
        typer.echo(f"note: {res.no_distractors} old record(s) name no distractors; scored without them")
