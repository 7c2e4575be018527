"""Shared look of every figure: colour maps, labels, saving (matplotlib Agg, lazily)."""

from __future__ import annotations

from pathlib import Path

from niah.errors import writing

# The convention of the original NIAH plots (gkamradt): red -> yellow -> green.
NIAH_COLOURS = ["#F0496E", "#EBB839", "#0CD79F"]
OUTAGE = "#B8B8B8"  # cells where every trial errored
EMPTY = "#F2F2F2"  # cells with no trials


def plt():
    """matplotlib.pyplot on the Agg backend (imported on first use)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as pyplot

    return pyplot


def recall_cmap():
    from matplotlib.colors import LinearSegmentedColormap

    return LinearSegmentedColormap.from_list("niah", NIAH_COLOURS).with_extremes(bad=EMPTY)


def diff_cmap():
    from matplotlib.colors import LinearSegmentedColormap

    return LinearSegmentedColormap.from_list(
        "niah_diff", [NIAH_COLOURS[0], "#FFFFFF", NIAH_COLOURS[2]]).with_extremes(bad=EMPTY)


def fmt_len(n: int) -> str:
    """4096 -> 4K, 8000 -> 8k, 1200 -> 1.2k, 1234 -> 1234 (tick labels)."""
    n = int(n)
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}K"
    if n >= 1000 and n % 100 == 0:
        return f"{n / 1000:g}k"
    return str(n)


def fmt_depth(d: float) -> str:
    return f"{d:g}%"


def save(fig, path: Path, svg: bool) -> Path:
    """Write fig as PNG (default) or SVG next to `path` (suffix replaced); close it."""
    path = Path(path).with_suffix(".svg" if svg else ".png")
    try:
        with writing(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=130, bbox_inches="tight", facecolor="white")
    finally:
        plt().close(fig)
    return path
