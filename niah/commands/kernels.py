"""`niah kernels bench` and `niah kernels test`: the bundled indexer kernels (niah.kernels)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer

from niah.cli import kernels_app


@kernels_app.command("bench")
def bench_cmd(
    out: Optional[Path] = typer.Option(None, "--out", help="Write the JSON report here."),
    tiny: bool = typer.Option(False, "--tiny", help="Small shapes on CPU under TRITON_INTERPRET=1 (wiring check)."),
    quick: bool = typer.Option(False, "--quick", help="Skip the secondary cases."),
    only: Optional[str] = typer.Option(None, "--only", help="Comma list of sections: decode,prefill,topk,store."),
) -> None:
    """Time the kernels, the naive gather-then-bmm and chunked torch side by side on one GPU,
    with the roofline floor, peak extra memory and a full-size correctness check."""
    import torch

    if tiny and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from niah.kernels.bench import run

    run(str(out) if out else None, tiny=tiny, quick=quick, only=only)


@kernels_app.command("test")
def test_cmd(
    pytest_args: Optional[list[str]] = typer.Argument(None, help="Extra pytest arguments."),
) -> None:
    """Run the kernel tests (the Triton interpreter on CPU; CUDA when a GPU is present)."""
    root = Path(__file__).resolve().parents[2] / "tests"
    files = sorted(str(p) for p in root.glob("test_kernels_*.py"))
    if not files:
        raise typer.BadParameter(f"no tests/test_kernels_*.py under {root.parent} (installed without the tests?)")
    rc = subprocess.call([sys.executable, "-m", "pytest", "-q", *files, *(pytest_args or [])])
    raise typer.Exit(rc)
