"""Moodle: its "download all submissions" zip names, its grading worksheet (the gradebook export
fills) and the submission times that worksheet gives.

- The zip: a folder per student ``<Full Name>_<participant id>_assignsubmission_file_/``
  holding the files, or (without "download in folders") files named
  ``<Full Name>_<id>_assignsubmission_file_<file name>``. The student id is
  ``<Full Name>_<id>``. Online-text parts (``assignsubmission_onlinetext``) are skipped. The
  names carry no time.
- The grading worksheet (View all submissions > Download grading worksheet): one assignment,
  students keyed by ``Identifier`` ("Participant 1001", the number a student id ends with), a
  ``Grade`` column on each row's ``Maximum Grade`` (:class:`_Moodle`), its headers in the
  language of the Moodle that wrote it (:data:`MOODLE_HEADERS`).
- The submission times: the worksheet's "Last modified (submission)"
  (:func:`moodle_submission_times`, read for a lesson whose term entry names its worksheet).
"""
from pathlib import Path

from autograder.lms.base import Lms, register
from autograder.ids import folder_name
from autograder.lms.gradebooks import (Column, _Gradebook, decimal_comma, number_of,
                                       trailing_number)
from autograder.lms.table import ExportError, read_table

__all__ = ["Moodle", "MOODLE_SOURCE", "MOODLE_HEADERS", "MOODLE_NO", "moodle_language",
           "moodle_header", "moodle_date", "moodle_submission_times", "moodle_lesson"]

MOODLE_SOURCE = "Moodle worksheet 'Last modified (submission)'"

# The grading worksheet's headers (mod/assign's grading table: strings recordid, fullname,
# gradenoun, maxgrade, gradecanbechanged, lastmodifiedsubmission of Moodle's language packs,
# 3.11 to 4.5), by their English text, in each language the grader reads. A worksheet's dates
# are userdate()'s strftimedaydatetime in the same language: "Monday, 5 October 2026, 10:00 AM",
# "Montag, 5. Oktober 2026, 10:00", "lundi 5 octobre 2026, 10:00", "lunes, 5 de octubre de 2026,
# 10:00"; a spreadsheet's re-save may turn them into numbers, day first outside English.
MOODLE_HEADERS = {
    "Identifier": {"en": "Identifier", "de": "ID", "fr": "Identifiant", "es": "Identificador"},
    "Full name": {"en": "Full name", "de": "Vollständiger Name", "fr": "Nom complet",
                  "es": "Nombre completo"},
    "Grade": {"en": "Grade", "de": "Bewertung", "fr": "Note", "es": "Calificación"},
    "Maximum Grade": {"en": "Maximum Grade", "de": "Bestwertung", "fr": "Note maximale",
                      "es": "Calificación máxima"},
    "Grade can be changed": {"en": "Grade can be changed", "de": "Bewertung kann geändert werden",
                             "fr": "La note peut être modifiée",
                             "es": "La calificación puede ser cambiada"},
    "Last modified (submission)": {"en": "Last modified (submission)",
                                   "de": "Zuletzt geändert (Abgabe)",
                                   "fr": "Dernière modification (travail remis)",
                                   "es": "Última modificación (entrega)"},
}
MOODLE_NO = {"en": "No", "de": "Nein", "fr": "Non", "es": "No"}     # "Grade can be changed"
_DATE_ORDER = {"en": "MDY", "de": "DMY", "fr": "DMY", "es": "DMY"}  # of an all-number date


def _same(a: str, b: str) -> bool:
    return a.strip().casefold() == b.strip().casefold()


def moodle_language(headers) -> str:
    """The language of a worksheet's header row: the one whose Identifier and Grade headers it
    holds (case and surrounding spaces aside); "en" when none does."""
    for lang in MOODLE_HEADERS["Identifier"]:
        if all(any(_same(h, MOODLE_HEADERS[k][lang]) for h in headers) for k in ("Identifier", "Grade")):
            return lang
    return "en"


def moodle_header(headers, english: str):
    """Index in ``headers`` of the column Moodle's English calls ``english``, in the header row's
    language (moodle_language), ignoring case and surrounding spaces; None when there is none
    or several."""
    want = MOODLE_HEADERS.get(english, {}).get(moodle_language(headers), english)
    if want in headers:
        return headers.index(want)
    found = [i for i, h in enumerate(headers) if _same(h, want)]
    return found[0] if len(found) == 1 else None


def moodle_date(text: str, lang: str):
    """A worksheet's "Last modified" cell as a datetime, in the worksheet's language
    (dateparser, the language's day and month names; an all-number date day first outside
    English): aware when the cell writes its zone ("22:30 UTC", "+0900"), else naive; None when
    it cannot be read."""
    import dateparser
    return dateparser.parse(text, languages=[lang] if lang == "en" else [lang, "en"],
                            settings={"DATE_ORDER": _DATE_ORDER.get(lang, "MDY"),
                                      "PARSERS": ["absolute-time"],   # never "yesterday"
                                      "REQUIRE_PARTS": ["day", "month", "year"]})


def moodle_submission_times(path, zone) -> dict:
    """{participant id: aware datetime} from a Moodle assignment's grading worksheet (the CSV
    of "Download grading worksheet": ``Identifier`` "Participant 1001", ``Last modified
    (submission)`` "Wednesday, 1 October 2026, 11:59 PM" in the Moodle user's time zone, read
    in ``zone`` (a tzinfo) unless the cell writes its own zone ("11:59 PM UTC", "+0900"); "-" or
    empty: no submission, left out), in any language of MOODLE_HEADERS, its dates in that
    language. The file is read as export reads every LMS table (lms/table.py: UTF-8 or UTF-16,
    an Excel re-save in Windows-1252 or Mac Roman, any line end, any delimiter). The id is the
    number a Moodle zip's student id ends with ("Ann Smith_1001"). Raises ValueError naming the
    file and line when a column is missing or a date cannot be read; FileNotFoundError."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No Moodle grading worksheet at {path}")
    table = read_table(path)
    head = table.header()
    lang = moodle_language(head)
    columns = {k: moodle_header(head, k) for k in ("Identifier", "Last modified (submission)")}
    missing = [MOODLE_HEADERS[k][lang] for k, i in columns.items() if i is None]
    if missing:
        raise ValueError(f"{path}: no column {', '.join(map(repr, missing))}; is it Moodle's "
                         "grading worksheet (Download grading worksheet)?")
    ident_at, when_at = columns["Identifier"], columns["Last modified (submission)"]
    times = {}
    for rec in table.records[1:]:
        row = rec.values
        if len(row) <= max(ident_at, when_at):
            continue
        ident, text = row[ident_at].strip(), row[when_at].strip()
        number = ident.rsplit(" ", 1)[-1]
        if not number.isdigit() or text in ("", "-"):
            continue
        when = moodle_date(text, lang)
        if when is None:
            raise ValueError(f"{path} line {rec.line}: "
                             f"{MOODLE_HEADERS['Last modified (submission)'][lang]!r} "
                             f"{text!r} is not a date") from None
        times[number] = when if when.tzinfo else when.replace(tzinfo=zone)
    return times


class _Moodle(_Gradebook):
    name, kind, id_column = "Moodle", "grading worksheet", "Identifier"
    one_column = True
    how = ("In Moodle: the assignment > View all submissions > Grading action: Download grading "
           "worksheet (with 'Offline grading worksheet' on in its Feedback types).")
    matched_by = ("the participant id that ends the student id, which a Moodle submissions zip "
                  "gives (Ann Smith_1001 -> Participant 1001)")

    def __init__(self, table):
        super().__init__(table)
        for col in ("Grade", "Maximum Grade"):     # matched as _Gradebook.index matches
            if self.index(col) is None:
                raise ExportError(f"{table.path}: no '{col}' column; {self.how}")

    def index(self, header):
        """As _Gradebook.index, in the worksheet's language (lms.MOODLE_HEADERS)."""
        return moodle_header(self.head, header)

    def normal(self, key):
        return trailing_number(key.replace(" ", "_")) or key

    def key(self, student_id):
        return trailing_number(student_id) or student_id

    def display(self, record):
        return self.cell(record, "Full name") or super().display(record)

    def column(self, lesson, wanted):
        i = self.index("Grade")
        return Column(i, self.head[i], None), ""

    def lesson_for(self, lessons, term, lesson, path):
        """The one lesson the worksheet is for (:func:`moodle_lesson`)."""
        return moodle_lesson(self, lessons, term, lesson, path)

    def row_points(self, record):
        """The row's Maximum Grade."""
        max_cell = self.cell(record, "Maximum Grade")
        points = number_of(max_cell)
        why = "" if points is not None else f"Maximum Grade {max_cell!r} is not a number"
        return points, decimal_comma(max_cell), why

    def capped(self, sid, value, points):
        """Moodle refuses a grade above the row's Maximum Grade: capped there, with a note."""
        if value > points:
            return points, (f"{sid}: {value:g} capped at the Maximum Grade {points:g} "
                            "(Moodle refuses a larger grade)")
        return value, ""

    def refused(self, record, sid):
        """Moodle skips a row whose "Grade can be changed" is No (in the worksheet's language)."""
        if self.cell(record, "Grade can be changed").strip().casefold() in (
                "no", MOODLE_NO[moodle_language(self.head)].casefold()):
            return (f"{sid}: the worksheet says 'Grade can be changed: No' (locked "
                    "or overridden in the gradebook); Moodle will skip this grade")
        return ""

    @classmethod
    def feedback_name(cls, sid, lesson, display):
        """<student id>_assignsubmission_file_/: Moodle reads its 2nd part (the participant)."""
        return f"{folder_name(sid)}_assignsubmission_file_/{lesson}_feedback.html"


def moodle_lesson(book, lessons, term, lesson, path) -> str:
    """The one lesson a Moodle worksheet is for: ``lesson`` (--lesson), else the lesson whose
    term-file lms_column the worksheet's file name holds, else grades.csv's only lesson."""
    if lesson is not None:
        if lesson not in lessons:
            raise ExportError(f"--lesson {lesson}: grades.csv has no grades for it "
                              f"(it has {', '.join(sorted(lessons)) or 'none'})")
        return lesson
    named = [l for l in lessons if term is not None and term.lesson(l).lms_column
             and term.lesson(l).lms_column.casefold() in Path(path).name.casefold()]
    if len(named) == 1:
        return named[0]
    if len(lessons) == 1:
        return next(iter(lessons))
    raise ExportError(f"{path}: a Moodle grading worksheet holds one assignment; say which "
                      f"lesson it is with --lesson (one of {', '.join(sorted(lessons))}), or name "
                      "the assignment in the term file's lms_column as in the worksheet's file name")


class Moodle(Lms):
    name, title = "moodle", "Moodle"
    pattern = (r"^(?P<student_id>[^/]+?_\d+)_assignsubmission_(?P<part>file|onlinetext)_/?"
               r"(?P<file_id>.+)$")
    described = "Moodle: <Full Name>_<id>_assignsubmission_file_/<notebook>.ipynb"
    gradebook = _Moodle

    def read(self, rel, found):
        return None if found["part"] != "file" else super().read(rel, found)


register(Moodle())
