"""The `niah` command line: a thin layer over the library.

Commands live in niah/commands/<noun>.py and register themselves on `app`; each is a
few lines that parse options, call a library function and print. At the edge (`Niah`,
the root group, so `niah` and an in-process CliRunner behave alike) every error meant
for the user is one line on stderr, `niah: error: ...`: domain errors (niah.errors) with
their exit code (2 for bad input), and click's usage errors (an unknown option, `--trials
abc`) with exit 2. Help is plain text (no rich markup, which would eat bracketed words
such as `[default: RUN/report]`). `niah --version` says niah's version (niah/__init__.py).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Optional

import typer
from typer.core import TyperGroup

from niah import __version__
from niah.errors import NiahError, one_line


class Niah(TyperGroup):
    """The root group: its `main` turns user errors into one line and an exit code."""

    def main(self, args: Any = None, prog_name: Optional[str] = None, complete_var: Optional[str] = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except NiahError as e:  # its raiser worded it (a launch failure adds its log's tail)
            print(f"niah: error: {e}", file=sys.stderr)
            sys.exit(e.exit_code)
        except typer.TyperException as e:  # typer's click: usage errors, exit 2 (click's own code)
            if type(e).__name__ == "NoArgsIsHelpError":  # `niah` or `niah baseline` alone: the help
                typer.echo(e.format_message())
                sys.exit(e.exit_code)
            ctx = getattr(e, "ctx", None)
            where = " ".join(["niah", *ctx.command_path.split()[1:]]) if ctx is not None else "niah"
            hint = f" (see {where} --help)"
            _fail(one_line(e.format_message(), limit=1000) + hint, e.exit_code)
        except typer.Abort:
            _fail("aborted", 1)
        # without standalone mode an Exit comes back as its code; a command's value is no code
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)


def _fail(message: str, code: int) -> None:
    print(f"niah: error: {message}", file=sys.stderr)
    sys.exit(code)


def package_version() -> str:
    """niah's version: `niah.__version__`, the one place it is set (the distribution, niah-lab,
    reads it from there at build time, so an installed wheel and a checkout say the same)."""
    return __version__


app = typer.Typer(
    cls=Niah,
    help="niah: long-context recall for sparse-attention serving.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
)
kernels_app = typer.Typer(help="The bundled indexer kernels (niah.kernels).", no_args_is_help=True,
                          rich_markup_mode=None)
baseline_app = typer.Typer(help="CI baselines: small exported summaries of a run.", no_args_is_help=True,
                           rich_markup_mode=None)
prompts_app = typer.Typer(help="Prompt sets: build every trial's prompt into a file first.", no_args_is_help=True,
                          rich_markup_mode=None)
app.add_typer(kernels_app, name="kernels")
app.add_typer(baseline_app, name="baseline")
app.add_typer(prompts_app, name="prompts")


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"niah {package_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                      help="Print niah's version and exit."),
) -> None:
    """niah: long-context recall for sparse-attention serving."""


# One module per noun; importing it registers its commands (imports inside stay lazy).
COMMAND_MODULES = ("sweep", "prompts", "serve", "report", "gate", "kernels", "doctor", "examples")


def _register() -> None:
    for name in COMMAND_MODULES:
        try:
            importlib.import_module(f"niah.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"niah.commands.{name}":
                raise


def main() -> None:
    _register()
    app()


if __name__ == "__main__":
    main()
