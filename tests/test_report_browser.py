"""The class report and a student's feedback page in headless Chromium (as tests/test_browser.py).

A small class of lesson 01's demo students (all correct, two catalogued mistakes, a blank
notebook, a missing function) is graded through the command line. The report is opened from the
file system, as an instructor opens it: its numbers (students, mean score, each exercise's
passes, each student's score and mistakes) are read from the page and checked against
grades-01_running_sum.csv, and both figures must load. A failed student's feedback page must
show the hint in the first screenful, with the exercise's title and the test code collapsed.
Screenshots: artifacts/screenshots/class_report.png and feedback_hint.png.

Needs Debian's Chromium and Playwright's Python package; skips without them unless
MLEXP_REQUIRE_BROWSER=1.
"""
import csv
import shutil
import statistics
import subprocess
import sys

import pytest

from autograder.grading.grade import BASE_COLUMNS, DEMO_SUBMISSIONS
from test_browser import CHROMIUM, CHROMIUM_FLAGS, REPO, SCREENSHOTS, _require_browser

pytestmark = pytest.mark.slow

LESSON = "01_running_sum"
STUDENTS = ["ada_all_correct", "ben_z_not_updated", "cleo_v_kT", "eve_blank", "finn_raises"]
VIEWPORT = {"width": 1280, "height": 800}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    _require_browser()
    tmp = tmp_path_factory.mktemp("report")
    for s in STUDENTS:
        shutil.copytree(DEMO_SUBMISSIONS / s / LESSON, tmp / "class" / s / LESSON)
    out = tmp / "out"
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(tmp / "class"),
                           "--out", str(out), "--no-progress", "-j", "2"], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out / f"grades-{LESSON}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return out, rows


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright
    _require_browser()
    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
    try:
        yield browser.new_page(viewport=VIEWPORT)
    finally:
        browser.close()
        pw.stop()


def test_report_numbers_match_grades_csv(graded, page):
    out, rows = graded
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto((out / "report.html").as_uri())
    section = page.locator(f"section[data-assignment='{LESSON}']")
    assert section.locator(".n-students").inner_text() == str(len(rows)) == str(len(STUDENTS))
    mean = statistics.mean(float(r["score"]) for r in rows)
    assert section.locator(".mean").inner_text() == f"{mean:.2f}"
    exercises = [c for c in rows[0] if c not in BASE_COLUMNS + ["hints"]]
    assert len(exercises) == 4
    for ex in exercises:
        passed = sum(float(r[ex]) > 0 for r in rows)
        shown = section.locator(f"tr.exercise[data-exercise='{ex}'] td.passed").inner_text()
        assert shown == f"{passed} / {len(rows)}", ex
    for r in rows:
        student = section.locator(f"tr.student[data-student='{r['student_id']}']")
        assert student.locator("td.score").text_content() == \
            f"{float(r['score']):g} / {float(r['max_score']):g}"
        for mid in r["hints"].split():
            who = section.locator(f"tr[data-mistake='{mid}'] td.who").text_content()
            assert r["student_id"] in who.split(", "), (mid, who)
    assert section.locator("tr.mistake").count() == len({m for r in rows for m in r["hints"].split()})
    loaded = page.evaluate("() => [...document.images].map(i => i.complete && i.naturalWidth > 0)")
    assert loaded == [True, True], "both figures are embedded and load offline"
    assert not errors, errors
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "class_report.png"), full_page=True)


def test_feedback_shows_the_hint_in_the_first_screenful(graded, page):
    out, _ = graded
    page.set_viewport_size(VIEWPORT)
    page.goto((out / "feedback" / "ben_z_not_updated" / LESSON / f"{LESSON}.html").as_uri())
    hint = page.locator("#toc .mlexp-hint").first
    assert hint.is_visible() and "z was not updated" in hint.inner_text()
    box = hint.bounding_box()
    assert box["y"] >= 0 and box["y"] + box["height"] <= VIEWPORT["height"], box
    summary = page.locator("#toc").inner_text()
    assert "Your-turn answer" in summary and "The parallel form" in summary
    assert "Test cell" not in page.content()
    code = page.locator("details.mlexp-code").first
    assert code.evaluate("d => !d.open"), "the test code starts collapsed under the hint"
    cell_hint = page.locator(".mlexp-test .mlexp-hint").first
    assert cell_hint.evaluate("(h, d) => !!(h.compareDocumentPosition(d) & Node.DOCUMENT_POSITION_FOLLOWING)",
                              code.element_handle()), "in the cell, the hint comes before the code"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "feedback_hint.png"))
    code.locator("summary").click()
    wide = page.evaluate("() => [...document.querySelectorAll('.mlexp-test pre')]"
                         ".filter(p => p.scrollWidth > p.clientWidth + 1).length")
    assert wide == 0, "long lines of the test code wrap"
