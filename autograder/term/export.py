"""Grades back into the LMS: fill in the gradebook file Canvas, Moodle or Blackboard downloads.

``python -m autograder export DIR --lms canvas|moodle|blackboard --gradebook FILE --out FILE``
reads the final scores of a graded class (DIR/grades.csv, :func:`_final_rows`) and writes a copy
of the LMS's own gradebook file with the cells it has a grade for filled in, ready to upload:

- **Canvas**, the gradebook export (Grades > Export > Export Entire Gradebook): a header row
  ``Student, ID, SIS User ID, SIS Login ID, [Integration ID,] Section``, one column per
  assignment named ``<title> (<assignment id>)``, totals columns; a second row whose first cell
  is ``Points Possible`` holds each column's points (``(read only)`` for totals); Canvas may add
  rows such as ``Muted`` or ``Manual Posting``. A student is matched by the trailing number of
  the id a Canvas submissions zip gives (``smithann_12345`` -> ID ``12345``); a lesson by its
  term file ``lms_column`` (the header, or just its ``(1234)``); its score is scaled to the
  column's points possible.
- **Moodle**, the assignment's grading worksheet (View all submissions > Download grading
  worksheet): ``Identifier`` (``Participant 1001``), ``Full name``, ..., ``Grade``, ``Maximum
  Grade``, ``Grade can be changed``, ``Last modified (submission)``, ``Last modified (grade)``,
  ``Feedback comments``. A worksheet is one assignment, so it fills one lesson: ``--lesson ID``,
  else the lesson whose ``lms_column`` (the assignment's name in Moodle) appears in the
  worksheet's file name (Moodle names it ``Grades-<course>-<assignment>-<cmid>.csv``), else the
  only lesson grades.csv holds. A student is matched by the participant id a Moodle zip gives
  (``Ann Smith_1001`` -> ``Participant 1001``); the score is scaled to the row's Maximum Grade
  (Moodle refuses a grade above it, so a larger one is capped, and said). Its headers are matched
  ignoring case and surrounding spaces (``Maximum grade``, `` maximum Grade ``): Moodle versions
  and language packs differ in case.
- **Blackboard**, the Grade Centre's Work Offline > Download (tab-delimited ``.xls``, often
  UTF-16, or comma-separated): ``Last Name, First Name, Username, Student ID, ...`` and columns
  ``<name> [Total Pts: 10 Score] |123456``. A student is matched by user name (the id a
  Blackboard zip gives), a lesson by ``lms_column`` (the header, its name or its ``|123456``);
  the score is scaled to the header's Total Pts. Only Score columns are filled: a calculated
  column (``up to``) or one shown as a percentage or letter is named as not filled.

Every other byte is kept: rows, columns, quoting, delimiter, encoding (a UTF-8 or UTF-16 byte
order mark included) and line endings (only a filled row holding a cell the csv module reads
otherwise than it is written, such as ``"Odd"ly``, is written again whole, quoted as the
header is); a student without a grade keeps what the LMS had. No
written cell is ever a formula (ids.spreadsheet_safe). What was matched, and what was not
(students on either side, lessons without a column), is returned and printed.

With ``--feedback ZIP`` it also writes the feedback pages (DIR/feedback/<student>/<lesson>/)
the way the LMS takes them back: for Moodle the "upload multiple feedback files in a zip"
layout, one folder per student named ``<student id>_assignsubmission_file_/`` after the id
grades.csv has (``Ann Smith_1001_assignsubmission_file_/<lesson>_feedback.html``: a class graded
from Moodle's own download has its ``Full Name_<participant id>``, an id ``bea_1002`` gives
``bea_1002_...``); Moodle's importer reads only the participant id, the number after the first
``_``. For Canvas and Blackboard: a folder per lesson with one page per student, named after
the student as the gradebook shows them and their id
(``01_running_sum/Smith, Ann (smithann_12345).html``), to attach in SpeedGrader or the Grade
Centre.
"""
from __future__ import annotations

import csv
import math
import os
import zipfile
from collections import Counter
from pathlib import Path

from autograder import ids
from autograder.lms.base import LMSS
from autograder.lms.gradebooks import Export, lesson_columns, number_of, points_text
from autograder.lms.table import ExportError, Table, read_table, write_table
from autograder.results import NEEDS_REVIEW, REJECTED, TIMED_OUT, Status
from autograder.term.policy import load_final_grades
from autograder.course import LESSONS
from autograder.term.termfile import TERM_RECORD, load_term, remembered_term
from autograder.engine.feedback import gradebook_page

__all__ = ["ExportError", "Table", "read_table", "write_table", "export_gradebook",
           "Export", "format_export", "export_outcome", "term_for", "recorded_term", "write_feedback_zip"]


# ------------------------------------------------------------------------------ grades.csv

def _original(cell: str) -> str:
    """A grades.csv text cell as it was before ids.spreadsheet_safe added an apostrophe."""
    return cell[1:] if cell.startswith("'") and cell[1:].startswith(ids.FORMULA_PREFIXES) else cell


def _undecided(status, review: str, overridden: bool) -> str:
    """Why a final grade is no one's decision yet ("" when it is one): a manual review or a
    timed-out submission no row of overrides.csv decided (for the attempt graded), or rejected
    work (no notebook, unreadable) with no row either."""
    if status.kind == NEEDS_REVIEW and review != "decided" and not overridden:
        return f"manual review undecided ({status.reason or 'no reason given'})"
    if status.kind == TIMED_OUT and review != "decided" and not overridden:
        return f"timed out ({status.reason or 'a limit was reached'})"
    if status.kind == REJECTED and not overridden:
        return f"rejected, not graded ({status.reason or 'no reason given'})"
    return ""


def _final_rows(out_dir, term=None) -> list:
    """The final score of each (student, lesson) of a graded class: dicts with student_id,
    assignment, score and max_score (floats) and held (why no one has decided that grade yet,
    :func:`_undecided`; "" when decided), read from ``out_dir``/grades.csv.

    The one place export reads scores from. A class graded here (its journal in
    ``out_dir``/results) is read as ``report`` reads it, with ``term``'s late rules (None: the
    term file of the last ``--term``) and ``overrides.csv`` applied
    (:func:`autograder.term.policy.load_final_grades`); a folder holding only a grades.csv (copied
    from elsewhere) is read from its ``score`` column. Raises ExportError naming the file, row
    and column of anything unreadable.
    """
    if (Path(out_dir) / "results").is_dir():
        try:
            return [{"student_id": g.student, "assignment": g.assignment, "score": float(g.score),
                     "max_score": float(g.max_score),
                     "held": _undecided(g.status, g.review, bool(g.overrides))}
                    for g in load_final_grades(out_dir, term)]
        except FileNotFoundError:
            pass   # no graded result in it: read grades.csv
    path = Path(out_dir) / "grades.csv"
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows, fields = list(reader), reader.fieldnames or []
    except FileNotFoundError:
        raise ExportError(f"No grades.csv in {out_dir}: run `python -m autograder grade "
                          f"SUBMISSIONS --out {out_dir}` first.") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ExportError(f"{path} is not the UTF-8 CSV file grade writes ({exc})") from None
    need = ["student_id", "assignment", "score", "max_score"]
    missing = [c for c in need if c not in fields]
    if missing:
        raise ExportError(f"{path}: no column {', '.join(missing)} (it has {', '.join(fields)})")
    out = []
    for n, row in enumerate(rows, start=2):
        item = {"student_id": _original(row["student_id"]), "assignment": row["assignment"],
                "held": _undecided(Status.of(row.get("status") or ""), row.get("review") or "",
                                   bool(row.get("override")))}
        for col in ("score", "max_score"):
            try:
                item[col] = float(row[col])
            except (TypeError, ValueError):
                raise ExportError(f"{path}, row {n}, column {col}: {row[col]!r} is not a "
                                  "number") from None
            if not math.isfinite(item[col]):
                raise ExportError(f"{path}, row {n}, column {col}: {row[col]!r} is not a number")
        out.append(item)
    return out


def term_for(path, out_dir):
    """The term file at ``path``, read with term.load_term for the course's lessons and those
    the class in ``out_dir`` was graded on (a course of other lessons than this one's)."""
    graded = set()
    try:    # only the lesson ids: read without a term (a recorded one could name other lessons)
        with open(Path(out_dir) / "grades.csv", newline="", encoding="utf-8") as f:
            graded = {r.get("assignment") or "" for r in csv.DictReader(f)} - {""}
    except (OSError, UnicodeDecodeError, csv.Error):
        pass    # _final_rows says what is wrong with it
    return load_term(path, set(LESSONS) | graded)


def recorded_term(out_dir):
    """The term file recorded in ``out_dir`` by the last ``grade``/``report --term``
    (term.TERM_RECORD), read whole as :func:`term_for` reads a ``--term`` file (its late rules
    and its lms_column entries), or None when none is recorded. Raises TermError when the
    recorded file is gone or no longer valid."""
    record = Path(out_dir) / TERM_RECORD
    if not record.is_file():
        return None
    path = Path(record.read_text().strip())
    if not path.is_file():
        remembered_term(out_dir)    # raises the TermError that names the record and the file
    return term_for(path, out_dir)


def export_gradebook(out_dir, lms: str, gradebook, out, term=None, lesson=None,
                     feedback=None, send_undecided: bool = False) -> Export:
    """Fill the LMS gradebook file ``gradebook`` with the final scores of the class graded into
    ``out_dir`` and write it to ``out``; with ``feedback``, also write the feedback zip.

    ``lms``: canvas, moodle or blackboard. ``term``: a :class:`autograder.term.termfile.Term` (its
    lms_column map and late rules), or None: the term file recorded in ``out_dir`` by the last
    ``--term`` (:func:`recorded_term`, the same one the scores' late penalties come from), else
    none. ``lesson``: for Moodle, the lesson the worksheet is for; for
    Canvas and Blackboard, fill only that lesson's column (None: every lesson). A grade no one
    decided (an undecided manual review, rejected work without an overrides.csv row) is held
    back: its cell stays as the LMS gave it and it is listed in ``Export.held``, unless
    ``send_undecided`` (then it is filled with its machine score and listed all the same). Returns an
    :class:`Export` (format_export prints it). Raises ExportError on a file it cannot use.
    """
    if lms not in LMSS:     # the LMSs of lms/ (autograder.lms.base.LMSS)
        raise ExportError(f"--lms {lms!r}: one of {', '.join(LMSS)}")
    recorded = term is None
    if recorded:    # the whole recorded term file: its late rules and its lms_column alike
        term = recorded_term(out_dir)
    rows = _final_rows(out_dir, term)
    table = read_table(gradebook)
    book = LMSS[lms].gradebook(table)
    lessons = {r["assignment"] for r in rows}
    only = book.lesson_for(lessons, term, lesson, gradebook)   # Moodle: the worksheet's one
    result = Export(lms, Path(gradebook), Path(out), sent_undecided=send_undecided)
    if term is not None and term.path is not None:
        result.term_file, result.term_recorded = Path(term.path), recorded
    result.columns, result.unmatched_lessons = lesson_columns(book, lessons, term, only)
    students = book.students()
    changes, graded_rows, filled_by, held_rows = {}, set(), {}, set()
    landing = {}     # (gradebook row, lesson) -> the student ids of grades.csv that land there
    found = {}      # student id -> (gradebook row or None, how it was found)
    for row in rows:
        sid = row["student_id"]
        found[sid] = found.get(sid) or book.lookup(students, sid)
        if found[sid][0] is not None:
            landing.setdefault((found[sid][0], row["assignment"]), set()).add(sid)
    for sid, (_, how) in sorted(found.items()):
        if how:
            result.notes.append(how)
    for row in rows:
        sid, col = row["student_id"], result.columns.get(row["assignment"])
        record = found[sid][0]
        if record is None:
            if sid not in result.unmatched_students and (only is None or row["assignment"] == only):
                result.unmatched_students.append(sid)
                hint = book.owner_hint(students, sid)    # an upload no one owns: whose it may be
                if hint:
                    result.notes.append(hint)
            continue
        result.rows[sid] = (record, book.display(record))
        if col is None:
            continue
        others = sorted(landing[(record, row["assignment"])] - {sid})
        if others:     # never first-wins: neither is filled, whatever --send-undecided says
            result.held.append((sid, row["assignment"], _clash(sid, others, book, record)))
            result.clashes.add((sid, row["assignment"]))
            held_rows.add(record)
            continue
        if row.get("held"):
            result.held.append((sid, row["assignment"], row["held"]))
            if not send_undecided:
                held_rows.add(record)
                continue
        points, comma = col.points, col.comma
        if points is None:      # per row (Moodle: its Maximum Grade)
            points, comma, why = book.row_points(record)
            if points is None:
                result.notes.append(f"{sid}: {why}; not filled")
                continue
        if row["max_score"] <= 0:
            result.notes.append(f"{sid}, {row['assignment']}: max_score is 0 in grades.csv; "
                                "nothing to scale, not filled")
            continue
        value = row["score"] / row["max_score"] * points
        if value < 0:
            result.notes.append(f"{sid}, {row['assignment']}: score {row['score']:g} is below 0; "
                                "not filled")
            continue
        value, capped = book.capped(sid, value, points)     # Moodle: at the Maximum Grade
        if capped:
            result.notes.append(capped)
        text = ids.spreadsheet_safe(points_text(value, comma))
        refused = book.refused(record, sid)    # Moodle: "Grade can be changed: No"
        if refused:
            result.notes.append(refused)
        old = table.records[record].values
        if col.index >= len(old):
            result.notes.append(f"{sid}: the gradebook's row (line {table.records[record].line}) "
                                f"has only {len(old)} cells; not filled")
            continue
        first = filled_by.setdefault((record, col.index), sid)
        if first != sid:
            result.notes.append(f"{sid} and {first} both match the gradebook's row "
                                f"{book.display(record)!r} (line {table.records[record].line}); "
                                f"{row['assignment']} kept {first}'s grade")
            continue
        changes[(record, col.index)] = text
        for index, cell in book.repair(record, sid).items():    # Blackboard: zeros restored
            changes[(record, index)] = ids.spreadsheet_safe(cell)
        result.filled[(sid, row["assignment"])] = text
        result.scale[(sid, row["assignment"])] = points_text(points, comma)
        graded_rows.add(record)
        if number_of(old[col.index]) != number_of(text):
            result.changed += 1
    result.kept = [book.display(r) for r in sorted(set(students.values()) - graded_rows - held_rows)]
    write_table(table, changes, out)
    if feedback is not None and result.filled:
        result.feedback = write_feedback_zip(lms, out_dir, result, feedback)
        result.feedback_zip = Path(feedback) if result.feedback else None
    if feedback is not None and not result.feedback:
        result.notes.append(f"no feedback zip written to {feedback}: no page goes with a filled grade")
    return result


def export_outcome(result: Export, gradebook, dest) -> tuple:
    """(exit code, the error line or ""): 2 when no cell was filled; 3 when a grade was held back
    or a graded student has no row, unless ``--send-undecided`` sent them; 3 for two rows on one
    LMS user (NEEDS YOU) whatever that flag says, since they are never sent; else 0."""
    if not result.filled:
        return 2, (f"no grade filled into {gradebook} (the lines above say what did not match); "
                   "nothing to upload")
    if result.needs_you and not result.sent_undecided:
        what = []
        if result.held:
            what.append(f"{len(result.held)} grade(s) held back (undecided, timed out or rejected)")
        if result.unmatched_students:
            what.append(f"{len(result.unmatched_students)} graded student(s) not in the gradebook")
        return 3, (f"{' and '.join(what)}: see HELD BACK / NOT FOUND above; {dest} leaves those grades "
                   "out. Decide them (DIR/overrides.csv, the gradebook's rows) and export again, or pass "
                   "--send-undecided to send what there is")
    if result.clashes:
        return 3, (f"{len(result.clashes)} grade(s) land on an LMS user another row of grades.csv lands "
                   f"on too: see NEEDS YOU above; {dest} leaves them out whatever --send-undecided says. "
                   "Fix the submissions (the file that is not theirs) and grade again")
    return 0, ""


def _clash(sid: str, others: list, book, record: int) -> str:
    """Why ``sid``'s grade is held: ``others`` of grades.csv land on its gradebook row too."""
    return (f"two rows for one LMS user ({sid} and {', '.join(others)} all land on the "
            f"gradebook's row {book.display(record)!r}, line {book.table.records[record].line}); "
            "nothing filled for any: which is theirs? Fix the submissions (the file that is not "
            "theirs) and grade again")


# ------------------------------------------------------------------------------ feedback zip

def _feedback_page(out_dir: Path, student: str, lesson: str):
    folder = Path(out_dir) / "feedback" / ids.folder_name(student) / lesson
    page = folder / f"{lesson}.html"
    if page.is_file():
        return page
    pages = sorted(folder.glob("*.html")) if folder.is_dir() else []
    return pages[0] if len(pages) == 1 else None


def write_feedback_zip(lms: str, out_dir, result: Export, path) -> list:
    """Write the feedback pages of every filled cell into the zip at ``path``, as the LMS takes
    them back (module docstring), each headed by the grade as written into its gradebook cell, on
    that column's scale (:func:`autograder.engine.feedback.gradebook_page`; the pages in DIR keep the
    lesson's points); returns the names written. A missing page becomes a note."""
    names = []
    tmp = Path(path).with_name(f".{Path(path).name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for sid, lesson in sorted(result.filled):
            page = _feedback_page(out_dir, sid, lesson)
            if page is None:
                result.notes.append(f"{sid}, {lesson}: no feedback page in "
                                    f"{Path(out_dir) / 'feedback'}; none packed")
                continue
            name = LMSS[lms].gradebook.feedback_name(sid, lesson, result.rows[sid][1])
            # the page says the grade as the gradebook shows it, on the column's scale
            text = gradebook_page(page.read_text(encoding="utf-8"), lesson,
                                  result.filled[(sid, lesson)], result.scale[(sid, lesson)], lms)
            zf.writestr(name, text)
            names.append(name)
    if names:
        os.replace(tmp, path)
    else:     # an empty zip would look like an upload: none is written
        tmp.unlink()
    return names


def format_export(result: Export) -> str:
    """The lines `export` prints: columns matched, cells filled, and everything not matched."""
    lines = [f"{result.lms} gradebook {result.gradebook}:"]
    if result.term_file is not None:
        lines.append(f"  lessons matched to columns with the term file {result.term_file}" +
                     (" (recorded in DIR/term-file.txt; --term names another)"
                      if result.term_recorded else ""))
    for lesson, col in sorted(result.columns.items()):
        n = sum(1 for (_, l) in result.filled if l == lesson)
        pts = f"{col.points:g} points" if col.points is not None else "each row's Maximum Grade"
        lines.append(f"  lesson {lesson} -> column {col.header!r} ({pts}): {n} student(s) filled")
    lines.append(f"  {len(result.filled)} cell(s) filled, {result.changed} of them changed from "
                 "what the LMS had; matched:")
    for sid, (record, name) in sorted(result.rows.items()):
        cells = ", ".join(f"{l} {v}" for (s, l), v in sorted(result.filled.items()) if s == sid)
        lines.append(f"    {ids.printable(sid)} -> {ids.printable(name)!r} (row {record + 1}): "
                     f"{cells or 'nothing filled'}")
    for lesson, why in sorted(result.unmatched_lessons.items()):
        lines.append(f"  NOT FILLED: lesson {lesson}: {why}")
    matched_by = LMSS[result.lms].gradebook.matched_by if result.lms in LMSS else "its id"
    if result.unmatched_students:
        lines.append(f"  NOT FOUND in the gradebook ({len(result.unmatched_students)} student(s) "
                     f"of grades.csv, their grades not written; a student's row is found by "
                     f"{matched_by}): " +
                     ", ".join(ids.printable(s) for s in result.unmatched_students))
    clashes = [h for h in result.held if (h[0], h[1]) in result.clashes]
    if clashes:
        lines.append(f"  NEEDS YOU ({len(clashes)}): rows of grades.csv that land on one LMS "
                     "user; nothing filled for them (never the first's or the last's grade):")
        lines += [f"    {ids.printable(sid)}, {lesson}: {ids.printable(why)}"
                  for sid, lesson, why in sorted(clashes)]
    undecided = [h for h in result.held if (h[0], h[1]) not in result.clashes]
    if undecided:
        kinds = Counter(why.split(" (", 1)[0] for _, _, why in undecided)
        counts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        if result.sent_undecided:
            lines.append(f"  SENT UNDECIDED ({counts}; --send-undecided): filled with the "
                         "machine score all the same:")
        else:
            lines.append(f"  HELD BACK ({counts}): no one decided these grades, so their cells "
                         "stay as the LMS gave them; decide each in DIR/overrides.csv and export "
                         "again, or send the machine score with --send-undecided:")
        lines += [f"    {ids.printable(sid)}, {lesson}: {ids.printable(why)}"
                  for sid, lesson, why in sorted(undecided)]
    if result.kept:
        lines.append(f"  kept as the LMS had ({len(result.kept)} student(s) of the gradebook with "
                     "no grade here): " + "; ".join(ids.printable(s) for s in result.kept))
    lines += [f"  note: {ids.printable(n)}" for n in result.notes]
    if result.filled:
        title = LMSS[result.lms].title if result.lms in LMSS else result.lms
        lines.append(f"wrote {result.out}: upload it to {title} (docs/instructors.md: "
                     "Grades back into the LMS)")
    else:    # as loud as the NOT FILLED / NOT FOUND lines: nothing here is worth an upload
        why = ("no student of grades.csv has a row there" if result.columns and not result.rows
               else "give --term FILE with each lesson's lms_column, or --lesson ID"
               if not result.columns else "")
        lines.append(f"  NOTHING FILLED: no grade was written, {result.out} is the gradebook as "
                     "downloaded; see the lines above for why" + (f" ({why})" if why else ""))
        lines.append(f"wrote {result.out}, unchanged: nothing in it to upload")
    if result.feedback:
        lines.append(f"wrote {result.feedback_zip}: {len(result.feedback)} feedback page(s) "
                     "(docs/instructors.md: Grades back into the LMS says where each LMS takes them)")
    return "\n".join(lines)
