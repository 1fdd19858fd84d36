"""The review page in headless Chromium, driven by the keyboard alone (issue 53).

The graded folder of tests/test_review.py is served on the loopback; the page is opened from the
address the command prints, the first held item is reached with Tab and Enter, the cell its
reason names is on screen and marked, and a decision is typed and sent with the keyboard. The
page then shows the next item, and overrides.csv holds the row. Screenshot:
artifacts/screenshots/review.png (the copy in docs/images/ is what docs/instructors.md shows).

Needs Debian's Chromium and Playwright's Python package; skips without them unless
MLEXP_REQUIRE_BROWSER=1.
"""
import csv

import pytest

from test_browser import CHROMIUM, CHROMIUM_FLAGS, SCREENSHOTS, _require_browser
from test_review import LESSON, NEW, graded_folder, serve_in_thread

pytestmark = pytest.mark.slow


def test_an_instructor_decides_a_held_submission_with_the_keyboard(tmp_path):
    _require_browser()
    from playwright.sync_api import sync_playwright
    out = graded_folder(tmp_path)
    url, _ = serve_in_thread(out)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.goto(url)
            assert page.locator("h1").inner_text() == "To decide: 3 of 3"
            for _ in range(40):                          # Tab to the first student's link
                page.keyboard.press("Tab")
                if page.evaluate("document.activeElement.textContent") == "bo_2":
                    break
            page.keyboard.press("Enter")
            page.wait_for_url("**/item?*")
            marked = page.locator(".cell.named")
            assert marked.count() == 1 and marked.locator(".label").inner_text() == "In [2]"
            assert marked.is_visible()
            comment = page.locator("form").first.locator("input[name=comment]")
            comment.focus()                              # the keep form's comment: typed, then Enter
            page.keyboard.type("checked by hand")
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "review.png"), full_page=True)
            page.keyboard.press("Enter")
            page.wait_for_url("**/item?student=cy_3*")
            assert "timed out" in page.locator(".reason").inner_text()
            page.keyboard.press("Escape")
            page.locator("body").focus()
            page.keyboard.press("j")                     # the next item still to decide
            page.wait_for_url("**/item?student=dee_4*")
            assert "rejected" in page.locator(".reason").inner_text()
            page.keyboard.press("q")                     # the queue
            page.wait_for_url(lambda url: "/item" not in url)
            assert page.locator("h1").inner_text() == "To decide: 2 of 2"
        finally:
            browser.close()
    rows = list(csv.reader((out / "overrides.csv").open()))
    assert rows[1] == ["bo_2", LESSON, "", "keep", "checked by hand", "prof", NEW]
