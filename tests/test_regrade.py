"""Regrading into the same DIR after the lesson changed: a test added, one reworded, one removed.

nbgrader refuses to change the cells of an assignment that has submissions; the grader brings
the gradebook up to date instead (autograder.publishing.releases.forget_assignments), grades every
submission of the changed lesson again (its digest holds the lesson's content) and tells a
student whose notebook predates the change so, instead of saying they deleted or edited a test
(autograder.intake.repair with the lesson's release history).
"""
import csv
import subprocess

import nbformat
import pytest

from autograder.publishing.build import build
from autograder.publishing.demo import student_notebook
from autograder.grading.grade import grade_class
from autograder.options import GradingOptions
from autograder.intake.repair import release_cells, repair_notebook
from toy_course import (ADD_SOLUTION, ASSIGNMENT, MEAN_SOLUTION, MUL_SOLUTION, NOTEBOOK, _test,
                        make_toy_course)

ALL = {"add": ADD_SOLUTION, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION}
NEW_TEST = _test("test_add_zero", 1, "assert add(0, 0) == 0, 'Hint: add(0, 0) is 0'")
REWORDED_MUL = "assert mul(2, 3) == 6, 'Hint: 2 times 3 is 6, got ' + str(mul(2, 3))"


def _cell(nb, grade_id):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _change_lesson(root):
    """Add test_add_zero after test_add, reword test_mul, remove test_mean."""
    path = root / "solutions" / ASSIGNMENT / NOTEBOOK
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(nb.cells.index(_cell(nb, "test_add")) + 1, NEW_TEST)
    _cell(nb, "test_mul").source = REWORDED_MUL
    nb.cells.remove(_cell(nb, "test_mean"))
    nbformat.write(nb, path)


def test_repair_tells_an_old_notebook_from_a_deletion(tmp_path):
    root = make_toy_course(tmp_path)
    build(root)
    old = nbformat.read(root / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    _change_lesson(root)
    build(root)
    new = nbformat.read(root / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    sub = student_notebook(old, ALL)
    notes = repair_notebook(sub, new, {}, [release_cells(old)])
    text = "; ".join(notes)
    assert "test cell 'test_add_zero' was added to the lesson after this notebook was " \
           "released: it was put in" in text
    assert "test cell 'test_mul' was changed in the lesson after this notebook was released" in text
    assert "'test_mean' was removed from the lesson" in text
    assert "deleted" not in text and "edited" not in text, notes
    assert _cell(sub, "test_add_zero").source == NEW_TEST.source
    # Without the history the same notebook reads as deleted and edited (what students saw).
    blamed = "; ".join(repair_notebook(student_notebook(old, ALL), new, {}))
    assert "'test_add_zero' was deleted" in blamed and "'test_mul' had been edited" in blamed


@pytest.mark.slow
def test_regrade_into_the_same_dir_after_the_lesson_changed(tmp_path):
    root = make_toy_course(tmp_path / "course")
    build(root)
    old = nbformat.read(root / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    deleter = student_notebook(old, ALL)
    deleter.cells.remove(_cell(deleter, "test_mul"))
    for student, nb in (("ann_old", student_notebook(old, ALL)), ("dee_deleted", deleter)):
        dest = tmp_path / "class" / student / ASSIGNMENT / NOTEBOOK
        dest.parent.mkdir(parents=True)
        nbformat.write(nb, dest)
    out, options = tmp_path / "out", GradingOptions(cell_timeout=30)
    first = {r.student: r for r in grade_class(root, tmp_path / "class", out, options, progress=False)}
    assert first["ann_old"].score == 6 and "test_mean" in first["ann_old"].exercises

    _change_lesson(root)
    again = {r.student: r for r in grade_class(root, tmp_path / "class", out, options,
                                               progress=False)}
    for student in ("ann_old", "dee_deleted"):
        r = again[student]
        assert not r.reused, f"{student}: reused a grade of the old lesson"
        assert r.status == "graded", (student, r.status)
        assert set(r.exercises) == {"test_add", "test_add_zero", "test_mul"}, r.exercises
        assert r.max_score == 6
        assert any("'test_add_zero' was added to the lesson after this notebook was released"
                   in n for n in r.notes), r.notes
        assert not any("test_add_zero' was deleted" in n for n in r.notes), r.notes
    ann, dee = again["ann_old"], again["dee_deleted"]
    assert ann.score == 6 and not any("deleted" in n or "edited" in n for n in ann.notes), ann.notes
    assert any("test cell 'test_mul' was deleted" in n for n in dee.notes), dee.notes
    with open(out / "grades.csv", newline="") as f:
        header = next(csv.reader(f))
    assert "test_add_zero" in header and "test_mean" not in header


def _commit(root, message):
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run(git + ["add", "-A"], check=True, capture_output=True)
    subprocess.run(git + ["commit", "-qm", message], check=True, capture_output=True)


@pytest.mark.slow
def test_a_new_dir_knows_the_earlier_release_from_the_courses_git_history(tmp_path):
    root = make_toy_course(tmp_path / "course")
    build(root)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    _commit(root, "lesson as released")
    old = nbformat.read(root / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    _change_lesson(root)
    build(root)
    _commit(root, "a test added")
    dest = tmp_path / "class" / "ann_old" / ASSIGNMENT / NOTEBOOK
    dest.parent.mkdir(parents=True)
    nbformat.write(student_notebook(old, ALL), dest)
    [r] = grade_class(root, tmp_path / "class", tmp_path / "fresh_out",
                      GradingOptions(cell_timeout=30), progress=False)
    assert any("'test_add_zero' was added to the lesson after this notebook was released"
               in n for n in r.notes), r.notes
    assert not any("deleted" in n or "edited" in n for n in r.notes), r.notes
    assert r.score == r.max_score == 6
