"""`niah report RUN`: every figure and summary.md into RUN/report/."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from niah.errors import BadInput, write_output, writing
from niah.report import cache_report, curves, headline, heatmaps, html, indexer_pairs, indexer_plots, summary
from niah.report.compare import ALL, compare
from niah.report.data import aggregate, config_infos, one_axis_pairs, split_controls, trials_frame
from niah.report.decode_report import decode_section
from niah.report.turns_report import turns_section
from niah.report.ranks import rank_compare
from niah.report.style import save
from niah.runs.integrity import load_checked
from niah.report.residues import modulus_of, residue_table
from niah.regime import config_regime, config_topk
from niah.runs.side import read_details


@dataclass
class Report:
    out: Path
    summary: Path
    page: Path | None = None  # index.html: the whole report in one self-contained page
    figures: list[Path] = field(default_factory=list)
    trials: int = 0
    configs: int = 0
    problems: list[str] = field(default_factory=list)  # run-folder integrity (niah.runs.integrity)
    notes: list[str] = field(default_factory=list)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "config"


def render_report(run: Path | str, out: Path | str | None = None, svg: bool = False, alpha: float = 0.05,
                  baseline: Path | str | None = None) -> Report:
    """Render RUN's heatmaps, grid, difference heatmaps, recall curves, summary.md and
    index.html (all of it in one self-contained page). The folder's integrity problems
    (niah.runs.integrity) head the summary and the page; the tables use its sound trials.
    Both open with the headline (niah.report.headline): per configuration, its verdict
    against `baseline` (a baseline file or run folder, gated as `niah gate` does) or else
    the run's dense control."""
    run = Path(run)
    checked = load_checked(run)
    manifest, records = checked.manifest, checked.records
    df = trials_frame(records)
    if df.empty:
        raise BadInput(f"{run} has no finished trials yet; nothing to report")
    out = Path(out) if out else run / "report"
    with writing(out):  # a file, or a place that cannot hold a folder: one line, exit 2
        out.mkdir(parents=True, exist_ok=True)
    infos = config_infos(manifest, df)
    infos = {n: i for n, i in infos.items() if (df["config"] == n).any()}
    lengths = sorted(int(x) for x in df["length"].unique())
    depths = sorted(float(x) for x in df["depth"].unique())
    grid = heatmaps.Axes2D(lengths, depths)

    cells = aggregate(df, ["config", "length", "depth"])
    by_len = aggregate(df, ["config", "length"])
    overall = aggregate(df, ["config"])
    rep = Report(out=out, summary=out / "summary.md", trials=len(df), configs=len(infos),
                 problems=checked.problems, notes=checked.notes)
    rel: dict[str, str] = {}
    paths: dict[str, Path] = {}

    def keep(key: str, path: Path) -> None:
        rep.figures.append(path)
        rel[key] = path.name
        paths[key] = path

    for name, info in infos.items():
        fig = heatmaps.config_heatmap(cells[cells["config"] == name], grid, info, manifest)
        keep(f"heatmap:{name}", save(fig, out / f"heatmap_{_slug(name)}", svg))
    if len(infos) > 1:
        keep("grid", save(heatmaps.grid_figure(cells, grid, infos, manifest), out / "grid", svg))
    keep("recall_vs_length", save(curves.recall_figure(by_len, infos, lengths), out / "recall_vs_length", svg))
    idx = indexer_plots.indexer_by_length(df)
    layers = indexer_plots.layer_table(read_details(run), list(infos)) if idx is not None else {}
    if idx is not None:
        keep("indexer", save(indexer_plots.indexer_figure(idx, layers, infos, lengths), out / "indexer", svg))
    topks = {n: config_topk((manifest.get("configs") or {}).get(n)) for n in infos}
    regimes = {n: config_regime((manifest.get("configs") or {}).get(n)) for n in infos}
    sections = (summary.indexer_section(idx, infos, lengths, topks, layers, rel.get("indexer")),
                indexer_pairs.markdown(indexer_pairs.indexer_pairs(df, indexer_pairs.same_k_pairs(df, infos, topks),
                                                                   alpha)),
                summary.control_section(split_controls(records)[1], infos),
                cache_report.cache_section(df, infos, lengths, manifest),
                cache_report.reasoning_section(df, infos, lengths, manifest),
                decode_section(records, infos, lengths),
                turns_section(records, infos, lengths))

    diffs = []
    for a, b, label in one_axis_pairs(infos):
        da, db = df[df["config"] == a], df[df["config"] == b]
        rows, method = compare(da, db, ["length"], alpha)
        cell_rows, _ = compare(da, db, ["length", "depth"], alpha, overall=False)
        ov = next((r for r in rows if r.group == ALL), None)
        fig = heatmaps.diff_figure(cell_rows, grid, a, b, label, ov, alpha)
        path = save(fig, out / f"diff_{_slug(b)}__minus__{_slug(a)}", svg)
        rep.figures.append(path)
        paths[f"diff:{a}:{b}"] = path
        diffs.append({"a": a, "b": b, "label": label, "rows": rows, "cells": cell_rows, "method": method,
                      "figure": path.name, "ranks": rank_compare(da, db, alpha)})

    states = {n: html.attestation_state((manifest.get("configs") or {}).get(n) or {})[0] for n in infos}
    heads, head_notes = headline.headlines(df, infos, one_axis_pairs(infos), states, len(depths), alpha,
                                           baseline=baseline, run=run, manifest=manifest, topks=regimes,
                                           records=records)
    rep.notes += head_notes
    text = summary.build(run.resolve().name, manifest, df, infos, cells, by_len, overall, lengths, depths,
                         diffs, rel, alpha, sections, checked.problems, checked.notes)
    if by_residue := residue_table(df, modulus_of(manifest)):
        text = text.rstrip("\n") + "\n\n" + by_residue
    first, _, rest = text.partition("\n")
    write_output(rep.summary, first + "\n\n" + headline.markdown(heads, head_notes) + rest)
    blocks = {"problems": summary.integrity_rows(checked.problems, checked.notes),
              "meta": summary.meta_rows(manifest, df, infos, lengths, depths),
              "recall": summary.recall_by_length_table(by_len, overall, infos, lengths),
              "taxonomy": summary.taxonomy_table(df, infos),
              "indexer": "\n\n".join(s for s in sections[:2] if s) or None, "control": sections[2]}
    page_head = {"items": heads, "notes": head_notes, "rule": headline.RULE, "needed": headline.needed_trials(alpha)}
    rep.page = html.write_page(out / "index.html", run.resolve().name, manifest, records, infos, paths, diffs, blocks,
                               page_head)
    return rep
