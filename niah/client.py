"""Async OpenAI-compatible client: chat and completion, streaming with TTFT, bounded retries.

Greedy (temperature 0). Retries with exponential backoff on 429, 5xx and connection
errors (refused, reset, dropped mid-stream), at most `retries` times; a timeout is not
retried (it would multiply the wait). Never raises for a failed request: the returned
`Reply` carries `error` instead (a reply body in it cut to one line of BODY_CHARS), so a
sweep records it and goes on. `root_url` and `api_url` turn a server's base URL into the
two roots niah talks to.

Pass-through (`niah sweep --header K:V --extra-body JSON`): inside `with pass_through(headers,
body):` every request niah sends carries the headers (`request_headers(api_key)`: the
probes, the counters, the attestation reads and the trials) and every generation request
the extra body fields (`request_body`, the usage-probe counter; the /tokenize counters get
`chat_template_kwargs` only, the one such field /tokenize takes). A header given with
--header wins over the bearer token of --api-key. Body fields niah sets itself (model,
messages, prompt, max_tokens, stream, temperature, top_p, niah_*) are refused: they would
change what is measured. `pass_through_state()` is (headers, body) as set; what the
manifest keeps of it (secret header values masked) is niah.sweep.targets' business.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import httpx

from niah.errors import BadInput, one_line

RETRY_STATUS = {429, 500, 502, 503, 504}
BODY_CHARS = 200  # of a failed reply's body, on one line, in a trial's `error` and in messages


def root_url(endpoint: str) -> str:
    """`http://h:p/v1` -> `http://h:p` (where /tokenize, /server_info live)."""
    e = endpoint.rstrip("/")
    return e[: -len("/v1")] if e.endswith("/v1") else e


def check_endpoint(endpoint: str) -> str:
    """The endpoint, or BadInput in one line when it is not an http(s) URL httpx can parse."""
    if not endpoint.startswith(("http://", "https://")):
        raise BadInput(f"endpoint {endpoint!r} must start with http:// or https://")
    try:
        url = httpx.URL(endpoint)
    except (httpx.InvalidURL, ValueError) as e:
        raise BadInput(f"endpoint {endpoint!r} is not a URL: {one_line(str(e))}") from None
    if not url.host:
        raise BadInput(f"endpoint {endpoint!r} names no host")
    return endpoint


def api_url(endpoint: str) -> str:
    """`http://h:p` or `http://h:p/v1` -> `http://h:p/v1`."""
    return root_url(endpoint) + "/v1"


# -- pass-through: extra headers and body fields on every request ---------------------------
RESERVED_BODY = frozenset({"model", "messages", "prompt", "max_tokens", "stream", "stream_options",
                           "temperature", "top_p"})
_PASS: dict[str, dict] = {"headers": {}, "body": {}}


def parse_extra_body(text: str | None) -> dict:
    """`--extra-body '{"chat_template_kwargs": {"thinking": true}}'` -> a dict; BadInput for
    anything but a JSON object, or for a field niah sets itself."""
    if text is None or not text.strip():
        return {}
    try:
        body = json.loads(text)
    except ValueError as e:
        raise BadInput(f"--extra-body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadInput(f"--extra-body must be a JSON object ({{\"field\": value}}), not {type(body).__name__}")
    taken = sorted(k for k in body if k in RESERVED_BODY or k.startswith("niah_"))
    if taken:
        raise BadInput(f"--extra-body cannot set {', '.join(taken)}: niah sets it (it is part of what is measured)")
    return body


def parse_headers(items: Iterable[str] | None) -> dict[str, str]:
    """`--header 'X-Team: ml' --header 'Authorization: Basic abc'` -> {name: value}; BadInput
    for an item without `NAME:` or with a name HTTP does not allow."""
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, value = str(item).partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name or not all(c.isalnum() or c in "!#$%&'*+-.^_`|~" for c in name):
            raise BadInput(f"--header {item!r} is not NAME:VALUE (e.g. --header 'X-Team: ml')")
        if "\n" in value or "\r" in value:
            raise BadInput(f"--header {name}: its value holds a line break")
        if not value.isascii():
            raise BadInput(f"--header {name}: its value must be ASCII (HTTP header values are bytes)")
        out[name] = value
    return out


@contextmanager
def pass_through(headers: dict[str, str] | None = None, body: dict | None = None) -> Iterator[None]:
    """Within: every request niah sends carries `headers`, every generation request `body`."""
    old = dict(_PASS)
    _PASS.update(headers=dict(headers or {}), body=dict(body or {}))
    try:
        yield
    finally:
        _PASS.update(old)


def request_headers(api_key: str | None = None) -> dict[str, str]:
    """The headers of every request: the bearer token (if any), then the pass-through headers
    (a pass-through Authorization replaces the token's)."""
    if api_key and (not api_key.isascii() or any(c.isspace() for c in api_key)):
        raise BadInput("the API key (--api-key, NIAH_API_KEY or OPENAI_API_KEY) must be ASCII without spaces")
    out = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    for k, v in _PASS["headers"].items():
        out = {a: b for a, b in out.items() if a.lower() != k.lower()}
        out[k] = v
    return out


def extra_body() -> dict:
    """The pass-through body fields (a copy)."""
    return json.loads(json.dumps(_PASS["body"]))


def template_fields() -> dict:
    """The pass-through fields a /tokenize of chat messages takes: chat_template_kwargs."""
    b = _PASS["body"]
    return {"chat_template_kwargs": b["chat_template_kwargs"]} if "chat_template_kwargs" in b else {}


def pass_through_state() -> tuple[dict[str, str], dict]:
    """(headers, body) of the pass-through now in force (copies; both empty outside one)."""
    return dict(_PASS["headers"]), extra_body()


@dataclass
class RequestConfig:
    endpoint: str  # http://host:port/v1
    model: str
    mode: str = "chat"  # chat | completion
    max_tokens: int = 32
    stream: bool = True
    timeout_s: float = 600.0
    retries: int = 3
    backoff_s: float = 0.5  # first retry waits this long, then doubles (capped at 8 s)
    api_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # extra JSON fields on every request


@dataclass
class Reply:
    answer: str = ""
    reasoning: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    attempts: int = 0
    error: str | None = None
    connection_error: bool = False  # the last failure was a connection-level one
    selection_recall: list[float | None] | None = None
    indexer: dict | None = None  # the server's `niah_indexer` probe detail (embedded server)
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, where reported


class _Retryable(Exception):
    def __init__(self, msg: str, connection: bool = False, retry_after: float | None = None):
        super().__init__(msg)
        self.connection = connection
        self.retry_after = retry_after


def make_client(cfg: RequestConfig, concurrency: int = 1):
    """An httpx.AsyncClient sized for the sweep (the caller closes it)."""
    headers = request_headers(cfg.api_key)
    limits = httpx.Limits(max_connections=max(1, concurrency) + 2, max_keepalive_connections=max(1, concurrency))
    timeout = httpx.Timeout(cfg.timeout_s, connect=min(cfg.timeout_s, 30.0))
    return httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout)


def request_body(cfg: RequestConfig, prompt_fields: dict) -> dict:
    body: dict[str, Any] = {
        "model": cfg.model,
        **prompt_fields,
        "max_tokens": cfg.max_tokens,
        "temperature": 0,
        "top_p": 1,
        "stream": cfg.stream,
    }
    if cfg.stream:
        body["stream_options"] = {"include_usage": True}
    body.update(_PASS["body"])
    body.update(cfg.extra)
    return body


async def complete(client, cfg: RequestConfig, prompt_fields: dict, extra: dict | None = None) -> Reply:
    """Send one request (with retries); never raises for request failures."""
    path = "/chat/completions" if cfg.mode == "chat" else "/completions"
    url = cfg.endpoint.rstrip("/") + path
    body = request_body(cfg, prompt_fields)
    if extra:
        body.update(extra)
    reply = Reply()
    for attempt in range(cfg.retries + 1):
        reply = Reply(attempts=attempt + 1)
        t0 = time.perf_counter()
        try:
            if cfg.stream:
                await _stream(client, url, body, reply, t0, cfg.mode)
            else:
                await _plain(client, url, body, reply, cfg.mode)
            reply.latency_s = round(time.perf_counter() - t0, 6)
            return reply
        except _Retryable as e:
            reply.error = str(e)
            reply.connection_error = e.connection
            wait = e.retry_after
        except httpx.TimeoutException as e:
            reply.error = f"timeout after {cfg.timeout_s:g}s ({type(e).__name__})"
            reply.latency_s = round(time.perf_counter() - t0, 6)
            return reply
        except (httpx.TransportError, httpx.StreamError) as e:
            reply.error = one_line(f"connection error: {type(e).__name__}: {e}".rstrip(": "), BODY_CHARS)
            reply.connection_error = True
            wait = None
        except _Fatal as e:
            reply.error = str(e)
            reply.latency_s = round(time.perf_counter() - t0, 6)
            return reply
        except (AttributeError, TypeError, ValueError, IndexError, KeyError) as e:
            # A reply of an unexpected shape: this trial's error, never the sweep's end.
            reply.error = one_line(f"malformed reply: {type(e).__name__}: {e}", BODY_CHARS)
            reply.latency_s = round(time.perf_counter() - t0, 6)
            return reply
        if attempt < cfg.retries:
            delay = min(8.0, cfg.backoff_s * (2**attempt)) if wait is None else min(wait, 30.0)
            await asyncio.sleep(delay)
    reply.latency_s = None
    reply.error = f"{reply.error} (gave up after {reply.attempts} attempts)"
    return reply


class _Fatal(Exception):
    pass


def _check_status(status: int, text: str, headers) -> None:
    if status == 200:
        return
    msg = f"HTTP {status}: {one_line(text, BODY_CHARS)}"
    if status in RETRY_STATUS:
        ra = headers.get("retry-after") if headers is not None else None
        try:
            retry_after = float(ra) if ra is not None else None
        except ValueError:
            retry_after = None
        raise _Retryable(msg, retry_after=retry_after)
    raise _Fatal(msg)


def _take_message(reply: Reply, data: dict, mode: str) -> None:
    choice = (data.get("choices") or [{}])[0]
    if mode == "chat":
        msg = choice.get("message") or {}
        reply.answer = msg.get("content") or ""
        r = msg.get("reasoning_content") or msg.get("reasoning")
        reply.reasoning = r or None
    else:
        reply.answer = choice.get("text") or ""
    reply.finish_reason = choice.get("finish_reason")
    _take_usage(reply, data)


def _take_usage(reply: Reply, data: dict) -> None:
    usage = data.get("usage") or {}
    if usage.get("prompt_tokens") is not None:
        reply.prompt_tokens = int(usage["prompt_tokens"])
    if usage.get("completion_tokens") is not None:
        reply.completion_tokens = int(usage["completion_tokens"])
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        reply.cached_tokens = details["cached_tokens"]  # the server's prefix-cache hit, where it says
    if data.get("selection_recall") is not None:
        reply.selection_recall = [None if x is None else float(x) for x in data["selection_recall"]]
    if isinstance(data.get("niah_indexer"), dict):
        reply.indexer = data["niah_indexer"]


def _json_object(text: str) -> dict:
    """A reply body that must be a JSON object; anything else is a fatal trial error."""
    try:
        data = json.loads(text)
    except ValueError:
        raise _Fatal(f"not JSON: {one_line(text, BODY_CHARS)}") from None
    if not isinstance(data, dict):
        raise _Fatal(f"not a JSON object: {one_line(text, BODY_CHARS)}")
    return data


async def _plain(client, url: str, body: dict, reply: Reply, mode: str) -> None:
    r = await client.post(url, json=body)
    _check_status(r.status_code, r.text, r.headers)
    _take_message(reply, _json_object(r.text), mode)


async def _stream(client, url: str, body: dict, reply: Reply, t0: float, mode: str) -> None:
    answer: list[str] = []
    reasoning: list[str] = []
    done = False
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode("utf-8", "replace")
            _check_status(r.status_code, text, r.headers)
        ctype = r.headers.get("content-type", "")
        if "text/event-stream" not in ctype:  # a server that ignored stream=true
            body_text = (await r.aread()).decode("utf-8", "replace")
            _take_message(reply, _json_object(body_text), mode)
            return
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                done = True
                break
            try:
                data = json.loads(payload)
            except ValueError:
                continue
            if not isinstance(data, dict):
                continue
            if "error" in data and not data.get("choices"):
                raise _Fatal(f"stream error: {one_line(json.dumps(data['error']), BODY_CHARS)}")
            _take_usage(reply, data)
            for choice in data.get("choices") or []:
                if mode == "chat":
                    delta = choice.get("delta") or {}
                    piece = delta.get("content") or ""
                    rpiece = delta.get("reasoning_content") or delta.get("reasoning") or ""
                else:
                    piece, rpiece = choice.get("text") or "", ""
                if (piece or rpiece) and reply.ttft_s is None:
                    reply.ttft_s = round(time.perf_counter() - t0, 6)
                answer.append(piece)
                reasoning.append(rpiece)
                if choice.get("finish_reason"):
                    reply.finish_reason = choice["finish_reason"]
    if not done and reply.finish_reason is None:
        raise _Retryable("connection error: stream ended before [DONE]", connection=True)
    reply.answer = "".join(answer)
    reply.reasoning = "".join(reasoning) or None
