"""The term's policy turned into final grades: the instructor's overrides, the late rule, the rows.

- :class:`Override`: one row of ``DIR/overrides.csv``, the instructor's decision (read with
  :func:`read_overrides`, which names the line of every bad row).
- :func:`final_grades`: each :class:`autograder.results.Result` turned into a
  :class:`autograder.results.FinalGrade`, with the term's late rule (autograder.term.termfile)
  and the overrides applied. ``report`` writes grades.csv, the per-lesson CSVs, the feedback
  pages' grade box and report.html from these rows; ``export`` reads the same rows through
  :func:`load_final_grades`. Nothing here starts a kernel.

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
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from autograder import ids
from autograder.config import list_assignments
from autograder.journal import atomic_write, load_results
from autograder.release import lesson_maxima
from autograder.lms.moodle import MOODLE_SOURCE, moodle_submission_times
from autograder.results import (KEPT, REJECTED, TIMESTAMP_SOURCE, UNDECIDED_KINDS, _ZONE_MARK,
                                FinalGrade, Result, Status)
from autograder.term.termfile import EMPTY_TERM, Term, remembered_term

__all__ = ["Override", "OverrideError", "OverridesStamped", "OVERRIDES_FILE", "OVERRIDE_COLUMNS",
           "ATTEMPT_COLUMN", "KEEP", "read_overrides", "stamp_overrides", "final_grades",
           "grade_rows", "class_grades", "with_worksheet_times", "late_penalty",
           "load_final_grades"]

OVERRIDES_FILE = "overrides.csv"
OVERRIDE_COLUMNS = ["student_id", "assignment", "exercise", "points", "comment", "by"]
ATTEMPT_COLUMN = "attempt"   # optional 7th column: the digest (or its first 8+ characters)
KEEP = "keep"                # the points of a row that keeps the tests' score (a decision)
_HEX = re.compile(r"[0-9a-f]{8,64}")


class OverrideError(ValueError):
    """overrides.csv has a bad row; the message names the file and line and what to write."""


class OverridesStamped(UserWarning):
    """Rows of overrides.csv written without an attempt were stamped with the one graded."""


@dataclass(frozen=True)
class Override:
    """One decision of overrides.csv: ``exercise`` "" sets the lesson's total ``points``;
    ``keep`` (points ``keep``, exercise "") keeps the tests' score as the decision; ``attempt``
    the digest (or a prefix) of the attempt decided, "" for a row not stamped yet."""
    student: str
    assignment: str
    exercise: str
    points: float
    comment: str = ""
    by: str = ""
    line: int = 0
    attempt: str = ""
    keep: bool = False

    def for_attempt(self, attempt: str) -> bool:
        """Whether this decision is for ``attempt`` (a row not stamped yet: for any)."""
        return not self.attempt or bool(attempt) and attempt.startswith(self.attempt)

    @property
    def what(self) -> str:
        """The decision in words ("lesson total set to 5 points", "kept the tests' score")."""
        if self.keep:
            return KEPT
        where = f"exercise {self.exercise}" if self.exercise else "lesson total"
        return f"{where} set to {self.points:g} point{'s' * (self.points != 1)}"


def _read_rows(path: Path):
    """(header, [(line, cells)]) of overrides.csv; raises OverrideError for a file that is not
    UTF-8. The BOM a spreadsheet writes is fine."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise OverrideError(f"{path} is not UTF-8 text ({exc}); save it as CSV UTF-8.") from None
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader, [])]
    rows = []
    for row in reader:
        rows.append((reader.line_num, row))
    return header, rows


def read_overrides(path, known: dict) -> list:
    """Read overrides.csv (header OVERRIDE_COLUMNS, optionally followed by ``attempt``) and
    check every row against the class.

    ``known``: {(student id, assignment): {grade_id: max points}} of the graded class. A missing
    file is no overrides. An id may be written as grades.csv shows it (an id starting with
    ``=`` there keeps the apostrophe that stops a spreadsheet from running it). Raises OverrideError naming the line for: a wrong header, an unknown
    student, lesson or exercise, points that are not a number (or ``keep`` for a lesson),
    negative or over the maximum, an attempt that is not a digest, and a row that repeats an
    earlier one (same student, lesson, exercise and attempt).
    """
    path = Path(path)
    if not path.is_file():
        return []
    header, rows = _read_rows(path)
    if header not in (OVERRIDE_COLUMNS, OVERRIDE_COLUMNS + [ATTEMPT_COLUMN]):
        raise OverrideError(f"{path} line 1: the header must be {','.join(OVERRIDE_COLUMNS)} "
                            f"(optionally followed by ,{ATTEMPT_COLUMN}) "
                            f"(found {','.join(header) or 'nothing'})")
    students = {s for s, _ in known}
    lessons = {a for _, a in known}
    out, seen = [], {}
    for line, row in rows:
        if not any(cell.strip() for cell in row):
            continue
        where = f"{path} line {line}"
        if len(row) not in (len(OVERRIDE_COLUMNS), len(header)):   # attempt may be left out
            expected = " or ".join(str(n) for n in sorted({len(OVERRIDE_COLUMNS), len(header)}))
            raise OverrideError(f"{where}: {len(row)} cells, expected {expected} "
                                f"({','.join(header)}; quote a comment with commas)")
        student, lesson, exercise, points, comment, by = (c.strip() for c in row[:6])
        attempt = row[6].strip().lower() if len(row) > 6 else ""
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
        if attempt and not _HEX.fullmatch(attempt):
            raise OverrideError(f"{where}: attempt {attempt!r} is not a digest (grades.csv's "
                                f"{ATTEMPT_COLUMN} column, or its first 8 characters or more); "
                                "leave it empty for the attempt graded now")
        keep = points.lower() == KEEP
        if keep and exercise:
            raise OverrideError(f"{where}: points {KEEP!r} keeps the tests' score of the whole "
                                f"lesson: leave exercise empty (or write the points of "
                                f"{exercise!r})")
        try:
            value = 0.0 if keep else float(points)
        except ValueError:
            raise OverrideError(f"{where}: points {points!r} is not a number (or {KEEP!r} to "
                                "keep the tests' score)") from None
        top = maxima[exercise] if exercise else sum(maxima.values())
        if not math.isfinite(value) or value < 0 or value > top:
            raise OverrideError(f"{where}: points {points} is outside 0 to {top:g}, the most "
                                f"{'exercise ' + repr(exercise) if exercise else 'the lesson'} "
                                "can score")
        key = (student, lesson, exercise, attempt)
        if key in seen:
            raise OverrideError(f"{where} repeats line {seen[key]} (same student, lesson, "
                                "exercise and attempt): keep one")
        seen[key] = line
        out.append(Override(student, lesson, exercise, value, comment, by, line, attempt, keep))
    return out


def stamp_overrides(path, overrides: list, attempts: dict) -> list:
    """Stamp each row of ``overrides`` (read from ``path``) that names no attempt with the
    attempt graded now (``attempts``: {(student, lesson): attempt id}), in the file itself (an
    ``attempt`` column added when it has none; every other cell as written), and warn
    (OverridesStamped) naming each line. Returns the overrides as stamped. A row whose
    submission has no attempt id is left as it is."""
    todo = {o.line: attempts.get((o.student, o.assignment)) for o in overrides
            if not o.attempt and attempts.get((o.student, o.assignment))}
    if not todo:
        return list(overrides)
    path = Path(path)
    raw = path.read_bytes()
    header, rows = _read_rows(path)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n" if b"\r\n" in raw else "\n")
    w.writerow(OVERRIDE_COLUMNS + [ATTEMPT_COLUMN])
    for line, row in rows:
        if not any(cell.strip() for cell in row):
            w.writerow(row)
            continue
        row = row + [""] * (len(OVERRIDE_COLUMNS) + 1 - len(row))
        if line in todo:
            row[len(OVERRIDE_COLUMNS)] = todo[line]
        w.writerow(row)
    atomic_write(path, ("\ufeff" if raw.startswith(b"\xef\xbb\xbf") else "") + buf.getvalue())
    said = "; ".join(f"line {o.line} ({o.student}, {o.assignment}: {o.what})"
                     for o in overrides if o.line in todo)
    first = next(iter(todo.values()))
    warnings.warn(OverridesStamped(
        f"{path}: {said} named no attempt: stamped with attempt {first[:12]}"
        f"{' and others' if len(set(todo.values())) > 1 else ''}, the one graded now (its "
        f"{ATTEMPT_COLUMN} column); a new attempt will not be decided by it"), stacklevel=2)
    return [replace(o, attempt=todo[o.line]) if o.line in todo else o for o in overrides]


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
    starts with "unknown (" (an Lms.late_source) gives its reason once: "submission time unknown
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
        attempt = res.attempt_id
        decided, stale = [], []
        for o in mine.get((res.student, res.assignment), []):
            (decided if o.for_attempt(attempt) else stale).append(o)
        exercises = {k: float(v) for k, v in res.exercises.items()}
        machine = float(res.score) if status.kind != REJECTED else 0.0
        raw = machine
        for o in decided:
            if o.exercise:
                raw += o.points - exercises.get(o.exercise, 0.0)
                exercises[o.exercise] = o.points
        total = [o for o in decided if not o.exercise and not o.keep]
        if total:
            raw = total[-1].points
        notes = list(res.notes)
        now = (f"line {', '.join(str(o.line) for o in decided)} decide{'s' * (len(decided) == 1)} this one"
               if decided else "decide again")
        for o in stale:
            notes.append(f"overrides.csv line {o.line} ({o.what}) decided an earlier attempt "
                         f"({o.attempt[:12]}), not this one ({attempt[:12] or 'unknown'}): not "
                         f"applied; {now}")
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
        if status.kind in UNDECIDED_KINDS:
            review = "decided" if decided else "undecided"
        max_score = float(res.max_score or (lesson_max or {}).get(res.assignment, 0.0))
        rows.append(FinalGrade(
            res.student, res.assignment, round(raw - penalty, 2), max_score, status, notes,
            round(raw, 2), machine, round(penalty, 2), days, due.isoformat() if due else "",
            res.submitted_at, res.submitted_at_source or ("" if res.submitted_at else "unknown"),
            decided, review, exercises, list(res.feedback), late_note, stale, attempt))
    return rows


def class_grades(out, results: list, maxima: dict, term: Term = None) -> list:
    """Final grade rows of ``results`` (journal dicts of the class graded into ``out``) with
    ``term`` and ``out/overrides.csv`` checked against ``maxima`` ({assignment: {grade_id:
    points}}). Raises OverrideError for a bad row."""
    known = {(r["student"], r["assignment"]): maxima.get(r["assignment"], {}) for r in results}
    path = Path(out) / OVERRIDES_FILE
    overrides = stamp_overrides(path, read_overrides(path, known), attempts_of(results))
    return grade_rows(results, term, overrides, {a: sum(m.values()) for a, m in maxima.items()})


def attempts_of(results) -> dict:
    """{(student, lesson): attempt id} of ``results`` (Results or journal dicts)."""
    found = (Result.from_dict(r) if isinstance(r, dict) else r for r in results)
    return {(r.student, r.assignment): r.attempt_id for r in found}


def grade_rows(results, term: Term = None, overrides=(), lesson_max: dict = None) -> list:
    """The one route to final grades: ``results`` (Results or journal dicts) with the Moodle
    worksheets' submission times (:func:`with_worksheet_times`), the late rule and ``overrides``
    applied (:func:`final_grades`). grades.csv while ``grade`` runs (and after it was
    interrupted, or its report step failed), ``report``, the feedback pages' grade box,
    ``export`` and ``canvas push`` all take their rows from here."""
    dicts = [asdict(r) if isinstance(r, Result) else r for r in results]
    return final_grades(with_worksheet_times(dicts, term), term, overrides, lesson_max)


def with_worksheet_times(results: list, term: Term = None) -> list:
    """``results`` (journal dicts) where each one with no submission time, of a lesson whose
    term entry names a Moodle grading worksheet, takes that worksheet's "Last modified
    (submission)" for its participant id (the number the Moodle student id ends with).
    Raises ValueError / FileNotFoundError for an unreadable worksheet."""
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
    results = load_results(Path(out))
    if term is None:
        term = remembered_term(out, list_assignments(Path(root)) if root else None)
    return class_grades(out, results, lesson_maxima(Path(out), {r["assignment"] for r in results}),
                        term)
