"""`niah examples`: the example matrix files that ship with niah (niah.serving's package
data, serving/examples/*.toml in a checkout), for a pip user who has no checkout.

    niah examples                     # each file's name and first line
    niah examples sglang              # print serving/examples/sglang.toml
    niah examples sglang -o my.toml   # copy it (refuses to overwrite an existing file)
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from niah.cli import app


def _examples() -> dict[str, str]:
    """{name: text} of every shipped example matrix, by name."""
    from importlib.resources import files

    folder = files("niah.serving") / "examples"
    return {p.name[:-len(".toml")]: p.read_text(encoding="utf-8")
            for p in sorted(folder.iterdir(), key=lambda p: p.name) if p.name.endswith(".toml")}


@app.command("examples")
def examples_cmd(
    name: Optional[str] = typer.Argument(None, help="An example's name (e.g. sglang); none: list them."),
    out: Optional[Path] = typer.Option(None, "--out", "-o",
                                       help="Copy the example here instead of printing it (never overwrites)."),
) -> None:
    """List, print or copy the example matrix files niah ships (`niah sweep --matrix FILE`)."""
    from niah.errors import BadInput, write_output

    found = _examples()
    if name is None:
        if out is not None:
            raise BadInput("--out needs an example's name: niah examples NAME --out FILE")
        for n, text in found.items():
            first = next((ln.lstrip("# ").strip() for ln in text.splitlines() if ln.strip()), "")
            typer.echo(f"{n:<16} {first}")
        typer.echo("\nniah examples NAME prints one; niah examples NAME -o FILE copies it.")
        return
    key = name[:-len(".toml")] if name.endswith(".toml") else name
    if key not in found:
        raise BadInput(f"no example {name!r}; there are {', '.join(found)}")
    if out is None:
        typer.echo(found[key], nl=False)
        return
    if out.exists():
        raise BadInput(f"{out} exists; niah examples never overwrites a file")
    write_output(out, found[key])
    typer.echo(f"wrote {out}", err=True)
