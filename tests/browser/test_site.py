"""The course website in a real browser: `make site-test` (after `make site`).

Serves build/site on 127.0.0.1 and visits every page once in headless Chromium (Debian's, see
``chromium.py``): the right title, every image decoded, no traceback the lesson did not mean to
show, a quiet console, nothing loaded from outside the site, no internal link that 404s, and a
search that finds ``all_reduce``. Screenshots for review go to build/site-screenshots/.

    make site && make site-test
    .venv/bin/python -m pytest -v tests/browser/test_site.py

The traceback rule: a stored traceback (an error output, or "Traceback (most recent call last)"
in an output) may appear only
- in a cell tagged ``raises-exception``: the cell fails on purpose (03's notebook-defined worker);
- in a cell tagged ``nbval-ignore-output`` (torch's own text, stored verbatim) that shows an error
  the course raises on purpose, listed in DELIBERATE with the line that says so (16: torchrun's
  @record report of ``elastic --raise-on-rank 1``).
Caught errors shown as one line by ``nbtools.show_error`` ("RuntimeError: says ...") are
summaries, not tracebacks, and are fine anywhere.
"""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import chromium
import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "build" / "site"
SCREENSHOTS = ROOT / "build" / "site-screenshots"
LESSONS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PAGES = (["index.html"] + [f"lessons/{name}.html" for name in LESSONS] + ["exercises.html", "benchmarks.html"]
         + sorted(f"api/{p.name}" for p in (SITE / "api").glob("*.html")))
TRACEBACK = "Traceback (most recent call last)"
# page -> the line of a traceback that a lesson shows on purpose in an nbval-ignore-output cell
DELIBERATE = {"lessons/16_cluster.html": "DeliberateError: rank 1 raises on purpose"}

if chromium.missing():  # make site-test asked for the browser: say what is missing, never skip quietly
    pytest.fail(chromium.missing(), pytrace=False)
if not (SITE / "index.html").exists():
    pytest.fail("build/site is not built: run `make site` first", pytrace=False)

# Runs in the page: waits for MathJax, the fonts and every image, then reports what the tests check.
PAGE_FACTS = r"""
const done = arguments[arguments.length - 1];
const imgs = Array.from(document.images);
imgs.forEach(img => { img.loading = "eager"; });
// MathJax typesets (and loads its web fonts) after the page's load event: wait for it, so what
// it logs to the console is collected with this page, every time, not only when a race shows it.
const mathDone = new Promise(resolve =>
  (window.MathJax && MathJax.Hub) ? MathJax.Hub.Queue(resolve) : resolve());
mathDone.then(() => document.fonts.ready)
  .then(() => Promise.all(imgs.map(img => img.decode().catch(() => null)))).then(() => {
  const outputs = Array.from(document.querySelectorAll("div.cell_output, div.output"));
  const tracebacks = outputs
    .filter(o => o.matches("div.output.traceback") || o.textContent.includes(arguments[0]))
    .map(o => { const cell = o.closest("div.cell");
                return {raises: !!(cell && cell.classList.contains("tag_raises-exception")),
                        ignored: !!(cell && cell.classList.contains("tag_nbval-ignore-output")),
                        text: o.textContent}; });
  const external = performance.getEntriesByType("resource").map(e => e.name)
    .concat(Array.from(document.querySelectorAll("script[src], link[href], img[src], iframe[src]"))
            .filter(e => !(e.tagName === "LINK" && ["index", "search", "next", "prev"].includes(e.rel)))
            .map(e => e.src || e.href))
    .filter(u => !u.startsWith(location.origin) && !u.startsWith("data:"));
  done({
    title: document.title,
    h1: (document.querySelector("article h1, main h1") || {textContent: ""}).textContent,
    images: imgs.map(i => ({src: i.getAttribute("src"), width: i.naturalWidth, title: i.closest("div.cell") ? "cell" : ""})),
    tracebacks: tracebacks,
    rawAnsi: outputs.filter(o => /\x1b\[|\[0;3\dm/.test(o.textContent)).length,
    external: external,
    links: Array.from(document.querySelectorAll("a[href]")).map(a => a.href),
    runBox: (document.querySelector(".course-run") || {textContent: ""}).textContent,
    math: document.querySelectorAll("span.MathJax, div.MathJax_Display").length,
    rawMath: document.body.innerText.includes("\\("),
    // a cell that imports a solution: its source drawn on the page, and a closed "Show code cell content"
    solutions: Array.from(document.querySelectorAll("div.cell"))
      .filter(c => c.textContent.includes("exercises.solutions"))
      .map(c => { const pre = c.querySelector("div.cell_input pre"), details = c.querySelector("details.hide");
                  return {visible: !!pre && pre.checkVisibility(), closed: !!details && !details.open}; }),
    rankLogs: Array.from(document.querySelectorAll("div.cell_output pre"))
      .filter(p => /^\[rank \d+\] /m.test(p.textContent))
      .map(p => ({font: getComputedStyle(p).fontFamily, whiteSpace: getComputedStyle(p).whiteSpace})),
  });
});
"""


def plain_quotes(text: str) -> str:
    """Sphinx's smartquotes prints ``rank's`` as ``rank’s``: compare titles with straight quotes."""
    return text.translate(str.maketrans({"‘": "'", "’": "'", "“": '"', "”": '"'}))


def heading(notebook: Path) -> str:
    """The lesson's title as the browser shows it: its first Markdown heading, markup removed."""
    cells = json.loads(notebook.read_text())["cells"]
    first = next(c for c in cells if c["cell_type"] == "markdown")
    line = next(t for t in "".join(first["source"]).splitlines() if t.startswith("# "))
    return re.sub(r"[`*]", "", line[2:]).strip()


@pytest.fixture(scope="module")
def site():
    """Every page visited once: {page: facts}, plus the console, the server log and the search."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with chromium.serve(SITE) as (base, requests), chromium.browser() as driver:
        driver.set_script_timeout(30)
        facts, console = {}, {}
        for page in PAGES:
            driver.get(f"{base}/{page}")
            facts[page] = driver.execute_async_script(PAGE_FACTS, TRACEBACK)
            console[page] = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            if page == "index.html":
                shot(driver, "landing.png")
            if page == "lessons/05_collectives.html":
                shot(driver, "lesson-04-top.png")
                figure = driver.find_elements("css selector", "div.cell_output img")[0]
                driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", figure)
                shot(driver, "lesson-04-figure.png")
        opened = open_a_solution(driver, base)
        search = search_results(driver, base)
        console["search.html"] = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        # links the browser did not visit: fetched once, so that the server log sees them all
        visited = {f"{base}/{p}" for p in PAGES}
        internal = {urldefrag(u)[0] for f in facts.values() for u in f["links"] if u.startswith(base)}
        for url in sorted(internal - visited):
            try:
                urllib.request.urlopen(url, timeout=10).close()
            except urllib.error.HTTPError:
                pass  # the server log records the 404
        yield {"facts": facts, "console": console, "requests": list(requests), "search": search,
               "internal": internal, "opened": opened}


def shot(driver, name: str) -> None:
    path = SCREENSHOTS / name
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")


def open_a_solution(driver, base: str) -> bool:
    """Lesson 02's first solution, opened as a reader does: is its source drawn then?"""
    driver.get(f"{base}/lessons/02_process_groups.html")
    cell = next(c for c in driver.find_elements("css selector", "div.cell") if "exercises.solutions" in
                c.get_attribute("textContent"))
    cell.find_element("css selector", "details.hide > summary").click()
    return driver.execute_script("return arguments[0].querySelector('div.cell_input pre').checkVisibility();", cell)


def search_results(driver, base: str) -> list[str]:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{base}/search.html?q=all_reduce")
    WebDriverWait(driver, 30).until(
        lambda d: d.find_elements("css selector", "#search-results ul.search li")
        or "did not match" in d.find_element("id", "search-results").text)
    return [a.get_attribute("href") for a in driver.find_elements("css selector", "#search-results ul.search li a")]


def test_every_lesson_page_has_its_title_and_run_commands(site):
    assert len(LESSONS) >= 15
    for name in LESSONS:
        facts = site["facts"][f"lessons/{name}.html"]
        title = heading(ROOT / "notebooks" / f"{name}.ipynb")
        assert plain_quotes(facts["title"]).startswith(title + " \u2014 "), (name, facts["title"], title)
        assert plain_quotes(facts["h1"]).strip().rstrip("#").strip() == title, (name, facts["h1"])
        assert f"jupyter lab notebooks/{name}.ipynb" in facts["runBox"], name
        assert re.search(r"(torchrun --master-addr=127\.0\.0\.1 --master-port=29500 --nproc-per-node=\d|python) -m ddp_tutorial", facts["runBox"]), name


def test_every_image_is_decoded(site):
    figures = 0
    for page, facts in site["facts"].items():
        broken = [i["src"] for i in facts["images"] if i["width"] == 0]
        assert not broken, f"{page}: images that did not load: {broken}"
        figures += sum(1 for i in facts["images"] if i["title"] == "cell")
    assert figures >= 20, f"only {figures} figures in the lessons' outputs"


def test_tracebacks_only_where_the_lesson_means_them(site):
    raised, shown = 0, set()
    for page, facts in site["facts"].items():
        for t in facts["tracebacks"]:
            if t["raises"]:
                raised += 1
            elif t["ignored"] and page in DELIBERATE and DELIBERATE[page] in t["text"]:
                shown.add(page)
            else:
                pytest.fail(f"{page}: a traceback the lesson does not mean to show (see DELIBERATE): "
                            f"{t['text'][:600]}")
        assert facts["rawAnsi"] == 0, f"{page}: raw ANSI escape codes in an output"
    assert raised >= 1, "03's deliberate failure is not shown: is the detector looking at the outputs?"
    assert shown == {p for p in DELIBERATE if p in site["facts"]}, "a DELIBERATE traceback is gone: update the list"


def test_rank_logs_are_monospace(site):
    logs = [log for facts in site["facts"].values() for log in facts["rankLogs"]]
    assert len(site["facts"]["lessons/00_start_here.html"]["rankLogs"]) >= 2, "00 shows [rank N] logs"
    for log in logs:
        assert "mono" in log["font"].lower(), log
        assert log["whiteSpace"].startswith("pre"), log  # one log line per line


def test_console_has_no_severe_entries(site):
    noisy = {page: [e["message"] for e in entries] for page, entries in site["console"].items() if entries}
    assert not noisy, noisy


def test_nothing_loads_from_outside_the_site(site):
    outside = {page: f["external"] for page, f in site["facts"].items() if f["external"]}
    assert not outside, outside


def test_internal_links_resolve(site):
    linked = {urlparse(u).path.lstrip("/") for u in site["internal"]}
    assert set(PAGES) - {"index.html"} <= linked, "a page no other page links to"
    missing = sorted({path for status, path in site["requests"] if status >= 400})
    assert not missing, f"404 and other errors from the server: {missing}"
    assert any(path.startswith("/_static/mathjax/") for _, path in site["requests"]), "MathJax never loaded"


def test_search_finds_all_reduce(site):
    hits = site["search"]
    assert hits, "search.html?q=all_reduce found nothing"
    assert any("lessons/05_collectives.html" in h for h in hits), hits


def test_screenshots_were_saved(site):
    for name in ("landing.png", "lesson-04-top.png", "lesson-04-figure.png"):
        path = SCREENSHOTS / name
        assert path.stat().st_size > 10_000, path


def test_math_is_typeset(site):
    """13 writes its memory formulas in $..$: MathJax (local copy, with its font probe quieted in
    docs/conf.py) turns every one into rendered math, leaving no raw TeX on the page."""
    facts = site["facts"]["lessons/14_sharding.html"]
    assert facts["math"] >= 3, facts["math"]
    assert not facts["rawMath"], "raw \\( ... \\) left on the page: MathJax did not typeset it"


def test_no_solution_is_on_a_page_until_the_reader_opens_it(site):
    """Issue 37: each lesson's solution cells (as many as the notebook has) are closed, their source not drawn."""
    for name in LESSONS:
        cells = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())["cells"]
        expected = sum(c["cell_type"] == "code" and "exercises.solutions" in "".join(c["source"]) for c in cells)
        found = site["facts"][f"lessons/{name}.html"]["solutions"]
        assert len(found) == expected, f"{name}: {len(found)} solution cells on the page, {expected} in the notebook"
        assert all(c["closed"] and not c["visible"] for c in found), f"{name}: a solution is on the page: {found}"
    assert site["opened"], "lesson 02's solution, once opened, should be drawn: the visibility check reads nothing"
