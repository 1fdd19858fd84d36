"""What the class got wrong: per student, lesson and exercise, the points and the mistake made.

Read from a grading output folder DIR (nothing is regraded): the class list ``DIR/class.json``
that ``grade`` writes, the journal ``DIR/results/``, the released lessons and the autograded and
submitted notebooks in ``DIR/work/``, and each lesson's mistake catalogue
(``solutions/<id>/mistakes.json``, autograder.mistakes). Written from it: ``DIR/insights.csv``
(one row per student, lesson and exercise), the ``hints`` column of ``DIR/grades.csv`` and one
``DIR/grades-<lesson>.csv`` per lesson.
"""
import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from autograder import ids
from autograder.journal import atomic_write, load_result, read_manifest
from autograder.cells import grade_id_of, is_test_cell
from autograder.mistakes import NO_MATCH, NOT_GRADED, hint_shown, match_mistake
from autograder.release import Release, answer_text
from autograder.results import REJECTED, TIMED_OUT, Status, write_grades_csv
from autograder.term.policy import final_grades

__all__ = ["INSIGHT_COLUMNS", "TIMED_OUT_MISTAKE", "Insight", "ClassData", "load_class",
           "write_insights_csv", "write_lesson_csvs"]

TIMED_OUT_MISTAKE = "timed_out"   # a failed exercise of a submission that reached a limit
INSIGHT_COLUMNS = ["student_id", "assignment", "exercise", "title", "points", "max_points",
                   "mistake", "hint"]


@dataclass
class Insight:
    """One row of insights.csv. ``mistake`` is "" for a passed exercise, a catalogued id,
    NO_MATCH (failed, hint matches no catalogued mistake), TIMED_OUT_MISTAKE (failed in a
    submission that timed out: whatever its output quoted, never a catalogued mistake) or
    NOT_GRADED."""
    student: str
    assignment: str
    exercise: str
    title: str
    points: float
    max_points: float
    mistake: str
    hint: str


@dataclass
class ClassData:
    """Everything the report and the CSVs need, read from DIR."""
    results: list                                   # journal dicts, in grades.csv order
    lessons: dict                                   # assignment -> autograder.release.Release
    columns: dict                                   # assignment -> its grades.csv columns
    insights: list = field(default_factory=list)    # [Insight]
    answers: dict = field(default_factory=dict)     # (student, assignment) -> answer text

    def hints(self, student: str, assignment: str) -> str:
        """The mistake ids of the exercises ``student`` lost, space-separated."""
        return " ".join(i.mistake for i in self.insights
                        if (i.student, i.assignment) == (student, assignment) and i.mistake)


def _load_lesson(root: Path, work: Path, assignment: str):
    """The assignment's Release in ``work``, its mistake catalogue read (a malformed one raises
    ValueError here); None when nothing of it was released."""
    lesson = Release(work, assignment, root)
    if not lesson.names:
        return None
    lesson.mistakes   # noqa: B018 (read now: a bad catalogue stops the report before it writes)
    return lesson


def _read_nb(path: Path):
    try:
        return nbformat.read(path, as_version=4)
    except (OSError, ValueError):
        return None


def _student_insights(work: Path, lesson: Release, res: dict, internal: str) -> tuple:
    """(insights, answer text) of one result: the hints from the autograded notebooks, the
    answers from the submitted ones (as graded, after repair)."""
    kind = Status.of(res.get("status", "")).kind
    graded = bool(res.get("exercises")) and kind != REJECTED
    shown, answers = {}, ""
    if graded:
        for name in lesson.notebooks:
            nb = _read_nb(work / "autograded" / internal / lesson.assignment / name)
            if nb is not None:
                shown.update({grade_id_of(c): hint_shown(c)
                              for c in nb.cells if is_test_cell(c)})
        subs = [_read_nb(work / "submitted" / internal / lesson.assignment / n) for n in lesson.notebooks]
        answers = answer_text([nb for nb in subs if nb is not None])
    rows = []
    for ex in lesson.exercises:
        points = res.get("exercises", {}).get(ex.grade_id) if graded else None
        if points is None:
            mistake, hint, points = NOT_GRADED, "", 0.0
        elif float(points) >= ex.points:
            mistake, hint = "", ""
        else:
            hint = shown.get(ex.grade_id, "")
            mistake = TIMED_OUT_MISTAKE if kind == TIMED_OUT else \
                match_mistake(lesson.mistakes, ex.grade_id, hint) or NO_MATCH
        rows.append(Insight(res["student"], lesson.assignment, ex.grade_id, ex.title,
                            float(points), ex.points, mistake, hint))
    return rows, answers


def load_class(root: Path, out: Path) -> ClassData:
    """Read the class graded into ``out`` (see the module docstring); raises FileNotFoundError
    when ``out`` holds no graded class, ValueError for a malformed mistakes.json."""
    out = Path(out)
    work = out / "work"
    entries, columns = read_manifest(out)
    lessons, data = {}, ClassData([], {}, columns)
    for student, assignment, internal in entries:
        res = load_result(out, assignment, student)
        if res is None:
            continue
        if assignment not in lessons:
            lessons[assignment] = _load_lesson(Path(root), work, assignment)
        lesson = lessons[assignment]
        if lesson is not None and not res.get("max_score"):
            res["max_score"] = lesson.max_score   # a rejected notebook: what it could have scored
        data.results.append(res)
        if lesson is not None:
            rows, answers = _student_insights(work, lesson, res, internal)
            data.insights += rows
            if answers.strip():
                data.answers[(student, assignment)] = answers
    data.lessons = {a: lesson for a, lesson in lessons.items() if lesson is not None}
    return data


def write_insights_csv(path: Path, data: ClassData) -> None:
    """insights.csv: INSIGHT_COLUMNS, one row per student, lesson and exercise (spreadsheet-safe)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(INSIGHT_COLUMNS)
    for i in data.insights:
        w.writerow([ids.spreadsheet_safe(v) for v in
                    (i.student, i.assignment, i.exercise, i.title, i.points, i.max_points,
                     i.mistake, i.hint)])
    atomic_write(path, buf.getvalue())


def write_lesson_csvs(out: Path, data: ClassData, rows: list = None) -> list:
    """grades.csv (autograder.results.GRADE_COLUMNS, the exercises, then ``hints``) and
    grades-<lesson>.csv for each lesson (only its rows and its exercise columns) from ``rows``
    ([results.FinalGrade]; default: the results as graded, no term, no overrides); returns the
    paths written."""
    rows = final_grades(data.results) if rows is None else rows
    hints = {(r.student, r.assignment): data.hints(r.student, r.assignment) for r in rows}
    paths = [Path(out) / "grades.csv"]
    write_grades_csv(paths[0], rows, [g for a in sorted(data.columns) for g in data.columns[a]],
                     hints=hints)
    for a in sorted({r.assignment for r in rows}):
        paths.append(Path(out) / f"grades-{a}.csv")
        write_grades_csv(paths[-1], [r for r in rows if r.assignment == a],
                         data.columns.get(a, []), hints=hints)
    return paths
