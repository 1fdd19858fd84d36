"""The term file: due dates, late-work rules, extensions and LMS gradebook columns, read from TOML.

An instructor keeps one term file per course term and gives it to ``grade``, ``report`` and
``export`` with ``--term FILE``. Example (every key optional; docs/instructors.md has a full one)::

    [lessons.01_running_sum]
    due = 2026-10-01T23:59:00+02:00       # ISO 8601 with its time zone
    lms_column = "01 Running sum (1234)"  # the LMS gradebook column this lesson fills
    moodle_worksheet = "grades-01.csv"    # Moodle only: its grading worksheet (submission times)

    [late]
    per_day = 0.10                        # fraction of the raw score lost per started day late
    zero_after_days = 7                   # later than this, the work scores 0

    [extensions."smithann_12345"]         # a student id as grades.csv shows it
    01_running_sum = 2026-10-03T23:59:00+02:00

A top-level ``timezone = "Europe/Berlin"`` (an IANA name, before the first table; default UTC)
says in which zone to read submission times that carry none (Blackboard's attempt dates).

The file is read with the standard library's ``tomllib`` (TOML 1.0); every mistake (a date
without a time zone, an unknown key, a lesson the course does not have) raises
:class:`TermError` naming the file, the key and what to write instead.
"""
from __future__ import annotations

import datetime as dt
import tomllib
import zoneinfo
from dataclasses import dataclass, field
from pathlib import Path
from autograder.course import LESSONS
from autograder.journal import atomic_write

__all__ = ["TermError", "LessonTerm", "LatePolicy", "Term", "load_term", "EMPTY_TERM",
           "TERM_RECORD", "remember_term", "remembered_term"]

TERM_RECORD = "term-file.txt"    # in a grading folder: the term file its grades were made with


class TermError(ValueError):
    """The term file is missing, is not TOML, or holds a key or value the course cannot use."""


@dataclass(frozen=True)
class LessonTerm:
    """One lesson's entry: its due date (aware datetime or None), its LMS column (or None) and
    the Moodle grading worksheet whose "Last modified (submission)" gives submission times
    (a Path, relative ones read from the term file's folder; or None)."""
    due: dt.datetime | None = None
    lms_column: str | None = None
    moodle_worksheet: Path | None = None


@dataclass(frozen=True)
class LatePolicy:
    """per_day: fraction of the raw score lost per started day late (0 to 1);
    zero_after_days: later than this many days the work scores 0 (None: never)."""
    per_day: float = 0.0
    zero_after_days: float | None = None


@dataclass(frozen=True)
class Term:
    """A parsed term file. ``extensions[student_id][lesson_id]`` is that student's own due date."""
    lessons: dict = field(default_factory=dict)        # lesson id -> LessonTerm
    late: LatePolicy = LatePolicy()
    extensions: dict = field(default_factory=dict)     # student id -> {lesson id: datetime}
    path: Path | None = None
    timezone: dt.tzinfo = dt.timezone.utc              # for submission times without a zone

    def lesson(self, lesson_id: str) -> LessonTerm:
        return self.lessons.get(lesson_id, LessonTerm())

    def due(self, student_id: str, lesson_id: str) -> dt.datetime | None:
        """The due date that applies to this student: their extension, else the lesson's."""
        return self.extensions.get(student_id, {}).get(lesson_id) or self.lesson(lesson_id).due


EMPTY_TERM = Term()


def _when(value, where: str) -> dt.datetime:
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            raise TermError(f"{where}: {value!r} is not an ISO 8601 date and time "
                            "(write e.g. 2026-10-01T23:59:00+02:00)") from None
    if not isinstance(value, dt.datetime):
        raise TermError(f"{where}: {value!r} is a date without a time; write a time and a time "
                        "zone, e.g. 2026-10-01T23:59:00+02:00")
    if value.tzinfo is None:
        raise TermError(f"{where}: {value.isoformat()} has no time zone; add one, e.g. "
                        f"{value.isoformat()}+02:00 or {value.isoformat()}Z")
    return value


def _unknown(table: dict, allowed: set, where: str) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise TermError(f"{where}: unknown key{'s' * (len(extra) > 1)} {', '.join(extra)} "
                        f"(known: {', '.join(sorted(allowed))})")


def load_term(path, lesson_ids=None) -> Term:
    """Read and check the term file at ``path``.

    ``lesson_ids``: the course's lessons (default: ``autograder.course.LESSONS``); a lesson table
    or an extension naming another id is an error. Returns a :class:`Term`. Raises TermError.
    """
    path = Path(path)
    if lesson_ids is None:
        lesson_ids = set(LESSONS)
    lesson_ids = set(lesson_ids)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TermError(f"No term file at {path}.") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TermError(f"{path} is not valid TOML: {exc}") from None
    _unknown(data, {"lessons", "late", "extensions", "timezone"}, str(path))
    zone = data.get("timezone", "UTC")
    try:
        zone = zoneinfo.ZoneInfo(zone) if isinstance(zone, str) else None
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        zone = None
    if zone is None:
        raise TermError(f"{path}: timezone {data['timezone']!r} is not a time zone name "
                        "(write e.g. timezone = \"Europe/Berlin\" or \"UTC\")")

    def lesson_id(name, where):
        if name not in lesson_ids:
            raise TermError(f"{where}: the course has no lesson {name!r} "
                            f"(its lessons: {', '.join(sorted(lesson_ids))})")
        return name

    lessons = {}
    for name, table in data.get("lessons", {}).items():
        where = f"{path}: [lessons.{name}]"
        lesson_id(name, where)
        if not isinstance(table, dict):
            raise TermError(f"{where} must be a table with due and/or lms_column")
        _unknown(table, {"due", "lms_column", "moodle_worksheet"}, where)
        column = table.get("lms_column")
        if column is not None and (not isinstance(column, str) or not column.strip()):
            raise TermError(f"{where}: lms_column must be the column's name as the LMS writes it")
        due = _when(table["due"], f"{where} due") if "due" in table else None
        sheet = table.get("moodle_worksheet")
        if sheet is not None:
            if not isinstance(sheet, str) or not sheet.strip():
                raise TermError(f"{where}: moodle_worksheet must be the path of the CSV that "
                                "Moodle's 'Download grading worksheet' writes")
            sheet = path.parent / sheet if not Path(sheet).is_absolute() else Path(sheet)
        lessons[name] = LessonTerm(due, column, sheet)

    late = data.get("late", {})
    _unknown(late, {"per_day", "zero_after_days"}, f"{path}: [late]")
    per_day = late.get("per_day", 0.0)
    if isinstance(per_day, bool) or not isinstance(per_day, (int, float)) or not 0 <= per_day <= 1:
        raise TermError(f"{path}: [late] per_day must be a fraction from 0 to 1 (0.10 = 10% a day)")
    zero_after = late.get("zero_after_days")
    if zero_after is not None and (isinstance(zero_after, bool) or
                                   not isinstance(zero_after, (int, float)) or zero_after < 0):
        raise TermError(f"{path}: [late] zero_after_days must be a number of days (0 or more)")

    extensions = {}
    for student, table in data.get("extensions", {}).items():
        where = f'{path}: [extensions."{student}"]'
        if not isinstance(table, dict):
            raise TermError(f"{where} must be a table of lesson id = new due date")
        extensions[student] = {lesson_id(name, where): _when(when, f"{where} {name}")
                               for name, when in table.items()}
    return Term(lessons, LatePolicy(float(per_day), zero_after), extensions, path, zone)


def remember_term(out, term: Term) -> None:
    """Record in the grading folder ``out`` which term file (its absolute path) made its
    grades, so a later ``report DIR`` (or ``export``) without ``--term`` uses the same one."""
    if term is not None and term.path is not None:
        atomic_write(Path(out) / TERM_RECORD, f"{Path(term.path).resolve()}\n")


def remembered_term(out, lesson_ids=None) -> Term:
    """The term file recorded by :func:`remember_term` in ``out``, read again now (so edits to
    it count); EMPTY_TERM when none was recorded. Raises TermError when the recorded file is
    gone or no longer valid."""
    record = Path(out) / TERM_RECORD
    if not record.is_file():
        return EMPTY_TERM
    path = Path(record.read_text().strip())
    if not path.is_file():
        raise TermError(f"{record} names the term file {path}, which is gone: give the term "
                        "with --term FILE (or delete the record to grade without one)")
    return load_term(path, lesson_ids)
