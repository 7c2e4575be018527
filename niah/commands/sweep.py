"""`niah sweep`, `niah prompt` and `niah export`.

Where the server is, for the commands that talk to one (sweep, prompt, prompts build):
a flag wins over the environment, which wins over the default. --endpoint, then
NIAH_ENDPOINT, then OPENAI_BASE_URL, then http://127.0.0.1:30000/v1; --model, then
NIAH_MODEL, then the first model of /v1/models; --api-key, then NIAH_API_KEY, then
OPENAI_API_KEY (never written: niah.redact). An empty variable counts as unset.
--header NAME:VALUE (repeatable) and --extra-body JSON go on every request
(niah.client.pass_through).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from niah.cli import app
from niah.commands.request_options import request_options
from niah.commands.sweep_regime import (COMPRESSION_HELP, RESIDUES_HELP, WINDOW_HELP, geometry_given,
                                        pick_auto_lengths, read_topks)
from niah.sweep.cache_state import CACHE_HELP, PREFIX_HELP
from niah.sweep.decode import DECODE_HELP
from niah.sweep.multiturn import MULTI_TURN_HELP
from niah.sweep.coverage import COVERAGE_HELP


DEPTHS_HELP = ("Needle depths in percent: 0,50,100; LO:HI:N gives N evenly spaced values, both ends "
               "included: N is a count, not a step (10:90:5 is 10, 30, 50, 70, 90); LO:HI/STEP steps by "
               "STEP (0:100/10 is 0, 10, ..., 100).")
LENGTHS_HELP = ("Prompt lengths in tokens, whole prompt: 300,1k,4k,128ki or LO:HI:N, e.g. 300:22k:8 (N log-spaced), "
                "or auto: k/2, k, 2k, 4k, ... of every index_topk, up to the model's context.")
TOKENIZER_HELP = ("auto | server | usage | hf:<path> | tiktoken:<encoding>. auto: the server's /tokenize, else "
                  "usage.prompt_tokens probes (max_tokens=1). Checked against the server before the run.")
DEFAULT_ENDPOINT = "http://127.0.0.1:30000/v1"
ENDPOINT_ENV = ["NIAH_ENDPOINT", "OPENAI_BASE_URL"]  # flag > these, in order > DEFAULT_ENDPOINT
MODEL_ENV = ["NIAH_MODEL"]
API_KEY_ENV = ["NIAH_API_KEY", "OPENAI_API_KEY"]


def needle_options(f):
    """The needle and haystack options shared by sweep, prompt and prompts build."""
    import functools
    import inspect

    extra = {
        "needles": typer.Option(1, "--keys", "--needles",
                                help="Keys in each haystack: the asked one(s) plus distractors at random depths."),
        "needle_key": typer.Option("city", "--needle-key", help="city | word."),
        "needle_value": typer.Option("number", "--needle-value", help="number (7 digits) | uuid | word."),
        "values": typer.Option(1, "--values",
                               help="Values per key; all of an asked key's values are asked, each scored."),
        "queries": typer.Option(1, "--queries", help="Keys asked at once (<= --keys)."),
        "haystack": typer.Option("prose", "--haystack",
                                 help="prose | book (Pride and Prejudice) | noise | needles | file:PATH."),
    }
    types = {"needles": int, "needle_key": str, "needle_value": str, "values": int, "queries": int, "haystack": str}
    sig = inspect.signature(f)
    params = [p for p in sig.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
    params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v, annotation=types[k])
               for k, v in extra.items()]

    @functools.wraps(f)
    def wrapper(*args, **kw):
        return f(*args, **kw)

    wrapper.__signature__ = sig.replace(parameters=params)
    wrapper.__annotations__ = {**{k: v for k, v in f.__annotations__.items() if k != "kinds"}, **types}
    return wrapper


def make_spec(lengths, depths, trials, seed, max_tokens, mode, tokenizer, concurrency=1, timeout=600.0,
              retries=3, stream=True, needles=1, needle_key="city", needle_value="number", values=1,
              queries=1, haystack="prose", approximate_lengths=False, prompts=None, control=False, auto=None,
              residues=None, cache_state=None, answer_prefix=None, decode_first=None, multi_turn=None):
    from niah.sweep.spec import parse_depths, parse_lengths
    from niah.sweep import SweepSpec, check_spec
    from niah.sweep.cache_state import parse_cache_states

    from niah.sweep.residues import expand, parse_residues

    asked = (auto if lengths.strip() == "auto" else parse_lengths(lengths)) if prompts is None else [1]
    plan = parse_residues(residues)
    spec = SweepSpec(
        lengths=expand(asked, plan) if plan is not None and prompts is None else asked,
        depths=parse_depths(depths) if prompts is None else [0.0],
        trials=trials, seed=seed, max_tokens=max_tokens, mode=mode, tokenizer=tokenizer,
        concurrency=concurrency, timeout_s=timeout, retries=retries, stream=stream, needles=needles,
        needle_key=needle_key, needle_value=needle_value, values=values, queries=queries, haystack=haystack,
        approximate_lengths=approximate_lengths, prompts=str(prompts) if prompts is not None else None,
        control=control, residues=plan.text() if plan is not None else None,
        cache_states=parse_cache_states(cache_state), answer_prefix=answer_prefix, decode_first=decode_first,
        multi_turn=multi_turn,
    )
    check_spec(spec)
    return spec


def _given(ctx: typer.Context, names: tuple[str, ...]) -> list[str]:
    """The options among `names` set on the command line."""
    return [f"--{n.replace('_', '-')}" for n in names
            if getattr(ctx.get_parameter_source(n), "name", None) == "COMMANDLINE"]


def _refuse_ignored(ctx: typer.Context, matrix, prompts) -> None:
    """Options another one makes meaningless are refused, never silently ignored."""
    from niah.errors import BadInput

    if matrix is not None and (given := _given(ctx, ("endpoint", "model", "api_key"))):
        raise BadInput(f"--matrix names its own servers: {', '.join(given)} would be ignored; "
                       "set endpoint, model or api_key_env in the matrix file instead")
    fixed = ("lengths", "depths", "trials", "seed", "mode", "tokenizer", "needles", "needle_key",
             "needle_value", "values", "queries", "haystack")
    if prompts is not None and (given := _given(ctx, fixed)):
        raise BadInput(f"--prompts fixes the prompts: {', '.join(given)} would be ignored; "
                       "build another set with niah prompts build")


@app.command()
@request_options
@needle_options
def sweep(
    ctx: typer.Context,
    endpoint: Optional[str] = typer.Option(None, envvar=ENDPOINT_ENV,
                                           help=f"OpenAI-compatible base URL (…/v1) (default: {DEFAULT_ENDPOINT})."),
    model: Optional[str] = typer.Option(None, envvar=MODEL_ENV,
                                        help="Served model name (default: the first in /v1/models)."),
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
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar=API_KEY_ENV,
                                          help="Bearer token, if the server wants one."),
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
    from rich.console import Console

    from niah.sweep.progress import SweepProgress
    from niah.sweep import Target, run_sweep

    _refuse_ignored(ctx, matrix, prompts)
    if matrix is None and (executor is not None or executor_set):
        from niah.errors import BadInput

        raise BadInput("--executor and --executor-set need --matrix")
    if dry_run:
        from niah.errors import BadInput
        from niah.serving.matrix.commands import print_matrix_commands

        if matrix is None:
            raise BadInput("--dry-run needs --matrix")
        print_matrix_commands(matrix, executor=_executor(matrix, executor, executor_set), out=out)
        return
    if resume:  # before any probe: a mistyped folder is refused at once, never started afresh
        from niah.errors import BadInput
        from niah.runs.folder import check_resumable

        if out is None:
            raise BadInput("--resume needs --out RUN, the run folder to resume")
        check_resumable(out)
    geometry = geometry_given(index_compression, index_window)
    cov = None
    if coverage is not None:  # the preset's values under the options given beside it
        from niah.commands.sweep_coverage import COVERED, apply_coverage

        now = dict(lengths=lengths, depths=depths, trials=trials, residues=residues, cache_state=cache_state)
        (lengths, depths, trials, residues, cache_state), cov = apply_coverage(
            coverage, now, _given(ctx, COVERED), endpoint=endpoint or DEFAULT_ENDPOINT, model=model,
            api_key=api_key, timeout=timeout, geometry=geometry, tokenizer=tokenizer, max_tokens=max_tokens,
            matrix=matrix, prompts=prompts, control=control)
    is_auto = lengths.strip() == "auto"
    topks, context = (read_topks(matrix, endpoint or DEFAULT_ENDPOINT, model, api_key, is_auto, timeout, geometry)
                      if matrix is not None or is_auto else ({}, None))
    auto = pick_auto_lengths(topks, context, max_tokens) if is_auto else None
    spec = make_spec(lengths, depths, trials, seed, max_tokens, mode, tokenizer, concurrency, timeout, retries,
                     not no_stream, approximate_lengths=approximate_lengths, prompts=prompts, control=control,
                     auto=auto, residues=residues, cache_state=cache_state, answer_prefix=answer_prefix,
                     decode_first=decode_first, multi_turn=multi_turn, **kinds)
    spec.coverage = cov
    if auto:
        print(f"niah: --lengths auto: {', '.join(map(str, auto))}", file=sys.stderr)
    if matrix is not None:
        from niah.sweep.indexer import length_warnings
        from niah.prompts.sets import read_set

        # a frozen set brings its own lengths (spec.lengths is a placeholder then)
        lengths = spec.lengths if prompts is None else sorted({e.length for e in read_set(prompts)})
        for line in length_warnings(lengths, topks):
            print(f"niah: {line}", file=sys.stderr)
    if out is None:
        import datetime as dt

        out = Path("results") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    from niah.sweep.interrupt import EXIT_ON_SIGNAL, terminate_as_interrupt

    console = Console(stderr=True)
    progress = None if quiet else SweepProgress(console)
    try:
        with terminate_as_interrupt():
            if matrix is not None:
                from niah.serving.matrix import run_matrix

                run_matrix(matrix, spec, out, resume, progress=progress, force_config=force_config,
                           executor=_executor(matrix, executor, executor_set))
            else:
                target = Target(endpoint=endpoint or DEFAULT_ENDPOINT, model=model, api_key=api_key,
                                geometry=geometry)
                run_sweep([target], spec, out, resume=resume, progress=progress, force_config=force_config)
    except KeyboardInterrupt as e:
        name = str(e.args[0]) if e.args else "SIGINT"
        print(f"niah: interrupted ({name}): finished trials are saved in {out}; resume with: "
              f"{resume_command(sys.argv[1:], out)}", file=sys.stderr, flush=True)
        raise typer.Exit(EXIT_ON_SIGNAL.get(name, 130)) from None
    errored, total = print_outcome(out)
    if errored:
        print(f"niah: {errored} of {total} trial(s) got no answer (outcome error: see the run's trials.jsonl); "
              f"exit 1. Retry them with: {resume_command(sys.argv[1:], out)}", file=sys.stderr)
        raise typer.Exit(1)


def _executor(matrix: Path, kind: Optional[str], pairs: list[str]):
    """The matrix file's [executor] table with --executor / --executor-set over it."""
    from niah.serving.matrix import load_matrix
    from niah.serving.matrix.executor import override

    return override(load_matrix(matrix).executor, kind, pairs)


def resume_command(argv: list[str], out: Path) -> str:
    """The `niah sweep ... --resume` that finishes this run (no bearer token and no secret
    header in it: pass them again, the token through NIAH_API_KEY)."""
    import shlex

    from niah.redact import is_secret_header

    args, skip = [], 0
    for i, a in enumerate(argv):
        if skip:
            skip -= 1
            continue
        if a == "--api-key":
            skip = 1
            continue
        if a.startswith("--api-key="):
            continue
        if a in ("--header", "-H") and i + 1 < len(argv) and is_secret_header(argv[i + 1].partition(":")[0]):
            skip = 1
            continue
        if a.startswith("--header=") and is_secret_header(a[len("--header="):].partition(":")[0]):
            continue
        args.append(a)
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", str(out)]
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(["niah", *args])


def print_outcome(out: Path) -> tuple[int, int]:
    """Print the run's recall tables and outcomes; returns (error trials, all trials)."""
    from rich.console import Console

    from niah.sweep.progress import length_check, outcome_counts, recall_tables
    from niah.runs.trials import load_run

    _, records = load_run(out, warn=False)
    stdout = Console()
    for t in recall_tables(records):
        stdout.print(t)
    lc = length_check(records)
    counts = ", ".join(f"{k} {v}" for k, v in outcome_counts(records).items() if v)
    stdout.print(f"outcomes: {counts}", soft_wrap=True)
    if lc["checked"]:
        stdout.print(
            f"length check: max |prompt_tokens - length| = {lc['max_dev']} tokens "
            f"({lc['max_rel']:.3%}); {lc['out_of_tolerance']} of {lc['checked']} trials outside max(4, 0.5%)",
            soft_wrap=True,
        )
    stdout.print(f"run folder: {out}", soft_wrap=True)
    return sum(r.get("outcome") == "error" for r in records), len(records)


@app.command()
@request_options
@needle_options
def prompt(
    length: str = typer.Option("1k", help="Whole-prompt length in tokens (1k, 943, 128ki)."),
    depth: float = typer.Option(50.0, help="Needle depth, percent."),
    trial: int = typer.Option(0, help="Trial index."),
    seed: int = typer.Option(0, help="Base seed."),
    mode: str = typer.Option("chat", help="chat or completion."),
    tokenizer: Optional[str] = typer.Option(None, help=TOKENIZER_HELP),
    endpoint: Optional[str] = typer.Option(None, envvar=ENDPOINT_ENV,
                                           help=f"The server whose tokens are counted (default: {DEFAULT_ENDPOINT})."),
    model: Optional[str] = typer.Option(None, envvar=MODEL_ENV,
                                        help="Served model name (default: the first in /v1/models)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar=API_KEY_ENV,
                                          help="Bearer token, if the server wants one."),
    approximate_lengths: bool = typer.Option(False, "--approximate-lengths", help="Allow a counter that is not exact."),
    json_out: bool = typer.Option(False, "--json", help="Print the prompt and its facts as JSON."),
    **kinds,
) -> None:
    """Print the prompt one sweep trial would send (same counter, same seed, same bytes)."""
    import json
    from dataclasses import asdict

    from niah.errors import BadInput
    from niah.prompts.needles import trial_seed
    from niah.prompts.builder import build_prompt
    from niah.prompts.sets import entry_from_prompt
    from niah.sweep.spec import parse_count
    from niah.sweep import Target, prepare_target

    n = parse_count(length)
    if not 0 <= depth <= 100:
        raise BadInput(f"depth {depth:g} is outside 0-100 (depths are percentages)")
    spec = make_spec(str(n), str(depth), trial + 1, seed, 32, mode, tokenizer,
                     approximate_lengths=approximate_lengths, **kinds)
    prepared = prepare_target(Target(endpoint or DEFAULT_ENDPOINT, model=model, api_key=api_key), spec)
    s = trial_seed(seed, n, depth, trial)
    p = build_prompt(prepared.tokenizer, n, depth, s, mode, spec.needles, spec.kind, spec.haystack)
    if json_out:
        e = entry_from_prompt(p, trial, base_seed=seed)
        print(json.dumps({**asdict(e), "needle": p.needle.value, "needle_key": p.needle.key, "content": p.content,
                          "distractor_facts": [{"key": d.key, "value": d.value} for d in p.distractors]},
                         ensure_ascii=False))
    else:
        sys.stdout.write(p.content + "\n")
        print(
            f"# {p.tokens} tokens ({p.tokenizer}); needle {p.needle.value} for {p.needle.key} "
            f"at depth {p.depth_achieved:g}% (asked {depth:g}%)",
            file=sys.stderr,
        )


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
