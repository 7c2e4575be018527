"""`niah sweep` and `niah export`: option declarations and one library call each.

Where the server is, for the commands that talk to one (sweep, prompt, prompts build):
a flag wins over the environment, which wins over the default. --endpoint, then
NIAH_ENDPOINT, then OPENAI_BASE_URL, then http://127.0.0.1:30000/v1; --model, then
NIAH_MODEL, then the first model of /v1/models; --api-key, then NIAH_API_KEY, then
OPENAI_API_KEY (never written: niah.redact). An empty variable counts as unset.
--header NAME:VALUE (repeatable) and --extra-body JSON go on every request
(niah.client.pass_through). The spec is built and checked in niah.sweep.plan; the run
ends through niah.sweep.outcome; a matrix runs through niah.serving.matrix.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from niah.cli import app
from niah.commands.options import (COMPRESSION_HELP, DEFAULT_ENDPOINT, DEPTHS_HELP, LENGTHS_HELP, RESIDUES_HELP,
                                   TOKENIZER_HELP, WINDOW_HELP, given, needle_options, server_options)
from niah.commands.request_options import request_options
from niah.sweep.cache_state import CACHE_HELP, PREFIX_HELP
from niah.sweep.coverage import COVERAGE_HELP
from niah.sweep.decode import DECODE_HELP
from niah.sweep.multiturn import MULTI_TURN_HELP

ASKED = ("endpoint", "model", "api_key", "lengths", "depths", "trials", "seed", "mode", "tokenizer", "needles",
         "needle_key", "needle_value", "values", "queries", "haystack", "residues", "cache_state")


@app.command()
@request_options
@needle_options
@server_options(f"OpenAI-compatible base URL (…/v1) (default: {DEFAULT_ENDPOINT}).")
def sweep(
    ctx: typer.Context,
    endpoint: Optional[str] = None,
    model: Optional[str] = None,
    lengths: str = typer.Option("300,1k,4k", help=LENGTHS_HELP),
    depths: str = typer.Option("0,25,50,75,100", help=DEPTHS_HELP),
    trials: int = typer.Option(3, help="Trials per (length, depth) cell."),
    seed: int = typer.Option(0, help="Base seed; each trial's prompt depends on (seed, length, depth, trial)."),
    max_tokens: int = typer.Option(32, "--max-tokens", help="Tokens the model may generate."),
    mode: str = typer.Option("chat", help="chat (/v1/chat/completions) or completion (/v1/completions)."),
    tokenizer: Optional[str] = typer.Option(None, help=TOKENIZER_HELP),
    approximate_lengths: bool = typer.Option(False, "--approximate-lengths",
                                             help="Run even when no counter is exact (drift recorded per trial, "
                                                  "flagged in the report)."),
    prompts: Optional[Path] = typer.Option(None, "--prompts",
                                           help="Run a frozen prompt set (niah prompts build) instead of building "
                                                "prompts."),
    concurrency: int = typer.Option(1, help="Requests in flight at once."),
    timeout: float = typer.Option(600.0, help="Bounds every request niah makes (trials, token counts, probes), "
                                               "seconds."),
    retries: int = typer.Option(3, help="Retries on 429/5xx/connection errors (with backoff)."),
    out: Optional[Path] = typer.Option(None, help="Run folder (default: results/<timestamp>)."),
    resume: bool = typer.Option(False, "--resume",
                                help="Fill the gaps of an existing run folder; never writes a trial twice."),
    force_config: bool = typer.Option(False, "--force-config",
                                      help="With --resume: allow another endpoint or model under the same "
                                           "configuration."),
    no_stream: bool = typer.Option(False, "--no-stream", help="Do not stream (no TTFT)."),
    matrix: Optional[Path] = typer.Option(None,
                                          help="A matrix file: launch one server per configuration "
                                               "(niah.serving.matrix)."),
    api_key: Optional[str] = None,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    control: bool = typer.Option(False, "--control",
                                 help="Add one no-needle control trial per (length, depth) cell (outcomes clean / leak "
                                      "/ hallucinated)."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="With --matrix: print each configuration's exact command and environment (and "
                                      "the job scripts of a slurm executor); start nothing."),
    executor: Optional[str] = typer.Option(None, "--executor",
                                           help="With --matrix: local | slurm, over the file's [executor] table "
                                                "(docs/matrix.md)."),
    cache_state: Optional[str] = typer.Option(None, "--cache-state", help=CACHE_HELP),
    answer_prefix: Optional[str] = typer.Option(None, "--answer-prefix", help=PREFIX_HELP),
    decode_first: Optional[int] = typer.Option(None, "--decode-first", metavar="N", help=DECODE_HELP),
    multi_turn: Optional[int] = typer.Option(None, "--multi-turn", metavar="N", help=MULTI_TURN_HELP),
    executor_set: list[str] = typer.Option([], "--executor-set",
                                           help="With --matrix: KEY=VALUE over the [executor] table, e.g. "
                                                "partition=gpu, time=04:00:00, gpus_per_config=2 (repeatable)."),
    index_compression: Optional[int] = typer.Option(None, "--index-compression", help=COMPRESSION_HELP),
    index_window: Optional[int] = typer.Option(None, "--index-window", help=WINDOW_HELP),
    residues: Optional[str] = typer.Option(None, "--residues", help=RESIDUES_HELP),
    coverage: Optional[str] = typer.Option(None, "--coverage", help=COVERAGE_HELP),
    **kinds,
) -> None:
    """Hide a needle in exact-length prompts and measure recall against a server.

    Every trial's prompt is exactly LENGTH tokens as the server counts them (chat template
    included); results go to OUT/manifest.json and OUT/trials.jsonl, one line per trial,
    and the prompts to OUT/prompts.jsonl. Ctrl-C or SIGTERM keeps every finished trial
    (exit 130 / 143): rerun with --resume to finish.
    Without a terminal, a progress line every 30 s.

    Exits 0 only when every trial has an answer; 1 when any trial errored (no answer:
    HTTP errors, timeouts, a dead server; --resume retries them), 2 on bad input, 130 / 143
    when interrupted (docs/ci.md has every command's exit codes).
    """
    import datetime as dt

    from niah.sweep.outcome import run_and_report
    from niah.sweep.plan import check_choices, plan_spec
    from niah.sweep.server_regime import geometry_given

    asked = given(ctx, ASKED)
    check_choices(asked, matrix=matrix, prompts=prompts, executor=executor, executor_set=executor_set,
                  dry_run=dry_run, resume=resume, out=out)
    if dry_run:
        from niah.serving.matrix.commands import print_matrix_commands

        return print_matrix_commands(matrix, executor=_executor(matrix, executor, executor_set), out=out)
    endpoint = endpoint or DEFAULT_ENDPOINT
    values = dict(lengths=lengths, depths=depths, trials=trials, seed=seed, max_tokens=max_tokens, mode=mode,
                  tokenizer=tokenizer, concurrency=concurrency, timeout=timeout, retries=retries,
                  stream=not no_stream, approximate_lengths=approximate_lengths, prompts=prompts, control=control,
                  residues=residues, cache_state=cache_state, answer_prefix=answer_prefix,
                  decode_first=decode_first, multi_turn=multi_turn, **kinds)
    geometry = geometry_given(index_compression, index_window)
    spec = plan_spec(values, asked, endpoint=endpoint, model=model, api_key=api_key, coverage=coverage,
                     geometry=geometry, matrix=matrix,
                     matrix_regimes=None if matrix is None else (lambda auto: _matrix_regimes(matrix, auto)))
    out = out or Path("results") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")

    def run(progress) -> None:
        if matrix is not None:
            from niah.serving.matrix import run_matrix

            run_matrix(matrix, spec, out, resume, progress=progress, force_config=force_config,
                       executor=_executor(matrix, executor, executor_set))
        else:
            from niah.sweep import Target, run_sweep

            target = Target(endpoint=endpoint, model=model, api_key=api_key, geometry=geometry)
            run_sweep([target], spec, out, resume=resume, progress=progress, force_config=force_config)

    code = run_and_report(run, out, sys.argv[1:], quiet)
    if code:
        raise typer.Exit(code)


def _matrix_regimes(matrix: Path, auto: bool) -> tuple[dict, Optional[int]]:
    """{config: Regime or None} from the matrix file (index_topk alone: V3.2's rule), and the context."""
    from niah.regime import as_regime
    from niah.serving.matrix import matrix_topks

    topks, context = matrix_topks(matrix, context_too=auto)
    return {n: as_regime(k) for n, k in topks.items()}, context


def _executor(matrix: Path, kind: Optional[str], pairs: list[str]):
    """The matrix file's [executor] table with --executor / --executor-set over it."""
    from niah.serving.matrix import load_matrix
    from niah.serving.matrix.executor import override

    return override(load_matrix(matrix).executor, kind, pairs)


@app.command()
def export(
    run: Path = typer.Argument(..., help="A run folder."),
    format: str = typer.Option("csv", "--format", "-f", help="csv, parquet or json."),
    out: Optional[Path] = typer.Option(None, help="Output file (default: RUN/trials.<format>)."),
) -> None:
    """Write a run's trials as one table (CSV or parquet, through pandas) or one JSON array
    of the records as trials.jsonl holds them."""
    from niah.runs.export import export_run

    path = export_run(run, format, out)
    print(path)
