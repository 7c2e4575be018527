"""--header and --extra-body: what a command that talks to a server sends on every request.

`@request_options` adds both options to a command (sweep, prompt, prompts build); they are
parsed before the command runs (bad JSON, a field niah sets itself, a header that is not
NAME:VALUE: one line, exit 2) and the command runs inside niah.client.pass_through, so
every request it sends carries them.
"""

from __future__ import annotations

from typing import List, Optional

import typer

HEADER_HELP = ("An HTTP header on every request, NAME:VALUE (repeatable), e.g. 'X-Team: ml'; it replaces the "
               "--api-key bearer when NAME is Authorization. Recorded in the manifest with secret-like values "
               "(Authorization, Cookie, *key*, *token*) masked.")
EXTRA_BODY_HELP = ("JSON object merged into every generation request, e.g. "
                   "'{\"chat_template_kwargs\": {\"thinking\": false}}'; recorded in the manifest. Fields niah sets "
                   "(model, messages, prompt, max_tokens, stream, temperature, top_p) are refused.")


def request_options(f):
    """--header and --extra-body on a command that talks to a server: parsed first (bad
    input: one line, exit 2), then the command runs inside niah.client.pass_through."""
    import functools
    import inspect

    sig = inspect.signature(f)
    params = list(sig.parameters.values())
    params += [inspect.Parameter("header", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[List[str]],
                                 default=typer.Option(None, "--header", "-H", metavar="NAME:VALUE", help=HEADER_HELP)),
               inspect.Parameter("extra_body", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                                 default=typer.Option(None, "--extra-body", metavar="JSON", help=EXTRA_BODY_HELP))]

    @functools.wraps(f)
    def wrapper(*args, header=None, extra_body=None, **kw):
        from niah.client import parse_extra_body, parse_headers, pass_through
        from niah.redact import remember_body, remember_headers

        headers, body = parse_headers(header), parse_extra_body(extra_body)
        remember_headers(headers)
        remember_body(body)
        with pass_through(headers, body):
            return f(*args, **kw)

    wrapper.__signature__ = sig.replace(parameters=params)
    wrapper.__annotations__ = {**getattr(f, "__annotations__", {}), "header": Optional[List[str]],
                               "extra_body": Optional[str]}
    return wrapper
