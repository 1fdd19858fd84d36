"""One piece of work, one grade, over a whole term from Canvas downloads (issue 52's Done-when).

Three lessons are graded in turn into one folder from Canvas's submission zips, whose file names
carry sortable names with ``_`` and a name part ending in ``_<digits>``; overrides.csv then
decides a review by keeping the machine's score, decides a timed-out submission with an
exercise's points, keeps another timed-out score, changes an exercise and sets a total; one
student resubmits a lesson whose earlier attempt was decided (Canvas renames the re-upload
``-1``), and a later attempt is not decided by the earlier decision. ``export`` then fills the
Canvas gradebook: every cell is checked against the rule computed here from the tables below,
held-back work (an undecided review, an undecided timeout, a PDF only) stays blank.

The kernel is replaced (``grade`` runs as it does, the scores come from which answers each
notebook holds), so the term runs in seconds; grading a real notebook is tested elsewhere.
"""
import csv
import shutil
import zipfile

import nbformat
import pytest

from autograder.cli import main
from autograder.grading.grade import ALONE_NOTE
from test_whole_term import read_rows, student_notebook, write_rows
from toy_course import ADD_SOLUTION, MEAN_SOLUTION, MUL_SOLUTION, NOTEBOOK, make_toy_course

pytestmark = pytest.mark.slow   # a whole term: seconds, kept out of the fast tier

RIGHT = {"add": ADD_SOLUTION, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION}
WRONG_ADD = {**RIGHT, "add": "def add(a, b):\n    return a - b"}
WRONG_MUL = {**RIGHT, "mul": "def mul(a, b):\n    return a * b + 1"}
POINTS = {"test_add": ("add", 2.0), "test_mul": ("mul", 3.0), "test_mean": ("mean", 1.0)}
# lesson -> (Canvas assignment id, points of its gradebook column)
LESSONS = {"toy_a": (101, 10.0), "toy_b": (102, 20.0), "toy_c": (103, 5.0)}
# Canvas user id -> (the file name's sortable-name part, the gradebook's Student)
STUDENTS = {555: ("o_brien", "O_Brien, Pat"), 901: ("annsmith_2", "Smith 2, Ann"),
            2: ("leeamy", "Lee, Amy"), 77: ("kim", "Kim, Jo")}
SID = {uid: f"{name}_{uid}" for uid, (name, _) in STUDENTS.items()}      # the grader's student ids
TIMEOUT = "timed out: test_mul ran past the 60 s limit per cell (scored as failed)"
REVIEW = "needs manual review: a graded cell's points were changed"
# (lesson, user) -> (answers, what the grader finds: "graded", "timeout" or "review"), or a PDF only
WORK = {("toy_a", 555): (RIGHT, "graded"), ("toy_a", 901): (WRONG_ADD, "graded"),
        ("toy_a", 2): (RIGHT, "review"), ("toy_a", 77): (RIGHT, "timeout"),
        ("toy_b", 555): (RIGHT, "timeout"), ("toy_b", 901): (WRONG_MUL, "graded"),
        ("toy_b", 2): (RIGHT, "graded"), ("toy_b", 77): (WRONG_ADD, "review"),
        ("toy_c", 555): (RIGHT, "graded"), ("toy_c", 901): (RIGHT, "timeout"),
        ("toy_c", 2): (WRONG_ADD, "graded"), ("toy_c", 77): "report.pdf"}
RESUBMITTED = ("toy_a", 901, RIGHT)        # graded after the decisions below were written
# overrides.csv, written after the first attempts were graded: (user, lesson, exercise, points)
DECISIONS = [(901, "toy_a", "", "5"),             # decides the first attempt only
             (2, "toy_a", "", "keep"),            # a review: the machine's score kept
             (555, "toy_b", "test_mul", "3"),     # a timeout: the exercise decided by hand
             (901, "toy_b", "test_add", "1"),     # an exercise changed
             (901, "toy_c", "", "keep")]          # a timeout: the machine's score kept


def machine(answers, found) -> dict:
    """The tests' points of each exercise: full where the answer is the solution; a timeout
    stops test_mul (it scores 0)."""
    points = {t: pts if answers[name] == RIGHT[name] else 0.0 for t, (name, pts) in POINTS.items()}
    if found == "timeout":
        points["test_mul"] = 0.0
    return points


def rule(lesson, uid):
    """(score of 6, held back): the decision of the attempt graded last applies, or none;
    a review or a timeout with no decision of its attempt, and work with no notebook, are held."""
    work = WORK[(lesson, uid)]
    if isinstance(work, str):
        return None, True
    answers, found = work
    decisions = [d for d in DECISIONS if d[:2] == (uid, lesson)]
    if (lesson, uid) == RESUBMITTED[:2]:
        answers, found, decisions = RESUBMITTED[2], "graded", []     # the earlier decision is stale
    if found != "graded" and not decisions:
        return None, True
    points, total = machine(answers, found), None
    for _, _, exercise, value in decisions:
        if value == "keep":
            continue
        if exercise:
            points[exercise] = float(value)
        else:
            total = float(value)
    return (sum(points.values()) if total is None else total), False


def fake_grade(self, job):
    """The grader with the kernel replaced: each test's points from the answers the notebook
    holds; a notebook whose metadata asks for it is found timed out or held for review."""
    res = job.result
    [nb] = job.notebooks.values()
    src = "\n".join(c.source for c in nb.cells) + "\n"    # a whole answer, not the start of a wrong one
    answers = {name: RIGHT[name] if RIGHT[name] + "\n" in src else "wrong" for name in RIGHT}
    found = nb.metadata.get("found", "graded")
    res.exercises = machine(answers, found)
    res.score, res.max_score = sum(res.exercises.values()), 6.0
    res.status = {"timeout": TIMEOUT, "review": REVIEW}.get(found, res.status)
    return res


def canvas_zip(path, lesson, released, resubmitted=False):
    """Canvas's download of one assignment: ``<name>_<user id>_<file id>_<file name>``."""
    with zipfile.ZipFile(path, "w") as zf:
        for (les, uid), work in WORK.items():
            if les != lesson:
                continue
            stem = f"{STUDENTS[uid][0]}_{uid}_{uid * 10 + 1}_"
            if isinstance(work, str):
                zf.writestr(stem + work, b"%PDF-1.4")
                continue
            answers, found = work
            name = f"{lesson}.ipynb"
            if resubmitted and (lesson, uid) == RESUBMITTED[:2]:
                answers, found, name = RESUBMITTED[2], "graded", f"{lesson}-1.ipynb"
            nb = student_notebook(released, answers)
            nb.metadata["found"] = found
            zf.writestr(stem + name, nbformat.writes(nb))
    return path


def gradebook():
    head = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    head += [f"Toy {lesson[-1].upper()} ({cid})" for lesson, (cid, _) in LESSONS.items()]
    rows = [head, ["    Points Possible", "", "", "", ""] + [f"{pts:.2f}" for _, pts in LESSONS.values()]]
    for uid, (_, student) in STUDENTS.items():
        rows.append([student, str(uid), f"S{uid}", f"u{uid}", "ML 101"] + [""] * len(LESSONS))
    return rows


@pytest.fixture
def course(tmp_path):
    from autograder.publishing.build import build
    root = make_toy_course(tmp_path / "course")
    for lesson in LESSONS:
        (root / "solutions" / lesson).mkdir()
        shutil.copy(root / "solutions" / "toy" / NOTEBOOK, root / "solutions" / lesson / f"{lesson}.ipynb")
    shutil.rmtree(root / "solutions" / "toy")
    build(root)
    return root


def test_a_canvas_term_exports_exactly_the_decided_grades(course, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("autograder.grading.grade.Grader.grade", fake_grade)
    term = tmp_path / "term.toml"
    term.write_text('timezone = "UTC"\n' + "".join(
        f'[lessons.{lesson}]\nlms_column = "Toy {lesson[-1].upper()} ({cid})"\n'
        for lesson, (cid, _) in LESSONS.items()))
    out = tmp_path / "term-folder"

    def grade(lesson, resubmitted=False):
        released = nbformat.read(course / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)
        zpath = canvas_zip(tmp_path / f"submissions-{lesson}.zip", lesson, released, resubmitted)
        code = main(["--course", str(course), "grade", str(zpath), "--out", str(out), "--term", str(term),
                     "-j", "2", "--no-progress"])
        assert code == 0, capsys.readouterr()

    for lesson in LESSONS:
        grade(lesson)
    with open(out / "overrides.csv", "w", newline="") as f:
        csv.writer(f).writerows([["student_id", "assignment", "exercise", "points", "comment", "by"]] +
                                [[SID[uid], lesson, ex, pts, "decided", "prof"] for uid, lesson, ex, pts in DECISIONS])
    with pytest.warns(UserWarning, match="stamped"):
        grade("toy_a", resubmitted=True)          # Smith 2 hands lesson A in again
    capsys.readouterr()

    rows = {(r["student_id"], r["assignment"]): r for r in csv.DictReader(open(out / "grades.csv"))}
    assert sorted(rows) == sorted((SID[uid], lesson) for lesson, uid in WORK), "each upload its owner's row"
    resubmitted = rows[(SID[901], "toy_a")]
    assert float(resubmitted["score"]) == 6 and "earlier attempt" in resubmitted["notes"]
    assert ALONE_NOTE in rows[(SID[77], "toy_a")]["notes"], "a timeout is graded again, alone"

    book = write_rows(tmp_path / "2026-12-06T0900_Grades-ML_101.csv", gradebook())
    code = main(["export", str(out), "--term", str(term), "--gradebook", str(book), "--lms", "canvas",
                 "--out", str(tmp_path / "filled.csv")])
    printed = capsys.readouterr().out
    assert code == 3, printed                               # some grades held back
    got, want = read_rows(tmp_path / "filled.csv"), gradebook()
    held = set()
    for r, line in enumerate(want[2:], start=2):
        uid = int(line[1])
        for c, (lesson, (_, pts)) in enumerate(LESSONS.items(), start=5):
            score, hold = rule(lesson, uid)
            if hold:
                held.add((lesson, uid))
                continue
            assert float(got[r][c]) == pytest.approx(score / 6 * pts, abs=0.005), (lesson, uid, got[r])
            want[r][c] = got[r][c]
    assert got == want, "held-back cells blank, every other cell as Canvas gave it"
    assert held == {("toy_a", 77), ("toy_b", 77), ("toy_c", 77)}
    assert "HELD BACK (1 manual review undecided, 1 rejected, not graded, 1 timed out)" in printed
