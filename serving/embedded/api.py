"""Request parsing for the embedded server: bytes -> a validated, tokenized request.

Contract: every malformed request is an ApiError (HTTP 400, OpenAI-shaped body), never
another exception. That covers bodies that are not JSON (invalid UTF-8, nesting too deep
for the parser, NaN / Infinity, numbers out of range, lone surrogates), JSON that is not
an object, and a wrong type or value in any field the server reads (`model`, `messages`,
`prompt`, `max_tokens` / `max_completion_tokens`, `stop`, `n`, `temperature`, `top_p`,
`stream`, `stream_options`, `niah_needle_span`, `niah_value_span`). Fields it does not
read are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

MAX_STOPS = 16


class ApiError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.status, self.param, self.type = message, status, param, type_

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.status}}


# -- the body ------------------------------------------------------------------------------
def _finite_float(s: str) -> float:
    x = float(s)
    if not math.isfinite(x):
        raise ValueError(f"number out of range: {s[:40]}")
    return x


def _no_constant(s: str):
    raise ValueError(f"{s} is not JSON")


def parse_body(raw: bytes) -> dict:
    """The request body as a JSON object; anything else is an ApiError (400)."""
    try:
        body = json.loads(raw, parse_float=_finite_float, parse_constant=_no_constant)
        json.dumps(body, ensure_ascii=False).encode("utf-8")   # lone surrogates cannot be served
    except RecursionError:
        raise ApiError("the request body is not valid JSON: nested too deeply") from None
    except UnicodeError:
        raise ApiError("the request body is not valid JSON: not UTF-8 text (or it escapes a lone surrogate)") from None
    except ValueError as e:
        raise ApiError(f"the request body is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, not {type(body).__name__}")
    return body


# -- fields --------------------------------------------------------------------------------
def _content_text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):                       # OpenAI content parts
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise ApiError(f"{where}: only text content parts are supported", param="messages")
            parts.append(p["text"])
        return "".join(parts)
    if content is None:
        return ""
    raise ApiError(f"{where}: content must be a string or a list of text parts", param="messages")


ROLES = ("system", "user", "assistant", "tool", "developer")


def parse_messages(raw) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise ApiError("`messages` must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or m["role"] not in ROLES:
            raise ApiError(f"messages[{i}]: needs a role of {'/'.join(ROLES)}", param="messages")
        out.append({"role": m["role"], "content": _content_text(m.get("content"), f"messages[{i}]")})
    return out


def render_chat(engine, messages: list[dict]) -> str:
    """The chat template applied; a template that refuses the messages is a 400."""
    from jinja2 import TemplateError  # noqa: PLC0415 (the [serve] extra; the matrix reads ServeConfig without it)

    try:
        return engine.render_chat(messages)
    except TemplateError as e:
        raise ApiError(f"chat template: {e}", param="messages") from None


def _int_field(body: dict, name: str, default, lo: int | None = None):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo):
        raise ApiError(f"`{name}` must be an integer >= {lo}", param=name)
    return v


def _number_field(body: dict, name: str, lo: float, hi: float | None = None) -> None:
    v = body.get(name)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= (math.inf if hi is None else hi):
        raise ApiError(f"`{name}` must be a number in [{lo}, {'inf' if hi is None else hi}]"
                       + (" (decoding is always greedy)" if name == "temperature" else ""), param=name)


def _bool_field(body: dict, name: str, where: dict | None = None, param: str | None = None) -> bool:
    v = (body if where is None else where).get(name)
    if v is not None and not isinstance(v, bool):
        raise ApiError(f"`{param or name}` must be true or false", param=param or name)
    return bool(v)


def _stops(body: dict) -> list[str]:
    s = body.get("stop")
    if s is None:
        return []
    if isinstance(s, str):
        s = [s]
    if not isinstance(s, list) or len(s) > MAX_STOPS or not all(isinstance(x, str) for x in s):
        raise ApiError(f"`stop` must be a string or a list of at most {MAX_STOPS} strings", param="stop")
    return s


def _needle_span(body: dict, text_len: int, field: str = "niah_needle_span") -> tuple[int, int] | None:
    span = body.get(field)
    if span is None:
        return None
    if (not isinstance(span, (list, tuple)) or len(span) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in span)
            or not 0 <= span[0] <= span[1] <= text_len):
        raise ApiError(f"`{field}` must be [start, end] with 0 <= start <= end <= {text_len} "
                       "(characters of the last user message / the prompt)", param=field)
    return span[0], span[1]


def _token_span(offsets: list[tuple[int, int]], a: int, b: int) -> tuple[int, int]:
    """Token positions [i, j) whose character spans overlap [a, b)."""
    idx = [i for i, (s, e) in enumerate(offsets) if s < b and e > a]
    return (idx[0], idx[-1] + 1) if idx else (0, 0)


def tokenize_text(engine, body: dict) -> str:
    """The text a /tokenize request names: its prompt, or its messages through the template."""
    if "messages" in body:
        return render_chat(engine, parse_messages(body["messages"]))
    if isinstance(body.get("prompt"), str):
        return body["prompt"]
    raise ApiError("send {\"prompt\": str} or {\"messages\": [...]}", param="prompt")


@dataclass
class Prepared:
    ids: list[int]
    needle: tuple[int, int] | None
    max_tokens: int
    stops: list[str]
    value: tuple[tuple[int, int], str] | None = None    # the needle value's token span and text
    model: str | None = None                            # the name the reply echoes
    stream: bool = False
    include_usage: bool = False


def prepare(engine, body: dict, chat: bool) -> Prepared:
    """Validate a completion request and tokenize its prompt."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError("`model` must be a string", param="model")
    stream = _bool_field(body, "stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise ApiError("`stream_options` must be an object", param="stream_options")
    include_usage = _bool_field(body, "include_usage", opts or {}, "stream_options.include_usage")
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise ApiError("only n=1 is supported", param="n")
    _number_field(body, "temperature", 0.0)
    _number_field(body, "top_p", 0.0, 1.0)
    stops = _stops(body)
    if chat:
        messages = parse_messages(body.get("messages"))
        text = render_chat(engine, messages)
        users = [m for m in messages if m["role"] == "user"]
        last_user = users[-1]["content"] if users else ""
        span = _needle_span(body, len(last_user))
        vspan = _needle_span(body, len(last_user), "niah_value_span")
        base = text.rfind(last_user) if span is not None or vspan is not None else 0
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ApiError("`prompt` must be a string", param="prompt")
        text = prompt
        span = _needle_span(body, len(text))
        vspan = _needle_span(body, len(text), "niah_value_span")
        base = 0
    max_tokens = _int_field(body, "max_completion_tokens", None, 1)
    max_tokens = _int_field(body, "max_tokens", max_tokens, 1)
    enc = engine.encode(text)
    ids = list(enc.ids)
    if not ids:
        raise ApiError("the prompt is empty", param="prompt")
    needle = _token_span(enc.offsets, base + span[0], base + span[1]) if span is not None else None
    value = None
    if vspan is not None:
        value = (_token_span(enc.offsets, base + vspan[0], base + vspan[1]), text[base + vspan[0]:base + vspan[1]])
    room = engine.max_len - len(ids)
    if max_tokens is None:
        if room < 1:
            raise ApiError(f"the prompt has {len(ids)} tokens; this model's context is {engine.max_len} "
                           "tokens, and at least one must be left to generate", param="messages" if chat else "prompt")
        max_tokens = room
    elif len(ids) + max_tokens > engine.max_len:
        raise ApiError(f"this model's maximum context length is {engine.max_len} tokens; the request has "
                       f"{len(ids)} prompt tokens + {max_tokens} max_tokens = {len(ids) + max_tokens}",
                       param="max_tokens")
    return Prepared(ids, needle, max_tokens, stops, value, model or None, stream, include_usage)
