"""summary.md: the tables behind every figure, as Markdown a person can paste anywhere."""

from __future__ import annotations

from typing import Any

from niah.attestation import last_attestation, report_section
from niah.report import style
from niah.report.compare import rows_markdown
from niah.report.ranks import rank_markdown
from niah.runs.record import CONTROL_OUTCOMES, OUTCOMES
from niah.tokens import length_tolerance



def _pct(x: float) -> str:
    return "—" if x != x else f"{100 * x:.1f}%"


def _cell(r, interval: bool = False) -> str:
    """One table cell: recall (correct/answered), with the Wilson interval if asked."""
    if r is None:
        return "no data"
    if r.answered == 0:
        return f"outage ({r.errors} err)"
    if interval:
        s = f"{_pct(r.recall)} [{100 * r.lo:.0f}–{100 * r.hi:.0f}] ({r.correct}/{r.answered})"
    else:
        s = f"{r.recall:.2f} ({r.correct}/{r.answered})"
    return s + (f" ⚠{r.errors} err" if r.errors else "")


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def recall_by_length_table(by_len, overall, infos, lengths) -> str:
    idx = {(r.config, r.length): r for r in by_len.itertuples(index=False)}
    ov = {r.config: r for r in overall.itertuples(index=False)}
    rows = [[f"`{n}`", *[_cell(idx.get((n, L)), interval=True) for L in lengths], _cell(ov.get(n), interval=True)]
            for n in infos]
    return _table(["config", *[style.fmt_len(L) for L in lengths], "all"], rows)


def cell_table(cells, name: str, lengths, depths) -> str:
    idx = {(r.length, r.depth): r for r in cells[cells["config"] == name].itertuples(index=False)}
    rows = [[style.fmt_depth(d), *[_cell(idx.get((L, d))) for L in lengths]] for d in depths]
    return _table(["depth \\ length", *[style.fmt_len(L) for L in lengths]], rows)


def selection_table(by_len, infos, lengths) -> str | None:
    if not len(by_len) or not (by_len["sel_n"] > 0).any():
        return None
    idx = {(r.config, r.length): r for r in by_len.itertuples(index=False)}
    rows = []
    for n in infos:
        cells = []
        for L in lengths:
            r = idx.get((n, L))
            cells.append("—" if r is None or r.sel_n == 0 else
                         f"{r.sel:.3f} ({r.sel_min:.2f}–{r.sel_max:.2f}, n={r.sel_n})")
        rows.append([f"`{n}`", *cells])
    return _table(["config", *[style.fmt_len(L) for L in lengths]], rows)


def indexer_section(idx, infos, lengths, topks: dict, layers: dict, figure: str | None) -> str | None:
    """The indexer's numbers per configuration and length (trials with selection only)."""
    if idx is None:
        return None
    at = {(r.config, r.length): r for r in idx.itertuples(index=False)}
    rows = []
    for n, info in infos.items():
        cells = []
        for L in lengths:
            r, k = at.get((n, L)), topks.get(n)
            if info.dense or (k is None and r is None):
                cells.append("— (dense: no selection)" if info.dense else "—")
            elif k is not None and L <= k and r is None:
                cells.append(f"≤ k={k}: no selection")
            elif r is None:
                cells.append("—")
            else:
                low = f"≤ k={k}, decode steps past k only: " if k is not None and L <= k else ""
                cells.append(f"{low}{r.rank:.3g} · {r.fidelity:.3f} · {r.kept:.2f} (n={r.n})")
        rows.append([f"`{n}`", *cells])
    out = ["\n## The indexer: where the needle ranks against k\n"]
    if figure:
        out.append(f"![indexer]({figure})\n")
    out.append("Per cell: **needle rank / k** (median over trials of the geometric mean over layers and probed steps "
               "of the worst needle-value token's rank / k; > 1 = below the cut) · **fidelity** (mean top-k overlap "
               "with exact fp32 keys for the same query) · **kept** (mean share of the value's tokens kept). Probed "
               "steps: the last prompt token and each decode step until the answer holds the value. A prompt no "
               "longer than k has no selection at the prompt; decode steps whose context (prompt + generated tokens) "
               "passes k do select, and only those count there.\n")
    out.append(_table(["config", *[style.fmt_len(L) for L in lengths]], rows))
    for n, per_layer in layers.items():
        ranked = sorted((v, i) for i, v in enumerate(per_layer) if v == v)[::-1][:4]
        if ranked:
            out.append(f"\n`{n}`: layers furthest from the cut (median rank / k): "
                       + ", ".join(f"layer {i} ({v:.2g})" for v, i in ranked) + "\n")
    return "\n".join(out)


def control_section(controls: list[dict], infos) -> str | None:
    """Outcomes of the no-needle control trials per configuration (niah/sweep/control.py)."""
    if not controls:
        return None

    rows = []
    for n in infos:
        c = [r for r in controls if r.get("config") == n]
        counts = [sum(r.get("outcome") == o for r in c) for o in CONTROL_OUTCOMES]
        rows.append([f"`{n}`", *map(str, counts), str(len(c))])
    return ("\n## No-needle control\n\nOne trial per cell whose haystack holds no needle. `leak`: the answer holds "
            "another trial's needle value (state carried between requests); `hallucinated`: a 7-digit number in "
            "neither this prompt nor any needle of the sweep; `clean`: neither.\n\n"
            + _table(["config", *CONTROL_OUTCOMES, "total"], rows))


def taxonomy_table(df, infos) -> str:
    """Outcome counts per configuration; the `near` column only when a trial is near."""
    shown = [o for o in OUTCOMES if o != "near" or (df["outcome"] == "near").any()]
    rows = []
    for n in infos:
        d = df[df["config"] == n]
        counts = d["outcome"].value_counts()
        rows.append([f"`{n}`", *[str(int(counts.get(o, 0))) for o in shown], str(len(d))])
    return _table(["config", *shown, "total"], rows)


def error_table(df, limit: int = 5) -> str | None:
    e = df[df["is_error"]]
    if e.empty:
        return None
    msgs = (e["error"].fillna("(no message)").astype(str).str.slice(0, 120)
            .str.replace("|", "\\|").str.replace("\n", " "))
    top = e.assign(msg=msgs).groupby(["config", "msg"]).size().reset_index(name="n")
    top = top.sort_values(["config", "n"], ascending=[True, False]).groupby("config").head(limit)
    return _table(["config", "error", "trials"],
                  [[f"`{r.config}`", r.msg, str(r.n)] for r in top.itertuples(index=False)])


def _med(s) -> str:
    s = s.dropna()
    return "—" if s.empty else f"{s.median():.3f}"


def timing_table(df, infos) -> str:
    rows = []
    for n in infos:
        d = df[(df["config"] == n) & (df["answered"])]
        rows.append([f"`{n}`", _med(d["latency_s"]), _med(d["ttft_s"]), str(int(d["ttft_s"].notna().sum())),
                     str(len(d))])
    return _table(["config", "median latency (s)", "median TTFT (s)", "trials with TTFT", "answered"], rows)


def timing_by_length_table(df, infos, lengths) -> str:
    rows = []
    for n in infos:
        d = df[(df["config"] == n) & (df["answered"])]
        cells = []
        for L in lengths:
            x = d[d["length"] == L]
            cells.append(f"{_med(x['latency_s'])} / {_med(x['ttft_s'])}")
        rows.append([f"`{n}`", *cells])
    return _table(["config (latency / TTFT, s)", *[style.fmt_len(L) for L in lengths]], rows)


def length_check(df, infos, lengths) -> tuple[str, int]:
    """Table of server-reported prompt_tokens against the requested length; returns the
    table and how many trials drift beyond the sweep's own tolerance (max(4 tokens, 0.5%))."""
    rows, flagged_total = [], 0
    for n in infos:
        for L in lengths:
            d = df[(df["config"] == n) & (df["length"] == L)]
            if d.empty:
                continue
            pt = d["prompt_tokens"].dropna()
            missing = len(d) - len(pt)
            if pt.empty:
                rows.append([f"`{n}`", f"{L:,}", "—", "—", "—", "—", str(missing)])
                continue
            drift = (pt - L) / L
            flagged = int(((pt - L).abs() > length_tolerance(L)).sum())
            flagged_total += flagged
            worst = drift.iloc[drift.abs().argmax()]
            rows.append([f"`{n}`", f"{L:,}", f"{pt.median():,.0f}", f"{int(pt.min()):,}–{int(pt.max()):,}",
                         f"{100 * worst:+.2f}%", f"**{flagged}**" if flagged else "0", str(missing)])
    table = _table(["config", "requested", "median prompt_tokens", "range", "worst drift",
                    "trials off by more than max(4, 0.5%)", "not reported"], rows)
    return table, flagged_total


def meta_rows(manifest: dict[str, Any], df, infos, lengths, depths) -> list[tuple[str, str]]:
    """(name, Markdown value) lines that head the report: when, which niah, models, sizes."""
    models = sorted({i.model for i in infos.values()})
    meta = [
        ("created", manifest.get("created")),
        ("niah", f"{manifest.get('niah_version', '?')} ({str(manifest.get('git_sha') or '?')[:12]})"),
        ("model(s)", ", ".join(models)),
        ("configurations", ", ".join(f"`{n}`" for n in infos)),
        ("trials", f"{len(df):,} ({int(df['is_error'].sum()):,} errors)"),
        ("lengths", ", ".join(f"{L:,}" for L in lengths)),
        ("depths", ", ".join(style.fmt_depth(d) for d in depths)),
    ]
    return [(k, str(v)) for k, v in meta if v not in (None, "")]


def integrity_section(problems: list[str], notes: list[str]) -> str | None:
    """The run folder's integrity problems (niah.runs.integrity): the first thing a reader sees."""
    if not problems and not notes:
        return None
    out = []
    if problems:
        out.append(f"## ⚠ This run folder has {len(problems)} integrity problem(s)\n\n"
                   "`niah compare` and `niah gate` refuse it (exit 2) until they are fixed; the tables below "
                   "use only its sound trials.\n")
        out.extend(f"- {p}" for p in problems)
    out.extend(f"- note: {n}" for n in notes)
    return "\n".join(out) + "\n"


def integrity_rows(problems: list[str], notes: list[str]) -> list[tuple[str, str]]:
    """The same as (name, value) rows that head the page."""
    return ([("integrity problem", p) for p in problems] + [("note", n) for n in notes])


def memory_section(manifest: dict[str, Any], infos, lengths) -> str | None:
    """GPU memory per prompt length, for the configurations whose server attests it (the
    embedded server on CUDA: facts work_gpu_bytes / peak_gpu_bytes, keyed by exact prompt
    tokens; each length takes the largest reading within its length tolerance). None when
    no configuration reports it."""
    rows = []
    for n in infos:
        facts = (last_attestation((manifest.get("configs") or {}).get(n) or {}) or {}).get("facts") or {}
        work, peak = facts.get("work_gpu_bytes") or {}, facts.get("peak_gpu_bytes") or {}
        if not work and not peak:
            continue

        def at(d: dict, length: int) -> str:
            got = [v for k, v in d.items() if str(k).isdigit() and abs(int(k) - length) <= length_tolerance(length)]
            return f"{max(got) / 2**30:.2f}" if got else "—"

        rows.append([f"`{n}`"] + [f"{at(work, L)} / {at(peak, L)}" for L in lengths])
    if not rows:
        return None
    return ("\n## GPU memory per prompt length (GiB: the prefill's working memory / its peak)\n\n"
            "Working memory: the prefill's peak minus what was allocated just before it (weights, caches, index-key "
            "pool, captured decode graphs); the peak includes those, so it also grows with the graphs a run captures. "
            "Largest reading per length, as the server attested it.\n\n"
            + _table(["config"] + [style.fmt_len(L) for L in lengths], rows))


def build(run_name: str, manifest: dict[str, Any], df, infos, cells, by_len, overall, lengths, depths,
          diffs: list[dict[str, Any]], figures: dict[str, str], alpha: float, sections: tuple = (),
          problems: list[str] = (), notes: list[str] = ()) -> str:
    """The whole summary.md (the run folder's integrity problems first)."""
    out: list[str] = []
    out.append(f"# niah report: {run_name}\n")
    integrity = integrity_section(list(problems), list(notes))
    if integrity:
        out.append(integrity)
    out.append("\n".join(f"- **{k}**: {v}" for k, v in meta_rows(manifest, df, infos, lengths, depths)) + "\n")

    attested = report_section(manifest, infos)
    if attested:
        out.append(attested)
    out.append("Recall = correct / answered trials; `error` trials (outages) are counted apart and never as misses. "
               f"Intervals are 95% Wilson; tests use alpha = {alpha:g}.\n")

    out.append("## Recall by configuration and length\n")
    if "recall_vs_length" in figures:
        out.append(f"![recall vs length]({figures['recall_vs_length']})\n")
    out.append(recall_by_length_table(by_len, overall, infos, lengths))
    out.extend(x for x in sections if x)
    sel = selection_table(by_len, infos, lengths)
    if sel:
        out.append("\n### Last-prompt-token selection recall (not the tokens that write the answer)\n")
        out.append("Share of the needle sentence's tokens the indexer kept for the LAST PROMPT TOKEN only: mean over "
                   "layers (weakest–strongest layer), averaged over trials. The answer's digits are fetched by the "
                   "decode steps' own selections, so this is low even when answers are right; the indexer section "
                   "above is the measurement to read.\n")
        out.append(sel)

    out.append("\n## Heatmaps (recall per cell: recall (correct/answered))\n")
    if "grid" in figures:
        out.append(f"![all configurations]({figures['grid']})\n")
    for n in infos:
        out.append(f"\n### `{n}`\n")
        if f"heatmap:{n}" in figures:
            out.append(f"![{n}]({figures[f'heatmap:{n}']})\n")
        out.append(cell_table(cells, n, lengths, depths))

    if diffs:
        out.append("\n## Differences (B − A) between configurations that differ in one axis\n")
        for d in diffs:
            out.append(f"\n### `{d['b']}` − `{d['a']}` ({d['label']})\n")
            if d.get("figure"):
                out.append(f"![diff]({d['figure']})\n")
            basis = d["method"]
            out.append(("Paired by " + ("prompt hash" if basis == "prompt" else "(length, depth, trial, seed)")
                        + "; McNemar's exact test on discordant pairs (losses: A right and B wrong).\n")
                       if basis else "No trials pair up: unpaired two-proportion comparison (Newcombe interval, "
                                     "z-test p).\n")
            out.append(rows_markdown(d["rows"], d["a"], d["b"]))
            if any(r.n for r in d.get("ranks") or []):
                out.append("\nNeedle rank / k on the same pairs (Wilcoxon signed-rank on log2(rank_B / rank_A); "
                           "r > 0: B deeper):\n\n" + rank_markdown(d["ranks"], d["a"], d["b"]))
            sig = [r for r in d["cells"] if r.significant]
            if not any(r.n_a and r.n_b for r in d["cells"]):
                out.append("\nNo cell has answered trials on both sides.\n")
            elif sig:
                out.append("\nSignificant cells: " + ", ".join(
                    f"{style.fmt_len(r.group[0])} @ {style.fmt_depth(r.group[1])} ({100 * r.diff:+.0f} pp, p={r.p:.2g})"
                    for r in sig) + "\n")
            else:
                out.append("\nNo single cell differs significantly.\n")

    memory = memory_section(manifest, infos, lengths)
    if memory:
        out.append(memory)

    out.append("\n## Failure taxonomy\n")
    out.append(taxonomy_table(df, infos))
    errs = error_table(df)
    if errs:
        out.append("\nMost frequent errors:\n\n" + errs)

    out.append("\n## Latency and time to first token (answered trials)\n")
    out.append(timing_table(df, infos))
    out.append("\nBy length (median latency / median TTFT, seconds):\n\n")
    out.append(timing_by_length_table(df, infos, lengths))

    out.append("\n## Length check: server-reported prompt_tokens vs requested length\n")
    table, flagged = length_check(df, infos, lengths)
    out.append(table)
    out.append("\n" + (f"**{flagged} trial(s) drift more than max(4 tokens, 0.5%) from the requested length.**\n"
                       if flagged else "Every reported length is within max(4 tokens, 0.5%) of the request.\n"))
    return "\n".join(out).replace("\n\n\n", "\n\n")

