"""The course as a book (`python -m autograder book`): pages, offline, and no answers.

Two lessons are built at the grader's token size (NBGRADER_EXECUTION=validate) into a temporary
folder, through the CLI. The site must hold each lesson page with every exercise and its visible
test, no solution line or hidden test (scan of the files and of the pages' text), no script or
stylesheet from the network, maths as MathML, and Download/Colab links to the student edition.
Without Sphinx and myst-nb (the grader's book extra) the tests skip, unless MLEXP_REQUIRE_BOOK=1.
The browser test opens the landing page and both lessons from file:// in headless Chromium with
every other request refused, and saves artifacts/screenshots/book_*.png.
"""
import importlib.util
import json
import os
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from test_browser import CHROMIUM, CHROMIUM_FLAGS, SCREENSHOTS, _require_browser

REPO = Path(__file__).resolve().parent.parent
LESSONS_BUILT = ["01_running_sum", "03_gates_and_delta_rule"]
TEST_REPO = "test-owner/test-course"

_missing = [m for m in ("sphinx", "myst_nb", "sphinx_book_theme", "jupyter_cache")
            if importlib.util.find_spec(m) is None]
if _missing and os.environ.get("MLEXP_REQUIRE_BOOK") == "1":
    raise RuntimeError(f"MLEXP_REQUIRE_BOOK=1 but {', '.join(_missing)} missing: "
                       "pip install -e './autograder[book]'")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(_missing), reason=f"the book extra is not installed "
                                 f"({', '.join(_missing)} missing): pip install -e './autograder[book]'")]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from autograder.cli import main
    tmp = tmp_path_factory.mktemp("book")
    out = tmp / "site"
    assert main(["--course", str(REPO), "book", str(out), "--size", "grading", "--repo", TEST_REPO,
                 "--cache", str(tmp / "cache"), "--lessons", *LESSONS_BUILT]) == 0
    return out


def _text(page: Path) -> str:
    from autograder.publishing.book import _Text
    parser = _Text()
    parser.feed(page.read_text(encoding="utf-8"))
    return "".join(parser.parts)


def _graded(lesson: str):
    nb = nbformat.read(REPO / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)
    return [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")
            or c.metadata.get("nbgrader", {}).get("solution")]


@pytest.mark.parametrize("lesson", LESSONS_BUILT)
def test_lesson_page_shows_each_exercise_and_its_visible_test(site, lesson):
    page = site / "lessons" / f"{lesson}.html"
    assert page.is_file(), sorted(p.name for p in (site / "lessons").iterdir())
    text = _text(page)
    for cell in _graded(lesson):
        meta = cell.metadata["nbgrader"]
        if meta.get("solution"):
            assert f"Exercise: {meta['grade_id']}" in text
        if meta.get("grade"):   # the visible test, line by line as the student's notebook has it
            for line in cell.source.splitlines():
                if line.strip() and "### BEGIN HIDDEN" not in line:
                    assert line.strip() in text, (meta["grade_id"], line)
    assert "Download notebook" in text and "Open in Colab" in text
    assert "(graded" in text or "Your turn" in text


def test_site_holds_no_answer(site):
    from autograder.publishing.book import html_text_scan
    from autograder.publishing.publish import scan
    assert html_text_scan(site, REPO) == []
    notebooks = sorted(site.rglob("*.ipynb"))
    assert [p.relative_to(site).as_posix() for p in notebooks] == \
        [f"lessons/{lesson}/{lesson}.ipynb" for lesson in LESSONS_BUILT]
    for nb in notebooks:
        assert scan(nb, REPO) == []


def test_scan_of_the_pages_finds_a_planted_solution_line(site, tmp_path):
    """The check above can fail: a solution line highlighted into spans is still found."""
    from autograder.publishing.book import html_text_scan
    from autograder.publishing.publish import secret_lines
    line = next(s for s, where in secret_lines(REPO).items() if "01_running_sum" in where
                and "solution" in where and "=" in s)
    spans = "".join(f'<span class="n">{tok}</span>' for tok in re.split(r"(\s+)", line))
    copy = tmp_path / "site"
    shutil.copytree(site, copy)
    page = copy / "lessons" / "01_running_sum.html"
    page.write_text(page.read_text(encoding="utf-8").replace(
        "</body>", f'<div class="highlight"><pre>{spans}\n</pre></div></body>'), encoding="utf-8")
    found = html_text_scan(copy, REPO)
    assert len(found) == 1 and "lessons/01_running_sum.html" in found[0] and "solution" in found[0]


def test_pages_load_nothing_from_the_network(site):
    remote = re.compile(r"<(script|link)\b[^>]*\b(src|href)=[\"']?(https?:)?//", re.I)
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 4      # index, api, the lessons, search
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert not remote.search(html), (page.name, remote.search(html).group(0))
        assert not re.search(r"<script[^>]*mathjax", html, re.I), page.name
    assert (site / "search.html").is_file() and (site / "searchindex.js").is_file()
    assert "delta" in (site / "searchindex.js").read_text(encoding="utf-8")


def test_maths_is_typeset_as_mathml(site):
    """Every $...$ and $$...$$ of the lesson's text is a <math> element of its page."""
    for lesson in LESSONS_BUILT:
        nb = nbformat.read(REPO / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)
        text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        formulas = re.findall(r"\$\$.+?\$\$|\$[^$\n]+\$", text, re.S)
        html = (site / "lessons" / f"{lesson}.html").read_text(encoding="utf-8")
        assert formulas and html.count("<math") >= len(formulas), (lesson, len(formulas))
        assert "math-tex" not in html, "a formula latex2mathml could not convert"


def test_links_point_at_the_student_edition(site):
    from autograder.course import BRANCH
    from autograder.publishing.publish import _files
    edition = _files(REPO, TEST_REPO, with_solutions=False)
    for lesson in LESSONS_BUILT:
        rel = f"lessons/{lesson}/{lesson}.ipynb"
        html = (site / "lessons" / f"{lesson}.html").read_text(encoding="utf-8")
        assert f'href="{lesson}/{lesson}.ipynb"' in html
        assert (site / rel).read_bytes() == edition[rel]
        assert f'href="https://colab.research.google.com/github/{TEST_REPO}/blob/{BRANCH}/{rel}"' in html


def test_landing_and_api_pages(site):
    index = _text(site / "index.html")
    for lesson in LESSONS_BUILT:
        assert lesson[:2] in index
    assert "How to run the lessons" in index and "Colab" in index
    api = _text(site / "api.html")
    for name in ("linear_attention", "gated_delta_rule", "GatedDeltaNet"):
        assert name in api, name
    marker = json.loads((site / ".course-book.json").read_text())
    assert marker["size"] == "grading" and marker["lessons"] == LESSONS_BUILT


def test_the_guides_are_pages(site):
    """docs/*.md as pages of the book (issue 42): listed on the landing page, links between guides
    kept, the README's lesson table read as the landing page's, no link to a file the book lacks."""
    from autograder.publishing.book import GUIDES
    index = (site / "index.html").read_text(encoding="utf-8")
    assert "The guides" in _text(site / "index.html")
    for name in GUIDES:
        assert f'href="guides/{name}.html"' in index, name
        assert (site / "guides" / f"{name}.html").is_file(), name
    assert "For instructors" in _text(site / "guides" / "instructors.html")
    students = (site / "guides" / "students.html").read_text(encoding="utf-8")
    assert 'href="../index.html#the-lessons"' in students and 'href="troubleshooting.html"' in students
    for name in GUIDES:
        assert "README.md" not in re.findall(r'href="([^"]*)"', (site / "guides" / f"{name}.html").read_text())


def test_book_in_a_browser_with_the_network_blocked(site):
    """Maths typeset, figures loaded, download links found and search answering "delta rule",
    from file:// with every other request refused."""
    _require_browser()
    from urllib.parse import unquote, urlparse
    from playwright.sync_api import sync_playwright
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    refused = []

    def refuse(route):
        refused.append(route.request.url)
        route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(offline=True, viewport={"width": 1280, "height": 1000})
            context.route(lambda url: not url.startswith("file:"), refuse)
            page = context.new_page()
            page.goto((site / "index.html").as_uri(), wait_until="load")
            assert "How to run the lessons" in page.inner_text("main")
            page.screenshot(path=str(SCREENSHOTS / "book_index.png"))
            for lesson in LESSONS_BUILT:
                page.goto((site / "lessons" / f"{lesson}.html").as_uri(), wait_until="load")
                maths = page.evaluate("""() => [...document.querySelectorAll('math')].map(m => [
                    m instanceof MathMLElement, m.getBoundingClientRect().width,
                    m.getBoundingClientRect().height])""")
                assert maths and all(ok and w > 5 and h > 5 for ok, w, h in maths), (lesson, maths)
                images = page.evaluate("() => [...document.querySelectorAll('main img')]"
                                       ".map(i => i.complete && i.naturalWidth > 0)")
                assert all(images), (lesson, images)
                href = page.get_attribute("a[download]", "href")
                target = page.evaluate("h => new URL(h, document.baseURI).href", href)
                assert Path(unquote(urlparse(target).path)).is_file(), target
                page.screenshot(path=str(SCREENSHOTS / f"book_{lesson}.png"))
            figures = sum(1 for p in (site / "_images").iterdir())
            assert figures >= 1
            page.goto((site / "search.html").as_uri() + "?q=delta+rule", wait_until="load")
            page.wait_for_selector("ul.search li a", timeout=120_000)   # the index loads by script: slow on a busy machine
            found = page.eval_on_selector_all("ul.search li a", "as => as.map(a => a.href)")
            assert any("03_gates_and_delta_rule" in h for h in found), found
            page.screenshot(path=str(SCREENSHOTS / "book_search.png"))
        finally:
            browser.close()
    assert refused == []


def test_self_study_edition_folds_the_worked_solutions(site, tmp_path):
    """--with-solutions adds each worked solution (found by the default edition's scan, so that
    scan would catch one), never a hidden test; the lessons come from the cache."""
    from autograder.publishing.book import html_text_scan
    from autograder.cli import main
    out = tmp_path / "self-study"
    assert main(["--course", str(REPO), "book", str(out), "--size", "grading", "--repo", TEST_REPO,
                 "--cache", str(site.parent / "cache"), "--lessons", LESSONS_BUILT[0],
                 "--with-solutions"]) == 0
    found = html_text_scan(out, REPO)
    assert found and all("solution cell" in f and "01_running_sum" in f for f in found), found
    assert html_text_scan(out, REPO, solutions_allowed=True) == []
    html = (out / "lessons" / f"{LESSONS_BUILT[0]}.html").read_text(encoding="utf-8")
    assert html.count("tag_worked-solution") == len(
        [c for c in _graded(LESSONS_BUILT[0]) if c.metadata["nbgrader"].get("solution")])


def test_a_lesson_that_raises_stops_the_build_naming_the_cell(tmp_path):
    from autograder.publishing.book import BookError, _execute
    lesson = "04_hybrid_kv_cache"
    nb = nbformat.read(REPO / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)
    nb.cells = nb.cells[:3] + [nbformat.v4.new_code_cell("# the broken cell\nraise ValueError('planted failure')")]
    (tmp_path / "solutions" / lesson).mkdir(parents=True)
    nbformat.write(nb, tmp_path / "solutions" / lesson / f"{lesson}.ipynb")
    with pytest.raises(BookError, match="planted failure") as err:
        _execute(tmp_path, [lesson], tmp_path / "cache", "grading", print)
    assert "cell 4 of the notebook raised" in str(err.value) and "# the broken cell" in str(err.value)
    assert lesson in str(err.value) and "\x1b[" not in str(err.value)
