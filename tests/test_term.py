"""A term: due dates, late work, extensions, overrides and manual review (issue 24, items 1-2).

Fast tests check the late rule, overrides.csv's checks and the final grade rows on records
built here. The slow one grades a toy class with due dates once, then changes an extension and
an override and runs ``report --term`` with every way of starting a kernel made to fail.
"""
import csv
import datetime as dt
import math
import re
from pathlib import Path

import nbformat
import pytest

from autograder.cli import main
from autograder.grading.grade import SANDBOX_PREPROCESSORS, grade_class
from autograder.results import GRADE_COLUMNS, NEEDS_REVIEW, Result, Status
from autograder.term.policy import (OVERRIDE_COLUMNS, Override, OverrideError, final_grades,
                                    late_penalty, load_final_grades, read_overrides)
from autograder.term.termfile import load_term
from toy_course import ADD_SOLUTION, ASSIGNMENT, MEAN_SOLUTION, MUL_SOLUTION, NOTEBOOK, make_toy_course

UTC = dt.timezone.utc
DUE = dt.datetime(2026, 10, 1, 23, 59, tzinfo=dt.timezone(dt.timedelta(hours=2)))
PER_DAY, ZERO_AFTER = 0.10, 7
MAXIMA = {"test_add": 2.0, "test_mul": 3.0, "test_mean": 1.0}


def expected(raw: float, submitted: dt.datetime, due: dt.datetime = DUE) -> float:
    """The documented rule, written out again here: per_day of the raw score per started day
    late, 0 past ZERO_AFTER days, rounded to 0.01 point."""
    late = (submitted - due).total_seconds()
    if late <= 0:
        return raw
    if late > ZERO_AFTER * 86400:
        return 0.0
    return round(raw - min(raw, raw * PER_DAY * math.ceil(late / 86400)), 2)


def term_text(extension: dt.datetime) -> str:
    return (f'timezone = "Europe/Berlin"\n[lessons.{ASSIGNMENT}]\ndue = {DUE.isoformat()}\n'
            f'lms_column = "Toy (1234)"\n[late]\nper_day = {PER_DAY}\nzero_after_days = {ZERO_AFTER}\n'
            f'[extensions."cat_extension"]\n{ASSIGNMENT} = {extension.isoformat()}\n'
            f'[extensions."zoe_typo"]\n{ASSIGNMENT} = {extension.isoformat()}\n')


def write_overrides(path: Path, rows: list) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(OVERRIDE_COLUMNS)
        w.writerows(rows)
    return path


# --------------------------------------------------------------------------------- fast

def test_late_penalty_counts_started_days_and_zeroes_past_the_limit(tmp_path):
    term = load_term(_term_file(tmp_path, DUE + dt.timedelta(days=3)), [ASSIGNMENT])
    for hours in (-5, 0, 0.01, 23.9, 24, 24.5, 47, 48.2, 24 * 7, 24 * 7 + 0.1, 24 * 30):
        when = DUE + dt.timedelta(hours=hours)
        penalty, days = late_penalty(6.0, (when - DUE).total_seconds(), term)
        assert round(6.0 - penalty, 2) == expected(6.0, when), hours
        assert days == max(0, math.ceil(hours / 24)), hours


def _term_file(tmp_path, extension) -> Path:
    path = tmp_path / "term.toml"
    path.write_text(term_text(extension))
    return path


def test_final_grades_apply_extensions_overrides_and_unknown_times(tmp_path):
    term = load_term(_term_file(tmp_path, DUE + dt.timedelta(days=2)), [ASSIGNMENT])
    late2 = DUE + dt.timedelta(days=1, hours=3)          # 2 started days
    results = [
        Result("ann", ASSIGNMENT, 6, 6, exercises=dict(MAXIMA), submitted_at=DUE.isoformat()),
        Result("bob", ASSIGNMENT, 4, 6, exercises={**MAXIMA, "test_add": 0},
               submitted_at=late2.isoformat(), submitted_at_source="nbgrader timestamp.txt"),
        Result("cat_extension", ASSIGNMENT, 6, 6, exercises=dict(MAXIMA),
               submitted_at=late2.isoformat()),
        Result("dan", ASSIGNMENT, 6, 6, exercises=dict(MAXIMA)),
        Result("eve", ASSIGNMENT, 6, 6, status="needs manual review: grader settings changed",
               exercises=dict(MAXIMA), submitted_at=DUE.isoformat()),
        Result("fay", ASSIGNMENT, 3, 6, exercises={**MAXIMA, "test_mul": 0},
               submitted_at="2026-10-02T23:00:00"),
        Result("gil", ASSIGNMENT, 6, 6, status="needs manual review: x", exercises=dict(MAXIMA)),
    ]
    overrides = [Override("eve", ASSIGNMENT, "", 5, "checked by hand", "prof"),
                 Override("fay", ASSIGNMENT, "test_mul", 2, "off by one")]
    rows = {r.student: r for r in final_grades(results, term, overrides)}
    assert rows["ann"].score == 6 and rows["ann"].late_penalty == 0
    assert rows["bob"].days_late == 2 and rows["bob"].score == expected(4, late2)
    assert rows["bob"].late_penalty == pytest.approx(4 - expected(4, late2))
    assert rows["cat_extension"].score == 6, "the extension moves the due date"
    assert rows["dan"].score == 6 and "submission time unknown" in "; ".join(rows["dan"].notes)
    assert rows["eve"].score == 5 and rows["eve"].review == "decided"
    assert rows["eve"].status == Status(NEEDS_REVIEW, "grader settings changed")
    assert rows["gil"].score == 6 and rows["gil"].review == "undecided", "machine score stands"
    # fay's time has no zone (a Blackboard wall clock): it is read in the term's Europe/Berlin
    # (UTC+2 in October), not in UTC.
    berlin = dt.datetime(2026, 10, 2, 23, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert rows["fay"].raw_score == 5 and rows["fay"].exercises["test_mul"] == 2
    assert rows["fay"].score == expected(5, berlin) != expected(5, berlin.replace(tzinfo=UTC))
    assert rows["fay"].days_late == math.ceil((berlin - DUE).total_seconds() / 86400)


@pytest.mark.parametrize("row, message", [
    (["nobody", ASSIGNMENT, "", "1", "", ""], "line 2: no student 'nobody'"),
    (["ann", "99_nope", "", "1", "", ""], "line 2: no lesson '99_nope'"),
    (["ann", ASSIGNMENT, "test_div", "1", "", ""], "line 2: lesson 'toy' has no exercise 'test_div'"),
    (["ann", ASSIGNMENT, "test_add", "two", "", ""], "line 2: points 'two' is not a number"),
    (["ann", ASSIGNMENT, "test_add", "3", "", ""], "line 2: points 3 is outside 0 to 2"),
    (["ann", ASSIGNMENT, "", "7", "", ""], "line 2: points 7 is outside 0 to 6"),
    (["ann", ASSIGNMENT, "", "-1", "", ""], "outside 0 to 6"),
    (["ann", ASSIGNMENT, "1"], "line 2: 3 cells, expected 6"),
])
def test_a_bad_override_row_names_its_line(tmp_path, row, message):
    path = write_overrides(tmp_path / "overrides.csv", [row])
    with pytest.raises(OverrideError, match=message):
        read_overrides(path, {("ann", ASSIGNMENT): MAXIMA})


def test_overrides_read_comments_repeats_and_header(tmp_path):
    known = {("ann", ASSIGNMENT): MAXIMA}
    assert read_overrides(tmp_path / "none.csv", known) == []
    path = write_overrides(tmp_path / "o.csv", [["ann", ASSIGNMENT, "", "4.5", "late, but ok", "TA"],
                                                [], ["ann", ASSIGNMENT, "test_add", "1", "", ""]])
    got = read_overrides(path, known)
    assert [(o.exercise, o.points, o.comment, o.by, o.line) for o in got] == [
        ("", 4.5, "late, but ok", "TA", 2), ("test_add", 1.0, "", "", 4)]
    write_overrides(path, [["ann", ASSIGNMENT, "", "1", "", ""], ["ann", ASSIGNMENT, "", "2", "", ""]])
    with pytest.raises(OverrideError, match="line 3 repeats line 2"):
        read_overrides(path, known)
    odd = {("=cmd|x", ASSIGNMENT): MAXIMA}   # copied from grades.csv with its apostrophe
    write_overrides(path, [["'=cmd|x", ASSIGNMENT, "", "1", "", ""]])
    assert read_overrides(path, odd)[0].student == "=cmd|x"
    path.write_text("student,lesson,points\n")
    with pytest.raises(OverrideError, match="line 1: the header must be"):
        read_overrides(path, known)


def test_an_unknown_canvas_time_reads_once_and_one_point_is_singular(tmp_path):
    from autograder.lms.canvas import CANVAS_LATE_SOURCE
    term = load_term(_term_file(tmp_path, DUE), [ASSIGNMENT])
    late = DUE + dt.timedelta(hours=3)      # 1 started day: 10% of 10 points is 1 point
    canvas, plain, one = final_grades([
        Result("doejohn_222", ASSIGNMENT, 6, 6, submitted_at_source=CANVAS_LATE_SOURCE),
        Result("dan", ASSIGNMENT, 6, 6),
        Result("ann", ASSIGNMENT, 10, 10, submitted_at=late.isoformat())], term)
    assert canvas.late_note == ("submission time unknown (Canvas marked it _LATE_, its file "
                                "names carry no time): no late penalty applied")
    assert canvas.submitted_at_source == CANVAS_LATE_SOURCE      # grades.csv keeps it as it was
    assert plain.late_note == "submission time unknown: no late penalty applied"
    assert one.late_penalty == 1 and ": -1 point (10% of 10" in one.late_note


def test_a_bad_timezone_is_a_clear_error(tmp_path):
    from autograder.term.termfile import TermError
    path = tmp_path / "t.toml"
    path.write_text('timezone = "Mars/Olympus"\n')
    with pytest.raises(TermError, match="not a time zone name"):
        load_term(path, [ASSIGNMENT])


NAMES = {ASSIGNMENT: [NOTEBOOK]}
NB = b'{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'


def submission_times(source: Path, tmp_path: Path) -> dict:
    """student -> (submitted_at, source) as grade records them, from collect alone."""
    from autograder.intake.collect import choose_notebook, collect
    from autograder.grading.grade import _submitted_at
    subs = collect(source, [ASSIGNMENT], tmp_path / "unpacked", NAMES)
    return {s.student: _submitted_at(s, choose_notebook(s, NOTEBOOK, True, [])) for s in subs}


def test_submission_times_come_from_timestamp_txt_blackboard_and_canvas(tmp_path):
    import zipfile
    folder = tmp_path / "class"
    for student, stamp in (("ann", "2026-10-01 21:00:00.123456 UTC"), ("bob", None),
                           ("cat", "not a date")):
        (folder / student / ASSIGNMENT).mkdir(parents=True)
        (folder / student / ASSIGNMENT / NOTEBOOK).write_bytes(NB)
        if stamp:
            (folder / student / ASSIGNMENT / "timestamp.txt").write_text(stamp)
    got = submission_times(folder, tmp_path / "f")
    assert got["ann"] == ("2026-10-01T21:00:00.123456+00:00", "nbgrader timestamp.txt")
    assert got["bob"] == ("", "") and got["cat"][0] == "" and "not a date" in got["cat"][1]
    bb = tmp_path / "bb.zip"
    with zipfile.ZipFile(bb, "w") as zf:
        zf.writestr(f"HW 1_jsmith_attempt_2026-10-02-10-00-00_{NOTEBOOK}", NB)
        zf.writestr(f"HW 1_jsmith_attempt_2026-10-01-09-30-00_{NOTEBOOK}", NB)
    assert submission_times(bb, tmp_path / "b")["jsmith"] == ("2026-10-02T10:00:00",
                                                             "Blackboard attempt date")
    canvas = tmp_path / "canvas.zip"
    with zipfile.ZipFile(canvas, "w") as zf:
        zf.writestr(f"doejohn_LATE_222_333_{NOTEBOOK}", NB)
        zf.writestr(f"smithann_12345_67890_{NOTEBOOK}", NB)
    got = submission_times(canvas, tmp_path / "c")
    assert got["doejohn_222"][0] == "" and "_LATE_" in got["doejohn_222"][1]
    assert got["smithann_12345"] == ("", "")
    moodle = tmp_path / "moodle.zip"   # a timestamp.txt a student uploads decides nothing
    with zipfile.ZipFile(moodle, "w") as zf:
        zf.writestr(f"Ann Smith_1001_assignsubmission_file_/{NOTEBOOK}", NB)
        zf.writestr("Ann Smith_1001_assignsubmission_file_/timestamp.txt",
                    "2020-01-01 00:00:00.000000 UTC")
    assert submission_times(moodle, tmp_path / "m")["Ann Smith_1001"] == ("", "")


def test_timestamp_txt_zones_abbreviations_in_the_terms_zone_or_refused(tmp_path):
    """nbgrader writes timestamp.txt in its Exchange.timezone with %Z: 'CEST', 'EDT'. An
    abbreviation is read in the term file's zone when that zone uses it then; otherwise the time
    is refused with a note on the row, never read as UTC. Offsets and zone names carry their
    own offset."""
    berlin_2359 = dt.datetime(2026, 10, 1, 23, 59, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    stamps = {"abbrev": "2026-10-01 23:59:00.000000 CEST",     # on time in Berlin (= DUE)
              "late": "2026-10-02 01:00:00.000000 CEST",
              "offset": "2026-10-01 23:59:00.000000 +0200", "colon": "2026-10-01 17:59:00 -04:00",
              "named": "2026-10-01 23:59:00.000000 Europe/Berlin",
              "new_york": "2026-10-01 17:59:00.000000 EDT",    # not Berlin's abbreviation
              "utc": "2026-10-01 21:59:00.000000 UTC", "bare": "2026-10-01 21:59:00.000000"}
    folder = tmp_path / "class"
    for student, stamp in stamps.items():
        (folder / student / ASSIGNMENT).mkdir(parents=True)
        (folder / student / ASSIGNMENT / NOTEBOOK).write_bytes(NB)
        (folder / student / ASSIGNMENT / "timestamp.txt").write_text(stamp)
    got = submission_times(folder, tmp_path / "f")
    results = [{"student": s, "assignment": ASSIGNMENT, "score": 6, "max_score": 6,
                "submitted_at": at, "submitted_at_source": source} for s, (at, source) in got.items()]
    berlin = load_term(_term_file(tmp_path, DUE - dt.timedelta(days=1)), [ASSIGNMENT])
    rows = {r.student: r for r in final_grades(results, berlin)}
    on_time = [s for s in stamps if s not in ("late", "new_york")]
    for s in on_time:       # each the same instant as the due date: no penalty, a known time
        assert _aware_of(rows[s], "Europe/Berlin") == berlin_2359, s
        assert rows[s].score == 6 and "unknown" not in rows[s].late_note, s
    assert rows["late"].score == expected(6, berlin_2359 + dt.timedelta(minutes=61)) < 6
    refused = rows["new_york"]
    assert refused.score == 6 and refused.late_penalty == 0
    assert "timestamp.txt gives the zone EDT" in refused.late_note and "Europe/Berlin" in refused.late_note
    assert "no late penalty applied" in refused.late_note
    new_york = tmp_path / "ny.toml"
    new_york.write_text(_term_file(tmp_path, DUE - dt.timedelta(days=1)).read_text()
                        .replace("Europe/Berlin", "America/New_York"))
    rows = {r.student: r for r in final_grades(results, load_term(new_york, [ASSIGNMENT]))}
    assert _aware_of(rows["new_york"], "America/New_York") == berlin_2359 and "unknown" not in rows["new_york"].late_note
    assert "gives the zone CEST" in rows["abbrev"].late_note


def _aware_of(row, zone=None) -> dt.datetime:
    """The instant final_grades read: a time without zone (an abbreviation's) in ``zone``."""
    from zoneinfo import ZoneInfo
    when = dt.datetime.fromisoformat(row.submitted_at)
    return when if when.tzinfo else when.replace(tzinfo=ZoneInfo(zone))


def test_a_moodle_worksheet_gives_submission_times_at_report_time(tmp_path):
    from autograder.term.policy import with_worksheet_times
    sheet = tmp_path / "worksheet.csv"
    sheet.write_text('"Identifier","Full name","Status","Grade","Last modified (submission)"\n'
                     '"Participant 1001","Ann Smith","Submitted","","Friday, 2 October 2026, 11:00 PM"\n'
                     '"Participant 1002","Bo Li","No submission","","-"\n')
    path = tmp_path / "t.toml"
    path.write_text(term_text(DUE).replace('lms_column', 'moodle_worksheet = "worksheet.csv"\nlms_column'))
    term = load_term(path, [ASSIGNMENT])
    results = [{"student": "Ann Smith_1001", "assignment": ASSIGNMENT, "score": 6, "max_score": 6},
               {"student": "Bo Li_1002", "assignment": ASSIGNMENT, "score": 6, "max_score": 6}]
    ann, bo = final_grades(with_worksheet_times(results, term), term)
    berlin = dt.datetime(2026, 10, 2, 23, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert ann.submitted_at_source.startswith("Moodle worksheet")
    assert ann.score == expected(6, berlin) < 6 and bo.score == 6 and bo.submitted_at == ""
    sheet.write_bytes(b"\xef\xbb\xbf" + sheet.read_text().replace('","', '";"').encode())   # re-saved
    assert final_grades(with_worksheet_times(results, term), term)[0].score == ann.score
    sheet.write_text('"Identifier","Last modified (submission)"\n"Participant 1001","yesterday-ish"\n')
    with pytest.raises(ValueError, match="line 2"):
        with_worksheet_times(results, term)


def test_nbgrader_never_applies_a_late_penalty_of_its_own():
    assert not any("LatePenalties" in p for p in SANDBOX_PREPROCESSORS)


# --------------------------------------------------------------- a graded class (slow)

WRONG_ADD = "def add(a, b):\n    return a - b"
WRONG_MUL = "def mul(a, b):\n    return a * b + 1"
RIGHT = {"add": ADD_SOLUTION, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION}
ON_TIME = DUE - dt.timedelta(hours=2)
TWO_DAYS = DUE + dt.timedelta(days=1, hours=12)          # 36 h late: 2 started days
EXTENDED = DUE + dt.timedelta(days=4)
CAT_AT = DUE + dt.timedelta(days=2, hours=14)             # late, within the extension
CLASS = {   # student -> (answers, submitted at (None: no timestamp.txt), raw machine score)
    "ann_on_time": (RIGHT, ON_TIME, 6),
    "bob_two_days": ({**RIGHT, "add": WRONG_ADD}, TWO_DAYS, 4),
    "cat_extension": (RIGHT, CAT_AT, 6),
    "dan_no_time": (RIGHT, None, 6),
    "eve_review": (RIGHT, ON_TIME, 6),                    # changes a test's points: manual review
    "fay_override": ({**RIGHT, "mul": WRONG_MUL}, ON_TIME, 3),
    "gil_too_late": (RIGHT, DUE + dt.timedelta(days=ZERO_AFTER, hours=1), 6),
}


def read_rows(path: Path) -> dict:
    with open(path, newline="") as f:
        return {r["student_id"]: r for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def term_class(tmp_path_factory):
    from autograder.publishing.build import build
    from autograder.publishing.demo import student_notebook
    course = make_toy_course(tmp_path_factory.mktemp("course"))
    build(course)
    lesson = nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    cls = tmp_path_factory.mktemp("class")
    for student, (answers, when, _) in CLASS.items():
        folder = cls / student / ASSIGNMENT
        folder.mkdir(parents=True)
        nb = student_notebook(lesson, answers)
        if student == "eve_review":
            cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_add")
            cell.metadata["nbgrader"]["points"] = 100
        nbformat.write(nb, folder / NOTEBOOK)
        if when is not None:   # as nbgrader's exchange writes it
            (folder / "timestamp.txt").write_text(when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
    out = tmp_path_factory.mktemp("graded") / "out"
    term_file = _term_file(tmp_path_factory.mktemp("term"), EXTENDED)
    term = load_term(term_file, [ASSIGNMENT])
    grade_class(course, cls, out, progress=False, jobs=2, term=term)
    return course, cls, out, term_file


def no_kernel(monkeypatch):
    """Make every way the grader starts a kernel or a notebook run fail."""
    import jupyter_client
    from nbgrader.apps import NbGraderAPI

    from autograder.engine import sandbox
    from autograder.grading import grade

    def refuse(*args, **kwargs):
        raise AssertionError("a kernel was started")
    monkeypatch.setattr(jupyter_client.KernelManager, "start_kernel", refuse)
    monkeypatch.setattr(sandbox, "run_submission", refuse)
    monkeypatch.setattr(sandbox.SandboxedExecute, "preprocess", refuse)
    monkeypatch.setattr(NbGraderAPI, "autograde", refuse)
    monkeypatch.setattr(grade, "grade_class", refuse)


@pytest.mark.slow
def test_a_term_grades_to_the_rule_and_report_updates_without_a_kernel(term_class, monkeypatch,
                                                                       capsys):
    course, cls, out, term_file = term_class
    rows = read_rows(out / "grades.csv")
    assert list(next(iter(rows.values())))[:len(GRADE_COLUMNS)] == GRADE_COLUMNS
    for student, (_, when, raw) in CLASS.items():
        row = rows[student]
        assert float(row["raw_score"]) == raw, (student, row)
        due = EXTENDED if student == "cat_extension" else DUE
        want = raw if when is None else expected(raw, when, due)
        assert float(row["score"]) == pytest.approx(want), (student, row)
        assert float(row["late_penalty"]) == pytest.approx(raw - want), student
        assert row["submitted_at_source"] == ("unknown" if when is None else "nbgrader timestamp.txt")
    assert float(rows["bob_two_days"]["late_penalty"]) > 0 and rows["bob_two_days"]["days_late"] == "2"
    assert rows["gil_too_late"]["score"] == "0.0"
    assert "submission time unknown" in rows["dan_no_time"]["notes"]
    eve = rows["eve_review"]
    assert Status.of(eve["status"]).kind == NEEDS_REVIEW and eve["review"] == "undecided"
    assert float(eve["score"]) == 6, "a manual review keeps the machine score until decided"
    assert not (out / "overrides.csv").exists(), "grade never writes overrides.csv"
    report = (out / "report.html").read_text()
    undecided = report.split("data-status='needs manual review'")[1].split("</tr>")[0]
    assert "manual review: undecided" in undecided and "eve_review" in undecided

    # The instructor decides eve's review, gives fay partial credit, shortens cat's extension.
    write_overrides(out / "overrides.csv", [
        ["eve_review", ASSIGNMENT, "", "5", "changed a test's points; answers checked by hand", "prof"],
        ["fay_override", ASSIGNMENT, "test_mul", "2", "off by one only", "TA"]])
    shorter = DUE + dt.timedelta(days=2)                  # cat is now 14 h late: 1 started day
    term_file.write_text(term_text(shorter))
    before = (out / "feedback" / "cat_extension" / ASSIGNMENT / NOTEBOOK.replace(".ipynb", ".html")).read_text()
    assert "Late work" not in before and "mlexp-final" in before
    no_kernel(monkeypatch)
    capsys.readouterr()
    assert main(["--course", str(course), "report", str(out), "--term", str(term_file)]) == 0
    said = capsys.readouterr()
    assert "1 late penalt" not in said.out and "3 late penalties" in said.out, said.out
    assert f"extensions to zoe_typo ({ASSIGNMENT}), who have no submission of that lesson" in said.err

    rows = read_rows(out / "grades.csv")
    cat = rows["cat_extension"]
    assert float(cat["score"]) == pytest.approx(expected(6, CAT_AT, shorter)) and cat["days_late"] == "1"
    assert float(rows["eve_review"]["score"]) == 5 and rows["eve_review"]["review"] == "decided"
    assert rows["eve_review"]["override"] == "total=5"
    assert "answers checked by hand (prof)" in rows["eve_review"]["override_comment"]
    fay = rows["fay_override"]
    assert float(fay["raw_score"]) == 5 and float(fay["test_mul"]) == 2 and float(fay["score"]) == 5
    assert read_rows(out / f"grades-{ASSIGNMENT}.csv")["cat_extension"]["score"] == cat["score"]
    page = (out / "feedback" / "cat_extension" / ASSIGNMENT / NOTEBOOK.replace(".ipynb", ".html")).read_text()
    assert page.count("mlexp-final-grade -->") == 2, "one box, replaced, not added"
    assert "Late work" in page and f"-{6 - expected(6, CAT_AT, shorter):g} points" in page
    fay_page = (out / "feedback" / "fay_override" / ASSIGNMENT / NOTEBOOK.replace(".ipynb", ".html")).read_text()
    assert re.search(r'class="mlexp-tests-score" data-tests="\(Score: [^"]*"></span></h4>', fay_page), \
        "one score: the box's, not nbgrader's tests-only one in the heading"
    mul = re.findall(r'class="(?:score|mlexp-points)" data-grade-id="test_mul" data-tests="[^"]*">([^<]*)<', fay_page)
    assert mul == ["2 / 3.0 (set by your instructor)"] * 2, mul     # the summary row and the test's panel
    assert re.findall(r'class="mark" data-grade-id="test_mul" data-tests="[^"]*">([^<]*)<', fay_page) == ["✎"]
    eve_page = (out / "feedback" / "eve_review" / ASSIGNMENT / NOTEBOOK.replace(".ipynb", ".html")).read_text()
    assert "answers checked by hand" in eve_page and "lesson total set to 5 points" in eve_page
    report = (out / "report.html").read_text()
    decided = report.split("data-status='decided'")[1].split("</tr>")[0]
    assert "eve_review" in decided and "changed a test&#x27;s points" in decided
    assert "fay_override" in decided and "test_mul=2" in decided
    assert "data-status='needs manual review'" not in report, "eve's review is decided"
    assert "data-status='late'" in report and "cat_extension" in report.split("data-status='late'")[1]
    assert load_final_grades(out, root=course)[0].student in CLASS, "export reads the same rows"
    assert {g.student: g.score for g in load_final_grades(out, root=course)} == \
        {s: float(r["score"]) for s, r in rows.items()}

    # A bad row stops report with its line; a regrade keeps overrides.csv and its decisions.
    with open(out / "overrides.csv", "a", newline="") as f:
        csv.writer(f).writerow(["ann_on_time", ASSIGNMENT, "test_add", "9", "", ""])
    assert main(["--course", str(course), "report", str(out)]) == 2
    with pytest.raises(OverrideError, match="line 4: points 9 is outside 0 to 2"):
        grade_class(course, cls, out, progress=False)   # refused before any kernel starts
    lines = (out / "overrides.csv").read_text().splitlines()
    (out / "overrides.csv").write_text("\n".join(lines[:-1]) + "\n")
    monkeypatch.undo()
    kept = (out / "overrides.csv").read_text()
    again = grade_class(course, cls, out, progress=False, jobs=1)   # same bytes: reused, no run
    assert all(r.reused for r in again)
    assert (out / "overrides.csv").read_text() == kept
    rows = read_rows(out / "grades.csv")
    assert float(rows["eve_review"]["score"]) == 5 and rows["cat_extension"]["score"] == cat["score"]


def test_the_instructors_guide_term_example_is_a_valid_term_file(tmp_path):
    import re
    text = (Path(__file__).resolve().parent.parent / "docs" / "instructors.md").read_text()
    section = text[text.index("## A term: due dates, extensions, overrides"):]
    section = section[:section.index("\n## ")]
    path = tmp_path / "term.toml"
    path.write_text(re.search(r"```toml\n(.*?)```", section, re.S).group(1))
    term = load_term(path)            # the course's own lessons
    assert term.late.per_day == PER_DAY and term.due("smithann_12345", "01_running_sum") > \
        term.lesson("01_running_sum").due
    header = re.search(r"```csv\n(.*?)\n", section, re.S).group(1)
    assert header.split(",") == OVERRIDE_COLUMNS


def test_the_grade_box_is_placed_replaced_escaped_and_removed(tmp_path, tmp_path_factory):
    from autograder.engine.feedback import GRADE_BOX_START, write_grade_boxes
    page = tmp_path / "feedback" / "ann" / ASSIGNMENT / "toy.html"
    page.parent.mkdir(parents=True)
    page.write_text("<html><body><h4>toy (Score: 6 / 6)</h4><p>cells</p></body></html>")
    term = load_term(_term_file(tmp_path_factory.mktemp("t"), DUE), [ASSIGNMENT])
    res = Result("ann", ASSIGNMENT, 6, 6, exercises=dict(MAXIMA),
                 submitted_at=(DUE + dt.timedelta(hours=3)).isoformat())
    evil = Override("ann", ASSIGNMENT, "test_add", 1, "<script>alert(1)</script>", "<b>TA</b>")
    assert write_grade_boxes(tmp_path, final_grades([res], term, [evil])) == [page]
    text = page.read_text()
    assert text.index("</h4>") < text.index(GRADE_BOX_START) < text.index("<p>cells")
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert f"-{5 - expected(5, DUE + dt.timedelta(hours=3)):g} points" in text
    write_grade_boxes(tmp_path, final_grades([res], term))
    text = page.read_text()
    assert text.count(GRADE_BOX_START) == 1 and "alert" not in text, "replaced, not added"
    write_grade_boxes(tmp_path, final_grades([res]))      # no term, no override: no box
    assert page.read_text() == "<html><body><h4>toy (Score: 6 / 6)</h4><p>cells</p></body></html>"


@pytest.mark.slow
def test_one_folder_holds_every_lesson_graded_into_it(tmp_path):
    """Grading lesson B into the folder that holds lesson A keeps A: grades.csv, class.json,
    report and overrides see both; grading A again replaces A's entries only."""
    from autograder.publishing.build import build
    from autograder.publishing.demo import student_notebook
    from autograder.term.policy import load_final_grades
    course = make_toy_course(tmp_path / "course")
    second = "toy_two"
    (course / "solutions" / second).mkdir()
    (course / "solutions" / second / "toy_two.ipynb").write_bytes(
        (course / "solutions" / ASSIGNMENT / NOTEBOOK).read_bytes())
    build(course)
    out = tmp_path / "term_folder"

    def hand_in(name, lesson, notebook, who):
        cls = tmp_path / name
        released = nbformat.read(course / "lessons" / lesson / notebook, as_version=4)
        for student, answers in who.items():
            (cls / student / lesson).mkdir(parents=True)
            nbformat.write(student_notebook(released, answers), cls / student / lesson / notebook)
        return cls

    first = hand_in("first", ASSIGNMENT, NOTEBOOK, {"ann": RIGHT, "bob": {**RIGHT, "add": WRONG_ADD}})
    grade_class(course, first, out, progress=False, jobs=2)
    # an override for lesson one, written before lesson two is graded, stays valid through it
    write_overrides(out / "overrides.csv", [["bob", ASSIGNMENT, "", "5", "regraded by hand", ""]])
    grade_class(course, hand_in("second", second, "toy_two.ipynb", {"ann": RIGHT}), out,
                progress=False)
    rows = {(r["student_id"], r["assignment"]): r for r in csv.DictReader(open(out / "grades.csv"))}
    assert sorted(rows) == [("ann", ASSIGNMENT), ("ann", second), ("bob", ASSIGNMENT)]
    assert float(rows[("bob", ASSIGNMENT)]["score"]) == 5.0     # its override still applied
    assert float(rows[("ann", second)]["score"]) == float(rows[("ann", ASSIGNMENT)]["score"]) == 6
    grades = {(g.student, g.assignment): g.score for g in load_final_grades(out)}
    assert grades == {k: float(v["score"]) for k, v in rows.items()}
    assert main(["report", str(out)]) == 0
    # lesson one again, bob's submission gone: lesson two and ann's lesson one stay
    (out / "overrides.csv").unlink()
    grade_class(course, hand_in("again", ASSIGNMENT, NOTEBOOK, {"ann": RIGHT}), out, progress=False)
    rows = {(r["student_id"], r["assignment"]) for r in csv.DictReader(open(out / "grades.csv"))}
    assert sorted(rows) == [("ann", ASSIGNMENT), ("ann", second)]


def test_extension_warnings_name_only_lessons_graded_in_the_folder():
    """One folder per lesson: an extension for a lesson this folder does not hold is another
    folder's, never a warning; one whose id has no row of a lesson graded here is."""
    from types import SimpleNamespace

    from autograder.reporting.report import unknown_extensions
    when = dt.datetime(2026, 10, 1)
    term = SimpleNamespace(extensions={"ann": {"01_running_sum": when, "04_hybrid_kv_cache": when},
                                       "an_typo": {"01_running_sum": when},
                                       "bob": {"04_hybrid_kv_cache": when}})
    grades = [SimpleNamespace(student=s, assignment="01_running_sum") for s in ("ann", "bob")]
    assert unknown_extensions(term, grades) == ["an_typo (01_running_sum)"]
    grades.append(SimpleNamespace(student="ann", assignment="04_hybrid_kv_cache"))
    assert unknown_extensions(term, grades) == ["an_typo (01_running_sum)", "bob (04_hybrid_kv_cache)"]
    assert unknown_extensions(term, []) == []


def test_one_score_on_the_page_and_overrides_on_their_rows(tmp_path):
    """The page as the template marks its scores: with a box, nbgrader's tests-only heading score
    goes and an overridden exercise shows the override; without one, the tests' scores return."""
    from autograder.engine.feedback import write_grade_boxes
    page = tmp_path / "feedback" / "ann" / ASSIGNMENT / "toy.html"
    page.parent.mkdir(parents=True)
    graded = ('<html><body><h4>toy.ipynb <span class="mlexp-tests-score" data-tests="(Score: 3.0 / 6.0)">'
              '(Score: 3.0 / 6.0)</span></h4><table>'
              '<tr><td class="score" data-grade-id="test_add" data-tests="0.0 / 2.0">0.0 / 2.0</td></tr>'
              '<tr><td class="score" data-grade-id="test_mul" data-tests="3.0 / 3.0">3.0 / 3.0</td></tr>'
              '</table><span class="pull-right">Score: <span class="mlexp-points" data-grade-id="test_add" '
              'data-tests="0.0 / 2.0">0.0 / 2.0</span></span></body></html>')
    page.write_text(graded)
    res = Result("ann", ASSIGNMENT, 3, 6, exercises={"test_add": 0.0, "test_mul": 3.0, "test_mean": 0.0})
    fix = Override("ann", ASSIGNMENT, "test_add", 1.5, "right idea", "TA")
    write_grade_boxes(tmp_path, final_grades([res], None, [fix]))
    text = page.read_text()
    assert "(Score: 3.0 / 6.0)</span>" not in text and "4.5</span> of 6 points" in text
    assert text.count(">1.5 / 2.0 (set by your instructor)<") == 2 and ">3.0 / 3.0<" in text
    write_grade_boxes(tmp_path, final_grades([res]))        # the override removed: as graded
    assert page.read_text() == graded


def test_the_page_sent_to_the_lms_heads_with_the_gradebooks_grade(tmp_path):
    """The feedback zip's page says the grade the gradebook cell holds, on that column's scale, at
    the top; the lesson's points and the box's other lines stay under it; with no box, one is
    made and nbgrader's tests-only heading score goes, so the page shows one grade."""
    from autograder.engine.feedback import GRADE_BOX_START, gradebook_page, write_grade_boxes
    page = tmp_path / "feedback" / "ann" / ASSIGNMENT / "toy.html"
    page.parent.mkdir(parents=True)
    graded = ('<html><body><h4>toy.ipynb <span class="mlexp-tests-score" data-tests="(Score: 3.0 / 6.0)">'
              '(Score: 3.0 / 6.0)</span></h4><p>cells</p></body></html>')
    page.write_text(graded)
    bare = gradebook_page(graded, ASSIGNMENT, "5", "10", "canvas")
    assert "(Score: 3.0 / 6.0)</span>" not in bare and bare.count(GRADE_BOX_START) == 1
    assert "Your grade for toy in Canvas: <span class='lms-score'>5</span> of 10</strong>" in bare
    assert bare.index("</h4>") < bare.index(GRADE_BOX_START) < bare.index("<p>cells")
    res = Result("ann", ASSIGNMENT, 3, 6, exercises={"test_add": 0.0, "test_mul": 3.0, "test_mean": 0.0})
    write_grade_boxes(tmp_path, final_grades([res], None, [Override("ann", ASSIGNMENT, "test_add", 1.5, "ok")]))
    boxed = page.read_text()
    sent = gradebook_page(boxed, ASSIGNMENT, "7,5", "10", "moodle")
    assert sent.count(GRADE_BOX_START) == 1 and "Changed by your instructor" in sent
    assert "in Moodle: <span class='lms-score'>7,5</span> of 10</strong>" in sent
    assert "In lesson points: <span class='final-score'>4.5</span> of 6 points" in sent
    assert sent.index("lms-score") < sent.index("final-score") < sent.index("Changed by")
    assert gradebook_page(sent.replace("<h4>", "<h5>").replace("</h4>", "</h5>"), ASSIGNMENT,
                          "1", "2", "blackboard").count("<strong>Your grade") == 1
