"""The cache-state axis: in which prefix-cache state the server meets each trial's prompt.

`niah sweep --cache-state cold,warm,repeat` runs every (length, depth, trial) once per
state asked; each trial records its `cache_state`, and a cell is length x depth x cache
state (reports, compare and gate pair within a state).

- `cold`: the prompt opens with a line holding a nonce drawn for that trial alone
  (`cold_lead`), counted inside the exact length, so no earlier request shares any prefix
  with it beyond the chat template's first tokens. A counter that sends the prompt before
  the trial (`--tokenizer usage`, whose probes warm the cache) cannot keep it cold:
  `check_counter_keeps_cold` refuses that pairing (BadInput, exit 2) before any trial.
- `warm`: the identical request is sent first with max_tokens=1 (its reply is dropped), so
  the trial is a prefix-cache hit of its whole prompt.
- `repeat`: the identical request is sent twice; the second reply is scored and the first
  kept as `repeat_answer`. At temperature 0 both must be the same: when content or
  reasoning differ the trial records `repeat_fault: true`.

Without `--cache-state` nothing changes: one request per trial, `cache_state` null. With
the usage counter those trials are still prefix-cache hits (the counter sent each prompt
first; the manifest's `tokenizer_cost.warms_prefix_cache`), which the report says.
A server that reports `usage.prompt_tokens_details.cached_tokens` has it recorded per trial
(`cached_tokens`), whatever the state: the server's own word on what it reused.
"""

from __future__ import annotations

import secrets
from dataclasses import replace

from niah.client import RequestConfig, complete
from niah.errors import BadInput
from niah.runs.record import CACHE_STATES

__all__ = ["CACHE_HELP", "CACHE_STATES", "PREFIX_HELP", "ask", "check_counter_keeps_cold", "check_states",
           "cold_lead", "parse_cache_states"]
_NONCE_LETTERS = "bcdfghjklmnpqrstvwxz"
# Each trial runs its states in this order: repeat before warm, so repeat's first request is
# not already a hit of warm's identical one.
_RUN_ORDER = ("cold", "repeat", "warm")
CACHE_HELP = ("cold,warm,repeat: run every trial once per state. cold: a per-trial nonce opens the prompt (no "
              "cached prefix; refused with the usage counter); warm: the same request is sent first; repeat: "
              "sent twice, answers that differ are a fault. Default: not controlled (the usage counter warms "
              "each prompt).")
PREFIX_HELP = "Ask that the answer begin with TEXT; each trial records whether it did (answer_prefix_ok)."


def parse_cache_states(text: str | None) -> list[str] | None:
    """`warm,cold,repeat` -> ["cold", "repeat", "warm"] (the order they run in, duplicates dropped);
    None or empty -> None (the default: state not controlled). BadInput on an unknown name."""
    if text is None or not str(text).strip():
        return None
    states = list(dict.fromkeys(t.strip().lower() for t in str(text).split(",") if t.strip()))
    bad = [s for s in states if s not in CACHE_STATES]
    if bad or not states:
        raise BadInput(f"unknown --cache-state {', '.join(bad) or text!r}: use cold, warm and/or repeat")
    return sorted(states, key=_RUN_ORDER.index)


def check_states(states: list[str] | None, prompts: str | None) -> None:
    """A frozen prompt set cannot be made cold (its bytes are fixed): BadInput."""
    if states is None:
        return
    bad = [s for s in states if s not in CACHE_STATES]
    if bad:
        raise BadInput(f"unknown --cache-state {bad[0]!r}: use cold, warm and/or repeat")
    if "cold" in states and prompts is not None:
        raise BadInput("--cache-state cold needs prompts niah builds (a per-trial nonce opens each one); "
                       "a frozen --prompts set cannot be made cold")


def check_counter_keeps_cold(states: list[str] | None, tokenizer) -> None:
    """BadInput when `cold` is asked of a counter that sends every prompt to the server
    before its trial (the usage counter: its probes would warm the cache)."""
    if states and "cold" in states and getattr(tokenizer, "spec", None) == "usage":
        raise BadInput("--cache-state cold cannot be promised with the usage counter: it sends every prompt "
                       "before its trial, which warms the prefix cache; use a counter that does not "
                       "(the server's /tokenize, hf:PATH, or --prompts built elsewhere for warm/repeat)")


def cold_lead() -> str:
    """The first line of a cold prompt: a nonce no earlier request can have carried."""
    # letters only: no digit run a number needle could be mistaken for
    return f"Request {''.join(secrets.choice(_NONCE_LETTERS) for _ in range(16))}.\n\n"


def state_fields(state: str | None) -> dict:
    """What a trial records of its state before any request (nothing without one)."""
    return {} if state is None else {"cache_state": state}


async def ask(client, cfg: RequestConfig, fields: dict, extra: dict | None, state: str | None):
    """Send the trial's request as its cache state wants; returns (scored reply, the
    trial's state fields: `repeat_answer`, `repeat_fault` for repeat, `warmup_error` when
    the warm-up request failed)."""
    out: dict = {}
    if state == "warm":
        warm = await complete(client, replace(cfg, max_tokens=1, stream=False), fields, extra)
        if warm.error:
            out["warmup_error"] = warm.error
    if state == "repeat":
        first = await complete(client, cfg, fields, extra)
        reply = await complete(client, cfg, fields, extra)
        if not first.error and not reply.error:
            out["repeat_answer"] = first.answer
            out["repeat_fault"] = (first.answer, first.reasoning) != (reply.answer, reply.reasoning)
        elif first.error and not reply.error:
            out["warmup_error"] = first.error
        return reply, out
    return await complete(client, cfg, fields, extra), out
