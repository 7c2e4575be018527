"""No secret on disk: what niah records of a command line or an environment goes through here.

    redact_argv(sys.argv)      # the manifest's and the lock's `command`, a launched server's argv
    redact_env(env)            # a launched server's environment overrides
    redact_text(line)          # any other recorded line (a formatted command, a log header)
    redact_settings(settings)  # a matrix configuration's settings (command, args, env)
    remember_secret(api_key)   # a token that came from elsewhere (a matrix's api_key_env)
    remember_from(argv, env)   # the secrets of a command not yet recorded (a matrix's commands)

A secret is the value of a secret-named flag (`--api-key VALUE`, `--api-key=VALUE`,
`--hf-token`, `--password`, ...), the value of a secret-named environment variable
(NIAH_API_KEY, OPENAI_API_KEY, HF_TOKEN, ..._SECRET, ...), a `Bearer` token, or any value
remembered or found in such a variable of this process's environment, wherever it appears
in the recorded text. Each becomes `***`. A header given on the command line (`--header
NAME:VALUE`, `-H`) has its value masked when NAME is secret-like (is_secret_header:
Authorization, Proxy-Authorization, Cookie, X-Api-Key, anything with token / secret / auth
/ key in its name). Pure: nothing here writes anything.
"""

from __future__ import annotations

import os
import re
from typing import Iterable, Mapping

MASK = "***"
_SECRET_NAME = re.compile(r"(^|[-_])(api[-_]?key|token|secret|password|passwd|auth)$", re.IGNORECASE)
_BEARER = re.compile(r"(Bearer\s+)[^\s\"',;]+", re.IGNORECASE)
_INLINE_FLAG = re.compile(r"(--[A-Za-z0-9_-]+)=(.*)", re.DOTALL)
_SECRET_HEADER = re.compile(r"auth|token|secret|passw|cookie|session|(^|[-_])(api[-_]?)?key($|[-_])", re.IGNORECASE)
_HEADER_FLAGS = ("--header", "-H")
_MIN_SECRET = 8  # shorter values are not searched for in free text (they would mask innocent words)
_remembered: set[str] = set()


def is_secret_name(name: str) -> bool:
    """A flag (`--api-key`) or environment variable (`OPENAI_API_KEY`) whose value is a secret."""
    return bool(_SECRET_NAME.search(name.lstrip("-")))


def is_secret_header(name: str) -> bool:
    """An HTTP header whose value is a credential (Authorization, Cookie, X-Api-Key, ...)."""
    return bool(_SECRET_HEADER.search(name.strip()))


def _header_arg(value: str) -> str:
    """`NAME: VALUE` of a --header flag, VALUE masked when NAME is secret-like."""
    name, sep, rest = value.partition(":")
    if not (sep and is_secret_header(name)):
        return redact_text(value)
    scheme = rest.split(None, 1)
    keep = f"{scheme[0]} " if len(scheme) == 2 and scheme[0].isalpha() and "authorization" in name.lower() else ""
    return f"{name}: {keep}{MASK}"  # Authorization: Bearer ***


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """HTTP headers as recorded: secret-like ones' values masked, the others as they are."""
    return {k: MASK if is_secret_header(k) else redact_text(v) for k, v in headers.items()}


def remember_headers(headers: Mapping[str, str]) -> None:
    """Remember the values of secret-like headers (and the credential after an auth scheme,
    `Basic abc...` -> `abc...`), so no recorded text quotes them."""
    for k, v in headers.items():
        if is_secret_header(k):
            remember_secret(v)
            remember_secret(v.split(None, 1)[-1] if v.split() else v)


def remember_body(body: object) -> None:
    """Remember the values under secret-named keys of a JSON body (`{"api_key": "..."}` at any
    depth), so neither the recorded body nor the recorded command quotes them."""
    if isinstance(body, dict):
        for k, v in body.items():
            if is_secret_name(str(k)) and isinstance(v, (str, int, float)) and not isinstance(v, bool):
                remember_secret(str(v))
            else:
                remember_body(v)
    elif isinstance(body, list):
        for v in body:
            remember_body(v)


def redact_body(body: object) -> object:
    """A JSON body as recorded: values under secret-named keys masked, known secrets masked in text."""
    if isinstance(body, dict):
        return {k: MASK if is_secret_name(str(k)) else redact_body(v) for k, v in body.items()}
    if isinstance(body, list):
        return [redact_body(v) for v in body]
    return redact_text(body) if isinstance(body, str) else body


def remember_secret(value: str | None) -> None:
    """Mask `value` wherever it appears in what this process records from now on."""
    if value:
        _remembered.add(str(value))


def remember_from(argv: Iterable[object] = (), env: Mapping[str, str | None] | None = None) -> None:
    """Remember the secrets of a command line and its environment (secret-named flags' and
    variables' values), so they are masked in any text that quotes them (a matrix file)."""
    args = [str(a) for a in argv]
    for i, arg in enumerate(args):
        m = _INLINE_FLAG.fullmatch(arg)
        if m and is_secret_name(m.group(1)):
            remember_secret(m.group(2))
        elif arg.startswith("--") and is_secret_name(arg) and i + 1 < len(args):
            remember_secret(args[i + 1])
    for k, v in (env or {}).items():
        if v and is_secret_name(k):
            remember_secret(v)


def _known(env: Mapping[str, str | None] | None = None) -> list[str]:
    found = set(_remembered)
    for source in (os.environ, env or {}):
        found.update(v for k, v in source.items() if v and is_secret_name(k))
    return sorted((v for v in found if len(v) >= _MIN_SECRET), key=len, reverse=True)


def redact_text(text: str, env: Mapping[str, str | None] | None = None) -> str:
    """`text` with every known secret and Bearer token masked."""
    text = _BEARER.sub(lambda m: m.group(1) + MASK, str(text))
    for value in _known(env):
        text = text.replace(value, MASK)
    return text


def redact_argv(argv: Iterable[object], env: Mapping[str, str | None] | None = None) -> list[str]:
    """A command line with the value of every secret-named flag, and every known secret, masked."""
    out: list[str] = []
    hide_next = header_next = False
    for arg in map(str, argv):
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if header_next:
            out.append(_header_arg(arg))
            header_next = False
            continue
        m = _INLINE_FLAG.fullmatch(arg)
        if m and is_secret_name(m.group(1)):
            out.append(f"{m.group(1)}={MASK}")
            continue
        if m and m.group(1) in _HEADER_FLAGS:
            out.append(f"{m.group(1)}={_header_arg(m.group(2))}")
            continue
        hide_next = arg.startswith("--") and is_secret_name(arg)
        header_next = arg in _HEADER_FLAGS
        out.append(redact_text(arg, env))
    return out


def redact_settings(settings: Mapping[str, object]) -> dict[str, object]:
    """A configuration's settings as recorded: lists (a command, extra args) as command
    lines, tables (env) as environments, strings as text; everything else as it is."""
    out: dict[str, object] = {}
    for k, v in settings.items():
        if isinstance(v, (list, tuple)) and all(isinstance(a, (str, int, float)) for a in v):
            out[k] = redact_argv(v)
        elif isinstance(v, Mapping) and all(x is None or isinstance(x, str) for x in v.values()):
            out[k] = redact_env(v)
        elif isinstance(v, str):
            out[k] = MASK if is_secret_name(k) else redact_text(v)
        else:
            out[k] = v
    return out


def redact_env(env: Mapping[str, str | None]) -> dict[str, str | None]:
    """Environment overrides with every secret-named variable's value masked (None, an
    unset, stays None) and known secrets masked in the others."""
    return {k: v if v is None else (MASK if is_secret_name(k) else redact_text(v, env)) for k, v in env.items()}
