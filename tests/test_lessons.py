"""Every lesson against the grader: solutions run and score full marks, fresh lessons score zero,
and each demo student gets its catalogued score and hint. (That lessons/ and the demo class are
in sync with solutions/ and the catalogue is `make check-generated`: tests/test_generated.py.)

Each lesson's class (some of its demo students + the solution + the fresh lesson) is graded once
per session through the command line, from a zip with a wrapping folder as an LMS exports it.
Which demo students: see `sandbox_students`. Every demo student's score and hints are checked by
tests/test_exercises.py (all of them in make test), through the same harness without the sandbox.
"""
import csv
import html
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from autograder.engine.check import check_notebook
from autograder.intake.collect import collect
from autograder.config import KERNEL_ARGS, list_assignments
from autograder.publishing.demo import load_catalog
from autograder.grading.grade import BASE_COLUMNS, DEMO_SUBMISSIONS
from mlexp.check import output_widgets_read_only, printed_hints

REPO = Path(__file__).resolve().parent.parent
ASSIGNMENTS = list_assignments(REPO)
CATALOG = load_catalog()
SOLUTION, FRESH = "zz_solution", "zz_fresh_lesson"     # extra students added to the graded class
DEMO_CASES = [(a, s) for a, cat in CATALOG.items() for s in cat["students"]]


def sandbox_students(assignment: str) -> list:
    """The demo students of a lesson whose class is graded here, in catalogue order: every student
    who gets full marks (the correct variants), every blank one, and the first student to fail
    each test with a catalogued hint and the first to fail it with the neutral one (unforeseen).
    So each test's pass, its hinted failure and its unforeseen failure go through the sandbox,
    the zip, the feedback pages and the report once, at about a third of the cost of the whole
    class (the suite's time goal); the other students' verdicts are test_exercises' to check."""
    chosen, seen = [], set()
    for student, spec in CATALOG[assignment]["students"].items():
        expect = spec["expect"]
        kinds = {(test, mistake == "no_hint_matched") for test, mistake in zip(expect["hints"], expect["mistakes"])}
        if expect["score"] in (0, expect["max_score"]) or kinds - seen:
            chosen.append(student)
            seen |= kinds if expect["score"] else set()
    return chosen


CLASS_CASES = [(a, s) for a in CATALOG for s in sandbox_students(a)]

pytestmark = pytest.mark.slow


def notebooks(folder: Path) -> list:
    return sorted(folder.glob("*.ipynb"))


def page_text(path: Path) -> str:
    """The visible text of an HTML page: tags dropped, entities decoded (code highlighting
    splits a line into many <span>s, so raw HTML would hide a leaked line from a search)."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


def hidden_lines(solution: Path, lesson: Path) -> list:
    """Lines between BEGIN/END HIDDEN TESTS that are not also visible in the released lesson
    (not even as part of a longer line: a bare `for j in range(k):` is in a commented visible one)."""
    visible = "\n".join(c.source for c in nbformat.read(lesson, as_version=4).cells)
    found, inside = [], False
    for cell in nbformat.read(solution, as_version=4).cells:
        for line in cell.source.splitlines():
            if "BEGIN HIDDEN TESTS" in line:
                inside = True
            elif "END HIDDEN TESTS" in line:
                inside = False
            elif inside and len(line.strip()) >= 12 and line.strip() not in visible:
                found.append(line.strip())
    return found


def student_text(submitted: Path) -> str:
    """The source of the cells a student writes in (answer cells and free cells) of the notebook
    as the grader received it, after repair."""
    cells = nbformat.read(submitted, as_version=4).cells
    return "\n".join(c.source for c in cells if c.metadata.get("nbgrader", {}).get("solution")
                     or not c.metadata.get("nbgrader", {}).get("grade"))


def visible_test_lines(lesson: Path) -> list:
    """Code lines of the released lesson's autograded test cells (at least 12 characters)."""
    return [ln.strip() for c in nbformat.read(lesson, as_version=4).cells
            if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"
            and not c.metadata["nbgrader"].get("solution")
            for ln in c.source.splitlines() if len(ln.strip()) >= 12]


def grade_class_zip(assignment: str, tmp: Path):
    """Run `python -m autograder grade CLASS.zip --out DIR` on one lesson's class; return
    (out, stdout, rows). The class: its `sandbox_students`, the solution and the fresh lesson."""
    cls = tmp / "export" / "course_export_2026"
    for student in sandbox_students(assignment) if assignment in CATALOG else []:
        shutil.copytree(DEMO_SUBMISSIONS / student / assignment, cls / student / assignment)
    for nb in notebooks(REPO / "solutions" / assignment):
        for student, src in [(SOLUTION, nb), (FRESH, REPO / "lessons" / assignment / nb.name)]:
            (cls / student / assignment).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, cls / student / assignment / nb.name)
    zpath = tmp / "class.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        for f in sorted((tmp / "export").rglob("*")):
            zf.write(f, f.relative_to(tmp / "export").as_posix())
    out = tmp / "out"
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(zpath), "--out",
                           str(out), "--no-progress", "-j", "2"], cwd=REPO, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out / "grades.csv") as f:
        rows = {(r["student_id"], r["assignment"]): r for r in csv.DictReader(f)}
    return out, proc.stdout, rows


@pytest.fixture(scope="module")
def graded_lessons(tmp_path_factory):
    """graded_lessons(assignment) grades that lesson's class on first use, then reuses it, so
    `pytest -k 01_running_sum` grades lesson 01 only and a full run grades each lesson once."""
    cache = {}

    def get(assignment):
        if assignment not in cache:
            cache[assignment] = grade_class_zip(assignment, tmp_path_factory.mktemp(assignment))
        return cache[assignment]
    return get


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_solution_runs_top_to_bottom_in_full_mode(assignment, tmp_path):
    """Full size, as a student runs it (not grading), in a copy so nothing lands in the repo."""
    folder = Path(shutil.copytree(REPO / "solutions" / assignment, tmp_path / assignment))
    env = {k: v for k, v in os.environ.items() if k != "NBGRADER_EXECUTION"}
    for path in notebooks(folder):
        nb = nbformat.read(path, as_version=4)
        output_widgets_read_only(NotebookClient(nb, timeout=600, kernel_name="python3",
                                                extra_arguments=list(KERNEL_ARGS),
                                                resources={"metadata": {"path": str(folder)}})).execute(env=env)


def test_default_class_is_the_demo_class():
    found = {(s.assignment, s.student) for s in collect(DEMO_SUBMISSIONS, ASSIGNMENTS, Path("."))}
    assert found == set(DEMO_CASES)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_solution_scores_full_marks_and_fresh_lesson_zero(graded_lessons, assignment):
    _, _, rows = graded_lessons(assignment)
    solution, fresh = rows[(SOLUTION, assignment)], rows[(FRESH, assignment)]
    assert float(solution["max_score"]) > 0
    assert float(solution["score"]) == float(solution["max_score"]), solution
    assert float(fresh["score"]) == 0, fresh
    assert solution["status"] == fresh["status"] == "graded"


@pytest.mark.parametrize("assignment, student", CLASS_CASES)
def test_demo_student_gets_catalogued_score_and_hints(graded_lessons, assignment, student):
    out, _, rows = graded_lessons(assignment)
    expect = CATALOG[assignment]["students"][student]["expect"]
    row = rows[(student, assignment)]
    assert (float(row["score"]), float(row["max_score"])) == (expect["score"], expect["max_score"])
    partial = expect.get("partial", {})     # a test with partial credit gives part of its points
    for grade_id, hint in expect["hints"].items():
        assert float(row[grade_id]) == partial.get(grade_id, 0), f"{student}: {grade_id} should fail"
    feedback = out / "feedback" / student / assignment / CATALOG[assignment]["notebook"].replace(
        ".ipynb", ".html")
    text = page_text(feedback)
    for grade_id, hint in expect["hints"].items():
        assert hint in text, f"{student}: hint for {grade_id} missing from the feedback"
    # The failing test's hint is in its own cell's output in the autograded notebook: its error,
    # or (a test that gave partial credit, which cannot raise) the hints it printed.
    autograded = nbformat.read(out / "work" / "autograded" / student / assignment /
                               CATALOG[assignment]["notebook"], as_version=4)
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in autograded.cells}
    for grade_id, hint in expect["hints"].items():
        errors = [o for o in cells[grade_id].outputs if o.output_type == "error"]
        if grade_id in partial:
            assert not errors and hint in printed_hints(cells[grade_id]), (student, grade_id)
            assert f"Partial credit: this test gave {partial[grade_id]:g} of" in text, (student, grade_id)
        else:
            assert errors and hint in f"{errors[0].ename}: {errors[0].evalue}", (student, grade_id)


def insight_rows(out: Path) -> list:
    with open(out / "insights.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("assignment, student", CLASS_CASES)
def test_demo_student_mistakes_are_detected_by_name(graded_lessons, assignment, student):
    """insights.csv and the hints column name exactly the mistakes the student was built to make."""
    out, _, rows = graded_lessons(assignment)
    expect = CATALOG[assignment]["students"][student]["expect"]
    lost = {r["exercise"]: r["mistake"] for r in insight_rows(out)
            if r["student_id"] == student and r["mistake"]}
    assert lost == dict(zip(expect["hints"], expect["mistakes"])), student
    assert sorted(rows[(student, assignment)]["hints"].split()) == sorted(expect["mistakes"])


@pytest.mark.parametrize("assignment", [a for a in ASSIGNMENTS if a in CATALOG])
def test_report_counts_match_the_demo_catalogue(graded_lessons, assignment):
    """Each catalogued mistake's row in report.html counts and names the demo students built to
    make it (and the fresh lesson, blank, where it makes it too); the "no hint matched" rows name
    exactly the demo students built as unforeseen answers (catalogued as no_hint_matched)."""
    out, _, _ = graded_lessons(assignment)
    page = (out / "report.html").read_text()
    makers = {}
    graded = sandbox_students(assignment)
    for student, spec in CATALOG[assignment]["students"].items():
        for mid in spec["expect"]["mistakes"] if student in graded else []:
            makers.setdefault(mid, set()).add(student)
    unforeseen = makers.pop("no_hint_matched", set())
    for mid, students in makers.items():
        row = re.search(rf"<tr class='mistake' data-mistake='{mid}'>.*?"
                        r"<td class='num count'>(\d+)</td>.*?<td class='who'>([^<]*)</td>", page)
        assert row, f"{mid} is missing from the report"
        who = set(html.unescape(row.group(2)).split(", "))
        assert students <= who and who - students <= {FRESH}, (mid, who)
        assert int(row.group(1)) == len(who)
    in_rows = set()
    for row in re.findall(r"data-mistake='no_hint_matched'>.*?<td class='who'>([^<]*)</td>", page):
        who = set(html.unescape(row).split(", ")) & set(graded)
        assert who <= unforeseen, row
        in_rows |= who
    assert in_rows == unforeseen


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_no_hidden_test_in_any_feedback(graded_lessons, assignment):
    out, _, _ = graded_lessons(assignment)
    for solution in notebooks(REPO / "solutions" / assignment):
        hidden = hidden_lines(solution, REPO / "lessons" / assignment / solution.name)
        assert hidden, "expected hidden tests in the solution notebook"
        visible = visible_test_lines(REPO / "lessons" / assignment / solution.name)
        pages = sorted((out / "feedback").glob(f"*/{assignment}/{solution.stem}.html"))
        assert len(pages) >= 2
        for page in pages:
            text = page_text(page)
            # A line the student typed themselves (an import, a loop header) is theirs to see.
            own = student_text(out / "work" / "submitted" / page.parent.parent.name / assignment /
                               solution.name)
            secret = [ln for ln in hidden if ln not in own]
            assert secret, f"{page}: every hidden line is also in the student's own code"
            leaked = [ln for ln in secret if ln in text]
            assert not leaked, f"{page}: hidden test lines in feedback: {leaked[:3]}"
            # The search can find code: the visible test lines are there, found the same way.
            assert all(ln in text for ln in visible), f"{page}: visible tests not found"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_table_and_grades_csv(graded_lessons, assignment):
    out, stdout, rows = graded_lessons(assignment)
    header = stdout.splitlines()[0].split()
    assert header == ["student", "assignment", "score", "status"]
    for (student, assignment), row in rows.items():
        assert re.search(rf"^{re.escape(student)}\s+{assignment}\s+"
                         rf"{float(row['score']):g}/{float(row['max_score']):g}\s", stdout, re.M)
    with open(out / "grades.csv") as f:
        assert next(csv.reader(f))[:len(BASE_COLUMNS)] == BASE_COLUMNS
    demo = [s for a, s in CLASS_CASES if a == assignment]
    assert sorted(student for student, _ in rows) == sorted(demo + [SOLUTION, FRESH])


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_check_passes_the_solution(assignment):
    for solution in notebooks(REPO / "solutions" / assignment):
        results, notes = check_notebook(solution)
        assert results and all(r.passed for r in results), (results, notes)


@pytest.mark.parametrize("assignment", [a for a in ASSIGNMENTS if a in CATALOG])
def test_check_shows_the_hint_of_a_wrong_answer(assignment, capsys):
    from autograder.cli import main
    students = CATALOG[assignment]["students"]
    # the first student whose hint the visible tests give (a value judged at grading only is not checked here)
    student, grade_id, hint = next((s, test, hint) for s, spec in students.items() if spec["expect"]["score"] > 0
                                   for test, hint in spec["expect"]["hints"].items()
                                   if test not in spec["expect"].get("hidden_only", ()))
    nb = DEMO_SUBMISSIONS / student / assignment / CATALOG[assignment]["notebook"]
    assert main(["check", str(nb)]) == 1
    report = capsys.readouterr().out
    line = next(ln for ln in report.splitlines() if ln.startswith("FAIL") and grade_id in ln)
    assert hint in line
