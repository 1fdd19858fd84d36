"""The grader on a toy course written from code: build, grade (zip), feedback, check, demo."""
import csv
import json
import os
import shutil
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.publishing.build import build, check_build
from autograder.engine.check import NotebookError, check_notebook, format_report
from autograder.cli import main
from autograder.intake.collect import collect
from autograder.config import find_course_root
from autograder.publishing.demo import generate_demo, student_notebook
from autograder.grading.grade import BASE_COLUMNS, format_table, grade_class
from autograder.options import GradingOptions
from toy_course import (ADD_SOLUTION, ASSIGNMENT, HIDDEN_MARK, MEAN_SOLUTION, MUL_SOLUTION,
                        NOTEBOOK, make_toy_course)

WRONG_ADD = "def add(a, b):\n    return a - b"
RAISING_MUL = "def mul(a, b):\n    raise ValueError('student bug')"
# student id -> (answers, file name, expected score, {test cell: hint substring})
STUDENTS = {
    "a_broken_json": (None, NOTEBOOK, 0, {}),
    "ann_correct": ({"add": ADD_SOLUTION, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION}, NOTEBOOK, 6,
                    {}),
    "bob_subtracts": ({"add": WRONG_ADD, "mul": MUL_SOLUTION}, NOTEBOOK, 3,
                      {"test_add": "did you subtract?"}),
    "cat_blank": ({}, NOTEBOOK, 0, {"test_add": "NotImplementedError"}),
    "dan_raises": ({"add": ADD_SOLUTION, "mul": RAISING_MUL}, NOTEBOOK, 2,
                   {"test_mul": "student bug"}),
    "eve_renamed": ({"add": ADD_SOLUTION, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION},
                    "Copy of toy (1).ipynb", 6, {}),
    # nbgrader 0.9.6 refuses a notebook with a duplicated graded cell; repair keeps the last copy
    "fay_duplicated_cell": ("duplicate", NOTEBOOK, 6, {}),
}


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = make_toy_course(tmp_path_factory.mktemp("course"))
    build(root)
    return root


def write_class(course: Path, dest: Path) -> Path:
    lesson = nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    for student, (answers, name, _, _) in STUDENTS.items():
        path = dest / student / ASSIGNMENT / name
        path.parent.mkdir(parents=True)
        if answers is None:
            path.write_text('{"cells": [ broken')
        elif answers == "duplicate":
            nb = student_notebook(lesson, {"add": ADD_SOLUTION, "mul": MUL_SOLUTION,
                                           "mean": MEAN_SOLUTION})
            copy = nbformat.from_dict(json.loads(json.dumps(nb.cells[2])))   # the "add" cell
            copy.id = "duplicate-of-add"
            nb.cells.insert(2, copy)
            nbformat.write(nb, path)
        else:
            nbformat.write(student_notebook(lesson, answers), path)
    return dest


@pytest.fixture(scope="module")
def graded(course, tmp_path_factory):
    """Grade the toy class once, from an LMS-style zip with one wrapping folder."""
    tmp = tmp_path_factory.mktemp("graded")
    write_class(course, tmp / "export" / "lms_download")
    zpath = tmp / "class.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        for f in sorted((tmp / "export").rglob("*")):
            zf.write(f, f.relative_to(tmp / "export").as_posix())
    out = tmp / "out"
    results = grade_class(course, zpath, out, options=GradingOptions(cell_timeout=30), progress=False)
    return {r.student: r for r in results}, out


def test_build_is_in_sync_then_detects_edits_and_strays(course, tmp_path):
    root = Path(shutil.copytree(course, tmp_path / "c"))
    assert check_build(root) == []
    lesson = root / "lessons" / ASSIGNMENT / NOTEBOOK
    lesson.write_text(lesson.read_text().replace("Toy lesson", "Edited lesson"))
    (root / "lessons" / "orphan").mkdir()
    diffs = check_build(root)
    assert f"lessons/{ASSIGNMENT}/{NOTEBOOK}" in diffs
    assert any(d.startswith("lessons/orphan/") for d in diffs)
    assert main(["--course", str(root), "build", "--check"]) == 1
    assert main(["--course", str(root), "build"]) == 0
    assert check_build(root)[-1].startswith("lessons/orphan/")   # build never deletes strays
    assert not list(root.rglob("gradebook.db")), "build left a gradebook in the course"


def test_released_lesson_has_no_solution_or_hidden_test(course):
    text = (course / "lessons" / ASSIGNMENT / NOTEBOOK).read_text()
    assert HIDDEN_MARK not in text and "return a + b" not in text
    assert "NotImplementedError" in text


@pytest.mark.slow
def test_each_student_gets_expected_score_and_status(graded):
    results, _ = graded
    assert sorted(results) == sorted(STUDENTS)
    for student, (_, _, score, _) in STUDENTS.items():
        assert results[student].score == score, (student, results[student])
        assert results[student].max_score == 6
    assert results["a_broken_json"].status.startswith("rejected: ")
    assert results["fay_duplicated_cell"].status == "graded"
    assert "appeared 2 times: kept the last copy" in results["fay_duplicated_cell"].notes[0]
    assert "renamed 'Copy of toy (1).ipynb'" in results["eve_renamed"].notes[0]
    assert all(results[s].status == "graded" for s in STUDENTS if s != "a_broken_json")
    assert results["dan_raises"].exercises == {"test_add": 2, "test_mul": 0, "test_mean": 0}
    table = format_table(list(results.values()))
    assert "bob_subtracts" in table and "3/6" in table


@pytest.mark.slow
def test_feedback_has_hints_and_no_hidden_tests(graded):
    results, out = graded
    for student, (answers, _, _, hints) in STUDENTS.items():
        html = out / "feedback" / student / ASSIGNMENT / "toy.html"
        if answers is None:
            assert not html.exists()
            continue
        text = html.read_text()
        for needle in hints.values():
            assert needle in text, (student, needle)
        assert HIDDEN_MARK not in text, f"hidden test leaked into {student}'s feedback"
        # nbgrader's autograded copy does hold the hidden test, so the check above can fail.
        autograded = out / "work" / "autograded" / student / ASSIGNMENT / NOTEBOOK
        assert HIDDEN_MARK in autograded.read_text()


@pytest.mark.slow
def test_grades_csv_has_columns_and_rows(graded):
    _, out = graded
    with open(out / "grades.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:len(BASE_COLUMNS)] == BASE_COLUMNS
    assert {"test_add", "test_mul"} <= set(rows[0])
    by_student = {r["student_id"]: r for r in rows}
    assert float(by_student["bob_subtracts"]["score"]) == 3
    assert float(by_student["bob_subtracts"]["test_add"]) == 0


@pytest.mark.slow
def test_regrading_another_class_into_the_same_out_lists_only_that_class(course, graded, tmp_path):
    out = Path(shutil.copytree(graded[1], tmp_path / "out"))   # an earlier run's output
    write_class(course, tmp_path / "cls")
    for student in STUDENTS:
        if student not in ("ann_correct", "bob_subtracts"):
            shutil.rmtree(tmp_path / "cls" / student)
    results = grade_class(course, tmp_path / "cls", out, options=GradingOptions(cell_timeout=30), progress=False)
    assert [(r.student, r.score) for r in results] == [("ann_correct", 6), ("bob_subtracts", 3)]
    assert all(r.reused for r in results), "same bytes as the earlier run: nothing to regrade"
    with open(out / "grades.csv") as f:
        assert [r["student_id"] for r in csv.DictReader(f)] == ["ann_correct", "bob_subtracts"]
    forced = grade_class(course, tmp_path / "cls", out, options=GradingOptions(cell_timeout=30), progress=False,
                         force=True)
    assert [(r.student, r.score, r.reused) for r in forced] == [("ann_correct", 6, False),
                                                               ("bob_subtracts", 3, False)]


@pytest.mark.slow
def test_grade_class_runs_twice_in_one_process_and_leaves_nothing_behind(course, tmp_path, monkeypatch):
    """Each run has its own executor and gradebook lock (autograder.engine.sandbox.GradingRun): two
    runs one after the other in one process, with -j 2, grade alike and leave the process as
    they found it (nbgrader's NBGRADER_EXECUTION, the working folder)."""
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    write_class(course, tmp_path / "cls")
    for student in STUDENTS:
        if student not in ("ann_correct", "bob_subtracts", "dan_raises"):
            shutil.rmtree(tmp_path / "cls" / student)
    cwd = os.getcwd()
    runs = [grade_class(course, tmp_path / "cls", tmp_path / f"out{i}", progress=False, jobs=2,
                        options=GradingOptions(cell_timeout=30)) for i in range(2)]
    first, second = ([(r.student, r.score, r.status) for r in rs] for rs in runs)
    assert first == second == [("ann_correct", 6, "graded"), ("bob_subtracts", 3, "graded"),
                               ("dan_raises", 2, "graded")]
    assert "NBGRADER_EXECUTION" not in os.environ and os.getcwd() == cwd


def test_collect_reads_folders_and_reports_unknown(course, tmp_path):
    write_class(course, tmp_path / "cls")
    (tmp_path / "cls" / "zed" / "99_unknown").mkdir(parents=True)
    subs = collect(tmp_path / "cls", [ASSIGNMENT], tmp_path / "unpack")
    assert {s.student for s in subs} == set(STUDENTS) | {"zed"}
    assert [s.problem for s in subs if s.student == "zed"] == ["unknown assignment '99_unknown'"]
    (tmp_path / "empty" / "just_a_folder").mkdir(parents=True)
    with pytest.raises(ValueError, match="No submissions found"):
        collect(tmp_path / "empty", [ASSIGNMENT], tmp_path / "u2")
    with pytest.raises(FileNotFoundError):
        collect(tmp_path / "missing", [ASSIGNMENT], tmp_path / "u3")


@pytest.mark.slow
def test_check_reports_pass_hint_and_exit_code(course, tmp_path, capsys):
    write_class(course, tmp_path)
    solution = course / "solutions" / ASSIGNMENT / NOTEBOOK
    results, notes = check_notebook(solution, course=course)
    assert results and all(r.passed for r in results), (results, notes)
    wrong = tmp_path / "bob_subtracts" / ASSIGNMENT / NOTEBOOK
    assert main(["--course", str(course), "check", str(wrong)]) == 1
    report = capsys.readouterr().out
    assert "FAIL  test_add" in report and "Hint: add(1, 2) should be 3" in report
    assert "PASS  test_mul" in report
    assert main(["--course", str(course), "check", str(tmp_path / "ann_correct" / ASSIGNMENT / NOTEBOOK)]) == 0


def test_check_errors_are_clear(tmp_path, capsys):
    with pytest.raises(NotebookError, match="No such notebook"):
        check_notebook(tmp_path / "nope.ipynb")
    bad = tmp_path / "bad.ipynb"
    bad.write_text("{not json")
    assert main(["check", str(bad)]) == 2
    assert "not valid notebook JSON" in capsys.readouterr().err
    assert "no autograded test cells" in format_report("x.ipynb", [])


def test_demo_generation_and_catalogue_typos(course, tmp_path):
    demo = tmp_path / "demo"
    (demo / "catalog").mkdir(parents=True)
    catalog = {"assignment": ASSIGNMENT, "notebook": NOTEBOOK, "students": {
        "all": {"from_solution": True, "expect": {"score": 5, "max_score": 5, "hints": {}}},
        "typo": {"answers": {"ad": WRONG_ADD}, "expect": {}}}}
    (demo / "catalog" / f"{ASSIGNMENT}.json").write_text(json.dumps(catalog))
    with pytest.raises(ValueError, match="'ad' is not a solution cell"):
        generate_demo(course, demo / "out", demo)
    del catalog["students"]["typo"]
    (demo / "catalog" / f"{ASSIGNMENT}.json").write_text(json.dumps(catalog))
    [path] = generate_demo(course, demo / "out", demo)
    text = path.read_text()
    assert "return a + b" in text and "BEGIN SOLUTION" not in text and HIDDEN_MARK not in text


def test_course_root_error_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="--course"):
        find_course_root(tmp_path)


@pytest.mark.slow
def test_a_page_that_cannot_be_written_is_said_in_the_status_and_the_report(course, tmp_path, monkeypatch):
    """nbconvert fails on one student's page: the score stands and is exported, the status says
    "graded: no feedback page (<notebook>: <error>)", the report lists the student under "no page",
    and the next run (nbconvert working again) writes the page and the status is plain "graded"."""
    from nbgrader.apps import NbGraderAPI
    from autograder.reporting.report import write_class_outputs
    lesson = nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    path = tmp_path / "cls" / "ann" / ASSIGNMENT / NOTEBOOK
    path.parent.mkdir(parents=True)
    nbformat.write(student_notebook(lesson, {"add": ADD_SOLUTION, "mul": MUL_SOLUTION,
                                             "mean": MEAN_SOLUTION}), path)
    real = NbGraderAPI.generate_feedback
    monkeypatch.setattr(NbGraderAPI, "generate_feedback", lambda self, *a, **k: (_ for _ in ()).throw(
        KeyError("state")))
    out = tmp_path / "out"
    [res] = grade_class(course, tmp_path / "cls", out, options=GradingOptions(cell_timeout=30), progress=False)
    assert res.score == 6 and res.feedback == [] and res.retry
    assert res.status == f"graded: no feedback page ({NOTEBOOK}: KeyError: 'state')", res.status
    assert not any("feedback failed" in n for n in res.notes), "said once, in the status"
    write_class_outputs(course, out)
    report = (out / "report.html").read_text()
    assert "data-status='no page'" in report and "ann" in report.split("data-status='no page'")[1][:400]
    with open(out / "grades.csv") as f:
        [row] = list(csv.DictReader(f))
    assert float(row["score"]) == 6 and row["status"].startswith("graded: no feedback page")

    monkeypatch.setattr(NbGraderAPI, "generate_feedback", real)
    [again] = grade_class(course, tmp_path / "cls", out, options=GradingOptions(cell_timeout=30), progress=False)
    assert again.status == "graded" and not again.reused and again.score == 6
    assert [Path(p).name for p in again.feedback] == ["toy.html"]
