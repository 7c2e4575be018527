"""Sweep orchestration: ask every (length, depth, trial) of one or more targets, store each.

Library API (the matrix and lifecycle code builds on it):

    spec = SweepSpec(lengths=[300, 4000], depths=[0, 50, 100], trials=3)
    run_sweep([Target("http://127.0.0.1:30000/v1")], spec, Path("results/run"))

or, one server at a time (one launched per configuration):

    prepared = prepare_target(Target(endpoint, name="bf16", engine="sglang"), spec)
    record_config(out, "bf16", {...prepared.info, "command": [...]})
    asyncio.run(run_target(prepared, spec, store, dead=lambda: cause_or_None))

Every trial's prompt depends only on (seed, length, depth, trial) and the tokenizer, so
every configuration answers identical prompts (`prompt_sha256` pairs them).
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from niah.errors import BadInput, ServerError
from niah.store import RunStore, read_manifest, trial_key, write_manifest

DeadFn = Callable[[], "str | None"]


@dataclass
class SweepSpec:
    """What to ask; identical for every configuration."""

    lengths: list[int]
    depths: list[float]
    trials: int = 3
    seed: int = 0
    max_tokens: int = 32
    mode: str = "chat"  # chat | completion
    tokenizer: str | None = None  # None = auto (server /tokenize, else tiktoken)
    concurrency: int = 1
    timeout_s: float = 600.0
    retries: int = 3
    stream: bool = True
    needles: int = 1  # facts in each haystack; the question asks for the one at `depth`
    control: bool = False  # add one no-needle control trial per (length, depth) cell


@dataclass
class Target:
    """Who answers."""

    endpoint: str
    model: str | None = None
    name: str = "default"
    engine: str = "external"
    axes: dict = field(default_factory=dict)
    api_key: str | None = None


@dataclass
class PreparedTarget:
    target: Target
    model: str
    tokenizer: Any  # niah.tokenize.Tokenizer
    max_model_len: int | None
    server: dict  # {"models": GET /v1/models body, "server_info": GET /server_info body}
    needle_span: bool  # the server accepts `niah_needle_span` and returns selection_recall
    endpoint: str = ""
    indexer_probe: bool = False  # the server accepts `niah_value_span` and returns niah_indexer

    @property
    def index_topk(self) -> int | None:
        from niah.indexer import config_topk

        return config_topk({"axes": self.target.axes, "server": self.server})

    @property
    def info(self) -> dict:
        """The manifest's configs[name] entry."""
        t = self.target
        return {
            "endpoint": self.endpoint,
            "model": self.model,
            "engine": t.engine,
            "axes": dict(t.axes),
            "server": self.server,
            "max_model_len": self.max_model_len,
            "tokenizer": self.tokenizer.spec,
            "tokenizer_exact": bool(self.tokenizer.exact),
            "tokenizer_chat": getattr(self.tokenizer, "chat_via", None),
            "chat_template_tokens": getattr(self.tokenizer, "chat_overhead", None),
            "needle_span": self.needle_span,
            "indexer_probe": self.indexer_probe,
            "index_topk": self.index_topk,
        }


def length_tolerance(length: int) -> float:
    """How far server-reported prompt_tokens may drift from the requested length."""
    return max(4.0, 0.005 * length)


# -- checking the spec ------------------------------------------------------------------------
def check_spec(spec: SweepSpec) -> None:
    """Reject an impossible spec (BadInput), before any network."""
    from niah.tokenize import check_spec as check_tokenizer

    if spec.trials < 1:
        raise BadInput(f"--trials must be at least 1 (got {spec.trials})")
    if not spec.lengths:
        raise BadInput("no lengths given")
    if not spec.depths:
        raise BadInput("no depths given")
    for length in spec.lengths:
        if int(length) < 1:
            raise BadInput(f"length {length} must be at least 1 token")
    for d in spec.depths:
        if not 0 <= float(d) <= 100:
            raise BadInput(f"depth {d:g} is outside 0-100 (depths are percentages)")
    if spec.mode not in ("chat", "completion"):
        raise BadInput(f"unknown --mode {spec.mode!r}: use chat or completion")
    if spec.max_tokens < 1:
        raise BadInput(f"--max-tokens must be at least 1 (got {spec.max_tokens})")
    if spec.needles < 1:
        raise BadInput(f"--needles must be at least 1 (got {spec.needles})")
    if spec.concurrency < 1:
        raise BadInput(f"--concurrency must be at least 1 (got {spec.concurrency})")
    if spec.retries < 0:
        raise BadInput(f"--retries must be 0 or more (got {spec.retries})")
    if not spec.timeout_s > 0:
        raise BadInput(f"--timeout must be positive (got {spec.timeout_s})")
    check_tokenizer(spec.tokenizer)


# -- probing a server ---------------------------------------------------------------------------
def _get_json(client, url: str) -> Any | None:
    import httpx

    try:
        r = client.get(url)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    try:
        return r.json()
    except ValueError:
        return None


def prepare_target(target: Target, spec: SweepSpec) -> PreparedTarget:
    """Probe the server, resolve model and tokenizer, check that every length fits.

    Raises BadInput for an unreachable endpoint, an unknown model, a length whose prompt
    plus max_tokens exceeds the model's context, or a length shorter than the prompt's
    fixed parts.
    """
    import httpx

    from niah.prompts import corpus_capacity, fixed_tokens
    from niah.tokenize import api_url, load_tokenizer, root_url

    check_spec(spec)
    endpoint = api_url(target.endpoint)
    if not endpoint.startswith(("http://", "https://")):
        raise BadInput(f"endpoint {target.endpoint!r} must start with http:// or https://")
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    with httpx.Client(timeout=30.0, headers=headers) as client:
        try:
            r = client.get(endpoint + "/models")
        except httpx.HTTPError as e:
            raise BadInput(f"cannot reach {endpoint}: {type(e).__name__}: {e}".rstrip(": ")) from None
        if r.status_code != 200:
            raise BadInput(f"{endpoint}/models answered HTTP {r.status_code}: {r.text[:200].strip()}")
        try:
            models = r.json()
        except ValueError:
            raise BadInput(f"{endpoint}/models did not answer JSON; is this an OpenAI-compatible server?") from None
        server_info = _get_json(client, root_url(endpoint) + "/server_info")
        if server_info is None:
            server_info = _get_json(client, root_url(endpoint) + "/get_server_info")
    entries = [m for m in (models.get("data") or []) if isinstance(m, dict)]
    ids = [m.get("id") for m in entries]
    model = target.model or (ids[0] if ids else None)
    if not model:
        raise BadInput(f"{endpoint} serves no model; pass --model")
    if ids and model not in ids:
        raise BadInput(f"model {model!r} is not served at {endpoint} (it serves: {', '.join(map(str, ids))})")
    entry = next((m for m in entries if m.get("id") == model), {})
    tok = load_tokenizer(spec.tokenizer, endpoint, model, target.api_key)
    max_len = entry.get("max_model_len") or getattr(tok, "max_model_len", None)
    if not max_len and isinstance(server_info, dict):
        max_len = server_info.get("max_model_len") or server_info.get("context_length")
    max_len = int(max_len) if max_len else None
    prepared = PreparedTarget(
        target=target, model=model, tokenizer=tok, max_model_len=max_len,
        server={"models": models, "server_info": server_info},
        needle_span="needle_span" in (entry.get("niah_extensions") or []),
        endpoint=endpoint,
        indexer_probe="indexer_probe" in (entry.get("niah_extensions") or []),
    )
    too_long = [n for n in spec.lengths if max_len and n + spec.max_tokens > max_len]
    if too_long:
        n = too_long[0]
        raise BadInput(
            f"length {n} + max_tokens {spec.max_tokens} = {n + spec.max_tokens} exceeds the "
            f"context of {model!r} ({max_len} tokens); niah never truncates: drop that length"
        )
    try:
        fixed = fixed_tokens(tok, spec.mode)
    except ServerError as e:
        raise BadInput(f"{endpoint}: tokenizer failed: {e}") from None
    capacity = int(0.97 * corpus_capacity(tok)) + fixed
    if max(spec.lengths) > capacity:
        raise BadInput(
            f"length {max(spec.lengths)} is longer than the bundled corpus fills without "
            f"repeating itself (about {capacity} tokens with this tokenizer)"
        )
    fixed += 20 * (spec.needles - 1)  # distractor sentences
    too_short = [n for n in spec.lengths if n < fixed + 8]
    if too_short:
        raise BadInput(
            f"length {too_short[0]} is too short: the prompt's fixed parts (template, "
            f"instruction, needle, question) already take {fixed} tokens"
        )
    return prepared


# -- one target --------------------------------------------------------------------------------
def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _record(prepared: PreparedTarget, length: int, depth: float, trial: int, seed: int) -> dict:
    return {
        "config": prepared.target.name, "model": prepared.model,
        "length": int(length), "prompt_tokens": None, "prompt_tokens_local": None,
        "depth": float(depth), "depth_achieved": None, "trial": int(trial), "seed": seed,
        "prompt_sha256": None, "needle": None, "needle_key": None,
        "answer": None, "reasoning": None, "correct": False, "outcome": "error",
        "finish_reason": None, "completion_tokens": None, "latency_s": None, "ttft_s": None,
        "error": None, "attempts": 0, "selection_recall": None, "indexer": None, "finished_at": None,
    }


def pending_trials(name: str, spec: SweepSpec, done: set[str]) -> list[tuple[int, float, int]]:
    """(length, depth, trial) of this configuration not yet in the store."""
    return [
        (int(n), float(d), t)
        for n in spec.lengths
        for d in spec.depths
        for t in range(spec.trials)
        if trial_key(name, n, d, t) not in done
    ]


async def run_target(
    prepared: PreparedTarget,
    spec: SweepSpec,
    store: RunStore,
    progress=None,
    dead: DeadFn | None = None,
) -> None:
    """Run this target's trials that are not yet in `store.done`.

    `dead()` is polled before each trial and after each connection error; once it
    returns a cause, no request is sent any more and every remaining trial of this target
    is recorded as `error` with "server died: <cause>".

    Without `dead` (a server niah did not launch), a trial that fails to connect after
    its retries makes niah probe GET /v1/models; if the server is gone, that trial and
    every one after it are left unwritten (for --resume once the server is back) and
    ServerError is raised after the trials in flight finish.
    """
    from niah.client import RequestConfig, complete, make_client
    from niah.control import classify, pending_controls
    from niah.control import sweep_values as control_values
    from niah.indexer import append_detail, request_fields, summarise
    from niah.needles import trial_seed
    from niah.prompts import build_prompt
    from niah.scoring import score, scored_text

    name = prepared.target.name
    todo = [(*t, False) for t in pending_trials(name, spec, store.done)]
    todo += [(n, d, 0, True) for n, d in pending_controls(name, spec, store.done)]
    known = control_values(spec) if spec.control else set()
    if progress is not None:
        progress.start_target(name, total=len(todo))
    if not todo:
        return
    cfg = RequestConfig(
        endpoint=prepared.endpoint, model=prepared.model, mode=spec.mode,
        max_tokens=spec.max_tokens, stream=spec.stream, timeout_s=spec.timeout_s,
        retries=spec.retries, api_key=prepared.target.api_key,
    )
    queue: asyncio.Queue = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)
    died: list[str] = []
    gone: list[str] = []  # the external server stopped answering (no dead() given)

    async def unreachable(client) -> str | None:
        import httpx

        try:
            r = await client.get(prepared.endpoint + "/models", timeout=10.0)
        except httpx.HTTPError as e:
            return f"{type(e).__name__}: {e}".rstrip(": ")
        return f"HTTP {r.status_code}" if r.status_code >= 500 else None

    def check_dead() -> str | None:
        if not died and dead is not None:
            cause = dead()
            if cause:
                died.append(str(cause))
        return died[0] if died else None

    def finish(rec: dict) -> None:
        rec["finished_at"] = _now()
        rec["correct"] = rec["outcome"] == "correct" and not rec.get("control")
        store.append(rec)
        if progress is not None:
            progress.advance(name, rec)

    async def one(client, length: int, depth: float, trial: int, control: bool) -> None:
        seed = trial_seed(spec.seed, length, depth, trial)
        rec = _record(prepared, length, depth, trial, seed)
        if control:
            rec["control"] = True
        cause = check_dead()
        if cause:
            rec["error"] = f"server died: {cause}"
            return finish(rec)
        try:
            p = await asyncio.to_thread(
                build_prompt, prepared.tokenizer, length, depth, seed, spec.mode, spec.needles, control
            )
        except Exception as e:  # ServerError or httpx errors from /tokenize
            cause = check_dead()
            if cause is None and dead is None and (lost := await unreachable(client)):
                gone.append(lost)
                return None
            msg = str(e) if isinstance(e, (ServerError, BadInput)) else f"{type(e).__name__}: {e}"
            rec["error"] = f"server died: {cause}" if cause else f"prompt building failed: {msg}"
            return finish(rec)
        rec.update(
            prompt_tokens_local=p.tokens, depth_achieved=p.depth_achieved,
            prompt_sha256=p.sha256, needle=None if control else p.needle.value, needle_key=p.needle.key,
        )
        reply = await complete(client, cfg, p.body(), None if control else request_fields(prepared, p))
        if reply.error and reply.connection_error:
            cause = check_dead()
            if cause:
                reply.error = f"server died: {cause}"
            elif dead is None and (lost := await unreachable(client)):
                gone.append(lost)
                return None
        rec.update(
            prompt_tokens=reply.prompt_tokens, answer=reply.answer, reasoning=reply.reasoning,
            finish_reason=reply.finish_reason, completion_tokens=reply.completion_tokens,
            latency_s=reply.latency_s, ttft_s=reply.ttft_s, error=reply.error,
            attempts=reply.attempts, selection_recall=reply.selection_recall,
            indexer=summarise(reply.indexer),
        )
        if control:
            rec["outcome"] = classify(scored_text(reply.answer, reply.reasoning), p.content, known, reply.error)
        else:
            rec["outcome"] = score(
                p.needle.value, reply.answer, reply.reasoning, reply.finish_reason, reply.error,
                distractors=[d.value for d in p.distractors],
            )
        if reply.indexer is not None and not reply.error:
            append_detail(store.dir, rec, reply.indexer)
        finish(rec)

    async def worker(client) -> None:
        while not gone:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await one(client, *item)

    async with make_client(cfg, spec.concurrency) as client:
        await asyncio.gather(*(worker(client) for _ in range(min(spec.concurrency, len(todo)))))
    if gone:
        left = len(pending_trials(name, spec, store.done))
        raise ServerError(
            f"{prepared.endpoint} stopped answering ({gone[0]}); finished trials are saved, "
            f"{left} of {name!r} are left: rerun with --resume once it is back"
        )


# -- the manifest ------------------------------------------------------------------------------
_manifest_lock = threading.Lock()


def record_config(out: Path | str, name: str, info: dict) -> None:
    """Add (or update) configs[name] in RUN/manifest.json, atomically."""
    with _manifest_lock:
        manifest = read_manifest(out)
        configs = manifest.setdefault("configs", {})
        configs[name] = {**configs.get(name, {}), **info}
        manifest.pop("schema_version", None)
        write_manifest(out, manifest)


def _git_sha() -> str | None:
    import subprocess

    try:
        r = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("niah")
    except PackageNotFoundError:
        return None


# Arguments that change the prompts or answers: a resumed run must keep them.
_FIXED_ON_RESUME = ("seed", "mode", "max_tokens", "needles")


def start_run(out: Path | str, spec: SweepSpec, resume: bool) -> RunStore:
    """Open the run folder (BadInput if unwritable, or if resume changes fixed args) and
    write the manifest's args; configs are added by `record_config`."""
    out = Path(out)
    args = asdict(spec)
    manifest: dict[str, Any] = {}
    if resume and (out / "manifest.json").exists():
        # Check before opening the store: a refused resume must change nothing.
        manifest = read_manifest(out)
        manifest.pop("schema_version", None)
        old = manifest.get("args", {})
        for k in _FIXED_ON_RESUME:
            if k in old and old[k] != args[k]:
                raise BadInput(f"--resume with a different {k} ({args[k]!r}, the run has {old[k]!r}): use another --out")
        manifest.setdefault("resumed", []).append(_now())
    store = RunStore(out).open(resume)
    from niah.needles import NEEDLE, QUESTION
    from niah.prompts import corpus_info

    args["needle"] = {"sentence": NEEDLE, "question": QUESTION, "key": "city", "value": "7 digits"}
    args["corpus"] = corpus_info()
    manifest.update(
        niah_version=_version(), git_sha=_git_sha(), command=list(sys.argv), args=args,
    )
    manifest.setdefault("created", _now())
    manifest.setdefault("configs", {})
    write_manifest(out, manifest)
    if store.skipped_lines:
        print(
            f"niah: {out / 'trials.jsonl'}: skipped unreadable line(s) {store.skipped_lines} "
            "(a write cut short); those trials run again",
            file=sys.stderr,
        )
    if store.retried:
        print(
            f"niah: {store.retried} trial(s) recorded as error run again "
            f"(the old records are kept in {out / 'trials.errors.jsonl'})",
            file=sys.stderr,
        )
    return store


def check_same_tokenizers(manifest: dict, prepared: list[PreparedTarget]) -> None:
    """A resumed configuration must count tokens as before, or its prompts would differ."""
    old = manifest.get("configs", {})
    for p in prepared:
        was = old.get(p.target.name, {}).get("tokenizer")
        if was and was != p.tokenizer.spec:
            raise BadInput(
                f"--resume: configuration {p.target.name!r} was measured with tokenizer {was}, "
                f"now {p.tokenizer.spec}; prompts would differ: pass --tokenizer {was}"
            )


def run_sweep(
    targets: list[Target],
    spec: SweepSpec,
    out: Path,
    resume: bool = False,
    concurrent: bool = False,
    progress=None,
) -> Path:
    """Run a whole sweep into one run folder; returns the folder.

    Every target is probed first (so bad input fails before any trial); then targets run
    one after another, or all at once with `concurrent=True`.
    """
    check_spec(spec)
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise BadInput(f"configuration names must be unique: {names}")
    out = Path(out)
    # Probe every target before touching the run folder: bad input changes nothing.
    prepared = [prepare_target(t, spec) for t in targets]
    if resume and (out / "manifest.json").exists():
        check_same_tokenizers(read_manifest(out), prepared)
    from niah.indexer import length_warnings

    for line in length_warnings(spec.lengths, {p.target.name: p.index_topk for p in prepared}):
        print(f"niah: {line}", file=sys.stderr)
    store = start_run(out, spec, resume)
    try:
        for p in prepared:
            record_config(out, p.target.name, p.info)

        async def main() -> None:
            if concurrent:
                await asyncio.gather(*(run_target(p, spec, store, progress) for p in prepared))
            else:
                for p in prepared:
                    await run_target(p, spec, store, progress)

        if progress is not None:
            with progress:
                asyncio.run(main())
        else:
            asyncio.run(main())
        from niah.attestation import record_from_server

        for p in prepared:  # what each server's indexer ran, into the manifest
            record_from_server(out, p.target.name, dict(p.target.axes), p.endpoint)
    finally:
        store.close()
    return out
