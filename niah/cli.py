"""The `niah` command line: a thin layer over the library.

Commands live in niah/commands/<noun>.py and register themselves on `app`; each is a
few lines that parse options, call a library function and print. Domain errors
(niah.errors) become one line on stderr here, at the edge: exit 2 for bad input.
"""

from __future__ import annotations

import importlib
import sys

import typer

from niah.errors import NiahError

app = typer.Typer(
    help="niah: long-context recall for sparse-attention serving.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
kernels_app = typer.Typer(help="The bundled indexer kernels (niah.kernels).", no_args_is_help=True)
baseline_app = typer.Typer(help="CI baselines: small exported summaries of a run.", no_args_is_help=True)
prompts_app = typer.Typer(help="Prompt sets: build every trial's prompt into a file first.", no_args_is_help=True)
app.add_typer(kernels_app, name="kernels")
app.add_typer(baseline_app, name="baseline")
app.add_typer(prompts_app, name="prompts")

# One module per noun; importing it registers its commands (imports inside stay lazy).
COMMAND_MODULES = ("sweep", "prompts", "serve", "report", "gate", "kernels", "doctor")


def _register() -> None:
    for name in COMMAND_MODULES:
        try:
            importlib.import_module(f"niah.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"niah.commands.{name}":
                raise


def main() -> None:
    _register()
    try:
        app()
    except NiahError as e:
        print(f"niah: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
