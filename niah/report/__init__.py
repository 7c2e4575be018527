"""Reports, comparisons and the CI gate over run folders (see docs/reports.md).

Modules: stats (Wilson, McNemar, power), data (trial tables, pairing), heatmaps, curves,
summary, render (`niah report`), compare, baseline, gate. Nothing is imported until used.
"""

from __future__ import annotations

from pathlib import Path

from niah.report.render import render_report


def build_report(run: Path | str, out: Path | str | None = None, svg: bool = False, alpha: float = 0.05) -> Path:
    """Render RUN's report (figures + summary.md); returns the report folder."""
    return render_report(run, out, svg=svg, alpha=alpha).out
