"""Results and final grades as typed records: one model for grades.csv, report, penalties, export.

- :class:`Result`: what grading found for one student and lesson (the journal keeps it as JSON,
  ``DIR/results/``). Its ``status`` stays the one-line text grades.csv shows;
  :meth:`Status.of` reads it into a :class:`Status` (a kind and a reason), so callers compare
  kinds instead of parsing text.
- :class:`Override`: one row of ``DIR/overrides.csv``, the instructor's decision (read with
  :func:`read_overrides`, which names the line of every bad row).
- :class:`FinalGrade`: a Result turned into a grade by :func:`final_grades`, with the term's
  late rule (autograder.term.termfile) and the overrides applied. ``report`` writes grades.csv, the
  per-lesson CSVs, the feedback pages' grade box and report.html from these rows;
  ``export`` reads the same rows through :func:`load_final_grades`. Nothing here starts a kernel.

The rule (docs/instructors.md, "A term: due dates, extensions, overrides"):

1. raw score = the machine score, with each exercise override replacing that exercise's points,
   or the lesson-total override replacing the whole sum;
2. the due date is the student's extension, else the lesson's; the submission time comes from
   nbgrader's ``timestamp.txt`` (a folder submission), the Blackboard attempt date or a Moodle
   grading worksheet named in the term file; unknown: no penalty, and a note says so;
3. late by ``d`` started days (``d = ceil(late seconds / 86400)``): penalty =
   ``min(raw, raw * per_day * d)``; later than ``zero_after_days`` days: penalty = raw (score 0);
4. score = raw - penalty, rounded to 0.01 point.
"""
from __future__ import annotations

import csv
import datetime as dt
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from autograder import ids
from autograder.journal import atomic_write
from autograder.term.termfile import EMPTY_TERM, Term

__all__ = ["Result", "Status", "GRADED", "NEEDS_REVIEW", "TIMED_OUT", "REJECTED", "Override",
           "OverrideError", "OVERRIDES_FILE", "OVERRIDE_COLUMNS", "read_overrides", "FinalGrade",
           "final_grades", "class_grades", "with_worksheet_times", "late_penalty",
           "GRADE_COLUMNS", "write_grades_csv", "load_final_grades", "TIMESTAMP_SOURCE",
           "BLACKBOARD_SOURCE", "CANVAS_LATE_SOURCE", "read_timestamp"]

GRADED, NEEDS_REVIEW, TIMED_OUT, REJECTED = "graded", "needs manual review", "timed out", "rejected"
OVERRIDES_FILE = "overrides.csv"
OVERRIDE_COLUMNS = ["student_id", "assignment", "exercise", "points", "comment", "by"]
TIMESTAMP_SOURCE = "nbgrader timestamp.txt"
BLACKBOARD_SOURCE = "Blackboard attempt date"
CANVAS_LATE_SOURCE = "unknown (Canvas marked it _LATE_, its file names carry no time)"
# grades.csv: these, then the points of each exercise, then hints (autograder.reporting.insights).
GRADE_COLUMNS = ["student_id", "assignment", "score", "max_score", "status", "notes",
                 "raw_score", "late_penalty", "days_late", "due", "submitted_at",
                 "submitted_at_source", "override", "override_comment", "review"]


@dataclass
class Result:
    """The outcome for one student and one assignment (as the journal keeps it)."""
    student: str
    assignment: str
    score: float = 0.0
    max_score: float = 0.0
    status: str = "graded"     # "graded", "needs manual review: ...", "rejected: ...": Status.of
    exercises: dict = field(default_factory=dict)   # grade_id -> points scored
    feedback: list = field(default_factory=list)    # paths of the HTML feedback files
    notes: list = field(default_factory=list)       # repairs and choices made, one per line
    file: str = ""             # the submitted file that was graded
    digest: str = ""           # identity of the graded bytes + lesson + settings
    reused: bool = False       # True when taken from the journal of an earlier run
    retry: bool = False        # the grader (not the student) failed: grade again next run
    submitted_at: str = ""     # ISO 8601 (with its zone, or without for an LMS wall-clock time)
    submitted_at_source: str = ""   # where that time came from; "" when unknown

    @classmethod
    def from_dict(cls, data: dict) -> "Result":
        """A Result from a journal dict; keys this version does not know are ignored."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Status:
    """A submission's status: ``kind`` (GRADED, NEEDS_REVIEW, TIMED_OUT or REJECTED) and the
    ``reason`` (the text after the kind; for GRADED "" or what the grade lacks, e.g. "graded: no
    feedback page (...)": the score stands)."""
    kind: str
    reason: str = ""

    @classmethod
    def of(cls, text: str) -> "Status":
        """Read a status line as grades.csv shows it ("needs manual review: why")."""
        text = text or GRADED
        for kind in (NEEDS_REVIEW, TIMED_OUT, REJECTED):
            if text.startswith(kind):
                return cls(kind, text[len(kind):].lstrip(": ").strip())
        if text.startswith(GRADED + ":"):
            return cls(GRADED, text[len(GRADED) + 1:].strip())
        return cls(GRADED, "")

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}" if self.reason else self.kind


# ------------------------------------------------------------------------------- overrides

class OverrideError(ValueError):
    """overrides.csv has a bad row; the message names the file and line and what to write."""


@dataclass(frozen=True)
class Override:
    """One decision of overrides.csv: ``exercise`` "" sets the lesson's total ``points``."""
    student: str
    assignment: str
    exercise: str
    points: float
    comment: str = ""
    by: str = ""
    line: int = 0


def read_overrides(path, known: dict) -> list:
    """Read overrides.csv (header OVERRIDE_COLUMNS) and check every row against the class.

    ``known``: {(student id, assignment): {grade_id: max points}} of the graded class. A missing
    file is no overrides. An id may be written as grades.csv shows it (an id starting with
    ``=`` there keeps the apostrophe that stops a spreadsheet from running it). Raises OverrideError naming the line for: a wrong header, an unknown
    student, lesson or exercise, points that are not a number, negative or over the maximum,
    and a row that repeats an earlier one (same student, lesson and exercise).
    """
    path = Path(path)
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8-sig")   # a spreadsheet's BOM is fine
    except UnicodeDecodeError as exc:
        raise OverrideError(f"{path} is not UTF-8 text ({exc}); save it as CSV UTF-8.") from None
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader, [])]
    if header != OVERRIDE_COLUMNS:
        raise OverrideError(f"{path} line 1: the header must be {','.join(OVERRIDE_COLUMNS)} "
                            f"(found {','.join(header) or 'nothing'})")
    students = {s for s, _ in known}
    lessons = {a for _, a in known}
    out, seen = [], {}
    for row in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        where = f"{path} line {line}"
        if len(row) != len(OVERRIDE_COLUMNS):
            raise OverrideError(f"{where}: {len(row)} cells, expected {len(OVERRIDE_COLUMNS)} "
                                f"({','.join(OVERRIDE_COLUMNS)}; quote a comment with commas)")
        student, lesson, exercise, points, comment, by = (c.strip() for c in row)
        if student not in students and student[1:] in students and \
                ids.spreadsheet_safe(student[1:]) == student:
            student = student[1:]   # copied from grades.csv, where '=...' keeps its apostrophe
        if student not in students:
            raise OverrideError(f"{where}: no student {student!r} in this class (write the id "
                                "as grades.csv shows it)")
        if lesson not in lessons:
            raise OverrideError(f"{where}: no lesson {lesson!r} in this class "
                                f"(graded: {', '.join(sorted(lessons))})")
        if (student, lesson) not in known:
            raise OverrideError(f"{where}: {student!r} has no submission of {lesson!r}")
        maxima = known[(student, lesson)]
        if exercise and exercise not in maxima:
            raise OverrideError(f"{where}: lesson {lesson!r} has no exercise {exercise!r} "
                                f"(its exercises: {', '.join(maxima)}; empty sets the total)")
        try:
            value = float(points)
        except ValueError:
            raise OverrideError(f"{where}: points {points!r} is not a number") from None
        top = maxima[exercise] if exercise else sum(maxima.values())
        if not math.isfinite(value) or value < 0 or value > top:
            raise OverrideError(f"{where}: points {points} is outside 0 to {top:g}, the most "
                                f"{'exercise ' + repr(exercise) if exercise else 'the lesson'} "
                                "can score")
        key = (student, lesson, exercise)
        if key in seen:
            raise OverrideError(f"{where} repeats line {seen[key]} (same student, lesson and "
                                "exercise): keep one")
        seen[key] = line
        out.append(Override(student, lesson, exercise, value, comment, by, line))
    return out


# ---------------------------------------------------------------------------- final grades

@dataclass
class FinalGrade:
    """One row of grades.csv: a Result with the late rule and the overrides applied (points)."""
    student: str
    assignment: str
    score: float                   # the final one: raw_score - late_penalty
    max_score: float
    status: Status
    notes: list
    raw_score: float               # machine score with the overrides applied
    machine_score: float
    late_penalty: float = 0.0
    days_late: int = 0             # started days after the due date
    due: str = ""                  # ISO 8601, "" when the lesson has none
    submitted_at: str = ""
    submitted_at_source: str = ""
    overrides: list = field(default_factory=list)   # [Override] applied, in file order
    review: str = ""               # "undecided" / "decided" for a manual-review submission
    exercises: dict = field(default_factory=dict)   # grade_id -> points, overrides applied
    feedback: list = field(default_factory=list)
    late_note: str = ""            # why the penalty is what it is, in words (shown to students)

    @property
    def override_text(self) -> str:
        """What was overridden: "total=5" or "test_add=1; test_mul=3"."""
        return "; ".join(f"{o.exercise or 'total'}={o.points:g}" for o in self.overrides)

    @property
    def override_comment(self) -> str:
        return "; ".join(f"{o.comment}" + (f" ({o.by})" if o.by else "") for o in self.overrides
                         if o.comment or o.by)


_STAMP = re.compile(r"^(?P<when>\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d(?:\.\d+)?)?)"
                    r"(?:\s*(?P<zone>\S+))?$")
_OFFSET = re.compile(r"^(?P<sign>[+-])(?P<h>\d\d):?(?P<m>\d\d)$")
_ABBREVIATION = re.compile(r"^[A-Z]{2,5}$")
_ZONE_MARK = ", zone "     # TIMESTAMP_SOURCE + this + an abbreviation: read in the term's zone


def read_timestamp(text: str) -> tuple:
    """(ISO 8601 time, source) of an nbgrader ``timestamp.txt`` ("2026-10-01 17:59:00.000000
    EDT": nbgrader writes ``%Y-%m-%d %H:%M:%S.%f %Z`` in its ``Exchange.timezone``).

    The zone may be ``UTC``/``GMT``/``Z``, an offset (``+0200``, ``-04:00``), an IANA name
    (``America/New_York``) or none (UTC, as nbgrader reads it): the time returned carries it.
    An abbreviation (``EDT``, ``CEST``) names no single offset, so the wall-clock time is
    returned without a zone and the source says which abbreviation it was; final_grades reads
    it in the term file's time zone when that zone uses the abbreviation at that time, and
    otherwise refuses the time with a note (never UTC silently). Raises ValueError when the
    text is not such a time."""
    import zoneinfo
    m = _STAMP.match(text.strip())
    if not m:
        raise ValueError(f"not an nbgrader time: {text.strip()[:60]!r}")
    when = dt.datetime.fromisoformat(m["when"].replace(" ", "T"))
    zone = m["zone"] or "UTC"
    if zone in ("UTC", "GMT", "Z", "UT"):
        return when.replace(tzinfo=dt.timezone.utc).isoformat(), TIMESTAMP_SOURCE
    offset = _OFFSET.match(zone)
    if offset:
        minutes = int(offset["h"]) * 60 + int(offset["m"])
        delta = dt.timedelta(minutes=minutes if offset["sign"] == "+" else -minutes)
        return when.replace(tzinfo=dt.timezone(delta)).isoformat(), TIMESTAMP_SOURCE
    if _ABBREVIATION.match(zone):
        return when.isoformat(), f"{TIMESTAMP_SOURCE}{_ZONE_MARK}{zone}"
    try:
        return when.replace(tzinfo=zoneinfo.ZoneInfo(zone)).isoformat(), TIMESTAMP_SOURCE
    except (ValueError, zoneinfo.ZoneInfoNotFoundError):
        raise ValueError(f"time zone {zone!r} is neither an offset, an abbreviation nor a "
                         "time zone name") from None


def _abbreviation_mismatch(when: dt.datetime, source: str, zone) -> str:
    """Why the abbreviation ``source`` names does not fit the term's ``zone`` at ``when`` (an
    aware time read in that zone); "" when it fits or the source names none."""
    if not source.startswith(TIMESTAMP_SOURCE + _ZONE_MARK):
        return ""
    abbreviation = source[len(TIMESTAMP_SOURCE + _ZONE_MARK):]
    if when.tzname() == abbreviation:
        return ""
    return (f"unknown (timestamp.txt gives the zone {abbreviation}, but the term file's time zone "
            f"{zone} is {when.tzname()} at that time: set the term file's timezone to the one "
            "nbgrader's Exchange.timezone names)")


def _aware(text: str, zone) -> dt.datetime | None:
    """An ISO time string as an aware datetime (a time without zone is read in ``zone``)."""
    if not text:
        return None
    when = dt.datetime.fromisoformat(text)
    return when if when.tzinfo else when.replace(tzinfo=zone)


def _unknown_time(source: str) -> str:
    """"submission time unknown", with why when ``source`` says it. A source that itself
    starts with "unknown (" (CANVAS_LATE_SOURCE) gives its reason once: "submission time unknown
    (Canvas marked it _LATE_, ...)", not "unknown (unknown (...))"."""
    reason = source.strip()
    if reason.startswith("unknown (") and reason.endswith(")"):
        reason = reason[len("unknown ("):-1]
    elif reason == "unknown":
        reason = ""
    return f"submission time unknown ({reason})" if reason else "submission time unknown"


def late_penalty(raw: float, late_seconds: float, term: Term) -> tuple:
    """(penalty points, started days late) for ``raw`` points handed in ``late_seconds`` after
    the due date (0 or less: on time) under ``term.late``: per_day x raw per started day, all of
    it past zero_after_days days. Never more than ``raw``."""
    if late_seconds <= 0:
        return 0.0, 0
    days = math.ceil(late_seconds / 86400)
    rule = term.late
    if rule.zero_after_days is not None and late_seconds > rule.zero_after_days * 86400:
        return raw, days
    return min(raw, raw * rule.per_day * days), days


def final_grades(results, term: Term = None, overrides=(), lesson_max: dict = None) -> list:
    """Turn graded results into final grade rows (the rule in the module docstring).

    ``results``: Results or journal dicts; ``term``: a Term (None: no due dates); ``overrides``:
    [Override] from :func:`read_overrides`; ``lesson_max``: {assignment: max score} for a
    result that has none (rejected). Returns [FinalGrade] in the order of ``results``. Raises
    ValueError for a ``submitted_at`` that is not ISO 8601.
    """
    term = term or EMPTY_TERM
    zone = term.timezone
    mine = {}
    for o in overrides:
        mine.setdefault((o.student, o.assignment), []).append(o)
    rows = []
    for res in results:
        res = Result.from_dict(res) if isinstance(res, dict) else res
        status = Status.of(res.status)
        decided = mine.get((res.student, res.assignment), [])
        exercises = {k: float(v) for k, v in res.exercises.items()}
        machine = float(res.score) if status.kind != REJECTED else 0.0
        raw = machine
        for o in decided:
            if o.exercise:
                raw += o.points - exercises.get(o.exercise, 0.0)
                exercises[o.exercise] = o.points
        total = [o for o in decided if not o.exercise]
        if total:
            raw = total[-1].points
        notes = list(res.notes)
        due = term.due(res.student, res.assignment)
        when = _aware(res.submitted_at, zone)
        source = res.submitted_at_source
        refused = _abbreviation_mismatch(when, source, zone) if when is not None else ""
        if refused:
            when, source = None, refused
        penalty, days, late_note = 0.0, 0, ""
        if due is not None and when is not None and status.kind != REJECTED:
            penalty, days = late_penalty(raw, (when - due).total_seconds(), term)
            if days:
                late_note = (f"handed in {when.astimezone(due.tzinfo).isoformat(' ', 'minutes')}, "
                             f"{days} started "
                             f"day{'s' * (days != 1)} after the due date "
                             f"{due.isoformat(' ', 'minutes')}: -{penalty:g} "
                             f"point{'s' * (round(penalty, 2) != 1)}")
                if penalty == raw and term.late.zero_after_days is not None and \
                        days > term.late.zero_after_days:
                    late_note += f" (later than {term.late.zero_after_days:g} days scores 0)"
                else:
                    late_note += f" ({term.late.per_day:.0%} of {raw:g} per started day)"
        elif due is not None and status.kind != REJECTED:
            late_note = f"{_unknown_time(source)}: no late penalty applied"
            notes.append(late_note)
        review = ""
        if status.kind == NEEDS_REVIEW:
            review = "decided" if decided else "undecided"
        max_score = float(res.max_score or (lesson_max or {}).get(res.assignment, 0.0))
        rows.append(FinalGrade(
            res.student, res.assignment, round(raw - penalty, 2), max_score, status, notes,
            round(raw, 2), machine, round(penalty, 2), days, due.isoformat() if due else "",
            res.submitted_at, res.submitted_at_source or ("" if res.submitted_at else "unknown"),
            decided, review, exercises, list(res.feedback), late_note))
    return rows


def write_grades_csv(path: Path, rows: list, exercise_columns: list, hints=None) -> None:
    """grades.csv: GRADE_COLUMNS, the points of each exercise column, then ``hints`` when given
    ((student, assignment) -> mistake ids). Atomic. Every cell is spreadsheet-safe
    (ids.spreadsheet_safe): a text a spreadsheet would run as a formula starts with ``'``."""
    columns = GRADE_COLUMNS + [c for c in dict.fromkeys(exercise_columns) if c not in GRADE_COLUMNS]
    columns += ["hints"] if hints is not None else []
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")   # RFC 4180; a lone CR in a cell is quoted
    w.writerow([ids.spreadsheet_safe(c) for c in columns])
    for r in rows:
        row = {"student_id": r.student, "assignment": r.assignment, "score": r.score,
               "max_score": r.max_score, "status": str(r.status), "notes": "; ".join(r.notes),
               "raw_score": r.raw_score, "late_penalty": r.late_penalty,
               "days_late": r.days_late, "due": r.due, "submitted_at": r.submitted_at,
               "submitted_at_source": r.submitted_at_source, "override": r.override_text,
               "override_comment": r.override_comment, "review": r.review,
               "hints": (hints or {}).get((r.student, r.assignment), "")}
        row.update({k: v for k, v in r.exercises.items() if k in columns and k not in row})
        w.writerow([ids.spreadsheet_safe(row.get(c, "")) for c in columns])
    atomic_write(path, buf.getvalue())


def class_grades(out, results: list, maxima: dict, term: Term = None) -> list:
    """Final grade rows of ``results`` (journal dicts of the class graded into ``out``) with
    ``term`` and ``out/overrides.csv`` checked against ``maxima`` ({assignment: {grade_id:
    points}}). Raises OverrideError for a bad row."""
    known = {(r["student"], r["assignment"]): maxima.get(r["assignment"], {}) for r in results}
    overrides = read_overrides(Path(out) / OVERRIDES_FILE, known)
    return final_grades(with_worksheet_times(results, term), term, overrides,
                        {a: sum(m.values()) for a, m in maxima.items()})


def with_worksheet_times(results: list, term: Term = None) -> list:
    """``results`` (journal dicts) where each one with no submission time, of a lesson whose
    term entry names a Moodle grading worksheet, takes that worksheet's "Last modified
    (submission)" for its participant id (the number the Moodle student id ends with).
    Raises ValueError / FileNotFoundError for an unreadable worksheet."""
    from autograder.lms.layouts import MOODLE_SOURCE, moodle_submission_times
    term = term or EMPTY_TERM
    sheets, out = {}, []
    for r in results:
        sheet = term.lesson(r["assignment"]).moodle_worksheet
        number = r["student"].rsplit("_", 1)[-1]
        if sheet is None or r.get("submitted_at") or not number.isdigit():
            out.append(r)
            continue
        if sheet not in sheets:
            sheets[sheet] = moodle_submission_times(sheet, term.timezone)
        when = sheets[sheet].get(number)
        out.append({**r, "submitted_at": when.isoformat(), "submitted_at_source": MOODLE_SOURCE}
                   if when else r)
    return out


def load_final_grades(out, term: Term = None, root=None) -> list:
    """The final grade rows of the class graded into ``out`` (no kernel, no regrading): its
    journal, ``term`` (None: the term file recorded in ``out`` by the last ``--term``, else no
    due dates; its lessons checked against the course at ``root``, default the installed one)
    and ``out/overrides.csv``. This is what ``report`` writes and ``export`` reads.
    Raises FileNotFoundError when ``out`` holds no graded class, OverrideError, TermError."""
    from autograder.reporting.insights import lesson_maxima, load_results
    from autograder.term.termfile import remembered_term
    results = load_results(Path(out))
    if term is None:
        from autograder.config import list_assignments
        term = remembered_term(out, list_assignments(Path(root)) if root else None)
    return class_grades(out, results, lesson_maxima(Path(out), {r["assignment"] for r in results}),
                        term)
