"""`RUN/report/index.html`: the whole report as one self-contained page.

Everything is inside the file: figures as base64 `data:` URIs, the CSS (page.css) and the
trial filter's script (page.js) inline, and a Content-Security-Policy that lets the page
load nothing else (no network, no sibling file). The page answers first: the headline of
each configuration (niah/report/headline.py: recall by length, where it drops, PASS /
REGRESSION / OUTAGE against a baseline where there is one, a small-sample flag, what weakens
the verdict, the attestation: "n/a" where the server attests nothing), then what
the words mean (index keys, precision, top-k), then the evidence: the recall curves and
heatmaps, the paired comparisons (McNemar on the answers, Wilcoxon on the needle rank), the
indexer panels, the outcome counts; the attestation detail (what each server ran, its
internal call counters) and the run's details after those, and last a table of every
trial, filterable by configuration, length, outcome and text.

Tables come from the same functions as summary.md (Markdown pipe tables, converted here),
so the page and summary.md cannot disagree. All text is escaped: answers come from models.
"""

from __future__ import annotations

import base64
import hashlib
import re
from html import escape
from importlib.resources import files
from pathlib import Path
from string import Template
from typing import Any

from niah import __version__
from niah.attestation import last_attestation, shown_state
from niah.errors import write_output
from niah.report import style
from niah.report.compare import ALL, rows_markdown
from niah.report.ranks import rank_markdown

MIME = {".png": "image/png", ".svg": "image/svg+xml"}
ANSWER_CHARS = 2000  # longer answers are cut in the table (the full text stays in trials.jsonl)


# -- the attestation state: the one call into niah.attestation ---------------------------
def attestation_state(entry: dict) -> tuple[str, str]:
    """("valid" | "INVALID" | "unattested" | "n/a", reason) of one manifest `configs.<name>`
    entry; "n/a", never a green "valid", for a server that attested nothing."""
    return shown_state(entry)


def _state_class(state: str) -> str:
    return "state-" + ("na" if state == "n/a" else state)


# -- small pieces -------------------------------------------------------------------------
def _e(x: Any) -> str:
    return escape("" if x is None else str(x), quote=True)


def _inline(text: str) -> str:
    """Escaped text with the Markdown summary.md uses inside cells: `code` and **bold**."""
    s = _e(text)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", s)


def _cells(line: str) -> list[str]:
    parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [p.strip().replace("\\|", "|") for p in parts]


def markdown_block(text: str | None) -> str:
    """The Markdown subset summary.md writes (pipe tables, ### headings, paragraphs) as HTML.
    `## ` headings and image links are dropped: the page has its own sections and figures."""
    if not text:
        return ""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                block.append(lines[i])
                i += 1
            head, body = _cells(block[0]), [_cells(b) for b in block[2:]]
            out.append('<div class="scroll"><table><thead><tr>' + "".join(f"<th>{_inline(c)}</th>" for c in head)
                       + "</tr></thead><tbody>" + "".join(
                           "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in body)
                       + "</tbody></table></div>")
            continue
        if line.startswith("### "):
            out.append(f"<h3>{_inline(line[4:])}</h3>")
        elif line and not line.startswith("## ") and not line.startswith("!["):
            out.append(f'<p class="note">{_inline(line)}</p>')
        i += 1
    return "\n".join(out)


def figure(path: Path | None, caption: str = "", alt: str = "", cls: str = "") -> str:
    """An <img> holding the file itself as a data: URI."""
    if path is None:
        return ""
    path = Path(path)
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    cap = f"<figcaption>{_inline(caption)}</figcaption>" if caption else ""
    klass = f' class="{_e(cls)}"' if cls else ""
    return (f'<figure{klass}><img src="data:{MIME[path.suffix]};base64,{data}" alt="{_e(alt or path.stem)}">'
            f"{cap}</figure>")


def _section(sid: str, title: str, body: str) -> tuple[str, str, str]:
    return sid, title, f'<section id="{sid}">\n<h2>{_e(title)}</h2>\n{body}\n</section>'


# -- sections -----------------------------------------------------------------------------
def attestation_section(manifest: dict, names: list[str]) -> str:
    configs = manifest.get("configs") or {}
    rows = []
    for n in names:
        entry = configs.get(n) or {}
        state, reason = attestation_state(entry)
        a = last_attestation(entry) or {}
        ran = f"{a.get('index_dtype')} / {a.get('kernels')}" if a else "—"
        rows.append(f'<tr><td><code>{_e(n)}</code></td><td><span class="state {_state_class(state)}">'
                    f"{_e(state)}</span></td><td>{_e(ran)}</td><td>{_e(reason)}</td></tr>")
    return ('<p class="note">What each configuration\'s server says its indexer ran, checked against the '
            "configuration's label. INVALID: the server contradicts the label (compare and gate refuse it); "
            "unattested: the server reports nothing, so the label is taken on trust; n/a: a server that attests "
            "nothing, with no label to attest (nothing proven, nothing contradicted).</p>"
            '<table class="attestation"><thead><tr><th>config</th><th>state</th><th>ran (index dtype / kernels)</th>'
            "<th>calls / reason</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _pct(x: float) -> str:
    return "—" if x != x else f"{100 * x:.0f}%"


def headline_card(h) -> str:
    """One configuration's headline (a niah.report.headline.Headline) as a card."""
    verdict = h.verdict or ("control" if h.against else "no baseline")
    vcls = h.verdict or "none"
    against = f"against {h.against}" if h.verdict else (h.against or "nothing to compare it with in this run")
    weak = ' <span class="weak">weak evidence: small sample</span>' if h.verdict == "PASS" and h.small else ""
    cells = "".join(
        f'<td class="{"outage" if not x.answered else ""}">{_pct(x.recall)}<small>{x.correct}/{x.answered}'
        + (f" · {x.errors} err" if x.errors else "") + "</small></td>" for x in h.lengths)
    heads = "".join(f"<th>{_e(style.fmt_len(x.length))}"
                    + ('<small title="at or below k: every token kept">≤k</small>' if h.dense(x.length)
                       else "") + "</th>" for x in h.lengths)
    out = [f'<article class="card card-{_e(vcls)}" data-config="{_e(h.config)}">',
           f'<h3><code>{_e(h.config)}</code> <span class="verdict v-{_e(vcls)}">{_e(verdict)}</span>{weak}</h3>',
           f'<p class="against">{_inline(against)}</p>',
           f'<table class="by-length"><tr><th>length</th>{heads}</tr><tr><th>recall</th>{cells}</tr></table>',
           f'<p class="drop">{_inline(h.drop[:1].upper() + h.drop[1:])}.</p>']
    if h.below_k:
        out.append(f'<p class="below-k">{_inline(h.below_k[:1].upper() + h.below_k[1:])}.</p>')
    if h.failing:
        first = h.failing[0].split(":")[0]
        more = f" and {len(h.failing) - 1} more" if len(h.failing) > 1 else ""
        out.append(f"<details class=\"failing\"><summary>fails at {_e(first)}{more}</summary><ul>"
                   + "".join(f"<li>{_inline(f)}</li>" for f in h.failing) + "</ul></details>")
    if h.small:
        out.append(f'<p class="small-sample">⚠ {_inline(h.small)}</p>')
    out += [f'<p class="caveat">⚠ {_inline(c)}</p>' for c in h.caveats]
    if h.attestation:
        out.append(f'<p class="att">attestation: <span class="state {_e(_state_class(h.attestation))}">'
                   f'{_e(h.attestation)}</span> <a href="#attestation">detail</a></p>')
    return "\n".join(out) + "</article>"


TERMS = (
    ("Dense", "ordinary attention: the model reads every earlier token. The control."),
    ("Index keys", "a sparse-attention model (DeepSeek's DSA) keeps, beside its attention cache, one small "
     "key per token for a light <em>indexer</em>. For each new token the indexer scores every earlier token "
     "with these keys, and the model attends only to the best-scoring ones."),
    ("Top-k", "how many earlier tokens the model attends to (<code>index_topk</code>). A needle whose score "
     "falls below the k-th best token is invisible to the model. A prompt no longer than k keeps every token, "
     "so only lengths above k test the indexer."),
    ("Precision", "how the index keys are stored (<code>index_dtype</code>): <code>bf16</code> (16-bit) or "
     "<code>fp8</code> (8-bit, half the memory). Coarser keys shift the scores a little, so a needle near "
     "the cut can drop out. <em>Fidelity</em> measures this alone: the share of the chosen top-k that exact "
     "fp32 keys would also choose (1 = the same tokens)."),
    ("Recall", "the share of answered trials whose answer holds the hidden value. A trial with no answer "
     "(an error) is an outage, never a miss."),
)


def terms_section() -> str:
    return '<dl class="terms">' + "".join(f"<dt>{t}</dt><dd>{d}</dd>" for t, d in TERMS) + "</dl>"


def headline_section(headline: dict, problems: list[tuple[str, str]]) -> str:
    warn = ""
    if problems:
        warn = ('<div class="problems"><strong>This run folder has problems</strong> (compare and gate refuse it; '
                "the tables use its sound trials):<ul>"
                + "".join(f"<li>{_e(k)}: {_inline(v)}</li>" for k, v in problems) + "</ul></div>")
    cards = '<div class="cards">' + "".join(headline_card(h) for h in headline.get("items") or []) + "</div>"
    notes = "".join(f'<p class="note">note: {_inline(n)}</p>' for n in headline.get("notes") or [])
    return warn + cards + f'<p class="note rule">{_inline(headline.get("rule", ""))}</p>' + notes


def _power_note(row, needed: int | None) -> str:
    """A word about power under a comparison that found nothing on few pairs."""
    if row is None or needed is None or row.significant or min(row.n_a, row.n_b) >= needed:
        return ""
    return (f'<p class="small-sample">⚠ No significant difference on {min(row.n_a, row.n_b)} trial(s) a side: too '
            f"few to tell. Seeing a 10-point drop from 95% needs about {needed} per side; "
            "<code>niah plan</code> says how many for your case.</p>")


def comparison_section(diffs: list[dict], figures: dict[str, Path], needed: int | None = None) -> str:
    out = ['<p class="note">Every pair of configurations that differ in one axis, and every sparse one '
           "against a dense control. <strong>Answers</strong>: McNemar's exact test on the discordant pairs of "
           "trials that saw the same prompt (losses: A right and B wrong). <strong>Needle rank</strong> (where the "
           "indexer probe ran): Wilcoxon's signed-rank test on log2(rank_B / rank_A) over the same pairs.</p>"]
    for d in diffs:
        out.append(f"<h3><code>{_e(d['b'])}</code> − <code>{_e(d['a'])}</code> <span class=\"muted\">"
                   f"({_e(d['label'])})</span></h3>")
        out.append(figure(figures.get(f"diff:{d['a']}:{d['b']}"), alt=f"{d['b']} minus {d['a']}", cls="pair"))
        basis = {"prompt": "paired by prompt hash", "seed": "paired by (length, depth, trial, seed)",
                 None: "nothing pairs: unpaired two-proportion comparison (Newcombe interval, z-test p)"}
        out.append(f'<p class="note">Answers, {basis[d["method"]]}:</p>')
        out.append(markdown_block(rows_markdown(d["rows"], f"A: {d['a']}", f"B: {d['b']}")))
        out.append(_power_note(next((r for r in d["rows"] if r.group == ALL), None), needed))
        if any(r.n for r in d.get("ranks") or []):
            out.append('<p class="note">Needle rank / k, paired (r &gt; 0: B deeper):</p>')
            out.append(markdown_block(rank_markdown(d["ranks"], f"A: {d['a']}", f"B: {d['b']}")))
    return "\n".join(out)


# -- the trial table ----------------------------------------------------------------------
def _num(x: Any, fmt: str) -> str:
    return "—" if not isinstance(x, (int, float)) or x != x else format(x, fmt)


def trial_rows(records: list[dict], order: list[str]) -> str:
    """One <tr> per trial; data-config / data-length / data-outcome drive the filter."""
    rank = {n: i for i, n in enumerate(order)}
    recs = sorted(records, key=lambda r: (rank.get(r["config"], len(rank)), r["config"], bool(r.get("control")),
                                          r.get("length") or 0, r.get("depth") or 0, r.get("trial") or 0))
    out = []
    for r in recs:
        outcome = str(r.get("outcome"))
        want = r.get("expected") if isinstance(r.get("expected"), list) else [r.get("needle")]
        expected = "(no needle: control)" if r.get("control") else ", ".join(str(v) for v in want if v is not None)
        if outcome == "error":
            answer, cls = f"error: {r.get('error') or '(no message)'}", "answer muted"
        else:
            answer, cls = r.get("answer") or "", "answer"
        if len(answer) > ANSWER_CHARS:
            answer = answer[:ANSWER_CHARS] + f" … ({len(answer) - ANSWER_CHARS:,} more characters)"
        idx = r.get("indexer") if isinstance(r.get("indexer"), dict) else {}
        rk = idx.get("rank_worst") if idx.get("selection_active") else None
        num = '<td class="num">'
        cells = [f"<td><code>{_e(r['config'])}</code></td>", num + _num(r.get("length"), ",") + "</td>",
                 num + _num(r.get("depth"), "g") + "%</td>", num + _e(r.get("trial")) + "</td>",
                 f'<td class="o o-{_e(outcome)}">{_e(outcome)}</td>', f"<td><code>{_e(expected)}</code></td>",
                 f'<td class="{cls}">{_e(answer)}</td>', num + _num(r.get("latency_s"), ".3f") + "</td>",
                 num + _num(rk, ".3g") + "</td>"]
        out.append(f'<tr data-config="{_e(r["config"])}" data-length="{_e(r.get("length"))}" '
                   f'data-outcome="{_e(outcome)}">' + "".join(cells) + "</tr>")
    return "\n".join(out)


def _options(values: list[Any], label=str) -> str:
    return '<option value="">all</option>' + "".join(
        f'<option value="{_e(v)}">{_e(label(v))}</option>' for v in values)


# -- the page -----------------------------------------------------------------------------
def _resource(name: str) -> str:
    return files("niah.report").joinpath(name).read_text(encoding="utf-8")


def _csp(style: str, script: str) -> str:
    def h(s: str) -> str:
        return "'sha256-" + base64.b64encode(hashlib.sha256(s.encode("utf-8")).digest()).decode() + "'"

    return (f"default-src 'none'; img-src data:; style-src {h(style)}; script-src {h(script)}; "
            "form-action 'none'; base-uri 'none'")


def build_page(run_name: str, manifest: dict, records: list[dict], infos: dict,
               figures: dict[str, Path], diffs: list[dict], blocks: dict[str, str | None],
               headline: dict | None = None) -> str:
    """The page's HTML. figures: key -> file ("recall_vs_length", "grid", "heatmap:<config>",
    "diff:<A>:<B>", "indexer"); blocks: Markdown from summary.py ("meta", "problems",
    "recall", "indexer", "taxonomy", "control"); headline: {"items": [Headline], "notes",
    "rule", "needed"} (niah/report/headline.py)."""
    names = list(infos)
    headline = headline or {}
    records = [{**r, "config": str(r.get("config") or "default")} for r in records]  # as trials_frame names them
    secs = [_section("headline", "What this run found", headline_section(headline, blocks.get("problems") or [])),
            _section("terms", "What the words mean", terms_section()),
            _section("recall", "Recall by configuration and length",
                     figure(figures.get("recall_vs_length"), "Recall with 95% Wilson intervals; error trials "
                            "are outages, never misses.", "recall vs length") + markdown_block(blocks.get("recall")))]
    heat = figure(figures.get("grid"), "All configurations on one colour scale.", "grid")
    heat += '<div class="gallery">' + "".join(
        figure(figures.get(f"heatmap:{n}"), f"`{n}`", f"heatmap {n}") for n in names) + "</div>"
    secs.append(_section("heatmaps", "Heatmaps: recall per (length, depth)", heat))
    if diffs:
        secs.append(_section("comparisons", "Paired comparisons",
                             comparison_section(diffs, figures, headline.get("needed"))))
    if figures.get("indexer") or blocks.get("indexer"):
        panels = figure(figures.get("indexer"), "Left: the needle's rank / k (above 1: cut). Middle: fidelity on a "
                        "fixed 0-1 scale. Right: per layer.", alt="indexer panels", cls="wide")
        panels += markdown_block(blocks.get("indexer"))
        secs.append(_section("indexer", "The indexer: where the needle ranks against k", panels))
    control = blocks.get("control")
    secs.append(_section("outcomes", "Outcomes", markdown_block(blocks.get("taxonomy"))
                         + ("<h3>No-needle control</h3>" + markdown_block(control) if control else "")))
    secs.append(_section("attestation", "Attestation: what each server ran", attestation_section(manifest, names)))
    meta = "".join(f"<dt>{_e(k)}</dt><dd>{_inline(v)}</dd>" for k, v in (blocks.get("meta") or []))
    secs.append(_section("details", "Run details", f'<dl class="meta">{meta}</dl>'))
    nav = "".join(f'<a href="#{sid}">{_e(title.split(":")[0])}</a>' for sid, title, _ in secs)
    nav += '<a href="#trials">Trials</a>'
    present = lambda key: sorted({r.get(key) for r in records if r.get(key) is not None}, key=str)  # noqa: E731
    configs = [n for n in names if any(r.get("config") == n for r in records)]
    configs += [c for c in present("config") if c not in configs]
    outcomes = sorted(present("outcome"), key=lambda o: (o != "correct", o))
    style, script = _resource("page.css"), _resource("page.js")
    return Template(_resource("page.html")).substitute(
        csp=_csp(style, script), version=_e(__version__), title=_e(run_name), style=style, script=script,
        nav=nav, sections="\n".join(s for _, _, s in secs),
        config_options=_options(configs), length_options=_options(sorted(present("length")), "{:,}".format),
        outcome_options=_options(outcomes), trial_rows=trial_rows(records, names))


def write_page(path: Path, *args, **kwargs) -> Path:
    """build_page(...) into `path` (UTF-8); returns the path."""
    return write_output(path, build_page(*args, **kwargs))
