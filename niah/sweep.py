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
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from niah.errors import BadInput, ServerError
from niah.needles import NeedleKind
from niah.record import now as _now
from niah.run import DeadFn, pending_trials, run_target  # noqa: F401 (public names)
from niah.store import RunStore, read_manifest, write_manifest
from niah.usage import length_tolerance  # noqa: F401 (public name)


@dataclass
class SweepSpec:
    """What to ask; identical for every configuration."""

    lengths: list[int]
    depths: list[float]
    trials: int = 3
    seed: int = 0
    max_tokens: int = 32
    mode: str = "chat"  # chat | completion
    tokenizer: str | None = None  # None = auto (server /tokenize, else usage), checked
    concurrency: int = 1
    timeout_s: float = 600.0
    retries: int = 3
    stream: bool = True
    needles: int = 1  # keys in each haystack; the question asks for the one at `depth`
    needle_key: str = "city"  # city | word
    needle_value: str = "number"  # number | uuid | word
    values: int = 1  # values per key (all asked)
    queries: int = 1  # keys asked at once
    haystack: str = "prose"  # prose | book | noise | needles | file:PATH
    approximate_lengths: bool = False  # run even when the counter is not exact
    prompts: str | None = None  # a frozen prompt set (niah prompts build) to run

    @property
    def kind(self) -> NeedleKind:
        return NeedleKind(key=self.needle_key, value=self.needle_value, values=self.values,
                          keys=self.needles, queries=self.queries)


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
    prompts: Any = None  # niah.promptset.SetIndex when running a frozen set
    counter_check: Any = None  # niah.usage.CounterCheck

    @property
    def info(self) -> dict:
        """The manifest's configs[name] entry."""
        t = self.target
        tok = self.tokenizer
        info = {
            "endpoint": self.endpoint,
            "model": self.model,
            "engine": t.engine,
            "axes": dict(t.axes),
            "server": self.server,
            "max_model_len": self.max_model_len,
            "needle_span": self.needle_span,
        }
        if tok is None:  # a frozen prompt set: counted when it was built
            info.update(tokenizer=",".join(self.prompts.tokenizers), tokenizer_exact=None,
                        prompts=str(self.prompts.path))
            return info
        info.update(
            tokenizer=tok.spec, tokenizer_exact=bool(tok.exact),
            tokenizer_chat=getattr(tok, "chat_via", None),
            chat_template_tokens=getattr(tok, "chat_overhead", None),
        )
        if self.counter_check is not None:
            info["tokenizer_check"] = asdict(self.counter_check)
        if hasattr(tok, "cost"):
            info["tokenizer_cost"] = tok.cost
        return info


# -- checking the spec ------------------------------------------------------------------------
def check_spec(spec: SweepSpec) -> None:
    """Reject an impossible spec (BadInput), before any network."""
    from niah.haystacks import check_kind
    from niah.tokenize import check_tokenizer_spec

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
    spec.kind.check()
    check_kind(spec.haystack)
    if spec.concurrency < 1:
        raise BadInput(f"--concurrency must be at least 1 (got {spec.concurrency})")
    if spec.retries < 0:
        raise BadInput(f"--retries must be 0 or more (got {spec.retries})")
    if not spec.timeout_s > 0:
        raise BadInput(f"--timeout must be positive (got {spec.timeout_s})")
    check_tokenizer_spec(spec.tokenizer)


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


def prepare_target(target: Target, spec: SweepSpec, prompt_set=None) -> PreparedTarget:
    """Probe the server, resolve model and a checked counter, check that every length fits.

    With `prompt_set` (a niah.promptset.SetIndex) the prompts are frozen: no counter is
    needed. Raises BadInput for an unreachable endpoint, an unknown model, a counter that
    cannot be exact (unless spec.approximate_lengths), a length whose prompt plus
    max_tokens exceeds the model's context, or a length shorter than the prompt's fixed parts.
    """
    from niah.tokenize import api_url

    check_spec(spec)
    endpoint = api_url(target.endpoint)
    if not endpoint.startswith(("http://", "https://")):
        raise BadInput(f"endpoint {target.endpoint!r} must start with http:// or https://")
    models, server_info = _probe(endpoint, target.api_key)
    entries = [m for m in (models.get("data") or []) if isinstance(m, dict)]
    ids = [m.get("id") for m in entries]
    model = target.model or (ids[0] if ids else None)
    if not model:
        raise BadInput(f"{endpoint} serves no model; pass --model")
    if ids and model not in ids:
        raise BadInput(f"model {model!r} is not served at {endpoint} (it serves: {', '.join(map(str, ids))})")
    entry = next((m for m in entries if m.get("id") == model), {})
    prepared = PreparedTarget(
        target=target, model=model, tokenizer=None, max_model_len=None,
        server={"models": models, "server_info": server_info},
        needle_span="needle_span" in (entry.get("niah_extensions") or []),
        endpoint=endpoint, prompts=prompt_set,
    )
    if prompt_set is None:
        from niah.usage import resolve_counter

        prepared.tokenizer, prepared.counter_check = resolve_counter(
            spec.tokenizer, endpoint, model, target.api_key, spec.mode, spec.approximate_lengths)
    max_len = entry.get("max_model_len") or getattr(prepared.tokenizer, "max_model_len", None)
    if not max_len and isinstance(server_info, dict):
        max_len = server_info.get("max_model_len") or server_info.get("context_length")
    prepared.max_model_len = int(max_len) if max_len else None
    _check_fits(prepared, spec)
    return prepared


def _probe(endpoint: str, api_key: str | None) -> tuple[dict, Any]:
    """GET /v1/models (BadInput when it fails) and /server_info (None when absent)."""
    import httpx

    from niah.tokenize import root_url

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
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
        if not isinstance(models, dict):
            raise BadInput(f"{endpoint}/models did not answer a JSON object")
        server_info = _get_json(client, root_url(endpoint) + "/server_info")
        if server_info is None:
            server_info = _get_json(client, root_url(endpoint) + "/get_server_info")
    return models, server_info


def _check_fits(prepared: PreparedTarget, spec: SweepSpec) -> None:
    """Every length fits the context, the haystack and the prompt's fixed parts."""
    from niah.haystacks import load_haystack
    from niah.prompts import corpus_capacity, fixed_tokens

    max_len, model, tok = prepared.max_model_len, prepared.model, prepared.tokenizer
    too_long = [n for n in spec.lengths if max_len and n + spec.max_tokens > max_len]
    if too_long:
        n = too_long[0]
        raise BadInput(
            f"length {n} + max_tokens {spec.max_tokens} = {n + spec.max_tokens} exceeds the "
            f"context of {model!r} ({max_len} tokens); niah never truncates: drop that length"
        )
    if tok is None:
        return
    try:
        fixed = fixed_tokens(tok, spec.mode, spec.kind)
        capacity = int(0.97 * corpus_capacity(tok, load_haystack(spec.haystack, spec.kind.value))) + fixed
    except ServerError as e:
        raise BadInput(f"{prepared.endpoint}: tokenizer failed: {e}") from None
    if max(spec.lengths) > capacity:
        what = "the bundled corpus fills" if spec.haystack == "prose" else f"the {spec.haystack} haystack fills"
        raise BadInput(
            f"length {max(spec.lengths)} is longer than {what} without "
            f"repeating itself (about {capacity} tokens with this tokenizer)"
        )
    too_short = [n for n in spec.lengths if n < fixed + 8]
    if too_short:
        raise BadInput(
            f"length {too_short[0]} is too short: the prompt's fixed parts (template, "
            f"instruction, needles, question) already take {fixed} tokens"
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
_FIXED_ON_RESUME = ("seed", "mode", "max_tokens", "needles", "needle_key", "needle_value", "values",
                    "queries", "haystack", "prompts")


def start_run(out: Path | str, spec: SweepSpec, resume: bool) -> RunStore:
    """Lock and open the run folder (BadInput if in use, unwritable, or if resume changes
    fixed args) and write the manifest's args; configs are added by `record_config`."""
    from niah.lock import RunLock

    out = Path(out)
    lock = RunLock(out).acquire()
    try:
        store = _open_run(out, spec, resume)
    except BaseException:
        lock.release()
        raise
    store.lock = lock
    return store


def _open_run(out: Path, spec: SweepSpec, resume: bool) -> RunStore:
    from niah.haystacks import haystack_info
    from niah.prompts import corpus_info
    from niah.promptset import RunPrompts

    args = asdict(spec)
    manifest: dict[str, Any] = {}
    if resume and (out / "manifest.json").exists():
        # Check before opening the store: a refused resume must change nothing.
        manifest = read_manifest(out)
        manifest.pop("schema_version", None)
        old = manifest.get("args", {})
        for k in _FIXED_ON_RESUME:
            if old.get(k, SweepSpec.__dataclass_fields__[k].default) != args[k]:
                raise BadInput(f"--resume with a different {k} ({args[k]!r}, the run has {old.get(k)!r}): use another --out")
        manifest.setdefault("resumed", []).append(_now())
    store = RunStore(out).open(resume)
    from niah.needles import NEEDLE, QUESTION

    kind = spec.kind
    args["needle"] = {"sentence": NEEDLE, "question": QUESTION, "key": "city", "value": "7 digits"} if kind.default \
        else {"sentence": kind.sentence("{key}", "{value}"), "question": kind.question(["{key}"])}
    args["needle_kind"] = kind.as_dict()
    args["corpus"] = corpus_info() if spec.haystack == "prose" else haystack_info(spec.haystack, kind.value)
    manifest.update(niah_version=_version(), git_sha=_git_sha(), command=list(sys.argv), args=args)
    manifest.setdefault("created", _now())
    manifest.setdefault("configs", {})
    write_manifest(out, manifest)
    store.prompts = RunPrompts(out) if spec.prompts is None else None
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


def check_same_tokenizers(manifest: dict, prepared: list[PreparedTarget], force: bool = False) -> None:
    """A resumed configuration must be the same server (endpoint, model) counting tokens as
    before, or two servers' trials would merge under one name (`force`: allow another
    endpoint or model; the counter must still match, or the prompts would differ)."""
    old = manifest.get("configs", {})
    for p in prepared:
        before = old.get(p.target.name, {})
        was = before.get("tokenizer")
        now = p.info["tokenizer"]
        if was and was != now:
            raise BadInput(
                f"--resume: configuration {p.target.name!r} was measured with tokenizer {was}, "
                f"now {now}; prompts would differ: pass --tokenizer {was}"
            )
        if force or p.target.engine != "external":
            continue  # a launched server gets a new port each time; its settings are checked instead
        for key, new in (("endpoint", p.endpoint), ("model", p.model)):
            if before.get(key) and before[key] != new:
                raise BadInput(
                    f"--resume: configuration {p.target.name!r} was measured at {key} {before[key]}, "
                    f"now {new}; its trials would mix two servers: use another --out, or pass --force-config"
                )


def run_sweep(
    targets: list[Target],
    spec: SweepSpec,
    out: Path,
    resume: bool = False,
    concurrent: bool = False,
    progress=None,
    force_config: bool = False,
) -> Path:
    """Run a whole sweep into one run folder; returns the folder.

    Every target is probed first (so bad input fails before any trial); then targets run
    one after another, or all at once with `concurrent=True`. With spec.prompts the
    frozen set is run instead of building prompts.
    """
    check_spec(spec)
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise BadInput(f"configuration names must be unique: {names}")
    out = Path(out)
    prompt_set = load_prompt_set(spec)
    # Probe every target before touching the run folder: bad input changes nothing.
    prepared = [prepare_target(t, spec, prompt_set) for t in targets]
    if resume and (out / "manifest.json").exists():
        check_same_tokenizers(read_manifest(out), prepared, force_config)
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

        try:
            if progress is not None:
                with progress:
                    asyncio.run(main())
            else:
                asyncio.run(main())
        finally:
            for p in prepared:
                if p.tokenizer is not None and hasattr(p.tokenizer, "cost"):
                    record_config(out, p.target.name, {"tokenizer_cost": p.tokenizer.cost})
    finally:
        store.close()
    return out


def load_prompt_set(spec: SweepSpec):
    """The frozen set of spec.prompts (its grid becomes the spec's), or None."""
    if spec.prompts is None:
        return None
    from niah.promptset import SetIndex, read_set

    index = SetIndex(read_set(spec.prompts), spec.prompts)
    spec.lengths, spec.depths, spec.trials, spec.mode = index.lengths, index.depths, index.trials, index.mode
    return index
