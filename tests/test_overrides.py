"""overrides.csv as docs/instructors.md describes it: six columns, every one of them in every row.

test_term.py checks each kind of bad row and the final grades; this file checks the guide's
claim that ``comment`` and ``by`` are required columns (empty cells are fine, missing ones are
not), so a short row is refused with its line instead of being read with guessed cells.
"""
import csv

import pytest

from autograder.term.policy import OVERRIDE_COLUMNS, OverrideError, read_overrides

KNOWN = {("ann", "toy"): {"test_add": 2.0, "test_mul": 3.0}}


def _write(path, rows):
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([OVERRIDE_COLUMNS] + rows)
    return path


@pytest.mark.parametrize("row", [["ann", "toy", "test_add", "1"],             # no comment, no by
                                 ["ann", "toy", "test_add", "1", "fine"]])    # no by
def test_a_row_without_comment_or_by_is_refused_with_its_line(tmp_path, row):
    path = _write(tmp_path / "overrides.csv", [row])
    with pytest.raises(OverrideError, match=f"line 2: {len(row)} cells, expected 6"):
        read_overrides(path, KNOWN)


def test_empty_comment_and_by_cells_are_fine(tmp_path):
    path = _write(tmp_path / "overrides.csv", [["ann", "toy", "test_add", "1", "", ""]])
    (o,) = read_overrides(path, KNOWN)
    assert (o.exercise, o.points, o.comment, o.by) == ("test_add", 1.0, "", "")


def test_the_header_needs_comment_and_by(tmp_path):
    path = tmp_path / "overrides.csv"
    path.write_text("student_id,assignment,exercise,points\nann,toy,test_add,1\n")
    with pytest.raises(OverrideError, match="line 1: the header must be "
                                            "student_id,assignment,exercise,points,comment,by"):
        read_overrides(path, KNOWN)


def test_the_grade_box_names_the_exercise_by_title_and_says_1_point():
    """Item 3 (needs the patch to feedback.py and report.py): "exercise test_your_turn set to
    1 points" becomes "exercise “Your turn” set to 1 point"."""
    from autograder.engine.feedback import grade_box
    from autograder.results import Result
    from autograder.term.policy import Override, final_grades
    res = Result("ann", "toy", 5, 5, exercises={"test_add": 2.0, "test_mul": 3.0})
    over = [Override("ann", "toy", "test_add", 1, "", ""), Override("ann", "toy", "test_mul", 2, "", "")]
    (row,) = final_grades([res], None, over)
    box = grade_box(row, {"test_add": "Your turn: add"})
    assert "exercise &ldquo;Your turn: add&rdquo; set to 1 point<" in box
    assert "exercise <code>test_mul</code> set to 2 points<" in box     # no title known
    assert "1 points" not in box


def test_the_grade_box_keeps_grader_internals_off_the_students_page():
    """An unknown submission time (Canvas's _LATE_, no timestamp) is the report's to say; the
    student's page shows a late line only for a lateness the grader measured."""
    import datetime as dt

    from autograder.engine.feedback import grade_box
    from autograder.lms.canvas import CANVAS_LATE_SOURCE
    from autograder.results import Result
    from autograder.term.policy import final_grades
    from autograder.term.termfile import LatePolicy, LessonTerm, Term
    due = dt.datetime(2026, 10, 1, 23, 59, tzinfo=dt.timezone.utc)
    term = Term(lessons={"toy": LessonTerm(due=due)}, late=LatePolicy(per_day=0.1))
    late = Result("ann", "toy", 5, 5, submitted_at=(due + dt.timedelta(hours=3)).isoformat())
    canvas = Result("bob", "toy", 5, 5, submitted_at_source=CANVAS_LATE_SOURCE)
    rows = final_grades([late, canvas], term)
    assert "unknown" in rows[1].late_note            # the report and grades.csv still say it
    box = grade_box(rows[1])
    assert "Late work" not in box and "_LATE_" not in box and "penalty" not in box
    assert "Late work" in grade_box(rows[0]) and "-0.5 points" in grade_box(rows[0])
