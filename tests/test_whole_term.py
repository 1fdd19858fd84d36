"""A whole term in one folder, start to end, through the command line (issue 38's Done-when).

Three lessons are graded in turn into one folder from Blackboard downloads (attempts with their
receipts, user names with ``_``, ``.`` and ``-``, a later attempt, work that is not a notebook);
the term file gives each lesson a due date and one student an extension in each; overrides.csv
changes an exercise or a total in each lesson and decides one manual review, another stays
undecided. ``report`` applies them without a kernel, and ``export`` fills a Canvas gradebook, a
Blackboard Grade Centre file and one Moodle worksheet per lesson from the same folder. Every
number written is checked against the late rule computed here, separately from the grader's.
"""
import csv
import datetime as dt
import io
import math
import shutil
import zipfile
from zoneinfo import ZoneInfo

import nbformat
import pytest

from autograder.cli import main
from toy_course import ADD_SOLUTION, MEAN_SOLUTION, MUL_SOLUTION, NOTEBOOK, make_toy_course

pytestmark = pytest.mark.slow

ZONE = ZoneInfo("Europe/Berlin")
PER_DAY, ZERO_AFTER = 0.10, 7
RIGHT = {"add": ADD_SOLUTION, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION}
WRONG_ADD = {**RIGHT, "add": "def add(a, b):\n    return a - b"}     # 4 of 6
WRONG_MUL = {**RIGHT, "mul": "def mul(a, b):\n    return a * b + 1"}  # 3 of 6
# lesson id -> (Blackboard/Moodle assignment name, Canvas id, due (Berlin), points in the LMS)
LESSONS = {"toy_a": ("Toy A", 101, dt.datetime(2026, 10, 1, 23, 59), 10),
           "toy_b": ("Toy B", 102, dt.datetime(2026, 10, 15, 23, 59), 20),
           "toy_c": ("Toy C", 103, dt.datetime(2026, 10, 29, 23, 59), 5)}
# user name -> (Canvas/Moodle id, full name)
STUDENTS = {"ann_m_1001": (1001, "Ann Marie Smith"), "bo.li_1002": (1002, "Bo Li"),
            "cy-ng_1003": (1003, "Cy Ng"), "dee_1004": (1004, "Dee Okafor")}
H = dt.timedelta(hours=1)
# (lesson, user) -> (answers or a file name that is not a notebook, hours after the due date)
WORK = {("toy_a", "ann_m_1001"): (RIGHT, -20), ("toy_a", "bo.li_1002"): (WRONG_ADD, -3),
        ("toy_a", "cy-ng_1003"): ("review", 50), ("toy_a", "dee_1004"): (RIGHT, 36),
        ("toy_b", "ann_m_1001"): (RIGHT, 36), ("toy_b", "bo.li_1002"): (WRONG_MUL, 60),
        ("toy_b", "cy-ng_1003"): ("review", -1), ("toy_b", "dee_1004"): ("essay.docx", -2),
        ("toy_c", "ann_m_1001"): (RIGHT, 70), ("toy_c", "bo.li_1002"): (RIGHT, 24 * ZERO_AFTER + 5),
        ("toy_c", "cy-ng_1003"): (WRONG_ADD, 1)}                  # dee hands in nothing for C
EXTENSIONS = {("toy_a", "cy-ng_1003"): 72, ("toy_b", "bo.li_1002"): 96, ("toy_c", "ann_m_1001"): 96}
POINTS = {"test_add": ("add", 2), "test_mul": ("mul", 3), "test_mean": ("mean", 1)}


def exercise_points(lesson, user) -> dict:
    """The tests' points of each exercise: full where the answer is the solution."""
    answers = WORK[(lesson, user)][0]
    answers = RIGHT if answers == "review" else answers
    if isinstance(answers, str):                 # not a notebook: rejected, nothing ran
        return {}
    return {t: pts if answers.get(name) == RIGHT[name] else 0 for t, (name, pts) in POINTS.items()}


# overrides.csv: one change in each lesson, and cy's lesson-A review decided (B's stays undecided)
OVERRIDES = [["bo.li_1002", "toy_a", "test_add", "1", "right idea, sign slip", "TA"],
             ["cy-ng_1003", "toy_a", "", "5", "changed a test's points; answers read by hand", "prof"],
             ["bo.li_1002", "toy_b", "test_mul", "2", "off by one", "TA"],
             ["cy-ng_1003", "toy_c", "test_add", "2", "fixed in office hours", "prof"]]
HELD = {("toy_b", "cy-ng_1003"), ("toy_b", "dee_1004")}      # undecided review, rejected work


def due(lesson, user):
    base = LESSONS[lesson][2].replace(tzinfo=ZONE)
    return base + EXTENSIONS.get((lesson, user), 0) * H


def handed_in(lesson, user):
    return LESSONS[lesson][2].replace(tzinfo=ZONE) + WORK[(lesson, user)][1] * H


def rule(lesson, user) -> float:
    """The final score by the course's rule, computed from the tables above: the tests' points,
    an override's points in place of its exercise's (or of the whole total), then 10% of that
    per started day late, 0 after seven days; rejected work scores 0."""
    points = exercise_points(lesson, user)
    if not points:
        return 0.0
    total = None
    for who, les, exercise, value, _, _ in OVERRIDES:
        if (who, les) == (user, lesson):
            if exercise:
                points[exercise] = float(value)
            else:
                total = float(value)
    raw = sum(points.values()) if total is None else total
    late = (handed_in(lesson, user) - due(lesson, user)).total_seconds()
    if late <= 0:
        return round(raw, 2)
    days = math.ceil(late / 86400)
    return 0.0 if days > ZERO_AFTER else round(raw - raw * PER_DAY * days, 2)


def blackboard_zip(path, lesson, released):
    name = LESSONS[lesson][0]
    with zipfile.ZipFile(path, "w") as zf:
        for (les, user), (answers, _) in WORK.items():
            if les != lesson:
                continue
            when = handed_in(lesson, user).replace(tzinfo=None)    # as Blackboard names it
            stamp = f"{name}_{user}_attempt_{when:%Y-%m-%d-%H-%M-%S}"
            zf.writestr(f"{stamp}.txt", f"Name: {STUDENTS[user][1]} ({user})\nAssignment: {name}\n")
            if isinstance(answers, str) and answers != "review":
                zf.writestr(f"{stamp}_{answers}", b"PK\x03\x04 not a notebook")
                continue
            nb = student_notebook(released, RIGHT if answers == "review" else answers)
            if answers == "review":        # the student raised a test's points: manual review
                cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_add")
                cell.metadata["nbgrader"]["points"] = 100
            zf.writestr(f"{stamp}_{lesson}.ipynb", nbformat.writes(nb))
            if user == "ann_m_1001":       # an earlier attempt, all wrong: the later one counts
                early = when - dt.timedelta(hours=5)
                first = f"{name}_{user}_attempt_{early:%Y-%m-%d-%H-%M-%S}"
                zf.writestr(f"{first}.txt", f"Name: {STUDENTS[user][1]} ({user})\n")
                zf.writestr(f"{first}_{lesson}.ipynb", nbformat.writes(student_notebook(released, {})))


def student_notebook(released, answers):
    from autograder.publishing.demo import student_notebook as fill
    return fill(released, answers)


def term_toml(path):
    lines = ['timezone = "Europe/Berlin"']
    for lesson, (name, _, when, _) in LESSONS.items():
        lines += [f"[lessons.{lesson}]", f"due = {when.replace(tzinfo=ZONE).isoformat()}", f'lms_column = "{name}"']
    lines += ["[late]", f"per_day = {PER_DAY}", f"zero_after_days = {ZERO_AFTER}"]
    for lesson, user in EXTENSIONS:
        lines += [f'[extensions."{user}"]', f"{lesson} = {due(lesson, user).isoformat()}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def canvas_book():
    head = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    head += [f"{name} ({cid})" for name, cid, _, _ in LESSONS.values()] + ["Final Score"]
    rows = [head, ["    Points Possible", "", "", "", ""] +
            [f"{pts:.2f}" for *_, pts in LESSONS.values()] + ["(read only)"]]
    for user, (uid, full) in STUDENTS.items():
        last, first = full.rsplit(" ", 1)[1], full.rsplit(" ", 1)[0]
        rows.append([f"{last}, {first}", str(uid), f"S{uid}", user, "ML 101"] + [""] * 3 + [""])
    rows.append(["Student, Test", "999", "", "", "ML 101", "", "", "", ""])
    return rows


def blackboard_book():
    head = ["Last Name", "First Name", "Username", "Student ID"]
    head += [f"{name} [Total Pts: {pts} Score] |{cid}" for name, cid, _, pts in LESSONS.values()]
    rows = [head]
    for user, (uid, full) in STUDENTS.items():
        rows.append([full.rsplit(" ", 1)[1], full.rsplit(" ", 1)[0], user, str(uid), "", "", ""])
    return rows


def moodle_book(lesson):
    pts = LESSONS[lesson][3]
    rows = [["Identifier", "Full name", "Email address", "Status", "Grade", "Maximum Grade",
             "Grade can be changed", "Last modified (submission)", "Last modified (grade)",
             "Feedback comments"]]
    for user, (uid, full) in STUDENTS.items():
        rows.append([f"Participant {uid}", full, f"{user}@x.edu", "Submitted for grading", "",
                     f"{pts:.2f}", "Yes", "-", "-", ""])
    return rows


def write_rows(path, rows, delimiter=",", encoding="utf-8"):
    with open(path, "w", newline="", encoding=encoding) as f:
        csv.writer(f, delimiter=delimiter).writerows(rows)
    return path


def read_rows(path, delimiter=",", encoding="utf-8-sig"):
    return list(csv.reader(io.StringIO(path.read_text(encoding=encoding), newline=""),
                           delimiter=delimiter))


def test_a_whole_term_in_one_folder_reaches_three_gradebooks(tmp_path, capsys):
    from autograder.publishing.build import build
    course = make_toy_course(tmp_path / "course")
    for lesson in LESSONS:
        (course / "solutions" / lesson).mkdir()
        (course / "solutions" / lesson / f"{lesson}.ipynb").write_bytes(
            (course / "solutions" / "toy" / NOTEBOOK).read_bytes())
    shutil.rmtree(course / "solutions" / "toy")
    build(course)
    term = term_toml(tmp_path / "term.toml")
    out = tmp_path / "term-folder"
    for lesson in LESSONS:                                    # graded in turn, into one folder
        released = nbformat.read(course / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)
        zpath = tmp_path / f"gradebook_ML101_{LESSONS[lesson][0].replace(' ', '_')}.zip"
        blackboard_zip(zpath, lesson, released)
        assert main(["--course", str(course), "grade", str(zpath), "--out", str(out),
                     "--term", str(term), "-j", "2", "--no-progress"]) == 0, capsys.readouterr()
    with open(out / "overrides.csv", "w", newline="") as f:
        csv.writer(f).writerows([["student_id", "assignment", "exercise", "points", "comment", "by"]]
                                + OVERRIDES)
    capsys.readouterr()
    assert main(["--course", str(course), "report", str(out), "--term", str(term)]) == 0
    said = capsys.readouterr()
    assert "not in this class" not in said.err and "no submission of that lesson" not in said.err

    rows = {(r["assignment"], r["student_id"]): r for r in csv.DictReader(open(out / "grades.csv"))}
    assert sorted(rows) == sorted(WORK), "every lesson kept, each student under their own name"
    for key, row in rows.items():
        assert float(row["score"]) == pytest.approx(rule(*key)), (key, row)
    assert rows[("toy_b", "cy-ng_1003")]["review"] == "undecided"
    assert rows[("toy_a", "cy-ng_1003")]["review"] == "decided"
    assert rows[("toy_b", "dee_1004")]["status"].startswith("rejected")

    def cell_rule(lesson, user, points):
        return rule(lesson, user) / 6 * points

    # Canvas: every lesson's column, one file
    book = write_rows(tmp_path / "2026-11-02T0900_Grades-ML_101.csv", canvas_book())
    args = ["export", str(out), "--term", str(term), "--gradebook"]
    assert main(args + [str(book), "--lms", "canvas", "--out", str(tmp_path / "canvas.csv"),
                        "--feedback", str(tmp_path / "canvas.zip")]) == 3, "two grades held back"
    printed = capsys.readouterr().out
    assert "HELD BACK (1 manual review undecided, 1 rejected, not graded)" in printed
    got = read_rows(tmp_path / "canvas.csv")
    want = canvas_book()
    for r, line in enumerate(want[2:-1], start=2):
        user = line[3]
        for c, lesson in enumerate(LESSONS, start=5):
            if (lesson, user) in WORK and (lesson, user) not in HELD:
                assert float(got[r][c]) == pytest.approx(cell_rule(lesson, user, LESSONS[lesson][3]),
                                                         abs=0.005), (user, lesson, got[r])
                want[r][c] = got[r][c]
    assert got == want, "held-back and missing work blank, every other cell as the LMS gave it"
    with zipfile.ZipFile(tmp_path / "canvas.zip") as zf:
        page = zf.read("toy_a/Li, Bo (bo.li_1002).html").decode()
        assert f"<span class='lms-score'>{got[3][5]}</span> of 10</strong>" in page
        assert "right idea, sign slip" in page and "(set by your instructor)" in page
        assert not any("cy-ng_1003" in n and n.startswith("toy_b") for n in zf.namelist())

    # Blackboard: the Grade Centre file, tab-separated as Work Offline downloads it
    book = write_rows(tmp_path / "gc_ML101_fullgc.xls", blackboard_book(), "\t", "utf-16")
    assert main(args + [str(book), "--lms", "blackboard", "--out", str(tmp_path / "bb.xls")]) == 3
    got, want = read_rows(tmp_path / "bb.xls", "\t", "utf-16"), blackboard_book()
    assert (tmp_path / "bb.xls").read_bytes()[:2] == book.read_bytes()[:2], "its encoding kept"
    for r, line in enumerate(want[1:], start=1):
        for c, lesson in enumerate(LESSONS, start=4):
            if (lesson, line[2]) in WORK and (lesson, line[2]) not in HELD:
                assert float(got[r][c]) == pytest.approx(cell_rule(lesson, line[2], LESSONS[lesson][3]),
                                                         abs=0.005)
                want[r][c] = got[r][c]
    assert got == want

    # Moodle: a worksheet per lesson, named after its assignment
    for lesson, (name, _, _, pts) in LESSONS.items():
        book = write_rows(tmp_path / f"Grades-ML101-{name}-7{pts}.csv", moodle_book(lesson))
        dest = tmp_path / f"moodle-{lesson}.csv"
        code = main(args + [str(book), "--lms", "moodle", "--out", str(dest)])
        assert code == (3 if lesson == "toy_b" else 0), (lesson, capsys.readouterr())
        got, want = read_rows(dest), moodle_book(lesson)
        for r, line in enumerate(want[1:], start=1):
            user = line[2].split("@")[0]
            if (lesson, user) in WORK and (lesson, user) not in HELD:
                assert float(got[r][4]) == pytest.approx(cell_rule(lesson, user, pts), abs=0.005)
                want[r][4] = got[r][4]
        assert got == want, lesson
