"""Recall heatmaps (x = context length, y = needle depth), the grid of all configurations
on one colour scale, and difference heatmaps (B - A) with significant cells marked.

Cell text: recall and n (answered trials). A cell where some trials errored is hatched and
says how many; a cell where all errored is grey, hatched and labelled "outage"; a cell with
no trials at all is pale and labelled "no data". Errors never count as misses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from niah.report import style
from niah.regime import Regime, as_regime
from niah.regime import config_regime


@dataclass
class Axes2D:
    lengths: list[int]
    depths: list[float]


def _font(n_cols: int, n_rows: int, base: float = 8.5) -> float:
    return max(5.0, base - 0.25 * max(0, n_cols - 6) - 0.2 * max(0, n_rows - 8))


def _matrix(cells, grid: Axes2D, value: str):
    import numpy as np

    m = np.full((len(grid.depths), len(grid.lengths)), np.nan)
    li = {v: j for j, v in enumerate(grid.lengths)}
    di = {v: i for i, v in enumerate(grid.depths)}
    for row in cells.itertuples(index=False):
        v = getattr(row, value)
        if v is not None and v == v:
            m[di[row.depth], li[row.length]] = v
    return m


def _frame_axes(ax, grid: Axes2D, fontsize: float, xlabel: bool = True, ylabel: bool = True) -> None:
    ax.set_xticks(range(len(grid.lengths)))
    ax.set_xticklabels([style.fmt_len(x) for x in grid.lengths], fontsize=fontsize + 0.5)
    ax.set_yticks(range(len(grid.depths)))
    ax.set_yticklabels([style.fmt_depth(d) for d in grid.depths], fontsize=fontsize + 0.5)
    if xlabel:
        ax.set_xlabel("context length (tokens, whole prompt)")
    if ylabel:
        ax.set_ylabel("needle depth")
    ax.set_xticks([x - 0.5 for x in range(len(grid.lengths) + 1)], minor=True)
    ax.set_yticks([y - 0.5 for y in range(len(grid.depths) + 1)], minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    for s in ax.spines.values():
        s.set_visible(False)


def uniform_n(cells) -> int | None:
    """The answered n shared by every cell when there are no errors (then cells need not
    repeat it; the title says it once); None otherwise."""
    if len(cells) == 0 or cells["errors"].any():
        return None
    ns = set(int(x) for x in cells["answered"])
    return ns.pop() if len(ns) == 1 else None


def _topk(manifest: dict[str, Any], name: str) -> Regime | None:
    return config_regime((manifest.get("configs") or {}).get(name))


def hatch_below_k(ax, grid: Axes2D, k: Regime | int | None) -> None:
    """Hatch (backslashes) the columns where every key is kept (niah.regime): no selection there."""
    from matplotlib.patches import Rectangle

    k = as_regime(k)
    for x, L in enumerate(grid.lengths):
        if k is not None and k.dense(L):
            ax.add_patch(Rectangle((x - 0.5, -0.5), 1, len(grid.depths), facecolor="none", edgecolor="#3b3b3b",
                                   hatch="\\\\", linewidth=0, alpha=0.35))
            ax.text(x, -0.5, f"≤ {k.short()}", ha="center", va="bottom", fontsize=7, color="#3b3b3b")


def draw_recall(ax, cells, grid: Axes2D, annotate: bool = True, show_n: bool = True,
                k: Regime | int | None = None):
    """Draw one configuration's recall heatmap on ax; returns the image (for a colorbar).
    k: the configuration's regime (or bare index_topk); its dense columns are hatched."""
    from matplotlib.patches import Rectangle

    m = _matrix(cells, grid, "recall")
    im = ax.imshow(m, cmap=style.recall_cmap(), vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    fs = _font(len(grid.lengths), len(grid.depths))
    li = {v: j for j, v in enumerate(grid.lengths)}
    di = {v: i for i, v in enumerate(grid.depths)}
    seen = set()
    for r in cells.itertuples(index=False):
        x, y = li[r.length], di[r.depth]
        seen.add((x, y))
        if r.errors:
            face = style.OUTAGE if r.answered == 0 else "none"
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=face, edgecolor="#555555",
                                   hatch="///", linewidth=0, alpha=0.55 if r.answered else 1.0))
        if not annotate:
            continue
        if r.answered == 0:
            text = f"outage\n{r.errors} err"
        else:
            text = f"{r.recall:.2f}" + (f"\nn={r.answered}" if show_n or r.errors else "") + (
                f"\n{r.errors} err" if r.errors else "")
        box = dict(boxstyle="round,pad=0.2", facecolor="white", alpha=0.75, edgecolor="none") if r.errors else None
        ax.text(x, y, text, ha="center", va="center", fontsize=fs, color="#1a1a1a",
                fontweight="bold" if r.errors else "normal", linespacing=1.1, bbox=box)
    if annotate:
        for x in range(len(grid.lengths)):
            for y in range(len(grid.depths)):
                if (x, y) not in seen:
                    ax.text(x, y, "no data", ha="center", va="center", fontsize=fs - 1, color="#8a8a8a")
    hatch_below_k(ax, grid, k)
    _frame_axes(ax, grid, fs)
    return im


def _title(info, manifest: dict[str, Any]) -> str:
    axes = ", ".join(f"{k}={v}" for k, v in info.axes.items())
    date = str(manifest.get("created") or "")[:10]
    first = info.name + (f"  ({axes})" if axes else "")
    return f"{first}\n{info.model} · {date}".rstrip(" ·")


def _figsize(grid: Axes2D) -> tuple[float, float]:
    return (max(5.5, 1.05 * len(grid.lengths) + 2.6), max(3.2, 0.62 * len(grid.depths) + 1.9))


def _footnote(ax, text: str) -> None:
    """Small grey text under the x label of ax (stays close however tall the figure)."""
    ax.annotate(text, xy=(0, 0), xycoords="axes fraction", xytext=(-40, -42), textcoords="offset points",
                fontsize=7, color="#555555", ha="left", va="top", annotation_clip=False)


FOOTNOTE = ("recall = correct / answered; hatched /// = some trials errored (outage, not counted as a miss); "
            "hatched \\\\ = no selection at that length (<= k, or within k compressed keys): every key kept")


def config_heatmap(cells, grid: Axes2D, info, manifest: dict[str, Any]):
    """Figure: one configuration's heatmap, with colour bar, title and footnote."""
    plt = style.plt()
    fig, ax = plt.subplots(figsize=_figsize(grid))
    n = uniform_n(cells)
    im = draw_recall(ax, cells, grid, show_n=n is None, k=_topk(manifest, info.name))
    ax.set_title(_title(info, manifest) + (f" · n={n} per cell" if n else ""), fontsize=10.5, loc="left")
    cb = fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    cb.set_label("recall")
    _footnote(ax, FOOTNOTE)
    return fig


def grid_layout(infos: dict[str, Any]) -> list[list[str | None]]:
    """Arrange configurations: when the sparse ones span exactly two axes, rows = values of
    the first axis and columns = values of the second (the fp8/bf16 x 512/1024 picture),
    dense controls in a last row; otherwise rows of up to three in manifest order."""
    sparse = [i for i in infos.values() if not i.dense]
    dense = [i.name for i in infos.values() if i.dense]
    keys = list(dict.fromkeys(k for i in sparse for k in i.axes))
    if len(keys) == 2 and all(set(i.axes) == set(keys) for i in sparse):
        k0, k1 = keys
        v0 = list(dict.fromkeys(i.axes[k0] for i in sparse))
        v1 = list(dict.fromkeys(i.axes[k1] for i in sparse))
        if len(v0) * len(v1) >= len(sparse) and len(v1) > 1 and len(v0) > 1:
            by = {(i.axes[k0], i.axes[k1]): i.name for i in sparse}
            if len(by) == len(sparse):
                rows = [[by.get((a, b)) for b in v1] for a in v0]
                width = len(v1)
                for j in range(0, len(dense), width):
                    chunk = dense[j:j + width]
                    rows.append(chunk + [None] * (width - len(chunk)))
                return rows
    names = list(infos)
    width = min(3, max(1, len(names)))
    return [names[j:j + width] + [None] * (width - len(names[j:j + width])) for j in range(0, len(names), width)]


def grid_figure(cells, grid: Axes2D, infos: dict[str, Any], manifest: dict[str, Any]):
    """Figure: every configuration side by side on one colour scale."""
    plt = style.plt()
    layout = grid_layout(infos)
    nr, nc = len(layout), len(layout[0])
    w, h = _figsize(grid)
    fig, axes = plt.subplots(nr, nc, figsize=(w * nc * 0.92, h * nr * 0.95), squeeze=False)
    im = None
    n = uniform_n(cells)
    for r, row in enumerate(layout):
        for c, name in enumerate(row):
            ax = axes[r][c]
            if name is None:
                ax.axis("off")
                continue
            info = infos[name]
            im = draw_recall(ax, cells[cells["config"] == name], grid, show_n=n is None, k=_topk(manifest, name))
            axes_txt = ", ".join(f"{k}={v}" for k, v in info.axes.items())
            ax.set_title(f"{name}" + (f"\n{axes_txt}" if axes_txt and axes_txt not in name else ""), fontsize=10)
            if r != nr - 1 and layout[r + 1][c] is not None:
                ax.set_xlabel("")
            if c != 0:
                ax.set_ylabel("")
    models = sorted({i.model for i in infos.values()})
    date = str(manifest.get("created") or "")[:10]
    per = f" · n={n} per cell" if n else ""
    fig.suptitle(f"Recall by configuration — {', '.join(models)} · {date}{per}", fontsize=12, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0.02, 0.93, 0.97))
    if im is not None:
        cax = fig.add_axes((0.945, 0.15, 0.012, 0.7))
        cb = fig.colorbar(im, cax=cax)
        cb.set_label("recall (shared scale)")
    fig.text(0.01, 0.0, FOOTNOTE, fontsize=7, color="#555555", ha="left", va="bottom")
    return fig


def diff_figure(rows, grid: Axes2D, name_a: str, name_b: str, label: str, overall, alpha: float):
    """Figure: B - A recall per cell (comparison rows grouped by (length, depth)); cells
    significant at alpha (paired McNemar, else Newcombe interval) get a black frame and *."""
    import numpy as np
    from matplotlib.patches import Rectangle

    plt = style.plt()
    li = {v: j for j, v in enumerate(grid.lengths)}
    di = {v: i for i, v in enumerate(grid.depths)}
    m = np.full((len(grid.depths), len(grid.lengths)), np.nan)
    for r in rows:
        length, depth = r.group
        if r.diff == r.diff:
            m[di[depth], li[length]] = r.diff
    span = np.nanmax(np.abs(m)) if np.isfinite(m).any() else 0.0
    span = max(0.25, math.ceil(span * 4) / 4)
    fig, ax = plt.subplots(figsize=_figsize(grid))
    im = ax.imshow(m, cmap=style.diff_cmap(), vmin=-span, vmax=span, aspect="auto", interpolation="nearest")
    fs = _font(len(grid.lengths), len(grid.depths))
    ns = {min(r.n_a, r.n_b) for r in rows}
    same_n = ns.pop() if len(ns) == 1 and not any(r.errors_a or r.errors_b for r in rows) else None
    seen = set()
    for r in rows:
        length, depth = r.group
        x, y = li[length], di[depth]
        seen.add((x, y))
        if r.diff != r.diff:
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=style.OUTAGE, edgecolor="#555555", hatch="///",
                                   linewidth=0))
            ax.text(x, y, "no answered\ntrials", ha="center", va="center", fontsize=fs - 1, color="#333333",
                    bbox=dict(boxstyle="round,pad=0.2", facecolor="white", alpha=0.75, edgecolor="none"))
            continue
        star = " *" if r.significant else ""
        p = "" if r.p != r.p else (f"\np={r.p:.2g}" if r.p < 0.1 else "")
        n_txt = "" if same_n else f"\nn={min(r.n_a, r.n_b)}"
        ax.text(x, y, f"{r.diff:+.2f}{star}{n_txt}{p}", ha="center", va="center", fontsize=fs,
                fontweight="bold" if r.significant else "normal", color="#1a1a1a", linespacing=1.1)
        if r.significant:
            ax.add_patch(Rectangle((x - 0.47, y - 0.47), 0.94, 0.94, fill=False, edgecolor="black", linewidth=2.2))
    for x in range(len(grid.lengths)):
        for y in range(len(grid.depths)):
            if (x, y) not in seen:
                ax.text(x, y, "no data", ha="center", va="center", fontsize=fs - 1, color="#8a8a8a")
    _frame_axes(ax, grid, fs)
    basis = rows[0].basis if rows else "unpaired"
    ov = "nothing answered on both sides"
    if overall is not None and overall.diff == overall.diff:
        ov = f"overall {100 * overall.diff:+.1f} pp, p={overall.p:.2g} ({overall.verdict})"
    ax.set_title(f"{name_b} − {name_a}\n{label} · {ov}", fontsize=10, loc="left")
    cb = fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    cb.set_label("recall difference (B − A)")
    test = "exact McNemar on paired prompts" if basis.startswith("paired") else "Newcombe interval (unpaired)"
    n_note = f"n = {same_n} answered pairs per cell" if same_n else "n = answered trials per side"
    _footnote(ax, f"framed, * = significant at alpha={alpha:g} ({test}); {n_note}")
    return fig
