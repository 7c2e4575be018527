"""Prompts: needles, haystacks, the exact-length builder and frozen prompt sets.

    from niah.prompts import build_prompt
    p = build_prompt(tok, 4000, 50.0, seed, "chat")   # tok: a niah.tokens counter

niah.prompts.needles (the facts and the question), niah.prompts.haystacks (the filler
texts; the bundled corpus is package data in niah/corpus/), niah.prompts.builder
(`build_prompt`, `CHAT_PROBE`: the message a server counter measures its chat template
on) and niah.prompts.sets (prompt sets: build, write, read, replay). Counts come from the
counter handed in; nothing here talks to a server of its own.
"""

from niah.prompts.builder import CHAT_PROBE, INSTRUCTION, Prompt, build_prompt, prompt_sha256

__all__ = ["CHAT_PROBE", "INSTRUCTION", "Prompt", "build_prompt", "prompt_sha256"]
