"""Exact length against any server: count with `usage.prompt_tokens`, and check every counter.

`UsageTokenizer` (`--tokenizer usage`) sends the text as a `max_tokens=1` request and reads
the server's own `usage.prompt_tokens`; answers are cached per text. It works against any
OpenAI-compatible server, hosted APIs included, at the cost of a few extra short requests
per prompt (counted in `cost`, recorded in the manifest as `tokenizer_cost`). Those probes
send the trial's prompt before the trial itself: a server with prefix caching then serves
the trial from its cache (recorded as `tokenizer_cost.warms_prefix_cache`).

`resolve_counter` picks and checks the counter of one target. `auto` tries, in order, the
`/tokenize` shapes niah knows (SGLang, vLLM), then `usage`; tiktoken only when told
(`--tokenizer tiktoken:...`) or, with `--approximate-lengths`, as the last resort. Every
counter is checked before a run on a probe prompt of a few hundred tokens against the
server's `usage.prompt_tokens`: one that disagrees beyond max(4, 0.5%) is not used (`auto`
moves on, an explicit one is refused), and one that cannot be checked or is not exact is
refused unless `--approximate-lengths`.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from niah.errors import BadInput, ServerError
from niah.tokenize import (FALLBACK, Messages, ServerTokenizer, Tokenizer, api_url, http_client,
                           load_tokenizer)

PROBE_LENGTH = 300  # tokens of the probe prompt every counter is checked on


def length_tolerance(length: int) -> float:
    """How far server-reported prompt_tokens may drift from the requested length."""
    return max(4.0, 0.005 * length)


class UsageTokenizer(Tokenizer):
    """Counts through the server's `usage.prompt_tokens` (max_tokens=1 probes, cached)."""

    spec = "usage"
    exact = True

    def __init__(self, endpoint: str, model: str | None, api_key: str | None = None, timeout_s: float = 120.0):
        self.endpoint, self.model, self.api_key, self.timeout_s = api_url(endpoint), model, api_key, timeout_s
        self._cache: dict[str, int] = {}
        self._lock = threading.RLock()
        self._client = None
        self._empty: int | None = None
        self.requests = 0
        self.prompt_tokens = 0

    @property
    def cost(self) -> dict:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens, "cached_texts": len(self._cache),
                "warms_prefix_cache": True}

    def _http(self):
        return http_client(self)

    def _usage(self, path: str, fields: dict) -> int:
        import httpx

        key = hashlib.sha256(json.dumps([path, fields], sort_keys=True).encode()).hexdigest()
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        body = {"model": self.model, **fields, "max_tokens": 1, "temperature": 0, "stream": False}
        last = ""
        for _ in range(3):
            try:
                r = self._http().post(self.endpoint + path, json=body)
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if r.status_code in (429, 500, 502, 503, 504):
                last = f"HTTP {r.status_code}"
                continue
            if r.status_code != 200:
                raise ServerError(f"usage probe {path} answered HTTP {r.status_code}: {r.text[:200]}")
            try:
                n = r.json()["usage"]["prompt_tokens"]
            except (ValueError, KeyError, TypeError):
                raise ServerError(f"{path} reports no usage.prompt_tokens; it cannot count tokens") from None
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ServerError(f"{path} reported usage.prompt_tokens {n!r}; not a token count")
            with self._lock:
                self.requests += 1
                self.prompt_tokens += n
                self._cache[key] = n
            return n
        raise ServerError(f"usage probe {path} failed: {last}")

    def count_chat(self, messages: Messages) -> int:
        return self._usage("/chat/completions", {"messages": messages})

    def count_prompt(self, text: str) -> int:
        return self._usage("/completions", {"prompt": text})

    def count_plain(self, text: str) -> int:
        # A piece of text: a one-message chat minus the same chat with an empty message.
        # Only the builder's step size and the achieved depth use it; lengths use count_chat
        # or count_prompt, which are exact.
        if self._empty is None:
            self._empty = self.count_chat([{"role": "user", "content": ""}])
        return max(0, self.count_chat([{"role": "user", "content": text}]) - self._empty)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


@dataclass
class CounterCheck:
    """How a counter was checked against the server (the manifest's `tokenizer_check`)."""

    probe_length: int = PROBE_LENGTH
    counted: int | None = None
    server: int | None = None
    ok: bool = False
    note: str = ""
    tried: list[dict[str, Any]] = field(default_factory=list)  # auto: every candidate and why


def check_counter(tok: Tokenizer, endpoint: str, model: str, api_key: str | None, mode: str) -> CounterCheck:
    """Count a probe prompt with `tok` and compare with the server's usage.prompt_tokens."""
    from niah.needles import trial_seed
    from niah.prompts import build_prompt

    chk = CounterCheck()
    try:
        p = build_prompt(tok, PROBE_LENGTH, 50.0, trial_seed(0, PROBE_LENGTH, 50.0, 0), mode)
    except (ServerError, BadInput) as e:
        chk.note = f"cannot count the probe: {e}"
        return chk
    except Exception as e:  # a /tokenize of an odd shape, a dropped connection
        chk.note = f"cannot count the probe: {type(e).__name__}: {e}"
        return chk
    chk.counted = p.tokens
    probe = tok if isinstance(tok, UsageTokenizer) else UsageTokenizer(endpoint, model, api_key)
    try:
        chk.server = probe.count(mode, p.messages if mode == "chat" else p.content)
    except ServerError as e:
        chk.note = f"cannot check it: {e}"
        return chk
    finally:
        if probe is not tok:
            probe.close()
    chk.ok = abs(chk.server - chk.counted) <= length_tolerance(PROBE_LENGTH)
    if not chk.ok:
        chk.note = f"counted {chk.counted} tokens where the server counts {chk.server}"
    return chk


def resolve_counter(spec: str | None, endpoint: str, model: str, api_key: str | None, mode: str,
                    approximate: bool = False) -> tuple[Tokenizer, CounterCheck]:
    """The checked counter for one target (see module doc); BadInput when none is exact."""
    if spec not in (None, "", "auto"):
        tok = load_tokenizer(spec, endpoint, model, api_key)
        chk = check_counter(tok, endpoint, model, api_key, mode)
        if chk.ok and tok.exact:
            return tok, chk
        why = chk.note or "it does not know the server's chat template"
        if not approximate:
            tok.close()
            raise BadInput(f"--tokenizer {tok.spec} is not exact for {endpoint}: {why}; "
                           "choose another (auto, usage) or pass --approximate-lengths")
        _warn(f"--tokenizer {tok.spec} is not exact for {endpoint} ({why}); lengths are approximate")
        tok.exact = False
        return tok, chk
    tried: list[dict[str, Any]] = []
    server = ServerTokenizer(endpoint=endpoint, model=model, api_key=api_key)
    candidates: list[Tokenizer] = [server] if server.probe() else []
    if not candidates:
        tried.append({"tokenizer": "server", "note": server.rejected or "no /tokenize"})
        server.close()
    candidates.append(UsageTokenizer(endpoint, model, api_key))
    for tok in candidates:
        chk = check_counter(tok, endpoint, model, api_key, mode)
        tried.append({"tokenizer": tok.spec, "ok": chk.ok, "note": chk.note})
        if chk.ok:
            chk.tried = tried
            return tok, chk
        tok.close()
    if not approximate:
        raise BadInput(f"no exact token counter for {endpoint}: "
                       + "; ".join(f"{t['tokenizer']}: {t['note']}" for t in tried)
                       + ". Pass --approximate-lengths to count with " + FALLBACK)
    _warn(f"{endpoint}: no exact token counter; counting with {FALLBACK}, lengths are approximate")
    tok = load_tokenizer(FALLBACK)
    chk = check_counter(tok, endpoint, model, api_key, mode)
    chk.tried = tried
    return tok, chk


def _warn(msg: str) -> None:
    print(f"niah: warning: {msg}", file=sys.stderr)
