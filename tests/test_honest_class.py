"""An honest class is graded full marks and never held (issue 51, items 3 and 4).

tests/honest_class/build_honest_class.py writes correct answers of lessons 01, 03 and 06 with
the habits students have (a loop over heads or over the batch, Colab guards, ``%cd``, ``!pip``,
a line added to the Setup or imports cell, their own attributes, the standard library, a list
appended to, scratch cells comparing with the library, ``%timeit``, plots) and three dishonest
neighbours. The class is graded once, with one command at -j 2. Before issue 51 the grader held
11 of the 13 honest students "for manual review" (the reading's "code the grader cannot check",
a loop over heads or the batch, "SHAPES_SEEN calls itself"); now: none.
"""
import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.publishing.build import build

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "honest_class"))
import build_honest_class as honest  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("honest")
    course = tmp / "course"
    (course / "lessons").mkdir(parents=True)
    for lesson in honest.LESSONS:
        shutil.copytree(REPO / "solutions" / lesson, course / "solutions" / lesson)
    build(course)
    honest.write_class(tmp / "class", honest.read_lessons(course))
    out = tmp / "out"
    proc = subprocess.run([sys.executable, "-m", "autograder", "--course", str(course), "grade", str(tmp / "class"),
                           "--out", str(out), "-j", "2", "--no-progress"],
                          capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "grades.csv") as f:
        return {r["student_id"]: r for r in csv.DictReader(f)}


def test_the_class_has_each_habit():
    students = set(honest.students(honest.read_lessons(REPO)))
    assert len(students - set(honest.DISHONEST)) >= 12
    assert set(honest.DISHONEST) <= students


def test_every_honest_student_gets_full_marks_and_is_not_held(graded):
    honest_rows = {s: r for s, r in graded.items() if s not in honest.DISHONEST}
    assert len(honest_rows) >= 12
    wrong = [(s, r["score"], r["max_score"], r["status"]) for s, r in honest_rows.items()
             if r["status"] != "graded" or float(r["score"]) != float(r["max_score"])]
    held = sum(r["status"].startswith("needs manual review") for r in honest_rows.values())
    assert not wrong, f"false holds: {held} of {len(honest_rows)}\n" + "\n".join(map(str, wrong))


def test_dishonest_neighbours_fail_their_rule_or_are_held_with_the_true_reason(graded):
    for student, (status, lost, said) in honest.DISHONEST.items():
        row = graded[student]
        assert row["status"].startswith(status) and said in row["status"], (student, row["status"])
        assert float(row["max_score"]) - float(row["score"]) == lost, (student, row["score"], row["status"])
    pasted = graded["d01_pastes_library"]["status"]
    assert "'test_recurrent_form'" in pasted and "your In [" in pasted, pasted
    # the lesson's catalogue (solutions/01_running_sum/mistakes.json) names each failure by its hint
    assert "calls_library_op" in graded["d01_calls_library"]["hints"]
    assert "parallel_loops_over_t" in graded["d01_loops_tokens"]["hints"]
