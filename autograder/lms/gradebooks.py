"""The gradebook an export fills, as one small base (:class:`_Gradebook`): which rows are
students, their keys, the columns and their points. Each LMS's own is in its module
(``canvas._Canvas``, ``moodle._Moodle``, ``blackboard._Blackboard``) and is its ``Lms.gradebook``;
export finds them by LMS name in the registry (``lms.base.LMSS``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from autograder.course import LESSONS
from autograder.ids import folder_name
from autograder.lms.table import ExportError, Record, Table

__all__ = ["Column", "Export", "number_of", "decimal_comma", "points_text", "trailing_number",
           "lesson_columns"]


# ------------------------------------------------------------------------------ the base

def number_of(cell: str):
    """A points cell as a float ('10', '10.00', '10,5'), or None."""
    cell = cell.strip()
    if "," in cell and "." not in cell:
        cell = cell.replace(",", ".")
    try:
        value = float(cell)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def decimal_comma(cell: str) -> bool:
    """Whether a number cell uses a comma as its decimal mark ('10,5', '10,00'; not '10')."""
    return "," in cell and "." not in cell


def points_text(value: float, comma: bool) -> str:
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return text.replace(".", ",") if comma else text


def trailing_number(student_id: str):
    m = re.search(r"(?:^|_)(\d+)\Z", student_id)
    return m.group(1) if m else None


@dataclass
class Column:
    """A gradebook column a lesson fills: index, header, points possible (None: per row)."""
    index: int
    header: str
    points: float = None
    comma: bool = False     # the points were written with a decimal comma: so is each grade


@dataclass
class Export:
    """What an export matched and did: the lines it prints, and the facts tests check."""
    lms: str
    gradebook: Path
    out: Path
    columns: dict = field(default_factory=dict)       # lesson -> Column
    filled: dict = field(default_factory=dict)        # (student id, lesson) -> text written
    scale: dict = field(default_factory=dict)         # (student id, lesson) -> its points possible, as text
    changed: int = 0
    kept: list = field(default_factory=list)          # gradebook students with no grade
    unmatched_students: list = field(default_factory=list)   # grades.csv ids with no row
    unmatched_lessons: dict = field(default_factory=dict)    # lesson -> why
    notes: list = field(default_factory=list)
    rows: dict = field(default_factory=dict)          # student id -> (record index, display name)
    feedback: list = field(default_factory=list)      # names written into the feedback zip
    feedback_zip: Path = None
    term_file: Path = None        # the term file whose lms_column matched lessons (None: none)
    term_recorded: bool = False   # that file was the one recorded in DIR/term-file.txt
    held: list = field(default_factory=list)    # (student id, lesson, why) not sent: undecided
    clashes: set = field(default_factory=set)   # (student id, lesson) of held whose LMS user
    #                                             another row lands on too: never filled
    sent_undecided: bool = False  # --send-undecided: those were filled all the same

    @property
    def needs_you(self) -> bool:
        """Something graded did not reach the gradebook: held back, or no row for the student."""
        return bool(self.held or self.unmatched_students)


class _Gradebook:
    """What differs between the LMSs: which rows are students, their keys, the columns."""
    name = ""
    id_column = ""
    matched_by = "its id"     # how a student of grades.csv finds their row, in words
    one_column = False    # one assignment per file: its one grade column, whatever the lesson

    def __init__(self, table: Table):
        self.table = table
        self.head = table.header()
        self.id_index = self.index(self.id_column)
        if self.id_index is None:
            raise ExportError(
                f"{table.path} is not a {self.name} {self.kind}: its first row has no "
                f"'{self.id_column}' column (it has {', '.join(map(repr, self.head[:8]))}"
                f"{', ...' if len(self.head) > 8 else ''}). {self.how}")

    def index(self, header: str):
        """Index of the column named ``header``: the exact name, else the one name equal to it
        ignoring case and surrounding spaces (``Maximum Grade``, ``maximum grade``; LMS versions
        and language packs differ in case); None when none or several are."""
        if header in self.head:
            return self.head.index(header)
        found = [i for i, h in enumerate(self.head) if h.strip().casefold() == header.casefold()]
        return found[0] if len(found) == 1 else None

    def cell(self, record: int, header: str) -> str:
        values = self.table.records[record].values
        i = self.index(header)
        return values[i] if i is not None and i < len(values) else ""

    def students(self) -> dict:
        """gradebook key -> record index, for every row that is a student."""
        out = {}
        for r, rec in enumerate(self.table.records[1:], start=1):
            key = rec.values[self.id_index].strip() if len(rec.values) > self.id_index else ""
            if key and self.is_student(rec):
                out.setdefault(self.normal(key), r)
        return out

    def is_student(self, rec: Record) -> bool:
        return True

    def normal(self, key: str) -> str:
        return key

    def key(self, student_id: str) -> str:
        """The gradebook key of a grades.csv student id (as students() keys the rows)."""
        return student_id

    def lookup(self, students: dict, student_id: str) -> tuple:
        """(record index or None, note): the row of ``student_id`` in ``students`` (as
        students() returns them), and what export says of how it was found ("" when by its
        key). The base finds it by its key only."""
        return students.get(self.key(student_id)), ""

    def owner_hint(self, students: dict, student_id: str) -> str:
        """For a row no one owns (an upload whose owner the LMS's names left uncertain,
        ``base.unclaimed_id``): what this gradebook says of whose it is, or "" (the base: nothing)."""
        return ""

    def repair(self, record: int, student_id: str) -> dict:
        """{column index: text} to write into ``record``'s own cells so that the LMS finds
        ``student_id`` there on upload (the base: nothing)."""
        return {}

    def row_points(self, record: int) -> tuple:
        """(points possible, decimal comma, why not) of ``record``'s row, for a column whose
        points are per row (``Column.points`` None); the base has no such column."""
        return None, False, "no points possible in its row"

    def capped(self, sid: str, value: float, points: float) -> tuple:
        """(grade, note): the grade the LMS takes for ``value`` of ``points``, and a note when
        that is not ``value``; the base takes any grade."""
        return value, ""

    def refused(self, record: int, sid: str) -> str:
        """A note when the LMS will skip the grade written into ``record``'s row; "" when it
        takes it."""
        return ""

    @classmethod
    def feedback_name(cls, sid: str, lesson: str, display: str) -> str:
        """The name of ``sid``'s page for ``lesson`` in the feedback zip (``display``: the
        student's name as the gradebook shows it): one folder per lesson, a page per student."""
        return f"{lesson}/{folder_name(f'{display} ({sid})')}.html"

    def display(self, record: int) -> str:
        return self.table.records[record].values[self.id_index]

    SUFFIX = re.compile(r"(?!)")     # a column's LMS id at the end of its header (group 1)
    HEADER = None                    # a header with its name in group 'name'

    def find(self, wanted: str):
        """Index of the column ``wanted`` names: the header itself, its id suffix (Canvas
        ``(1234)``, Blackboard ``|123456``), or its name without that suffix; None when none
        or when the name alone fits several columns."""
        clean = [h.strip() for h in self.head]
        wanted = wanted.strip()
        if wanted in clean:
            return clean.index(wanted)
        want_id = self.SUFFIX.search(wanted) or re.fullmatch(r"\|?(\d+)", wanted)
        if want_id:
            found = [i for i, h in enumerate(clean)
                     if (m := self.SUFFIX.search(h)) and m.group(1) == want_id.group(1)]
            if found:
                return found[0]

        def name(h):
            m = self.HEADER.match(h) if self.HEADER else None
            return m["name"] if m else self.SUFFIX.sub("", h)
        found = [i for i, h in enumerate(clean) if name(h).casefold() == wanted.casefold()]
        return found[0] if len(found) == 1 else None

    def lesson_for(self, lessons, term, lesson, path):
        """The lesson whose column alone is filled (None: every lesson's), ``lesson`` being
        --lesson (or None); raises ExportError when grades.csv has no grades for it."""
        if lesson is not None and lesson not in lessons:
            raise ExportError(f"--lesson {lesson}: grades.csv has no grades for it "
                              f"(it has {', '.join(sorted(lessons)) or 'none'})")
        return lesson


def _no_column(wanted: str, candidates) -> str:
    shown = ", ".join(repr(c) for c in list(candidates)[:12]) or "none"
    return f"no column {wanted!r} in the gradebook (its assignment columns: {shown})"


def lesson_columns(book, lessons, term, only=None) -> tuple:
    """lesson -> Column, and lesson -> why not, for the lessons grades.csv holds."""
    columns, missing = {}, {}
    for lesson in sorted(lessons):
        if only is not None and lesson != only:
            continue
        wanted = term.lesson(lesson).lms_column if term is not None else None
        if wanted is None and book.one_column:
            wanted = lesson
        if wanted is None:     # no term file entry: the lesson's id or its title as column name
            for guess in (lesson, getattr(LESSONS.get(lesson), "title", None)):
                if guess and book.find(guess) is not None:
                    wanted = guess
                    break
            else:
                where = (f"no lms_column for it in the term file {term.path}" if term is not None
                         else "no term file (no --term, none recorded in DIR/term-file.txt)")
                missing[lesson] = (f"{where}, and no column is named after the lesson (give "
                                   f"--term FILE with [lessons.{lesson}] lms_column = \"...\")")
                continue
        col, why = book.column(lesson, wanted)
        if col is None:
            missing[lesson] = why
        else:
            columns[lesson] = col
    return columns, missing
