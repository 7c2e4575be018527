"""`niah kernels bench` and `niah kernels test`: the bundled indexer kernels (niah.kernels).

Both run the checkout's own files in a subprocess (benchmarks/kernels/bench.py, tests/kernels/):
the benchmarks and tests are not part of the installed package, and niah imports neither.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer

from niah.cli import kernels_app

_CHECKOUT = Path(__file__).resolve().parents[2]


@kernels_app.command("bench")
def bench_cmd(
    out: Optional[Path] = typer.Option(None, "--out", help="Write the JSON report here."),
    tiny: bool = typer.Option(False, "--tiny", help="Small shapes on CPU under TRITON_INTERPRET=1 (wiring check)."),
    quick: bool = typer.Option(False, "--quick", help="Skip the secondary cases."),
    only: Optional[str] = typer.Option(None, "--only",
                                       help="Comma list of sections: decode,ragged,prefill,topk,store."),
) -> None:
    """Time the kernels, the naive gather-then-bmm and chunked torch side by side on one GPU,
    with the roofline floor, peak extra memory and a full-size correctness check
    (runs the checkout's benchmarks/kernels/bench.py)."""
    script = _CHECKOUT / "benchmarks" / "kernels" / "bench.py"
    if not script.is_file():
        raise typer.BadParameter(f"no benchmarks/kernels/bench.py under {_CHECKOUT} (installed without the checkout?)")
    args = [*(["--out", str(out)] if out else []), *(["--tiny"] if tiny else []), *(["--quick"] if quick else []),
            *(["--only", only] if only else [])]
    raise typer.Exit(subprocess.call([sys.executable, str(script), *args]))


@kernels_app.command("test")
def test_cmd(
    pytest_args: Optional[list[str]] = typer.Argument(None, help="Extra pytest arguments."),
) -> None:
    """Run the kernel tests (the Triton interpreter on CPU; CUDA when a GPU is present)."""
    tests = _CHECKOUT / "tests" / "kernels"
    if not sorted(tests.glob("test_kernels_*.py")):
        raise typer.BadParameter(f"no tests/kernels/test_kernels_*.py under {_CHECKOUT} (installed without the tests?)")
    rc = subprocess.call([sys.executable, "-m", "pytest", "-q", str(tests), *(pytest_args or [])])
    raise typer.Exit(rc)
