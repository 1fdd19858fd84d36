"""Canvas: its "download all submissions" zip names and its gradebook export.

- The zip: every file loose at the top, ``<name>_[LATE_]<user id>_<file id>_<file name>``, e.g.
  ``smithann_12345_67890_01_running_sum.ipynb`` (a resubmitted file may end in ``-1``). The
  student id is ``<name>_<user id>`` (``smithann_12345``): names alone are not unique. The names
  carry no time; ``_LATE_`` says Canvas marked the file late (the submission's note
  "marked late by Canvas"; its time is then unknown: :data:`CANVAS_LATE_SOURCE`).
- The gradebook: Grades > Export > Export Entire Gradebook, students keyed by ``ID`` (the user
  id a student id ends with), a "Points Possible" row, a column per assignment named
  ``<name> (<assignment id>)`` (:class:`_Canvas`).

The REST client of ``canvas pull`` / ``canvas push`` is ``lms/canvas_api.py``.
"""
import re

from autograder.lms.base import Lms, LmsFile, register
from autograder.lms.gradebooks import (Column, _Gradebook, _no_column, decimal_comma, number_of,
                                       trailing_number)
from autograder.lms.table import ExportError

__all__ = ["Canvas", "CANVAS_LATE_SOURCE", "CANVAS_LATE_NOTE"]

CANVAS_LATE_SOURCE = "unknown (Canvas marked it _LATE_, its file names carry no time)"
CANVAS_LATE_NOTE = "marked late by Canvas"


class _Canvas(_Gradebook):
    name, kind, id_column = "Canvas", "gradebook export", "ID"
    how = "In Canvas: Grades > Export > Export Entire Gradebook."
    matched_by = ("the number that ends the student id, which a Canvas submissions zip gives "
                  "(smithann_12345 -> ID 12345)")
    SPECIAL = {"points possible", "muted", "manual posting"}
    SUFFIX = re.compile(r"\s*\((\d+)\)\Z")

    def __init__(self, table):
        super().__init__(table)
        self.points_row = next((r for r, rec in enumerate(table.records[1:], start=1)
                                if rec.values and rec.values[0].strip().lower() == "points possible"),
                               None)
        if self.points_row is None:
            raise ExportError(f"{table.path}: no 'Points Possible' row (Canvas writes it second); "
                              f"{self.how}")

    def is_student(self, rec):
        return rec.values[0].strip().lower() not in self.SPECIAL

    def key(self, student_id):
        return trailing_number(student_id) or student_id

    def display(self, record):
        return self.table.records[record].values[0] or super().display(record)

    def column(self, lesson, wanted) -> tuple:
        i = self.find(wanted)
        if i is None:
            return None, _no_column(wanted, self.head[5:])
        values = self.table.records[self.points_row].values
        points = number_of(values[i]) if i < len(values) else None
        if points is None:
            return None, (f"column {self.head[i]!r} has no points possible "
                          f"({values[i] if i < len(values) else ''!r}): a read-only column")
        return Column(i, self.head[i], points, decimal_comma(values[i])), ""


class Canvas(Lms):
    name, title = "canvas", "Canvas"
    pattern = (r"^(?P<name>[^_/]+)_(?:(?P<late>LATE|late)_)?(?P<user_id>\d+)_(?P<file_no>\d+)_"
               r"(?P<file_id>[^/]+)$")
    described = "Canvas: <name>_<user id>_<file id>_<notebook>.ipynb at the top (_LATE_ allowed)"
    gradebook = _Canvas
    late_note, late_source = CANVAS_LATE_NOTE, CANVAS_LATE_SOURCE

    def read(self, rel, found):
        late = bool(found.get("late"))
        return LmsFile(rel, f"{found['name']}_{found['user_id']}", found["file_id"], late=late,
                       note=self.late_note if late else "")


register(Canvas())
