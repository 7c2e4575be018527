"""Recall against context length, one line per configuration, with 95% Wilson intervals.

(An earlier version drew the last prompt token's "selection recall" beside it under the
title "Indexer kept the needle"; it plotted 1.0 for the dense control and for prompts no
longer than k, where nothing is selected, and the last prompt token is not the one that
writes the answer. The indexer's own figure is niah/report/indexer_plots.py.)
"""

from __future__ import annotations

from niah.report import style


def recall_figure(by_len, infos: dict, lengths: list[int], confidence: float = 0.95):
    """by_len: aggregate(df, ["config", "length"]). Returns the figure."""
    plt = style.plt()
    ncols = 1
    fig, axes = plt.subplots(1, ncols, figsize=(6.4 * ncols, 4.3), squeeze=False)
    ax = axes[0][0]
    names = list(infos)
    colours = plt.get_cmap("tab10")
    k = len(names)
    use_log = len(lengths) > 1 and max(lengths) / max(1, min(lengths)) >= 4
    markers = "osD^vP*X"
    for i, name in enumerate(names):
        d = by_len[(by_len["config"] == name) & (by_len["answered"] > 0)].sort_values("length")
        if d.empty:
            if (by_len["config"] == name).any():
                ax.plot([], [], ls=":", color=colours(i % 10), label=f"{name} (outage: nothing answered)")
            continue
        marker = markers[i % len(markers)]
        # small horizontal offsets so overlapping intervals stay readable
        off = (i - (k - 1) / 2) * 0.025
        xs = [x * (2 ** off) if use_log else x * (1 + off / 4) for x in d["length"]]
        y = d["recall"].to_numpy()
        yerr = [y - d["lo"].to_numpy(), d["hi"].to_numpy() - y]
        ax.errorbar(xs, y, yerr=yerr, marker=marker, ms=4.5, capsize=3, lw=1.6, color=colours(i % 10),
                    label=name)
    for a, ylabel in zip(axes[0], ("recall (95% Wilson interval)",)):
        if use_log:
            a.set_xscale("log", base=2)
        a.set_xticks(lengths)
        crowded = use_log and any(b / a_ < 1.45 for a_, b in zip(lengths, lengths[1:]))
        a.set_xticklabels([style.fmt_len(x) for x in lengths], rotation=45 if crowded or len(lengths) > 9 else 0)
        a.minorticks_off()
        a.set_ylim(-0.03, 1.05)
        a.set_xlabel("context length (tokens)")
        a.set_ylabel(ylabel)
        a.grid(True, alpha=0.3)
        for s in ("top", "right"):
            a.spines[s].set_visible(False)
    ax.set_title("Recall vs context length (errors excluded)", fontsize=10.5, loc="left")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best", frameon=False)
    else:
        ax.text(0.5, 0.5, "no answered trials", transform=ax.transAxes, ha="center", va="center", color="#777777")
    fig.tight_layout()
    return fig
