"""Option declarations shared by the commands that build or send prompts (sweep, prompt,
prompts build): help texts, `@server_options` (--endpoint / --model / --api-key and the
environment variables behind them), `@needle_options` (the needle and haystack options) and
`given` (which options the command line set). Declarations only: what the values mean is the library's
(niah.sweep.plan, niah.sweep.regime_probe, niah.sweep.coverage).
"""

from __future__ import annotations

import typer

DEPTHS_HELP = ("Needle depths in percent: 0,50,100; LO:HI:N gives N evenly spaced values, both ends "
               "included: N is a count, not a step (10:90:5 is 10, 30, 50, 70, 90); LO:HI/STEP steps by "
               "STEP (0:100/10 is 0, 10, ..., 100).")
LENGTHS_HELP = ("Prompt lengths in tokens, whole prompt: 300,1k,4k,128ki or LO:HI:N, e.g. 300:22k:8 (N log-spaced), "
                "or auto: k/2, k, 2k, 4k, ... of every index_topk, up to the model's context.")
TOKENIZER_HELP = ("auto | server | usage | hf:<path> | tiktoken:<encoding>. auto: the server's /tokenize, else "
                  "usage.prompt_tokens probes (max_tokens=1). Checked against the server before the run.")
COMPRESSION_HELP = ("Index keys per compressed index key, for a server that does not attest it (DeepSeek-V4: 4; "
                    "V3.2: 1). Selection starts when (length - index window) / compression exceeds k; recorded "
                    "in the manifest.")
WINDOW_HELP = ("Raw recent tokens the indexer never selects over, for a server that does not attest it "
               "(DeepSeek-V4: 128); recorded in the manifest.")
RESIDUES_HELP = ("Lengths at chosen residues around each length: modM (every residue 0..M-1, e.g. mod4) or "
                 "M:v,v (e.g. 4:0,3). A length's block (it rounded down to a multiple of M) plus each residue; "
                 "one seed per block. Recorded per trial; the report has recall by residue.")
DEFAULT_ENDPOINT = "http://127.0.0.1:30000/v1"
ENDPOINT_ENV = ["NIAH_ENDPOINT", "OPENAI_BASE_URL"]  # flag > these, in order > DEFAULT_ENDPOINT
MODEL_ENV = ["NIAH_MODEL"]
API_KEY_ENV = ["NIAH_API_KEY", "OPENAI_API_KEY"]
COUNTED_HELP = f"The server whose tokens are counted (default: {DEFAULT_ENDPOINT})."


def server_options(endpoint_help: str = COUNTED_HELP):
    """--endpoint, --model and --api-key (each read from its environment variables when not
    given) on a command that declares `endpoint`, `model` and `api_key` (default None): their
    declarations, in the command's own order; `endpoint_help` says what the server is for."""
    import functools
    import inspect

    options = {
        "endpoint": typer.Option(None, envvar=ENDPOINT_ENV, help=endpoint_help),
        "model": typer.Option(None, envvar=MODEL_ENV, help="Served model name (default: the first in /v1/models)."),
        "api_key": typer.Option(None, "--api-key", envvar=API_KEY_ENV, help="Bearer token, if the server wants one."),
    }

    def decorate(f):
        sig = inspect.signature(f)
        missing = [n for n in options if n not in sig.parameters]
        if missing:
            raise TypeError(f"{f.__name__} declares no parameter {missing[0]!r} for @server_options")
        params = [p.replace(default=options[p.name]) if p.name in options else p for p in sig.parameters.values()]

        @functools.wraps(f)
        def wrapper(*args, **kw):
            return f(*args, **kw)

        wrapper.__signature__ = sig.replace(parameters=params)
        return wrapper

    return decorate


def given(ctx: typer.Context, names: tuple[str, ...]) -> list[str]:
    """The options among `names` set on the command line, as flags (`--needle-key`)."""
    return [f"--{n.replace('_', '-')}" for n in names
            if getattr(ctx.get_parameter_source(n), "name", None) == "COMMANDLINE"]


def needle_options(f):
    """The needle and haystack options shared by sweep, prompt and prompts build."""
    import functools
    import inspect

    extra = {
        "needles": typer.Option(1, "--keys", "--needles",
                                help="Keys in each haystack: the asked one(s) plus distractors at random depths."),
        "needle_key": typer.Option("city", "--needle-key", help="city | word."),
        "needle_value": typer.Option("number", "--needle-value", help="number (7 digits) | uuid | word."),
        "values": typer.Option(1, "--values",
                               help="Values per key; all of an asked key's values are asked, each scored."),
        "queries": typer.Option(1, "--queries", help="Keys asked at once (<= --keys)."),
        "haystack": typer.Option("prose", "--haystack",
                                 help="prose | book (Pride and Prejudice) | noise | needles | file:PATH."),
    }
    types = {"needles": int, "needle_key": str, "needle_value": str, "values": int, "queries": int, "haystack": str}
    sig = inspect.signature(f)
    params = [p for p in sig.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
    params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v, annotation=types[k])
               for k, v in extra.items()]

    @functools.wraps(f)
    def wrapper(*args, **kw):
        return f(*args, **kw)

    wrapper.__signature__ = sig.replace(parameters=params)
    wrapper.__annotations__ = {**{k: v for k, v in f.__annotations__.items() if k != "kinds"}, **types}
    return wrapper
