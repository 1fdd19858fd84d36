"""A feedback page opened in headless Chromium with the network off: math typeset, figure shown.

The toy lesson gets a markdown cell of math (inline, display and an environment) and a cell that
draws a matplotlib figure; one student is graded and their feedback page is opened from the file
system in an offline browser context, as a student opens an LMS attachment. The math must be
MathML that Chromium lays out (a MathMLElement with a size), no TeX or ``$`` may be left in the
text, the figure must load from the page itself, and no request may leave the page (every one is
recorded; only the page's own file:// and data: URLs are allowed).

Needs Debian's Chromium and Playwright's Python package; skips without them unless
MLEXP_REQUIRE_BROWSER=1.
"""
import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell

from autograder.publishing.build import build
from autograder.publishing.demo import student_notebook
from autograder.grading.grade import grade_class
from autograder.options import GradingOptions
from test_browser import CHROMIUM, CHROMIUM_FLAGS, SCREENSHOTS, _require_browser
from toy_course import ADD_SOLUTION, ASSIGNMENT, MUL_SOLUTION, NOTEBOOK, make_toy_course

pytestmark = pytest.mark.slow

MATH = ("The state.\n"
        "Each step adds $k_t v_t^\\top$ to the state, so $S_t = \\sum_{i \\le t} k_i v_i^\\top$ and\n"
        "$$o_t = \\frac{q_t^\\top S_t}{\\sqrt{d}}$$\n"
        "\\begin{align}\nS_t &= S_{t-1} + k_t v_t^\\top\n\\end{align}")
FIGURE = ("import io\nimport matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
          "from IPython.display import Image, display\n"
          "fig, ax = plt.subplots(figsize=(2, 1.5))\nax.plot([0, 1, 4])\nbuf = io.BytesIO()\n"
          "fig.savefig(buf, format='png')\ndisplay(Image(buf.getvalue()))")


@pytest.fixture(scope="module")
def feedback_page(tmp_path_factory):
    _require_browser()
    tmp = tmp_path_factory.mktemp("offline")
    root = make_toy_course(tmp / "course")
    path = root / "solutions" / ASSIGNMENT / NOTEBOOK
    nb = nbformat.read(path, as_version=4)
    nb.cells[1:1] = [new_markdown_cell(MATH), new_code_cell(FIGURE)]
    nbformat.write(nb, path)
    build(root)
    lesson = nbformat.read(root / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    dest = tmp / "class" / "ann" / ASSIGNMENT / NOTEBOOK
    dest.parent.mkdir(parents=True)
    nbformat.write(student_notebook(lesson, {"add": ADD_SOLUTION, "mul": MUL_SOLUTION}), dest)
    [res] = grade_class(root, tmp / "class", tmp / "out", GradingOptions(cell_timeout=60),
                        progress=False)
    assert res.feedback, res
    return tmp / "out" / "feedback" / "ann" / ASSIGNMENT / "toy.html"


def test_feedback_math_and_figure_need_no_network(feedback_page):
    from playwright.sync_api import sync_playwright
    html = feedback_page.read_text()
    assert "<script" not in html.lower(), "the page runs no script (no MathJax)"
    requests = []
    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
    try:
        context = browser.new_context(offline=True, viewport={"width": 1100, "height": 900})
        context.on("request", lambda r: requests.append(r.url))
        page = context.new_page()
        page.goto(feedback_page.as_uri(), wait_until="load")
        maths = page.evaluate("""() => [...document.querySelectorAll('math')].map(m => ({
            mathml: m instanceof MathMLElement, w: m.getBoundingClientRect().width,
            h: m.getBoundingClientRect().height, display: m.getAttribute('display')}))""")
        assert len(maths) >= 4, maths   # two inline, one display, one align environment
        assert all(m["mathml"] and m["w"] > 5 and m["h"] > 5 for m in maths), maths
        assert {"inline", "block"} <= {m["display"] for m in maths}
        prose = " ".join(page.locator(".text_cell_render").all_inner_texts())
        assert "The state." in prose
        for tex in ("$", "\\frac", "\\sum", "\\begin", "v_t^"):
            assert tex not in prose, f"raw TeX {tex!r} left in the page's text"
        images = page.evaluate("() => [...document.images].map(i => [i.src.slice(0, 22), "
                               "i.complete && i.naturalWidth > 0])")
        assert images and all(src.startswith("data:image/png") and ok for src, ok in images), images
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "feedback_offline.png"), full_page=True)
    finally:
        browser.close()
        pw.stop()
    left = [u for u in requests if not u.startswith(("file://", "data:"))]
    assert requests and not left, f"requests left the page: {left}"
