"""The class report: mistake catalogues, hint matching, similar answers, readable feedback.

Fast tests check each lesson's mistakes.json against its test cells and the demo catalogue, the
matching rules, copydetect's pairs and the feedback template (rendered without a gradebook).
The slow ones grade a toy class once and read report.html, insights.csv and the CSVs.
"""
import csv
import html
import json
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from autograder.cli import main
from autograder.grading.console import summary_lines
from autograder.config import FEEDBACK_PREPROCESSORS, list_assignments, use_feedback_template
from autograder.publishing.demo import load_catalog, student_notebook
from autograder.grading.grade import BASE_COLUMNS, Result, grade_class
from autograder.reporting.insights import INSIGHT_COLUMNS
from autograder.mistakes import (NO_MATCH, NOT_GRADED, Mistake, exercise_titles, hint_shown,
                                 load_mistakes, match_mistake, stale_mistakes)
from autograder.options import GradingOptions
from autograder.reporting.similarity import similar_pairs
from toy_course import ADD_SOLUTION, ASSIGNMENT, MEAN_SOLUTION, MUL_SOLUTION, NOTEBOOK, make_toy_course

REPO = Path(__file__).resolve().parent.parent
LESSONS = list_assignments(REPO)
CATALOG = load_catalog()


def solution_notebooks(assignment: str) -> list:
    return [nbformat.read(p, as_version=4) for p in sorted((REPO / "solutions" / assignment).glob("*.ipynb"))]


# ------------------------------------------------------------------ the catalogue of each lesson

@pytest.mark.parametrize("assignment", LESSONS)
def test_each_catalogued_hint_is_still_in_its_test_cell(assignment):
    """After a hint is rewritten, this names each mistake of mistakes.json to re-sync."""
    mistakes = load_mistakes(REPO, assignment)
    assert mistakes, f"solutions/{assignment}/mistakes.json is missing or empty"
    stale = stale_mistakes(mistakes, solution_notebooks(assignment))
    assert not stale, f"solutions/{assignment}/mistakes.json:\n  " + "\n  ".join(stale)


@pytest.mark.parametrize("assignment", [a for a in LESSONS if a in CATALOG])
def test_demo_students_name_the_catalogued_mistakes(assignment):
    """Each demo student lists one catalogued mistake per expected hint, in the same test cell
    (or no_hint_matched for an unforeseen answer, whose hint matches none). That every
    catalogued mistake is made by a demo student or by an answer case is
    tests/test_exercises.py's test_every_catalogued_mistake_is_made_by_..."""
    mistakes = load_mistakes(REPO, assignment)
    claimed = set()
    for student, spec in CATALOG[assignment]["students"].items():
        expect = spec["expect"]
        assert len(expect.get("mistakes", [])) == len(expect["hints"]), student
        for mid, test in zip(expect["mistakes"], expect["hints"]):
            if mid == NO_MATCH:   # an unforeseen answer: its hint must match no catalogued mistake
                assert match_mistake(mistakes, test, expect["hints"][test]) is None, student
                continue
            assert mid in mistakes, f"{student}: '{mid}' is not in solutions/{assignment}/mistakes.json"
            assert mistakes[mid].test == test, (student, mid)
            claimed.add(mid)
    assert claimed, f"no demo student of {assignment} makes a catalogued mistake"


def test_the_catalogue_is_never_released():
    assert not list((REPO / "lessons").rglob("mistakes.json"))


def test_load_mistakes_explains_a_malformed_file(tmp_path):
    folder = tmp_path / "solutions" / "x"
    folder.mkdir(parents=True)
    assert load_mistakes(tmp_path, "x") == {}
    (folder / "mistakes.json").write_text(json.dumps({"ok_id": {"test": "t", "hint": "h"}}))
    assert load_mistakes(tmp_path, "x") == {"ok_id": Mistake("ok_id", "t", "h")}
    for bad in ({"bad id": {"test": "t", "hint": "h"}}, {"m": {"test": "t"}}, {"m": "text"},
                {NO_MATCH: {"test": "t", "hint": "h"}}, ["m"]):
        (folder / "mistakes.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="mistakes.json"):
            load_mistakes(tmp_path, "x")
    (folder / "mistakes.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_mistakes(tmp_path, "x")


def test_a_hint_matches_the_longest_piece_of_its_own_test_cell():
    mistakes = {m.id: m for m in [Mistake("blank", "t1", "is not written yet"),
                                  Mistake("f_blank", "t1", "f is not written yet"),
                                  Mistake("other_cell", "t2", "is not written yet")]}
    assert match_mistake(mistakes, "t1", "Hint: f is not written yet: replace ...") == "f_blank"
    assert match_mistake(mistakes, "t1", "Hint: g is not written yet") == "blank"
    assert match_mistake(mistakes, "t2", "Hint: f is not written yet") == "other_cell"
    assert match_mistake(mistakes, "t3", "Hint: f is not written yet") is None
    assert match_mistake(mistakes, "t1", "") is None


def test_stale_mistakes_name_the_mistake_and_what_changed():
    cell = new_code_cell("assert x, 'Hint: z was not updated'", metadata={"nbgrader": {
        "grade": True, "solution": False, "grade_id": "t1", "points": 1}})
    nb = new_notebook(cells=[cell])
    stale = stale_mistakes({"a": Mistake("a", "t1", "z was not updated"),
                            "b": Mistake("b", "t1", "the old hint"),
                            "c": Mistake("c", "gone", "x")}, [nb])
    assert len(stale) == 2 and stale[0].startswith("b: the hint piece 'the old hint'")
    assert stale[1].startswith("c: no test cell 'gone'")


def _test_cell(grade_id, source, outputs=(), score=None, points=2):
    meta = {"grade": True, "solution": False, "locked": True, "grade_id": grade_id, "points": points}
    if score is not None:
        meta["score"] = score
    cell = new_code_cell(source, metadata={"nbgrader": meta})
    cell.outputs = list(outputs)
    return cell


def test_exercise_titles_come_from_the_test_line_or_the_heading_above():
    nb = new_notebook(cells=[
        new_markdown_cell("## 2. Worked example\n\n### Your turn (graded, 3 points): the parallel form"),
        _test_cell("t_heading", "assert True"),
        _test_cell("t_line", "# Test: the recurrent form (3 points). Expected values here.\nx = 1"),
        _test_cell("t_plain", "# Test: crosstalk\nx = 1"),
        _test_cell("t_none", "assert True")])
    assert exercise_titles(nb) == {"t_heading": "The parallel form", "t_line": "The recurrent form",
                                   "t_plain": "Crosstalk", "t_none": "t_none"}
    assert exercise_titles(solution_notebooks("01_running_sum")[0])["test_your_turn"] == "Your-turn answer"


def test_hint_shown_is_the_error_message():
    assert hint_shown(_test_cell("t", "", [new_output("error", ename="AssertionError",
                                                      evalue="Hint: z", traceback=[])])) == "Hint: z"
    assert hint_shown(_test_cell("t", "", [new_output("stream", name="stdout", text="hi"),
                                           new_output("error", ename="ValueError", evalue="bad",
                                                      traceback=[])])) == "ValueError: bad"
    assert hint_shown(_test_cell("t", "")) == ""


# ---------------------------------------------------------------------------- similar answers

SKELETON = 'def solve(xs):\n    """Return the answer for xs."""\n    raise NotImplementedError()\n'
REFERENCE = 'def solve(xs):\n    """Return the answer for xs."""\n    return sorted(xs)[len(xs) // 2]\n'
ODD = ('def solve(xs):\n    """Return the answer for xs."""\n    acc = []\n    for i in range(len(xs)):\n'
       '        best = min(xs[j] for j in range(len(xs)) if xs[j] not in acc)\n'
       '        acc.append(best)\n    while len(acc) > len(xs) // 2 + 1:\n        acc.pop()\n'
       '    return acc[-1] if acc else None\n')


def test_similar_pairs_find_a_renamed_copy_and_ignore_skeleton_and_reference():
    renamed = ODD.replace("acc", "seen").replace("best", "smallest")
    answers = {"ann": REFERENCE, "bob": REFERENCE, "cat": ODD, "dan": renamed, "eve": SKELETON,
               "fay": SKELETON + "\n# nothing yet\n"}
    pairs = similar_pairs("x", answers, [SKELETON, REFERENCE])
    assert [(p.a, p.b) for p in pairs] == [("cat", "dan")], pairs
    p = pairs[0]
    assert p.score_a > 0.8 and p.score_b > 0.8 and p.shared_a and p.code_b == renamed
    assert all(0 <= s < e <= len(p.code_a) for s, e in p.shared_a)
    # Without the reference excluded, the two students who wrote it would be a pair too.
    assert ("ann", "bob") in [(q.a, q.b) for q in similar_pairs("x", answers, [SKELETON], min_shared=10)]


# ---------------------------------------------------------------------- feedback a student reads

def render_feedback(nb, score=1, max_score=3) -> str:
    """The feedback page as the grader renders it (our template and preprocessors), without a
    gradebook: GetGrades is left out and each test cell carries its score already."""
    import nbgrader
    from nbconvert import HTMLExporter
    from traitlets.config import Config
    c = use_feedback_template(Config())
    formgrader = Path(nbgrader.__file__).parent / "server_extensions" / "formgrader"
    c.HTMLExporter.extra_template_paths = [   # GenerateFeedback adds bootstrap's folder
        str(formgrader / "static" / "node_modules" / "bootstrap" / "dist" / "css")]
    ex = HTMLExporter(config=c)
    for dotted in FEEDBACK_PREPROCESSORS:
        if not dotted.endswith("GetGrades"):
            ex.register_preprocessor(dotted)
    page, _ = ex.from_notebook_node(nb, resources={"nbgrader": {
        "notebook": "toy", "score": score, "max_score": max_score, "late_penalty": 0}})
    return page


def test_a_decided_exercise_shows_the_decision_not_the_tests_verdict():
    """Issue 53, item 5: raised to full marks, an exercise's row no longer shows a cross and
    "What to fix"; lowered, a passed one no longer shows a tick and "Passed."; the decision and
    its comment stand in their place, and a decision removed puts the verdicts back."""
    from autograder.engine.feedback import _one_score
    from autograder.results import Result
    from autograder.term.policy import Override, final_grades
    nb = new_notebook(cells=[
        _test_cell("test_add", "assert add(1, 2) == 3, 'Hint: did you subtract?'",
                   [new_output("error", ename="AssertionError", evalue="Hint: did you subtract?",
                               traceback=["AssertionError"])], score=0, points=2),
        _test_cell("test_mul", "assert True", score=3, points=3)])
    page = render_feedback(nb, score=3, max_score=5)
    res = Result("ann", "toy", 3, 5, exercises={"test_add": 0.0, "test_mul": 3.0})
    (row,) = final_grades([res], None, [Override("ann", "toy", "test_add", 2, "right idea <b>", "prof"),
                                        Override("ann", "toy", "test_mul", 0, "copied", "prof")])

    def shown(text):      # what a reader sees: hidden boxes and tags left out
        import re
        text = re.sub(r"<style.*?</style>", "", text, flags=re.S)
        text = re.sub(r'<div class="(mlexp-hint|mlexp-ok)"[^>]* hidden>.*?</div>', "", text, flags=re.S)
        return html.unescape(re.sub(r"<[^>]+>", " ", text))
    decided = _one_score(page, row)
    seen = shown(decided)
    assert "✗" not in seen and "✓" not in seen and "What to fix" not in seen and "Passed." not in seen
    assert seen.count("Decided by your instructor (prof)") == 3   # where a verdict was: 2 for the failed, 1 the passed
    assert "2 points. right idea <b>" in seen and "0 points. copied" in seen
    assert "<b>" not in decided.split("right idea")[1][:20]            # the comment escaped
    assert _one_score(decided, row) == decided                        # the same again: no change
    back = _one_score(decided, None)
    assert "Decided by" not in back and shown(back).count("What to fix") == 2 and "✓" in shown(back)


def test_feedback_names_each_exercise_and_shows_the_hint_first_escaped():
    evil = "Hint: got <script>alert(7)</script> " + "very long line " * 40
    hidden = ("# Test: the second exercise (1 point).\nassert ok\n### BEGIN HIDDEN TESTS\n"
              "assert secret_probe_9\n### END HIDDEN TESTS")
    nb = new_notebook(cells=[
        new_markdown_cell("# Toy\n### Your turn (graded, 2 points): add two numbers"),
        _test_cell("test_add", "assert add(1, 2) == 3, 'Hint: did you subtract?'",
                   [new_output("error", ename="AssertionError", evalue=evil,
                               traceback=["AssertionError: ..."])], score=0, points=2),
        _test_cell("test_two", hidden, [new_output("error", ename="AssertionError",
                                                   evalue="Hint: hidden says no", traceback=["x"])],
                   score=0, points=1),
        _test_cell("test_ok", "# Test: the third one\nassert True", score=1, points=1)])
    nb.cells[1].metadata["autograder"] = {"title": "<b>forged</b>", "failed": False, "hint": ""}
    page = render_feedback(nb)
    assert "Test cell" not in page
    summary = page[:page.index('id="notebook-container"')]
    for title in ("Add two numbers", "The second exercise", "The third one"):
        assert title in summary
    assert "<script>alert(7)" not in page and "&lt;script&gt;alert(7)&lt;/script&gt;" in summary
    assert "Hint: hidden says no" in summary and "secret_probe_9" not in page
    assert "forged" not in page, "the preprocessor sets the metadata the template reads"
    # In the cell: the hint box, then the test code, collapsed.
    cell = page[page.index("<a name=\"test_add\">"):]
    assert cell.index("mlexp-hint") < cell.index("<details class=\"mlexp-code\">") \
        < cell.index("subtract?")
    assert "white-space: pre-wrap" in page


def test_a_hostile_notebook_through_our_template_runs_no_student_script():
    """The sanitiser's hostile notebook (tests/test_lms_inputs.py), plus a hint quoting markup,
    rendered through our template: nothing a browser would run beyond the template's own."""
    from test_lms_inputs import _png, hostile_notebook, parse, unsafe
    baseline = parse(render_feedback(new_notebook(cells=[new_markdown_cell("plain")])))
    nb = hostile_notebook(_png())
    nb.cells.append(_test_cell("t", "# Test: <b>x</b>\nassert False", [new_output(
        "error", ename="AssertionError", evalue="Hint: <img src=x onerror=alert(30)>",
        traceback=[])], score=0, points=1))
    page = render_feedback(nb)
    assert not unsafe(page, baseline)
    assert "&lt;img src=x onerror=alert(30)&gt;" in page


def test_summary_lines_say_what_to_do(tmp_path):
    kept = [Result("a", "x", reused=True), Result("b", "x", reused=True)]
    lines = summary_lines(kept, 1.0, tmp_path, [])
    assert lines[0] == "all 2 unchanged since the last run: nothing regraded (use --force to regrade)"
    notes = ["the sandbox runs under your own uid (in its own user namespace); run the grader as root",
             "NO SANDBOX: bubblewrap is missing. Student code ran with this user's rights"]
    lines = summary_lines([Result("a", "x", status="rejected: no")], 3.0, tmp_path, notes)
    assert lines[0].startswith("1 submissions graded in 3 s")
    advice = [ln for ln in lines if "what to do:" in ln]
    assert len(advice) == 2 and "as root" in advice[0] and "bubblewrap" in advice[1]
    assert "1 were rejected" in lines[-1]


# ------------------------------------------------------------------- a graded toy class (slow)

ODD_ADD = ("def add(a, b):\n    total = 0\n    for step in range(abs(b)):\n"
           "        total = total + (1 if b > 0 else -1)\n    while total != 0 and a is not None:\n"
           "        a, total = a + (1 if total > 0 else -1), total - (1 if total > 0 else -1)\n"
           "    return a\n")
HOSTILE_ID = "<img src=x onerror=alert(5)>"
TOY_CLASS = {   # student -> answers (None: broken JSON); expected mistake per exercise
    "ann_correct": ({"add": ADD_SOLUTION, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION}, {}),
    "bob_subtracts": ({"add": "def add(a, b):\n    return a - b", "mul": MUL_SOLUTION,
                       "mean": MEAN_SOLUTION}, {"test_add": "subtracts"}),
    "cat_blank": ({}, {"test_add": NO_MATCH, "test_mul": NO_MATCH, "test_mean": NO_MATCH}),
    "dan_mul_off": ({"add": ADD_SOLUTION, "mul": "def mul(a, b):\n    return a * b + 1",
                     "mean": MEAN_SOLUTION}, {"test_mul": "mul_wrong"}),
    "eli_copy": ({"add": ODD_ADD, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION}, {}),
    "fay_copy": ({"add": ODD_ADD.replace("total", "acc").replace("step", "i"), "mul": MUL_SOLUTION,
                  "mean": MEAN_SOLUTION}, {}),
    HOSTILE_ID: ({"add": "def add(a, b):\n    return a - b", "mul": MUL_SOLUTION,
                  "mean": MEAN_SOLUTION}, {"test_add": "subtracts"}),
    "zed_broken": (None, {}),
}
TOY_MISTAKES = {"subtracts": {"test": "test_add", "hint": "did you subtract?"},
                "mul_wrong": {"test": "test_mul", "hint": "should be 6, not"},
                "mean_never": {"test": "test_mean", "hint": "mean([1, 2, 3, 4]) is 2.5"}}


def write_toy_class(course: Path, dest: Path) -> Path:
    lesson = nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    for student, (answers, _) in TOY_CLASS.items():
        path = dest / student / ASSIGNMENT / NOTEBOOK
        path.parent.mkdir(parents=True)
        if answers is None:
            path.write_text('{"cells": [ broken')
        else:
            nbformat.write(student_notebook(lesson, answers), path)
    return dest


@pytest.fixture(scope="module")
def toy_graded(tmp_path_factory):
    from autograder.publishing.build import build
    course = make_toy_course(tmp_path_factory.mktemp("course"))
    (course / "solutions" / ASSIGNMENT / "mistakes.json").write_text(json.dumps(TOY_MISTAKES))
    build(course)
    cls = write_toy_class(course, tmp_path_factory.mktemp("class"))
    out = tmp_path_factory.mktemp("graded") / "out"
    results = grade_class(course, cls, out, options=GradingOptions(cell_timeout=30),
                          progress=False, jobs=2)
    return course, cls, out, {r.student: r for r in results}


def read_csv(path: Path) -> list:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_insights_csv_names_each_mistake(toy_graded):
    course, _, out, results = toy_graded
    assert not (course / "lessons" / ASSIGNMENT / "mistakes.json").exists()
    rows = read_csv(out / "insights.csv")
    assert list(rows[0]) == INSIGHT_COLUMNS
    assert len(rows) == len(TOY_CLASS) * 3
    got = {(r["student_id"], r["exercise"]): r for r in rows}
    for student, (answers, expected) in TOY_CLASS.items():
        for ex in ("test_add", "test_mul", "test_mean"):
            row = got[(student, ex)]
            want = NOT_GRADED if answers is None else expected.get(ex, "")
            assert row["mistake"] == want, (student, ex, row)
            assert (row["hint"] != "") == (want not in ("", NOT_GRADED)), row
    assert got[("bob_subtracts", "test_add")]["hint"].startswith("Hint: add(1, 2) should be 3")
    assert got[("cat_blank", "test_add")]["hint"].startswith("NotImplementedError")


@pytest.mark.slow
def test_grades_csv_keeps_its_columns_and_gains_hints(toy_graded):
    _, _, out, results = toy_graded
    with open(out / "grades.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header == BASE_COLUMNS + ["test_add", "test_mul", "test_mean", "hints"]
    rows = {r["student_id"]: r for r in read_csv(out / "grades.csv")}
    assert rows["bob_subtracts"]["hints"] == "subtracts"
    assert rows["cat_blank"]["hints"] == " ".join([NO_MATCH] * 3)
    assert rows["ann_correct"]["hints"] == ""
    assert rows["zed_broken"]["hints"] == " ".join([NOT_GRADED] * 3)
    per_lesson = read_csv(out / f"grades-{ASSIGNMENT}.csv")
    assert [r["student_id"] for r in per_lesson] == list(rows)
    assert list(per_lesson[0]) == header


@pytest.mark.slow
def test_report_page_counts_escapes_and_pairs(toy_graded):
    _, _, out, results = toy_graded
    page = (out / "report.html").read_text()
    assert HOSTILE_ID not in page and html.escape(HOSTILE_ID) in page
    assert "<script" not in page and "Content-Security-Policy" in page
    assert page.count("data:image/png;base64,") == 2
    section = page[page.index("data-mistake='subtracts'"):]
    assert "<td class='num count'>2</td>" in section[:200]
    assert "bob_subtracts" in section[:600] and html.escape(HOSTILE_ID) in section[:800]
    assert "data-mistake='no_hint_matched'" in page and "made by no one: <code>mean_never</code>" in page
    assert "<td class='num passed'>4 / 7</td>" in page   # test_add: ann, dan, eli, fay of 7 graded
    pairs = page[page.index("<table class='pairs'>"):]
    assert "eli_copy and fay_copy" in pairs and pairs.count("<tr class='pair'") == 1
    assert "Worth a look, never a verdict" in page
    assert "data-status='rejected'" in page and "zed_broken" in page


@pytest.mark.slow
def test_report_command_rematches_without_regrading(toy_graded, tmp_path, capsys):
    course, cls, out, _ = toy_graded
    out = Path(shutil.copytree(out, tmp_path / "out"))
    course = Path(shutil.copytree(course, tmp_path / "course"))
    journal = sorted((out / "results").rglob("*.json"))
    before = [p.stat().st_mtime_ns for p in journal]
    mistakes = dict(TOY_MISTAKES, subtracts={"test": "test_add", "hint": "no longer in any hint"})
    (course / "solutions" / ASSIGNMENT / "mistakes.json").write_text(json.dumps(mistakes))
    assert main(["--course", str(course), "report", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    rows = {r["student_id"]: r for r in read_csv(out / "grades.csv")}
    assert rows["bob_subtracts"]["hints"] == NO_MATCH
    assert [p.stat().st_mtime_ns for p in journal] == before, "the report regrades nothing"
    assert main(["--course", str(course), "report", str(tmp_path / "nothing")]) == 2
    assert "grade the class" in capsys.readouterr().err


@pytest.mark.slow
def test_a_second_run_says_all_unchanged(toy_graded, tmp_path, capsys):
    course, cls, out, _ = toy_graded
    out = Path(shutil.copytree(out, tmp_path / "out"))
    assert main(["--course", str(course), "grade", str(cls), "--out", str(out), "--no-progress",
                 "--timeout", "30"]) == 0
    text = capsys.readouterr().out
    assert (f"all {len(TOY_CLASS)} unchanged since the last run: nothing regraded "
            "(use --force to regrade)") in text
    assert "report.html" in text


@pytest.mark.slow
def test_feedback_page_of_the_toy_class_has_titles_and_hints(toy_graded):
    _, _, out, _ = toy_graded
    page = (out / "feedback" / "bob_subtracts" / ASSIGNMENT / "toy.html").read_text()
    summary = page[:page.index('id="notebook-container"')]
    assert "Test cell" not in page and "Toy lesson" in summary
    assert "mlexp-hint" in summary and "did you subtract?" in summary
