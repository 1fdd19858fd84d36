"""A decision belongs to an attempt; one route to a final grade (issue 52, items 4 and 5).

Nothing here grades a notebook: each test builds a graded folder as ``grade`` leaves it (a
lesson's release, class.json, the journal) and runs ``export`` / ``report``'s computation on it.
The numbers expected are computed here from the rule (score / max x the column's points).
"""
import csv
import fcntl
import importlib.util
import re
import subprocess
import sys
import warnings
from pathlib import Path

import nbformat
import pytest

from autograder.cli import main
from autograder.journal import save_result, write_manifest
from autograder.results import Result
from test_export import CANVAS, assert_cells, expected_cells, parse, term_file

LESSON = "01_running_sum"
MAXIMA = {"test_add": 2.0, "test_mul": 3.0}      # 5 points; Canvas's column is worth 10
OLD, NEW = "a" * 64, "b" * 64                    # two attempts' digests
TIMEOUT = "timed out: test_mul ran past the 60 s limit per cell (scored as failed)"


def _release(out: Path) -> None:
    _release_of(out, LESSON)


def _release_of(out: Path, lesson: str) -> None:
    nb = nbformat.v4.new_notebook()
    for gid, pts in MAXIMA.items():
        cell = nbformat.v4.new_code_cell("assert True")
        cell.metadata["nbgrader"] = {"grade": True, "grade_id": gid, "points": pts,
                                     "solution": False, "locked": True, "schema_version": 3}
        nb.cells.append(cell)
    folder = out / "work" / "release" / lesson
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{lesson}.ipynb")


def graded(tmp_path: Path, results: list) -> Path:
    """DIR as grade leaves it: the release, class.json and one journal entry per Result."""
    out = tmp_path / "graded"
    _release(out)
    for r in results:
        r.max_score = r.max_score or sum(MAXIMA.values())
        save_result(out, r.__dict__)
    write_manifest(out, [(r.student, r.assignment, r.student) for r in results],
                   {LESSON: list(MAXIMA)})
    return out


def overrides(out: Path, rows: list, header=("student_id", "assignment", "exercise", "points",
                                              "comment", "by")) -> Path:
    path = out / "overrides.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([list(header)] + rows)
    return path


def export(tmp_path, out, name="x.csv", capsys=None):
    book = tmp_path / "canvas.csv"
    book.write_bytes(CANVAS.encode())
    term = term_file(tmp_path, "01 Running sum (1234)", "(1235)", out)
    code = main(["export", str(out), "--lms", "canvas", "--gradebook", str(book), "--term",
                 str(term.path), "--out", str(tmp_path / name)])
    return code, parse((tmp_path / name).read_bytes(), "utf-8")


BEFORE = parse(CANVAS.encode(), "utf-8")
ROW = {r[1]: i for i, r in enumerate(BEFORE)}
COL = BEFORE[0].index("01 Running sum (1234)")


def test_a_decision_for_one_attempt_does_not_decide_the_next(tmp_path, capsys):
    """The issue's student: given 9 of 10 after a regrade request, resubmits a 10/10 notebook;
    the LMS gets the machine's 10 (never the 9 of the attempt before), and the report, grades.csv
    and the page say that the decision was for an earlier attempt."""
    from autograder.engine.feedback import grade_box
    from autograder.term.policy import load_final_grades
    out = graded(tmp_path, [Result("smithann_12345", LESSON, 5, digest=NEW,
                                   exercises={"test_add": 2.0, "test_mul": 3.0}),
                            Result("leeamy_9", LESSON, 2, digest=NEW,
                                   exercises={"test_add": 2.0, "test_mul": 0.0})])
    header = ("student_id", "assignment", "exercise", "points", "comment", "by", "attempt")
    overrides(out, [["smithann_12345", LESSON, "", "4.5", "regrade request", "prof", OLD],
                    ["leeamy_9", LESSON, "test_mul", "1", "close", "TA", NEW[:12]]], header)
    code, cells = export(tmp_path, out)
    assert code == 0
    assert_cells(cells, expected_cells(BEFORE, {(ROW["12345"], COL): 5 / 5 * 10,
                                                (ROW["9"], COL): 3 / 5 * 10}))
    ann, amy = sorted(load_final_grades(out), key=lambda g: g.student)[::-1]
    assert (ann.score, ann.overrides, [o.points for o in ann.stale]) == (5.0, [], [4.5])
    assert (amy.score, [o.points for o in amy.overrides], amy.stale) == (3.0, [1.0], [])
    box = grade_box(ann)
    assert "earlier attempt" in box and "4.5" in box
    assert "earlier attempt" in " ".join(ann.notes)
    from autograder.reporting.report import _statuses
    table = _statuses([{"student": g.student, "assignment": LESSON, "status": "graded"}
                       for g in (ann, amy)], {(g.student, LESSON): g for g in (ann, amy)})
    assert "decided for an earlier attempt" in table and "aaaaaaaaaaaa" in table


def test_keeping_the_machines_score_is_a_decision_of_its_own(tmp_path, capsys):
    """``keep`` in the points cell decides a review with the machine's score: exported, shown as
    kept (not as a total typed in), and for that attempt only."""
    from autograder.engine.feedback import grade_box
    from autograder.term.policy import load_final_grades
    out = graded(tmp_path, [Result("smithann_12345", LESSON, 3, digest=NEW,
                                   status="needs manual review: the kernel printed a score",
                                   exercises={"test_add": 2.0, "test_mul": 1.0}),
                            Result("smithann_777", LESSON, 4, digest=NEW,
                                   status="needs manual review: the kernel printed a score",
                                   exercises={"test_add": 2.0, "test_mul": 2.0})])
    header = ("student_id", "assignment", "exercise", "points", "comment", "by", "attempt")
    overrides(out, [["smithann_12345", LESSON, "", "keep", "checked by hand", "prof", NEW],
                    ["smithann_777", LESSON, "", "keep", "", "prof", OLD]], header)
    code, cells = export(tmp_path, out)
    assert code == 3                                  # 777's keep was for another attempt
    assert "manual review undecided" in capsys.readouterr().out
    assert_cells(cells, expected_cells(BEFORE, {(ROW["12345"], COL): 3 / 5 * 10}))
    ann = {g.student: g for g in load_final_grades(out)}["smithann_12345"]
    assert (ann.score, ann.review, ann.override_text) == (3.0, "decided", "kept the tests' score")
    box = grade_box(ann)
    assert "kept the tests' score" in box and "set to" not in box
    with pytest.raises(Exception, match="keep"):      # keep decides a lesson, not an exercise
        overrides(out, [["smithann_12345", LESSON, "test_mul", "keep", "", ""]])
        load_final_grades(out)


def test_a_row_written_before_attempts_is_stamped_with_the_attempt_graded_then(tmp_path, capsys):
    """overrides.csv of six columns keeps working for the attempt graded when it is read, and is
    stamped with it then, saying so; the next attempt finds it stale."""
    from autograder.term.policy import load_final_grades
    out = graded(tmp_path, [Result("smithann_12345", LESSON, 5, digest=OLD)])
    path = overrides(out, [["smithann_12345", LESSON, "", "4.5", "regrade request", "prof"]])
    with pytest.warns(UserWarning, match=r"line 2.*stamped with attempt aaaaaaaa"):
        (g,) = load_final_grades(out)
    assert g.score == 4.5
    rows = list(csv.reader(path.open()))
    assert rows[0][-1] == "attempt" and rows[1] == ["smithann_12345", LESSON, "", "4.5",
                                                    "regrade request", "prof", OLD]
    with warnings.catch_warnings():
        warnings.simplefilter("error")                # stamped once: nothing more to say
        assert load_final_grades(out)[0].score == 4.5
    save_result(out, {**Result("smithann_12345", LESSON, 5, 5, digest=NEW).__dict__})
    (g,) = load_final_grades(out)
    assert (g.score, [o.points for o in g.stale]) == (5.0, [4.5])


def test_a_timed_out_submission_is_held_back_until_decided(tmp_path, capsys):
    out = graded(tmp_path, [Result("smithann_12345", LESSON, 2, digest=NEW,
                                   status="timed out: test_mul ran past the 60 s limit per cell "
                                          "(scored as failed)",
                                   exercises={"test_add": 2.0, "test_mul": 0.0}),
                            Result("leeamy_9", LESSON, 2, digest=NEW)])
    code, cells = export(tmp_path, out)
    printed = capsys.readouterr()
    assert code == 3 and "HELD BACK (1 timed out)" in printed.out
    assert "held back (undecided, timed out or rejected)" in printed.err
    assert_cells(cells, expected_cells(BEFORE, {(ROW["9"], COL): 2 / 5 * 10}))
    overrides(out, [["smithann_12345", LESSON, "test_mul", "3", "slow machine", "prof"]])
    code, cells = export(tmp_path, out, "y.csv")
    assert code == 0 and "HELD BACK" not in capsys.readouterr().out
    assert_cells(cells, expected_cells(BEFORE, {(ROW["12345"], COL): 5 / 5 * 10,
                                                (ROW["9"], COL): 2 / 5 * 10}))


def test_canvas_push_holds_a_timed_out_submission_back(tmp_path):
    """push's plan (what it would post) leaves out a timed-out submission until decided, and
    posts a stale decision's new attempt at the machine's score."""
    from types import SimpleNamespace as NS

    from autograder.term.canvas_sync import plan_push
    out = graded(tmp_path, [Result("smithann_12345", LESSON, 2, digest=NEW, status=TIMEOUT,
                                   exercises={"test_add": 2.0, "test_mul": 0.0}),
                            Result("leeamy_9", LESSON, 5, digest=NEW)])
    header = ("student_id", "assignment", "exercise", "points", "comment", "by", "attempt")
    overrides(out, [["leeamy_9", LESSON, "", "1", "", "", OLD]], header)
    subs = [NS(user_id=12345, score=None, submission_comments=[]),
            NS(user_id=9, score=None, submission_comments=[])]
    session = NS(assignment=lambda c, a: (None, NS(points_possible=10,
                                                   get_submissions=lambda **k: subs)),
                 listing=lambda what, items: list(items))
    plan = plan_push(session, out, 1, 2, LESSON)
    assert [h[0] for h in plan.held] == ["smithann_12345"] and plan.held[0][1].startswith("timed out")
    assert [(s["student"], s["score"]) for s in plan.steps] == [("leeamy_9", "10")]
    overrides(out, [["smithann_12345", LESSON, "", "keep", "", "", NEW]], header)
    plan = plan_push(session, out, 1, 2, LESSON)
    assert plan.held == [] and sorted((s["student"], s["score"]) for s in plan.steps) == [
        ("leeamy_9", "10"), ("smithann_12345", "4")]


def test_a_timeout_is_never_filed_under_a_catalogued_mistake(tmp_path):
    """A test that ran out of time says so, whatever its output happened to quote."""
    from autograder.mistakes import Mistake
    from autograder.reporting.insights import TIMED_OUT_MISTAKE, _student_insights
    from autograder.release import Exercise

    class Lesson:
        assignment, notebooks = LESSON, ["x.ipynb"]
        exercises = [Exercise("test_mul", "mul", 3.0)]
        mistakes = {"mul-plus-one": Mistake("mul-plus-one", "test_mul", "off by one")}
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("assert mul(2, 3) == 6, 'off by one'")
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "test_mul", "points": 3.0,
                                 "solution": False, "locked": True, "schema_version": 3}
    cell.outputs = [nbformat.v4.new_output("error", ename="AssertionError",
                                           evalue="off by one", traceback=[])]
    nb.cells.append(cell)
    (tmp_path / "autograded" / "ann" / LESSON).mkdir(parents=True)
    nbformat.write(nb, tmp_path / "autograded" / "ann" / LESSON / "x.ipynb")
    res = {"student": "ann", "assignment": LESSON, "exercises": {"test_mul": 0.0},
           "status": "timed out: test_mul ran past the 60 s limit per cell (scored as failed)"}
    (row,), _ = _student_insights(tmp_path, Lesson, res, "ann")
    assert row.mistake == TIMED_OUT_MISTAKE


def _parser_flags() -> set:
    import argparse

    from autograder import cli
    flags, todo = set(), [cli.parser()]
    while todo:
        p = todo.pop()
        for action in p._actions:
            flags.update(s for s in action.option_strings if s.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                todo += list(action.choices.values())
    return flags


ADVICE = re.compile(r"(?:`[^`]*|with|a larger|rerun with|regrade with|pass|use|add)\s+(--[a-z][a-z-]+)")

OTHER_PROGRAM = re.compile(r"\b(bwrap|bubblewrap|pip install)\b")


def test_every_flag_the_grader_advises_exists():
    """Every ``--flag`` a message of the grader advises (in backquotes, or after "with", "a
    larger", "use", "pass", "add") is one of the command line's own."""
    flags = _parser_flags()
    root = Path(__file__).resolve().parents[1] / "autograder"
    advised = {}
    for path in root.rglob("*.py"):
        text = path.read_text()
        for m in ADVICE.finditer(text):
            if OTHER_PROGRAM.search(text[max(0, m.start() - 40):m.start(1)]):
                continue       # another program's option (bwrap --seccomp, pip install --no-deps)
            advised.setdefault(m.group(1), []).append(str(path.relative_to(root)))
    missing = {f: where for f, where in advised.items() if f not in flags}
    assert "--timeout" in flags and not missing


def test_grades_csv_of_an_unfinished_run_is_the_reports(tmp_path):
    """The rows grade writes while it runs (and leaves when interrupted or when its report step
    fails) are the ones report writes: the Moodle worksheet's times are read by both."""
    from autograder.grading.grade import write_csv
    from autograder.term.policy import final_grades, with_worksheet_times
    from autograder.term.termfile import load_term
    sheet = tmp_path / "worksheet.csv"
    sheet.write_text('"Identifier","Full name","Status","Grade","Last modified (submission)"\n'
                     '"Participant 1001","Ann Smith","Submitted","","Friday, 9 October 2026, 11:00 PM"\n')
    path = tmp_path / "t.toml"
    path.write_text(f'timezone = "Europe/Berlin"\n[late]\nper_day = 0.1\n[lessons.{LESSON}]\n'
                    'due = 2026-10-01T23:59:00+02:00\nmoodle_worksheet = "worksheet.csv"\n')
    term = load_term(path, [LESSON])
    res = Result("Ann Smith_1001", LESSON, 5, 5)
    write_csv(tmp_path / "grades.csv", [res], [], term=term)
    (row,) = csv.DictReader((tmp_path / "grades.csv").open())
    (want,) = final_grades(with_worksheet_times([res.__dict__], term), term)
    assert want.late_penalty > 0
    assert float(row["score"]) == want.score and row["submitted_at"] == want.submitted_at


def test_a_second_grade_into_a_folder_in_use_stops_with_a_message(tmp_path, capsys):
    """A folder another ``grade`` is writing into: a second grade, a report and an export stop at
    once (exit 2), naming it."""
    from autograder.journal import FOLDER_LOCK
    out = tmp_path / "graded"
    out.mkdir()
    with open(out / FOLDER_LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = subprocess.run([sys.executable, "-m", "autograder", "grade", str(tmp_path / "none"),
                               "--out", str(out)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert "in use" in done.stderr and str(out) in done.stderr
        done = subprocess.run([sys.executable, "-m", "autograder", "report", str(out)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "in use" in done.stderr
        book = tmp_path / "canvas.csv"       # export would read half a run's results
        book.write_bytes(CANVAS.encode())
        code = main(["export", str(out), "--lms", "canvas", "--gradebook", str(book), "--out",
                     str(tmp_path / "x.csv")])
        assert code == 2 and not (tmp_path / "x.csv").exists() and "in use" in capsys.readouterr().err
        if importlib.util.find_spec("canvasapi"):     # push stops before it asks Canvas anything
            token = tmp_path / "token"
            token.write_text("7~tok")
            token.chmod(0o600)
            capsys.readouterr()
            code = main(["canvas", "push", str(out), "3", "77", "--url", "http://127.0.0.1:9",
                         "--token-file", str(token)])
            assert code == 2 and "in use" in capsys.readouterr().err


# ------------------------------------------------------------------ a whole term, decided

TERM_LESSONS = {"01_running_sum": ("L1 (201)", 10, "2026-10-01T23:59:00+00:00"),
                "02_fixed_state_recall": ("L2 (202)", 20, "2026-10-15T23:59:00+00:00"),
                "03_gates_and_delta_rule": ("L3 (203)", 5, "2026-10-29T23:59:00+00:00")}
REVIEW = "needs manual review: the kernel printed a score"
# (student, lesson) -> (test_add, test_mul, status, attempt, hours after the due date)
TERM_WORK = {
    ("ann_1001", "01_running_sum"): (2, 3, "graded", NEW, -5),     # decided 4, then resubmitted
    ("bo_1002", "01_running_sum"): (2, 0, "graded", NEW, 30),      # an exercise changed, late
    ("cy_1003", "01_running_sum"): (2, 1, REVIEW, NEW, -1),        # review: the score kept
    ("dee_1004", "01_running_sum"): (2, 0, TIMEOUT, NEW, -1),      # timed out, undecided
    ("ann_1001", "02_fixed_state_recall"): (2, 0, TIMEOUT, NEW, -2),   # timed out, decided
    ("bo_1002", "02_fixed_state_recall"): (2, 2, REVIEW, NEW, -2),     # kept, then resubmitted
    ("cy_1003", "02_fixed_state_recall"): (2, 3, "graded", NEW, 3),    # a row from before attempts
    ("dee_1004", "02_fixed_state_recall"): (0, 0, "rejected: no notebook", NEW, -2),
    ("ann_1001", "03_gates_and_delta_rule"): (2, 3, "graded", NEW, 200),   # past 7 days: 0
    ("bo_1002", "03_gates_and_delta_rule"): (0, 3, TIMEOUT, NEW, -3),      # timed out, kept
    ("cy_1003", "03_gates_and_delta_rule"): (2, 0, "graded", NEW, -3),     # decided again
}
# overrides.csv: (student, lesson, exercise, points, attempt)
TERM_DECISIONS = [("ann_1001", "01_running_sum", "", "4", OLD),
                  ("bo_1002", "01_running_sum", "test_mul", "1", NEW),
                  ("cy_1003", "01_running_sum", "", "keep", NEW[:8]),
                  ("ann_1001", "02_fixed_state_recall", "test_mul", "3", NEW),
                  ("bo_1002", "02_fixed_state_recall", "", "keep", OLD),
                  ("cy_1003", "02_fixed_state_recall", "", "4.5", ""),
                  ("bo_1002", "03_gates_and_delta_rule", "", "keep", NEW),
                  ("cy_1003", "03_gates_and_delta_rule", "test_add", "0", OLD),
                  ("cy_1003", "03_gates_and_delta_rule", "test_mul", "1.5", NEW)]


def term_rule(student, lesson):
    """(final score, held) by the rule, from the tables above: decisions of the attempt graded
    (or of none, read now), exercise points replaced or the total set (keep: the tests' score),
    10% per started day late, 0 after 7 days; a review or a timeout undecided and rejected work
    without a decision are held back."""
    import datetime as dt
    import math
    add, mul, status, attempt, hours = TERM_WORK[(student, lesson)]
    mine = [d for d in TERM_DECISIONS if d[:2] == (student, lesson)
            and (not d[4] or attempt.startswith(d[4]))]
    if status.startswith(("needs manual review", "timed out", "rejected")) and not mine:
        return None, True
    points, total = {"test_add": add, "test_mul": mul}, None
    for _, _, exercise, value, _ in mine:
        if value == "keep":
            continue
        if exercise:
            points[exercise] = float(value)
        else:
            total = float(value)
    raw = 0.0 if status.startswith("rejected") else sum(points.values()) if total is None else total
    late = hours * 3600
    if late <= 0 or status.startswith("rejected"):
        return round(raw, 2), False
    days = math.ceil(late / 86400)
    return (0.0 if days > 7 else round(raw - raw * 0.1 * days, 2)), False


def test_a_whole_term_exports_exactly_the_decided_grades(tmp_path, capsys):
    """Three lessons in one folder; an attempt decided then resubmitted, a kept score, a timed-out
    submission decided and one not, a row from before attempts, rejected work and late work:
    export fills exactly the decided grades, each the rule's, and holds back the rest."""
    import datetime as dt
    out = tmp_path / "graded"
    entries = []
    for (student, lesson), (add, mul, status, attempt, hours) in TERM_WORK.items():
        _release_of(out, lesson)
        when = dt.datetime.fromisoformat(TERM_LESSONS[lesson][2]) + dt.timedelta(hours=hours)
        rejected = status.startswith("rejected")
        save_result(out, Result(student, lesson, 0 if rejected else add + mul, 5.0, status,
                                {} if rejected else {"test_add": add, "test_mul": mul},
                                digest=attempt, submitted_at=when.isoformat(),
                                submitted_at_source="nbgrader timestamp.txt").__dict__)
        entries.append((student, lesson, student))
    write_manifest(out, entries, {lesson: list(MAXIMA) for lesson in TERM_LESSONS})
    header = ("student_id", "assignment", "exercise", "points", "comment", "by", "attempt")
    overrides(out, [[s, a, e, p, "", "prof", t] for s, a, e, p, t in TERM_DECISIONS], header)
    term = tmp_path / "term.toml"
    term.write_text('timezone = "UTC"\n[late]\nper_day = 0.1\nzero_after_days = 7\n' + "".join(
        f'[lessons.{a}]\ndue = {due}\nlms_column = "{col}"\n'
        for a, (col, _, due) in TERM_LESSONS.items()))
    head = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"] + \
        [col for col, _, _ in TERM_LESSONS.values()]
    students = sorted({s for s, _ in TERM_WORK})
    book_rows = [head, ["    Points Possible", "", "", "", ""] +
                 [f"{pts:.2f}" for _, pts, _ in TERM_LESSONS.values()]] + \
        [[f"Student, {s}", s.split("_")[1], "", s, "A", "", "", ""] for s in students]
    book = tmp_path / "canvas.csv"
    with open(book, "w", newline="") as f:
        csv.writer(f).writerows(book_rows)
    with pytest.warns(UserWarning, match="stamped"):
        code = main(["export", str(out), "--lms", "canvas", "--gradebook", str(book), "--term",
                     str(term), "--out", str(tmp_path / "filled.csv")])
    printed = capsys.readouterr().out
    assert code == 3
    got = list(csv.reader((tmp_path / "filled.csv").open(newline="")))
    held = set()
    for r, student in enumerate(students, start=2):
        for c, (lesson, (_, pts, _)) in enumerate(TERM_LESSONS.items(), start=5):
            if (student, lesson) not in TERM_WORK:
                assert got[r][c] == "", (student, lesson)
                continue
            score, hold = term_rule(student, lesson)
            if hold:
                held.add((student, lesson))
                assert got[r][c] == "", (student, lesson, got[r][c])
            else:
                assert float(got[r][c]) == pytest.approx(score / 5 * pts, abs=0.005), \
                    (student, lesson, got[r][c], score)
    assert held == {("dee_1004", "01_running_sum"), ("bo_1002", "02_fixed_state_recall"),
                    ("dee_1004", "02_fixed_state_recall")}
    assert "HELD BACK (1 manual review undecided, 1 rejected, not graded, 1 timed out)" in printed
    stamped = list(csv.reader((out / "overrides.csv").open()))
    assert stamped[6][:4] + stamped[6][6:] == ["cy_1003", "02_fixed_state_recall", "", "4.5", NEW]


# ------------------------------------------------- through `grade` (the kernel replaced)

def _fake_grade(self, job):
    """Score the toy answers as its tests would (add 2, mul 3, mean 1) without a kernel."""
    from toy_course import ADD_SOLUTION, MEAN_SOLUTION, MUL_SOLUTION
    res = job.result
    src = "\n".join(c.source for nb in job.notebooks.values() for c in nb.cells)
    res.exercises = {"test_add": 2.0 * (ADD_SOLUTION in src), "test_mul": 3.0 * (MUL_SOLUTION in src),
                     "test_mean": 1.0 * (MEAN_SOLUTION in src)}
    res.score, res.max_score = sum(res.exercises.values()), 6.0
    return res


def test_grade_stamps_a_row_with_the_attempt_it_had_before_grading_a_new_one(tmp_path, monkeypatch,
                                                                             capsys):
    """A row written without an attempt after the first run decides that run's attempt: the
    second run, grading a resubmission, stamps it with the earlier attempt (saying so) and
    grades.csv, written while it runs and by its report step, shows the new attempt's machine
    score with the decision stale. The same bytes graded again keep the decision."""
    from autograder.publishing.build import build
    from autograder.publishing.demo import student_notebook
    from toy_course import ADD_SOLUTION, ASSIGNMENT, MUL_SOLUTION, NOTEBOOK, make_toy_course
    monkeypatch.setattr("autograder.grading.grade.Grader.grade", _fake_grade)
    root = make_toy_course(tmp_path / "course")
    build(root)
    released = nbformat.read(root / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    dest = tmp_path / "class" / "ann" / ASSIGNMENT / NOTEBOOK
    dest.parent.mkdir(parents=True)
    nbformat.write(student_notebook(released, {"add": ADD_SOLUTION}), dest)
    out = tmp_path / "out"
    args = ["--course", str(root), "grade", str(tmp_path / "class"), "--out", str(out),
            "--no-progress"]
    assert main(args) == 0
    first = {r["student_id"]: r for r in csv.DictReader((out / "grades.csv").open())}["ann"]
    assert first["score"] == "2.0"
    overrides(out, [["ann", ASSIGNMENT, "", "4", "regrade request", "prof"]])
    assert main(args) == 0                                   # the same bytes: decided
    capsys.readouterr()
    (row,) = csv.DictReader((out / "grades.csv").open())
    assert (row["score"], row["override"]) == ("4.0", "total=4")
    nbformat.write(student_notebook(released, {"add": ADD_SOLUTION, "mul": MUL_SOLUTION}), dest)
    assert main(args) == 0                                   # a new attempt: not decided by it
    (row,) = csv.DictReader((out / "grades.csv").open())
    assert (row["score"], row["override"]) == ("5.0", ""), row
    assert "earlier attempt" in row["notes"]
    stamped = list(csv.reader((out / "overrides.csv").open()))
    assert stamped[0][-1] == "attempt" and len(stamped[1][-1]) == 64


def test_an_interrupted_run_and_a_failed_report_step_leave_the_reports_grades(tmp_path, monkeypatch):
    """A term whose submission times come from a Moodle worksheet: grades.csv after a run cut
    short before its report step, and after a run whose report step failed, holds the late
    penalty the worksheet's time gives, as report writes it."""
    from autograder.publishing.build import build
    from autograder.publishing.demo import student_notebook
    from toy_course import ADD_SOLUTION, ASSIGNMENT, MUL_SOLUTION, NOTEBOOK, make_toy_course
    root = make_toy_course(tmp_path / "course")
    build(root)
    released = nbformat.read(root / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    for student in ("ann_1001", "bo_1002"):
        dest = tmp_path / "class" / student / ASSIGNMENT / NOTEBOOK
        dest.parent.mkdir(parents=True)
        nbformat.write(student_notebook(released, {"add": ADD_SOLUTION, "mul": MUL_SOLUTION}), dest)
    (tmp_path / "worksheet.csv").write_text(
        '"Identifier","Full name","Status","Grade","Last modified (submission)"\n'
        '"Participant 1001","Ann","Submitted","","Friday, 2 October 2026, 11:00 PM"\n')
    term = tmp_path / "term.toml"
    term.write_text(f'timezone = "UTC"\n[late]\nper_day = 0.1\n[lessons.{ASSIGNMENT}]\n'
                    'due = 2026-10-01T23:59:00+00:00\nmoodle_worksheet = "worksheet.csv"\n')
    want = round(5 - 5 * 0.1 * 1, 2)                    # 23 hours late: 1 started day

    def cut_at_bo(self, job):
        if job.sub.student.startswith("bo"):
            raise KeyboardInterrupt
        return _fake_grade(self, job)
    monkeypatch.setattr("autograder.grading.grade.Grader.grade", cut_at_bo)
    out = tmp_path / "out"
    args = ["--course", str(root), "grade", str(tmp_path / "class"), "--out", str(out),
            "--term", str(term), "--no-progress"]
    assert main(args) == 130
    rows = {r["student_id"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert float(rows["ann_1001"]["score"]) == want and rows["ann_1001"]["days_late"] == "1"

    def no_report(*a, **k):
        raise RuntimeError("a broken report")
    monkeypatch.setattr("autograder.grading.grade.Grader.grade", _fake_grade)
    monkeypatch.setattr("autograder.grading.grade.write_class_outputs", no_report)
    with pytest.warns(UserWarning, match="class report could not be written"):
        assert main(args) == 0
    rows = {r["student_id"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert float(rows["ann_1001"]["score"]) == want and float(rows["bo_1002"]["score"]) == 5


def test_grades_summary_says_what_a_timeout_needs():
    from autograder.grading.console import summary_lines
    lines = summary_lines([Result("ann", LESSON, 2, 5, TIMEOUT)], 1.0, Path("/nowhere"), [])
    said = "\n".join(lines)
    assert "1 submission(s) timed out" in said and "hold them back" in said
    assert set(re.findall(r"--[a-z-]+", said)) <= _parser_flags()


def test_a_row_added_to_a_stamped_file_may_leave_the_attempt_out(tmp_path):
    """An editor appends six cells to a file the grader stamped (seven columns): the row is
    read, and stamped in its turn; five cells are still refused with their line."""
    from autograder.term.policy import OverrideError, load_final_grades
    out = graded(tmp_path, [Result("smithann_12345", LESSON, 5, digest=NEW,
                                   exercises={"test_add": 2.0, "test_mul": 3.0})])
    header = ("student_id", "assignment", "exercise", "points", "comment", "by", "attempt")
    path = overrides(out, [["smithann_12345", LESSON, "test_add", "1", "", "", OLD]], header)
    with open(path, "a", newline="") as f:
        csv.writer(f).writerow(["smithann_12345", LESSON, "test_mul", "2", "", ""])
    with pytest.warns(UserWarning, match="line 3"):
        (g,) = load_final_grades(out)
    assert (g.score, [o.exercise for o in g.stale]) == (4.0, ["test_add"])
    assert list(csv.reader(path.open()))[2][-1] == NEW
    with open(path, "a", newline="") as f:
        csv.writer(f).writerow(["smithann_12345", LESSON, "test_mul", "2", ""])
    with pytest.raises(OverrideError, match="line 4: 5 cells, expected 6 or 7"):
        load_final_grades(out)
