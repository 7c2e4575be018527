"""The report page (RUN/report/index.html) in a real headless browser.

Debian's chromium, driven by selenium through Debian's chromedriver (`make browser` installs
both; no browser is downloaded). The page is copied ALONE into an empty folder and opened by
file://: a page that needed a sibling file (a PNG beside it) or the network would show a
broken image, a console error (its Content-Security-Policy blocks every load but data:
URIs) or a request in the browser's network log, and each of those fails the test. A
loopback HTTP server would prove less: it would serve the siblings too.

Two runs: a real one (embedded servers launched by a matrix, as the demo does: dense and
DSA with fp8 index keys at top-k 64 and 512, so the page has a paired comparison with needle
ranks, the indexer panels, three attestations and no-needle controls; the `indexer_run`
fixture of tests/conftest.py, shared with tests/e2e/test_indexer_sweep.py) and a hand-written one
whose answers are hostile HTML and whose manifest holds a valid, an INVALID and a missing
attestation.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from report_runs import make_run

pytestmark = pytest.mark.slow

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,1000")
HOSTILE = ['<img src=x onerror="document.title=\'pwned\'">',
           "</td></tr></table><script>document.title='pwned'</script>",
           "a & b < c > d \" ' `code` **bold**"]
ROWS = "Array.from(document.querySelectorAll('#trial-rows tr'))"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless chromium (selenium + chromedriver, both from Debian); FAILS when missing."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.fail("the report page test needs Debian's chromium and chromedriver: run `make browser` "
                    "(part of `make test`), or "
                    "`apt-get install -y chromium chromium-driver` (as root)", pytrace=False)
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium  # with both paths given, selenium never fetches a driver or browser
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    d = webdriver.Chrome(service=Service(driver), options=opts)
    yield d
    d.quit()


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "trials.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]


def _open(d, page: Path, tmp_path: Path) -> str:
    """Copy the page alone into an empty folder, open it by file://, wait for every image."""
    from selenium.webdriver.support.ui import WebDriverWait

    alone = tmp_path / "alone" / "index.html"
    alone.parent.mkdir(parents=True)
    shutil.copy(page, alone)
    d.get_log("browser"), d.get_log("performance")  # drop what came before this page
    d.get(alone.as_uri())
    WebDriverWait(d, 60).until(lambda d: d.execute_script(
        "return document.readyState === 'complete' && Array.from(document.images).every(i => i.complete)"))
    return alone.as_uri()


def _check_renders(d, url: str, shot: Path) -> None:
    """Every image decoded, no console message of level SEVERE, no request but the page and
    data: URIs (chrome:// is the browser's own start page), a screenshot that is not blank."""
    from PIL import Image

    sizes = d.execute_script("return Array.from(document.images).map(i => [i.alt, i.naturalWidth])")
    assert sizes and all(w > 0 for _, w in sizes), sizes
    assert [e for e in d.get_log("browser") if e["level"] == "SEVERE"] == []
    sent = [json.loads(e["message"])["message"] for e in d.get_log("performance")]
    urls = [m["params"]["request"]["url"] for m in sent if m["method"] == "Network.requestWillBeSent"]
    assert url in urls
    assert [u for u in urls if u != url and not u.startswith(("data:", "chrome:", "chrome-untrusted:"))] == []
    png = d.get_screenshot_as_png()
    shot.write_bytes(png)
    img = Image.open(io.BytesIO(png)).convert("RGB")
    assert img.size[0] >= 1000 and len(img.getcolors(1 << 24)) > 50  # text, tables, coloured badges, a figure


def _filter(d, **want) -> int:
    """Set the filter's selects (config / length / outcome: value or "" for all) and the text
    box; the number of trial rows left visible."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    for key in ("config", "length", "outcome"):
        Select(d.find_element(By.ID, f"f-{key}")).select_by_value(str(want.get(key, "")))
    box = d.find_element(By.ID, "f-text")
    box.clear()
    if want.get("text"):
        box.send_keys(want["text"])
    shown, total = d.execute_script(f"const rows = {ROWS}; return [rows.filter(r => !r.hidden).length, rows.length]")
    assert d.find_element(By.ID, "shown").text == f"{shown} of {total} trials shown"
    return shown


# -- a real run ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_run(indexer_run):
    from niah.report.render import render_report

    return indexer_run, render_report(indexer_run)


def test_real_run_page_renders_and_filters(browser, real_run, tmp_path):
    run, rep = real_run
    assert rep.page == run / "report" / "index.html"
    url = _open(browser, rep.page, tmp_path)
    _check_renders(browser, url, tmp_path / "page.png")
    alts = browser.execute_script("return Array.from(document.images).map(i => i.alt)")
    assert {"recall vs length", "grid", "heatmap k64", "heatmap k512", "k512 minus k64", "indexer panels"} <= set(alts)

    records = _records(run)
    assert _filter(browser) == len(records)  # every trial, controls included
    for cfg, length in (("k64", 1000), ("k512", 400)):
        want = [r for r in records if r["config"] == cfg and r["length"] == length]
        assert 0 < _filter(browser, config=cfg, length=length) == len(want) < len(records)
        for outcome in {r["outcome"] for r in want}:
            assert _filter(browser, config=cfg, length=length, outcome=outcome) == \
                sum(r["outcome"] == outcome for r in want)
    needle = next(r for r in records if r["config"] == "k64" and not r.get("control"))["needle"]
    assert _filter(browser, text=needle) == sum(needle in f"{r.get('expected')} {r.get('answer')}" for r in records)

    body = browser.find_element("tag name", "body").text
    assert "Paired comparisons" in body and "Wilcoxon p" in body and "McNemar" in body
    states = browser.execute_script(
        "return Array.from(document.querySelectorAll('table.attestation tbody tr')).map(r => r.innerText)")
    # the servers attest
    assert sorted(s.split("\t")[:2] for s in states) == [["dense", "valid"], ["k512", "valid"], ["k64", "valid"]]


# -- hostile answers and every attestation state ----------------------------------------------
def test_hostile_answers_are_text_and_attestation_states(browser, tmp_path):
    from niah.report.render import render_report
    from niah.runs.manifest import read_manifest, write_manifest

    configs = {"a": {"index_dtype": "fp8"}, "b": {"index_dtype": "bf16"}, "c": {"index_dtype": "fp8"}}
    run = make_run(tmp_path / "run", configs, lengths=(1024, 2048), depths=(0.0, 100.0), trials=3)
    lines = _records(run)
    for i, rec in enumerate(lines[:len(HOSTILE)]):
        rec.update(answer=HOSTILE[i], outcome="wrong", correct=False)
    (run / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    from niah.attestation import reading_of

    def calls(n):
        return {"store": {"fp8": {"niah.store_roundtrip": {"eager": n, "captured": 0, "replayed": 0}}}}

    def att(n):  # what the embedded server reports: fp8 keys stored n times
        return {"index_dtype": "fp8", "kernels": "torch", "pool_bytes_per_token": 132,
                "facts": {"attention": "dsa"}, "calls": calls(n)}

    readings = {"segments": [{"start": reading_of({"niah_attestation": att(3)}),
                              "end": reading_of({"niah_attestation": att(40)})}]}
    m = read_manifest(run)
    m["configs"]["a"]["attestation"] = readings   # labelled fp8, ran fp8: valid
    m["configs"]["b"]["attestation"] = readings   # labelled bf16, ran fp8: INVALID
    write_manifest(run, m)                         # c: no attestation, an external label: unattested

    page = render_report(run).page
    _check_renders(browser, _open(browser, page, tmp_path), tmp_path / "page.png")
    assert browser.title.startswith("niah report") and "pwned" not in browser.title
    assert browser.execute_script("return document.querySelectorAll('#trial-rows img, #trial-rows script').length") == 0
    cells = browser.execute_script(f"return {ROWS}.map(r => r.querySelector('td.answer').textContent)")
    assert all(h in cells for h in HOSTILE)  # shown as the text the model wrote
    states = dict(browser.execute_script("return Array.from(document.querySelectorAll('table.attestation tbody tr'))"
                                         ".map(r => [r.cells[0].innerText, r.cells[1].innerText])"))
    assert states == {"a": "valid", "b": "INVALID", "c": "unattested"}
    assert _filter(browser, outcome="wrong") == len(HOSTILE) and _filter(browser, config="b", length=2048) == 6


# -- the page answers first ---------------------------------------------------------------------
def _sections(d) -> list[str]:
    return d.execute_script("return Array.from(document.querySelectorAll('main > section')).map(s => s.id)")


def test_headline_first_above_the_fold_and_readable_at_1400_px(browser, real_run, tmp_path):
    """At 1400 px wide, the first screen (the screenshot) holds every configuration's verdict
    and recall row; the sections come headline, terms, evidence, then attestation detail;
    internal counters appear nowhere above the attestation section; captions and the
    indexer panels' text are readable sizes on screen."""
    from PIL import Image
    from niah.report.indexer_plots import FONT_MIN

    run, rep = real_run
    _open(browser, rep.page, tmp_path)
    ids = _sections(browser)
    assert ids[:3] == ["headline", "terms", "recall"], ids
    assert ids.index("attestation") > ids.index("outcomes") and ids[-2:] == ["details", "trials"]

    shot = tmp_path / "fold.png"
    shot.write_bytes(browser.get_screenshot_as_png())
    width, height = Image.open(shot).size
    vw, vh = browser.execute_script("return [window.innerWidth, window.innerHeight]")
    assert (width, height) == (vw, vh) and width == 1400, (width, height, vw, vh)
    cards = browser.execute_script(
        "return Array.from(document.querySelectorAll('#headline .card')).map(c => [c.dataset.config, "
        "c.querySelector('.verdict').innerText, c.querySelector('table.by-length').getBoundingClientRect().bottom, "
        "c.getBoundingClientRect().right, c.querySelector('.drop').getBoundingClientRect().bottom])")
    assert sorted(c[0] for c in cards) == ["dense", "k512", "k64"]
    for name, verdict, table_bottom, right, drop_bottom in cards:
        assert max(table_bottom, drop_bottom) <= height and right <= width, (name, table_bottom, drop_bottom, height)
    verdicts = {c[0]: c[1] for c in cards}
    assert verdicts["dense"] == "control" and {verdicts["k64"], verdicts["k512"]} <= {"PASS", "REGRESSION", "OUTAGE"}
    text = {s: browser.execute_script(f"return document.getElementById('{s}').innerText") for s in ids}
    assert "against dense control dense" in text["headline"]
    k512 = browser.execute_script("return document.querySelector('#headline .card[data-config=\"k512\"]').innerText")
    assert "400 at or below k = 512" in k512  # a length that keeps every token is named, not passed off
    assert all(w in text["terms"] for w in ("Index keys", "Top-k", "Precision", "fp8", "bf16"))
    above = "".join(text[s] for s in ids[:ids.index("attestation")])
    assert "niah." not in above and "store_roundtrip" not in above  # counters only in the detail

    caption_px = browser.execute_script(
        "return Math.min(...Array.from(document.querySelectorAll('figcaption')).map("
        "f => parseFloat(getComputedStyle(f).fontSize)))")
    assert caption_px >= 13, caption_px
    shown, natural = browser.execute_script(
        "const i = Array.from(document.images).find(i => i.alt === 'indexer panels'); "
        "return [i.getBoundingClientRect().width, i.naturalWidth]")
    smallest_px = FONT_MIN * 130 / 72 * shown / natural  # style.save writes 130 dpi
    assert smallest_px >= 11, (shown, natural, smallest_px)


def test_small_sample_flag_and_baseline_verdicts(browser, tmp_path):
    """--baseline: each configuration's verdict is niah gate's against it; a small sample is
    flagged with the `niah plan` command, and a comparison that finds nothing on few pairs
    says it is too few to tell."""
    from niah.report.render import render_report

    configs = {"dense": {"attention": "dense"}, "sparse": {"index_dtype": "fp8", "index_topk": 512}}
    base = make_run(tmp_path / "base", configs, lengths=(1024, 4096), depths=(0.0, 50.0, 100.0), trials=8)
    lost = make_run(tmp_path / "cand", configs, lengths=(1024, 4096), depths=(0.0, 50.0, 100.0), trials=8,
                    outcome={"dense": lambda *a: "correct",
                             "sparse": lambda c, length, d, t, rng: "wrong" if length == 4096 else "correct"})
    rep = render_report(lost, baseline=base)
    _check_renders(browser, _open(browser, rep.page, tmp_path), tmp_path / "page.png")
    cards = dict(browser.execute_script(
        "return Array.from(document.querySelectorAll('#headline .card')).map(c => [c.dataset.config, c.innerText])"))
    assert "REGRESSION" in cards["sparse"] and f"baseline {base}" in cards["sparse"]
    assert "Drops at 4K: 100% at 1K, 0% at 4K" in cards["sparse"] and "PASS" in cards["dense"]
    assert "small sample: 24 answered trial(s)" in cards["dense"] and "niah plan --recall 0.95" in cards["dense"]
    summary = rep.summary.read_text()
    assert summary.index("## Headline") < summary.index("## Recall by configuration")
    assert "`sparse`: **REGRESSION** against baseline" in summary
    # the baseline run itself: dense and sparse agree on 48 pairs, too few to tell a 10-point drop
    _open(browser, render_report(base).page, tmp_path / "base")
    comparisons = browser.execute_script("return document.getElementById('comparisons').innerText")
    assert "No significant difference on 48 trial(s) a side: too few to tell" in comparisons
