"""Exact length against any server: count with the server's own `usage.prompt_tokens`.

`UsageTokenizer` (`--tokenizer usage`) sends the text as a `max_tokens=1` request and reads
the server's own `usage.prompt_tokens`; answers are cached per text. It works against any
OpenAI-compatible server, hosted APIs included, at the cost of a few extra short requests
per prompt (counted in `cost`, recorded in the manifest as `tokenizer_cost`). The probes
carry the pass-through body (niah.client.extra_body: `--extra-body`), so a field that
changes the chat template (chat_template_kwargs) is counted as the trials will send it. Those probes
send the trial's prompt before the trial itself: a server with prefix caching then serves
the trial from its cache (recorded as `tokenizer_cost.warms_prefix_cache`). How a sweep
chooses and checks its counter is niah.sweep.counter.
"""

from __future__ import annotations

import hashlib
import json
import threading

import httpx

from niah.client import BODY_CHARS, api_url, extra_body
from niah.errors import ServerError, one_line
from niah.tokens.counters import Messages, Tokenizer, http_client


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
        key = hashlib.sha256(json.dumps([path, fields], sort_keys=True).encode()).hexdigest()
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        body = {**extra_body(), "model": self.model, **fields, "max_tokens": 1, "temperature": 0, "stream": False}
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
                raise ServerError(f"usage probe {path} answered HTTP {r.status_code}: {one_line(r.text, BODY_CHARS)}")
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
