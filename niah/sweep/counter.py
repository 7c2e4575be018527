"""Choosing a sweep's counter: which one, checked against the server before any trial.

`resolve_counter` picks and checks the counter of one target. `auto` tries, in order, the
`/tokenize` shapes niah knows (SGLang, vLLM), then `usage`; tiktoken only when told
(`--tokenizer tiktoken:...`) or, with `--approximate-lengths`, as the last resort. Every
counter is checked before a run on a probe prompt of a few hundred tokens against the
server's `usage.prompt_tokens` (`check_counter`): one that disagrees beyond max(4, 0.5%)
is not used (`auto` moves on, an explicit one is refused), and one that cannot be checked
or is not exact is refused unless `--approximate-lengths`. The counters themselves are
niah.tokens; the probe prompt and the chat probe come from niah.prompts.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from niah.errors import BadInput, ServerError
from niah.prompts.builder import CHAT_PROBE, build_prompt
from niah.prompts.needles import trial_seed
from niah.tokens import FALLBACK, ServerTokenizer, Tokenizer, UsageTokenizer, length_tolerance, load_tokenizer

PROBE_LENGTH = 300  # tokens of the probe prompt every counter is checked on


@dataclass
class CounterCheck:
    """How a counter was checked against the server (the manifest's `tokenizer_check`)."""

    probe_length: int = PROBE_LENGTH
    counted: int | None = None
    server: int | None = None
    ok: bool = False
    note: str = ""
    tried: list[dict[str, Any]] = field(default_factory=list)  # auto: every candidate and why


def check_counter(tok: Tokenizer, endpoint: str, model: str, api_key: str | None, mode: str,
                  timeout_s: float = 120.0) -> CounterCheck:
    """Count a probe prompt with `tok` and compare with the server's usage.prompt_tokens
    (each request bounded by `timeout_s`)."""
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
    probe = tok if isinstance(tok, UsageTokenizer) else UsageTokenizer(endpoint, model, api_key, timeout_s)
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
                    approximate: bool = False, timeout_s: float = 120.0) -> tuple[Tokenizer, CounterCheck]:
    """The checked counter for one target (see module doc); BadInput when none is exact.
    Every request a counter makes (the checks, then every count) is bounded by `timeout_s`."""
    if spec not in (None, "", "auto"):
        tok = load_tokenizer(spec, endpoint, model, api_key, chat_probe=CHAT_PROBE, timeout_s=timeout_s)
        chk = check_counter(tok, endpoint, model, api_key, mode, timeout_s)
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
    server = ServerTokenizer(endpoint=endpoint, model=model, api_key=api_key, chat_probe=CHAT_PROBE,
                             timeout_s=timeout_s)
    candidates: list[Tokenizer] = [server] if server.probe() else []
    if not candidates:
        tried.append({"tokenizer": "server", "note": server.rejected or "no /tokenize"})
        server.close()
    candidates.append(UsageTokenizer(endpoint, model, api_key, timeout_s))
    for tok in candidates:
        chk = check_counter(tok, endpoint, model, api_key, mode, timeout_s)
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
    chk = check_counter(tok, endpoint, model, api_key, mode, timeout_s)
    chk.tried = tried
    return tok, chk


def _warn(msg: str) -> None:
    print(f"niah: warning: {msg}", file=sys.stderr)
