"""Reasoning models: the required answer prefix, where the value was found, thinking on/off.

- `prefix_kept(prefix, answer, reasoning)`: `--answer-prefix TEXT` asks that the answer
  start with TEXT (RULER's answer prefix, MRCR's required string); the answer scored
  (niah.sweep.scoring.scored_text: content, or the reasoning when content is empty) must
  start with it, leading whitespace aside, case kept. Recorded per trial as
  `answer_prefix_ok`; the outcome stays the value's (niah.sweep.scoring), so a rescore
  agrees with it.
- `found_in(expected, answer, reasoning)`: for a reply that carried reasoning, where
  every expected value appears: "content", "reasoning" (only there: the model found it and
  did not say it, or said it only while thinking), "both" or "neither"; None without
  reasoning. Recorded per trial as `found_in`.
- `thinking_of(body)`: whether a request body turns thinking on or off through
  `chat_template_kwargs` (`thinking` or `enable_thinking`); None when it says nothing (the
  server's default). Recorded per configuration in the manifest as `thinking`.
Pure functions.
"""

from __future__ import annotations

from typing import Any

from niah.sweep.scoring import holds, scored_text

_THINKING_KEYS = ("thinking", "enable_thinking")


def prefix_kept(prefix: str | None, answer: str | None, reasoning: str | None) -> bool | None:
    """Does the scored answer start with `prefix`? None when no prefix was asked."""
    if not prefix:
        return None
    return scored_text(answer, reasoning).lstrip().startswith(prefix.strip())


def found_in(expected: list[str] | None, answer: str | None, reasoning: str | None) -> str | None:
    """Where every expected value appears, for a reply with reasoning (module doc)."""
    if not expected or not (reasoning or "").strip():
        return None
    in_content = all(holds(answer, v) for v in expected)
    in_reasoning = all(holds(reasoning, v) for v in expected)
    if in_content and in_reasoning:
        return "both"
    return "content" if in_content else "reasoning" if in_reasoning else "neither"


def thinking_of(body: dict[str, Any] | None) -> bool | None:
    """Thinking on (True) or off (False) as the body's chat_template_kwargs say; None: unsaid."""
    kwargs = (body or {}).get("chat_template_kwargs")
    if not isinstance(kwargs, dict):
        return None
    for key in _THINKING_KEYS:
        if key in kwargs:
            return bool(kwargs[key])
    return None
