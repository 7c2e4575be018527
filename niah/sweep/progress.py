"""What a sweep shows: a progress bar (ETA, running recall) and the final tables.

On a terminal the bar is rich's, live. Without one (CI logs, a pipe) a live bar shows
nothing until the end, so `SweepProgress` prints instead one plain line per
configuration at most every `interval` seconds (30 by default):

    niah: default: 12/45 trials, recall 92% (11/12), 1 error, elapsed 0:01:02, ETA 0:02:50

The ETA weighs each trial by its prompt length: the time so far per token of the trials
done, times the tokens of the trials left (a sweep's long prompts come last and cost the
most; counting trials alone would promise the end too early).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Iterable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from niah.runs.record import OUTCOMES
from niah.tokens import length_tolerance


PLAIN_INTERVAL_S = 30.0


class SweepProgress:
    """A live bar per configuration; pass to `run_sweep(..., progress=SweepProgress())`.
    Without a terminal (`console.is_terminal` false), plain lines at most every `interval`
    seconds per configuration instead (0: one per finished trial)."""

    def __init__(self, console=None, interval: float = PLAIN_INTERVAL_S, clock=time.monotonic):
        self.console = console or Console(stderr=True)
        self.live = self.console.is_terminal
        self.interval = interval
        self.clock = clock
        self.plain: dict[str, list[float]] = {}  # name -> [total, done, started, last line]
        self.weights: dict[str, list[float]] = {}  # name -> [weight of all trials, weight done, by length]
        self.bar = Progress(
            TextColumn("[bold]{task.fields[name]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("recall {task.fields[recall]}"),
            TextColumn("{task.fields[errors]}"),
            TimeElapsedColumn(),
            TextColumn("ETA {task.fields[eta]}"),
            console=self.console,
            transient=False,
        )
        self.tasks: dict[str, Any] = {}
        self.hits: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # correct, scored, errors

    def __enter__(self) -> "SweepProgress":
        if self.live:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.bar.stop()

    def start_target(self, name: str, total: int, lengths: Iterable[int] | None = None) -> None:
        """`lengths`: each pending trial's prompt length, which the ETA weighs it by (none:
        every trial weighs the same)."""
        by_length = lengths is not None
        self.weights[name] = [float(sum(lengths)) if by_length else float(total), 0.0, by_length]
        t = self.clock()
        self.plain[name] = [total, 0, t, t]
        if self.live:
            self.tasks[name] = self.bar.add_task(name, total=total, name=name, recall="-", errors="", eta="-")

    def eta(self, name: str) -> str:
        """The time left for `name`, weighing each trial by its length ("-" before any is done)."""
        total, done, _ = self.weights.get(name, (0.0, 0.0, False))
        started = self.plain[name][2] if name in self.plain else self.clock()
        if not done or not total:
            return "-"
        return _clock((self.clock() - started) / done * max(total - done, 0.0))

    def advance(self, name: str, rec: dict) -> None:
        w = self.weights.setdefault(name, [0.0, 0.0, False])
        w[1] += float(rec.get("length") or 1) if w[2] else 1.0
        h = self.hits[name]
        if rec.get("control"):      # no-needle controls are not recall (summarised apart)
            pass
        elif rec["outcome"] == "error":
            h[2] += 1
        else:
            h[1] += 1
            h[0] += rec["outcome"] == "correct"
        recall = f"{h[0] / h[1]:.0%} ({h[0]}/{h[1]})" if h[1] else "-"
        if not self.live:
            self._plain_line(name, recall, h[2])
            return
        errors = f"[red]{h[2]} errors" if h[2] else ""
        self.bar.update(self.tasks[name], advance=1, recall=recall, errors=errors, eta=self.eta(name))

    def _plain_line(self, name: str, recall: str, errors: int) -> None:
        state = self.plain.setdefault(name, [0, 0, self.clock(), self.clock()])
        state[1] += 1
        total, done, started, last = state
        now = self.clock()
        if now - last < self.interval:
            return  # at most one line per interval (the sweep's own summary ends it)
        state[3] = now
        elapsed = now - started
        eta = self.eta(name)
        err = f", {errors} error{'s' if errors != 1 else ''}" if errors else ""
        self.console.print(f"niah: {name}: {int(done)}/{int(total)} trials, recall {recall}{err}, "
                           f"elapsed {_clock(elapsed)}, ETA {eta}", soft_wrap=True, markup=False, highlight=False)


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def recall_tables(records: Iterable[dict]) -> list:
    """One rich Table per configuration: recall by length (rows) x depth (columns)."""
    by_cfg: dict[str, dict[tuple[int, float], list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if not r.get("control"):
            by_cfg[r["config"]][(int(r["length"]), float(r["depth"]))].append(r)
    tables = []
    for cfg, cells in by_cfg.items():
        depths = sorted({d for _, d in cells})
        lengths = sorted({n for n, _ in cells})
        t = Table(title=f"recall: {cfg} (correct/scored; errors apart)")
        t.add_column("length", justify="right")
        for d in depths:
            t.add_column(f"{d:g}%", justify="right")
        t.add_column("all", justify="right")
        for n in lengths:
            row = [str(n)]
            allc = alls = 0
            for d in depths:
                rs = cells.get((n, d), [])
                c, s, e = _counts(rs)
                allc, alls = allc + c, alls + s
                row.append(_cell(c, s, e))
            row.append(_cell(allc, alls, 0))
            t.add_row(*row)
        tables.append(t)
    return tables


def _counts(rs: list[dict]) -> tuple[int, int, int]:
    errors = sum(r["outcome"] == "error" for r in rs)
    scored = len(rs) - errors
    return sum(r["outcome"] == "correct" for r in rs), scored, errors


def _cell(c: int, s: int, e: int) -> str:
    if not s and not e:
        return ""
    text = f"{c / s:.0%} {c}/{s}" if s else "-"
    return text + (f" [red]+{e}err" if e else "")


def length_check(records: Iterable[dict]) -> dict:
    """Drift of server-reported prompt_tokens from the requested length."""
    devs = [
        (abs(r["prompt_tokens"] - r["length"]), r)
        for r in records
        if r.get("prompt_tokens") is not None
    ]
    out_of = [r for d, r in devs if d > length_tolerance(r["length"])]
    return {
        "checked": len(devs),
        "max_dev": max((d for d, _ in devs), default=None),
        "max_rel": max((d / r["length"] for d, r in devs), default=None),
        "out_of_tolerance": len(out_of),
    }


def outcome_counts(records: Iterable[dict]) -> dict[str, int]:
    counts = {o: 0 for o in OUTCOMES}
    for r in records:
        key = f"control {r['outcome']}" if r.get("control") else r["outcome"]
        counts[key] = counts.get(key, 0) + 1
    return counts
