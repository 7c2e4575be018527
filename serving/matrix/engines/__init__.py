"""The engines a matrix file may name (`engine = "..."`): one module each, one registry.

    from niah.serving.matrix.engines import ENGINES, engine_of
    engine_of("sglang").command(cfg, port)     # -> (argv, env overrides)

Each engine module (embedded.py, sglang.py, external.py, command.py) builds one `Engine`
(serving/matrix/engines/base.py: its keys, command, checks, readiness, arm and dry-run
lines); `ENGINES` lists them in the order error messages name them. Adding an engine is its
module plus one line below; `register_engine` adds one at run time (a plugin, a test).
Nothing outside an engine's own module names it: the matrix looks everything up here.
"""

from __future__ import annotations

from niah.errors import BadInput
from niah.serving.matrix.engines import command, embedded, external, sglang
from niah.serving.matrix.engines.base import Engine

ENGINES: dict[str, Engine] = {}


def register_engine(engine: Engine) -> Engine:
    """Make `engine` nameable in matrix files (a later one of the same name replaces it)."""
    ENGINES[engine.name] = engine
    return engine


def engine_of(name: str) -> Engine:
    """The registered engine called `name` (BadInput listing the registered ones otherwise)."""
    if name not in ENGINES:
        raise BadInput(f"unknown engine {name!r} (engines: {', '.join(ENGINES)})")
    return ENGINES[name]


register_engine(embedded.ENGINE)
register_engine(sglang.ENGINE)
register_engine(external.ENGINE)
register_engine(command.ENGINE)

__all__ = ["ENGINES", "Engine", "engine_of", "register_engine"]
