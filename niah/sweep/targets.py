"""What a configuration is: a Target (endpoint, model, counter, optional lifecycle), probed
and prepared once before any trial.

    prepared = prepare_target(Target(endpoint, name="bf16", engine="sglang"), spec)
    prepared.info          # the manifest's configs[name] entry
    await niah.sweep.run.run_target(prepared, spec, store)   # polls target.lifecycle.dead(), if any

An external endpoint is a Target with no lifecycle. A launched one (niah.serving.matrix)
has a `Lifecycle`: start, the endpoint it serves, dead() -> cause or None, describe(),
stop(). The plain sweep and the matrix run their targets through the same
niah.sweep.orchestrate.orchestrate: prepare (this module), call (niah.sweep.run), record
(niah.runs). `spec` is checked here (niah.sweep.spec.check_spec: once per spec).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import httpx

from niah.client import (BODY_CHARS, api_url, check_endpoint, extra_body, pass_through_state, request_headers,
                         root_url)
from niah.errors import BadInput, ServerError, one_line
from niah.redact import redact_body, redact_headers
from niah.prompts.builder import corpus_capacity, fixed_tokens
from niah.prompts.haystacks import load_haystack
from niah.sweep.cache_state import check_counter_keeps_cold
from niah.sweep.counter import CounterCheck, resolve_counter
from niah.sweep.indexer import config_regime, config_topk, geometry_conflict
from niah.sweep.reasoning import thinking_of
from niah.sweep.spec import SweepSpec, check_spec


class Lifecycle(Protocol):
    """A server niah starts and stops (serving.launch.ServerProcess implements it)."""

    endpoint: str

    def start(self) -> None: ...

    def dead(self) -> str | None: ...

    def describe(self) -> dict: ...

    def stop(self) -> None: ...


@dataclass
class Target:
    """Who answers: an endpoint (and model, key), and for a server niah launched, its
    lifecycle (whose `dead()` the call stage polls)."""

    endpoint: str
    model: str | None = None
    name: str = "default"
    engine: str = "external"
    axes: dict = field(default_factory=dict)
    api_key: str | None = None
    geometry: dict = field(default_factory=dict)  # index_compression / index_window given on the command line
    lifecycle: Lifecycle | None = field(default=None, repr=False)


@dataclass
class PreparedTarget:
    target: Target
    model: str
    tokenizer: Any  # a niah.tokens.Tokenizer
    max_model_len: int | None
    server: dict  # {"models": GET /v1/models body, "server_info": GET /server_info body}
    needle_span: bool  # the server accepts `niah_needle_span` and returns selection_recall
    endpoint: str = ""
    prompts: Any = None  # niah.prompts.sets.SetIndex when running a frozen set
    counter_check: CounterCheck | None = None
    indexer_probe: bool = False  # the server accepts `niah_value_span` and returns niah_indexer

    @property
    def index_topk(self) -> int | None:
        return config_topk({"axes": self.target.axes, "server": self.server})

    @property
    def regime(self):
        """The sparse regime (niah.regime.Regime) the server's geometry gives, None when dense."""
        return config_regime({"axes": self.target.axes, "geometry": self.target.geometry, "server": self.server})

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
            "indexer_probe": self.indexer_probe,
            "index_topk": self.index_topk,
        }
        if t.geometry:  # given on the command line (a plain endpoint that does not attest it)
            info["geometry"] = dict(t.geometry)
        if (passed := pass_through_record()) is not None:  # --header / --extra-body (secret values masked)
            info["request"] = passed
        info["thinking"] = thinking_of(extra_body())  # chat_template_kwargs' thinking switch; None: unsaid
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


def pass_through_record() -> dict | None:
    """What a configuration's manifest entry records of --header / --extra-body (`request`):
    the extra body with values under secret-named keys masked, the headers with secret-like
    values masked; None without any."""
    headers, body = pass_through_state()
    if not (headers or body):
        return None
    return {"headers": redact_headers(headers), "extra_body": redact_body(body)}


# -- probing a server ---------------------------------------------------------------------------
def _get_json(client, url: str) -> Any | None:
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

    With `prompt_set` (a niah.prompts.sets.SetIndex) the prompts are frozen: no counter is
    needed. Raises BadInput for an unreachable endpoint, an unknown model, a counter that
    cannot be exact (unless spec.approximate_lengths), a length whose prompt plus
    max_tokens exceeds the model's context, or a length shorter than the prompt's fixed parts.
    """
    check_spec(spec)
    endpoint = check_endpoint(api_url(target.endpoint))
    models, server_info = _probe(endpoint, target.api_key, min(30.0, spec.timeout_s))
    entries = [m for m in (models.get("data") or []) if isinstance(m, dict)]
    ids = [m.get("id") for m in entries]
    model = target.model or (ids[0] if ids else None)
    if not model:
        raise BadInput(f"{endpoint} serves no model; pass --model")
    if ids and model not in ids:
        raise BadInput(f"model {model!r} is not served at {endpoint} (it serves: {', '.join(map(str, ids))})")
    entry = next((m for m in entries if m.get("id") == model), {})
    if conflict := geometry_conflict(target.geometry, [entry, server_info]):
        raise BadInput(f"{endpoint}: {conflict}")
    prepared = PreparedTarget(
        target=target, model=model, tokenizer=None, max_model_len=None,
        server={"models": models, "server_info": server_info},
        needle_span="needle_span" in (entry.get("niah_extensions") or []),
        endpoint=endpoint, prompts=prompt_set,
        indexer_probe="indexer_probe" in (entry.get("niah_extensions") or []),
    )
    if prompt_set is None:
        prepared.tokenizer, prepared.counter_check = resolve_counter(
            spec.tokenizer, endpoint, model, target.api_key, spec.mode, spec.approximate_lengths, spec.timeout_s)
        check_counter_keeps_cold(spec.cache_states, prepared.tokenizer)  # before any trial: exit 2
    max_len = entry.get("max_model_len") or getattr(prepared.tokenizer, "max_model_len", None)
    if not max_len and isinstance(server_info, dict):
        max_len = server_info.get("max_model_len") or server_info.get("context_length")
    prepared.max_model_len = int(max_len) if max_len else None
    _check_fits(prepared, spec)
    return prepared


def _probe(endpoint: str, api_key: str | None, timeout_s: float = 30.0) -> tuple[dict, Any]:
    """GET /v1/models (BadInput when it fails) and /server_info (None when absent)."""
    with httpx.Client(timeout=timeout_s, headers=request_headers(api_key)) as client:
        try:
            r = client.get(endpoint + "/models")
        except httpx.HTTPError as e:
            raise BadInput(f"cannot reach {endpoint}: {type(e).__name__}: {e}".rstrip(": ")) from None
        if r.status_code != 200:
            raise BadInput(f"{endpoint}/models answered HTTP {r.status_code}: {one_line(r.text, BODY_CHARS)}")
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


def _check_fits(prepared: PreparedTarget, spec) -> None:
    """Every length fits the context, the haystack and the prompt's fixed parts."""
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
