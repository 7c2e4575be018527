"""The indexer figure (`indexer.png`): where the needle ranks against k.

Three panels, from the trials' `indexer` summaries and the RUN/indexer/ side files:
1. needle rank / k against length, per configuration (median over trials of each trial's
   geometric mean over layers and probed steps of the worst value token's rank / k); the line at
   1 is the top-k cut (above it: not kept);
2. fidelity against length: overlap of the configuration's top-k with the top-k that exact
   fp32 keys give for the same query (1 = identical selection; the precision effect alone);
3. per layer (all trials with selection pooled): the median worst rank / k of each layer,
   one line per configuration: the layers that lose the needle first sit highest.
Only trials where selection happened count (prompt longer than k); dense has none.

Laid out for a page about 1400 px wide: panels 1 and 2 side by side, panel 3 across the
full width below, no text under FONT_MIN points. Fidelity's axis is fixed at
FIDELITY_SCALE (0-1, stated in its label), never fitted to the data: a band of 0.966-0.972
must not look like a cliff.
"""

from __future__ import annotations

import statistics

from niah.report import style
from niah.runs.side import layer_rows

FIDELITY_SCALE = (0.0, 1.0)
FONT_MIN = 11.0  # points, at style.save's dpi: every label, tick and legend of the figure
SIZE = (13.0, 9.0)  # inches


def indexer_by_length(df):
    """Per (config, length): trials with selection, median rank / k, mean fidelity, mean kept."""
    d = df[df["idx_active"] == True]  # noqa: E712 - a column of True/False/None
    if d.empty:
        return None
    g = d.groupby(["config", "length"])
    return g.agg(n=("idx_rank_worst", "size"), rank=("idx_rank_worst", "median"),
                 rank_best=("idx_rank_best", "median"), fidelity=("idx_fidelity", "mean"),
                 kept=("idx_kept", "mean"), margin=("idx_margin", "median")).reset_index()


def layer_table(details: list[dict], names: list[str]) -> dict[str, list[float]]:
    """config -> per-layer median (over trials) of the layer's median worst rank / k."""
    per: dict[str, list[list[float]]] = {}
    for d in details:
        rows = layer_rows(d["detail"])
        if not rows or d.get("config") not in names:
            continue
        acc = per.setdefault(d["config"], [[] for _ in rows])
        for i, r in enumerate(rows[:len(acc)]):
            if r["rank_worst"] is not None:
                acc[i].append(r["rank_worst"])
    return {c: [statistics.median(v) if v else float("nan") for v in layers] for c, layers in per.items()}


def indexer_figure(by_len, layers: dict[str, list[float]], infos: dict, lengths: list[int]):
    plt = style.plt()
    fig = plt.figure(figsize=SIZE)
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 0.85])
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])]
    fs = FONT_MIN
    colours = plt.get_cmap("tab10")
    names = [n for n in infos if (by_len["config"] == n).any()]
    for i, name in enumerate(names):
        d = by_len[by_len["config"] == name].sort_values("length")
        kw = dict(marker="osD^vP*X"[i % 8], ms=6, lw=1.8, color=colours(i % 10), label=name,
                  ls="-" if i % 2 == 0 else "--")
        axes[0].plot(d["length"], d["rank"], **kw)
        axes[1].plot(d["length"], d["fidelity"], **kw)
        if name in layers:
            axes[2].plot(range(len(layers[name])), layers[name], **kw)
    axes[0].axhline(1.0, color="#c0392b", lw=1.2, ls=":")
    axes[0].text(0.01, 1.0, " k (the cut): above = not kept", color="#c0392b", fontsize=fs,
                 transform=axes[0].get_yaxis_transform(), va="bottom")
    axes[2].axhline(1.0, color="#c0392b", lw=1.2, ls=":")
    for ax in (axes[0], axes[2]):
        ax.set_yscale("log", base=2)
    for ax in axes[:2]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths)
        ax.set_xticklabels([style.fmt_len(x) for x in lengths], rotation=45 if len(lengths) > 6 else 0)
        ax.minorticks_off()
        ax.set_xlabel("context length (tokens)", fontsize=fs)
    axes[1].set_ylim(*FIDELITY_SCALE)
    axes[0].set_ylabel("needle rank / k (median)", fontsize=fs)
    axes[0].set_title("Where the needle ranks against k\n"
                      "(worst value token; geometric mean over layers x steps)", fontsize=fs + 1, loc="left")
    axes[1].set_ylabel(f"top-k overlap with exact fp32 keys\n(fixed scale {FIDELITY_SCALE[0]:g}-{FIDELITY_SCALE[1]:g})",
                       fontsize=fs)
    axes[1].set_title("Fidelity: this top-k vs the exact-key top-k\n(same query; the precision effect alone)",
                      fontsize=fs + 1, loc="left")
    axes[2].set_xlabel("layer", fontsize=fs)
    axes[2].set_ylabel("needle rank / k\n(median per layer)", fontsize=fs)
    axes[2].set_title("Per layer: which layers lose the needle first (trials with selection pooled)",
                      fontsize=fs + 1, loc="left")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=fs)
        for s in ("top", "right"):
            ax.spines[s].set_visible(False)
    if axes[0].get_legend_handles_labels()[0]:
        axes[1].legend(fontsize=fs, loc="lower left", frameon=False)
    fig.tight_layout()
    return fig
