"""`niah doctor`: SGLang version, the plugin contract check, torch/Triton/CUDA/GPU facts."""

from __future__ import annotations

from typing import Optional

import typer

from niah.cli import app


@app.command()
def doctor(
    sglang_source: Optional[str] = typer.Option(
        None, "--sglang-source",
        help="Check the plugin contract against this SGLang wheel or unpacked source tree "
             "instead of the installed SGLang."),
    index_dtype: Optional[str] = typer.Option(
        None, "--index-dtype", help="Check only the patch points needed for fp8 or bf16 (default: all)."),
    points: bool = typer.Option(False, "--points", help="Also list every SGLang symbol the plugin touches "
                                                         "(on the checked SGLang's release; none: every release's)."),
) -> None:
    """Report the environment niah's SGLang plugin and kernels would run in.

    Exits 2 when the plugin contract is broken (each break names SGLang's file and line)."""
    from niah.errors import BadInput
    from niah.kernels import forms
    from niah.serving.sglang.environment import gather

    plugin = forms.sglang_plugin_names()
    if index_dtype is not None and index_dtype not in plugin:
        raise BadInput(f"--index-dtype must be {' or '.join(plugin)}, got {index_dtype!r}")
    facts = gather(sglang_source, index_dtype)
    width = max(len(k) for k, _ in facts.rows)
    for k, v in facts.rows:
        typer.echo(f"{k:<{width}}  {v}")
    if points:
        from niah.serving.sglang.contract import SUPPORTED_VERSIONS, points_for
        from niah.serving.sglang.patches import points_of

        typer.echo("")
        releases = (facts.release,) if facts.release else SUPPORTED_VERSIONS
        shown = dict.fromkeys(p for r in releases for p in (points_for(index_dtype, release=r) if index_dtype
                                                              else points_of(r)))
        for p in shown:  # each row with the SGLang releases it holds for ("all": every supported one)
            typer.echo(f"{p.action:<7} {p.when:<6} {','.join(p.versions) or 'all':<6} {p.target}  -- {p.why}")
    if facts.contract_ok is False:  # fail closed: the plugin would refuse this SGLang too
        raise typer.Exit(2)
