"""The records of grading: what it found for one student and lesson, and the rows grades.csv shows.

- :class:`Result`: what grading found for one student and lesson (the journal keeps it as JSON,
  ``DIR/results/``). Its ``status`` stays the one-line text grades.csv shows;
  :meth:`Status.of` reads it into a :class:`Status` (a kind and a reason), so callers compare
  kinds instead of parsing text.
- :class:`FinalGrade`: a Result as a grade, with the term's late rule and the instructor's
  overrides applied; :mod:`autograder.term.policy` makes these rows (its docstring states the
  rule) and :func:`write_grades_csv` writes them.
- :func:`read_timestamp`: the submission time an nbgrader ``timestamp.txt`` holds, and its source.

Records only: nothing here reads the term file, an LMS's files or the journal's folders.
"""
from __future__ import annotations

import csv
import datetime as dt
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

from autograder import ids
from autograder.journal import atomic_write

__all__ = ["Result", "Status", "GRADED", "NEEDS_REVIEW", "TIMED_OUT", "REJECTED", "FinalGrade",
           "UNDECIDED_KINDS", "KEPT",
           "GRADE_COLUMNS", "write_grades_csv", "TIMESTAMP_SOURCE", "read_timestamp"]

GRADED, NEEDS_REVIEW, TIMED_OUT, REJECTED = "graded", "needs manual review", "timed out", "rejected"
UNDECIDED_KINDS = (NEEDS_REVIEW, TIMED_OUT)   # held back (export, push) until a row decides them
KEPT = "kept the tests' score"   # an overrides.csv row whose points are ``keep``
TIMESTAMP_SOURCE = "nbgrader timestamp.txt"    # each LMS's own sources: lms/ (Lms.stamp_source)
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
    attempt: str = ""          # identity of what was handed in (bytes only): decisions are its
    reused: bool = False       # True when taken from the journal of an earlier run
    retry: bool = False        # the grader (not the student) failed: grade again next run
    submitted_at: str = ""     # ISO 8601 (with its zone, or without for an LMS wall-clock time)
    submitted_at_source: str = ""   # where that time came from; "" when unknown

    @classmethod
    def from_dict(cls, data: dict) -> "Result":
        """A Result from a journal dict; keys this version does not know are ignored."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    @property
    def attempt_id(self) -> str:
        """The attempt a decision of overrides.csv is for: ``attempt``, else (a result graded
        before attempts were recorded) its ``digest``."""
        return self.attempt or self.digest


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
    stale: list = field(default_factory=list)       # [Override] of an earlier attempt: not applied
    attempt: str = ""              # the attempt graded (Result.attempt_id)

    @property
    def override_text(self) -> str:
        """What was overridden: "total=5" or "test_add=1; test_mul=3"."""
        return "; ".join(KEPT if o.keep else f"{o.exercise or 'total'}={o.points:g}"
                         for o in self.overrides)

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


def write_grades_csv(path: Path, rows: list, exercise_columns: list, hints=None) -> None:
    """grades.csv: GRADE_COLUMNS, the points of each exercise column, then ``hints`` when given
    ((student, assignment) -> mistake ids). A review or timeout someone decided says so in its
    status: "decided (was needs manual review: ...)". Atomic. Every cell is spreadsheet-safe
    (ids.spreadsheet_safe): a text a spreadsheet would run as a formula starts with ``'``."""
    columns = GRADE_COLUMNS + [c for c in dict.fromkeys(exercise_columns) if c not in GRADE_COLUMNS]
    columns += ["hints"] if hints is not None else []
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")   # RFC 4180; a lone CR in a cell is quoted
    w.writerow([ids.spreadsheet_safe(c) for c in columns])
    for r in rows:
        row = {"student_id": r.student, "assignment": r.assignment, "score": r.score,
               "max_score": r.max_score, "notes": "; ".join(r.notes),
               "status": f"decided (was {r.status})" if r.review == "decided" else str(r.status),
               "raw_score": r.raw_score, "late_penalty": r.late_penalty,
               "days_late": r.days_late, "due": r.due, "submitted_at": r.submitted_at,
               "submitted_at_source": r.submitted_at_source, "override": r.override_text,
               "override_comment": r.override_comment, "review": r.review,
               "hints": (hints or {}).get((r.student, r.assignment), "")}
        row.update({k: v for k, v in r.exercises.items() if k in columns and k not in row})
        w.writerow([ids.spreadsheet_safe(row.get(c, "")) for c in columns])
    atomic_write(path, buf.getvalue())


