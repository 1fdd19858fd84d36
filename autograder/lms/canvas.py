"""Canvas: its "download all submissions" zip names and its gradebook export.

- The zip: every file loose at the top, ``<name>_[LATE_]<user id>_<file id>_<file name>``, e.g.
  ``smithann_12345_67890_01_running_sum.ipynb`` (a resubmitted file may end in ``-1``). The
  student id is ``<name>_<user id>`` (``smithann_12345``): names alone are not unique. The names
  carry no time; ``_LATE_`` says Canvas marked the file late (the submission's note
  "marked late by Canvas"; its time is then unknown: :data:`CANVAS_LATE_SOURCE`).
  The name is the sortable name, lowercased, with what is not a word character removed: it may
  hold ``_`` and digits (``o_brien``, ``smithann_2``), and the student's own file name may too,
  so a name is read the way every split of it allows (:func:`canvas_splits`: the two ids are
  Canvas's numbers, never written with a leading zero) and settled across the whole zip
  (:meth:`Canvas.settle`). A file whose owner stays uncertain is never given to anyone: it is
  its own rejected row, named after the file (:func:`unclaimed_id`).
- The gradebook: Grades > Export > Export Entire Gradebook, students keyed by ``ID`` (the user
  id a student id ends with), a "Points Possible" row, a column per assignment named
  ``<name> (<assignment id>)`` (:class:`_Canvas`).

The REST client of ``canvas pull`` / ``canvas push`` is ``lms/canvas_api.py``.
"""
import re
import unicodedata
from dataclasses import dataclass

from autograder.lms.base import Lms, LmsFile, register, unclaimed_id, unclaimed_rel
from autograder.lms.gradebooks import (Column, _Gradebook, _no_column, decimal_comma, number_of,
                                       trailing_number)
from autograder.lms.table import ExportError

__all__ = ["Canvas", "CANVAS_LATE_SOURCE", "CANVAS_LATE_NOTE", "canvas_splits", "unclaimed_id", "zip_name"]

CANVAS_LATE_SOURCE = "unknown (Canvas marked it _LATE_, its file names carry no time)"
CANVAS_LATE_NOTE = "marked late by Canvas"

_ID = re.compile(r"[1-9]\d*\Z")      # a Canvas id: a number, never with a leading zero
_TWO_IDS = re.compile(r"(?:\A|_)[1-9]\d*_[1-9]\d*(?:_|\Z)")


@dataclass(frozen=True)
class Split:
    """One way to read a Canvas file name: the name, LATE, the user id, the file id, the rest."""
    name: str
    late: bool
    user_id: str
    file_no: str
    file_id: str

    @property
    def student(self) -> str:
        return f"{self.name}_{self.user_id}"


def canvas_splits(base: str) -> list:
    """Every way ``base`` (a file name of a Canvas zip) reads as
    ``<name>_[LATE_]<user id>_<file id>_<file name>``, the shortest name first: both ids are
    numbers without a leading zero; the name and the file name may hold ``_`` and digits."""
    tokens, out = base.split("_"), []
    for i in range(1, len(tokens)):
        if i > 1 and tokens[i - 1] in ("LATE", "late"):
            continue    # <name>_LATE_<ids>: Canvas's late mark, read with the shorter name
        name, j = "_".join(tokens[:i]), i
        late = tokens[j] in ("LATE", "late")
        j += late
        rest = "_".join(tokens[j + 2:])
        if (name and j + 2 < len(tokens) and rest and _ID.match(tokens[j])
                and _ID.match(tokens[j + 1])):
            out.append(Split(name, late, tokens[j], tokens[j + 1], rest))
    return out


def _nfc(name: str) -> str:
    return unicodedata.normalize("NFC", name)


def zip_name(sortable: str) -> str:
    """A sortable name ("O'Brien, Ann") as a Canvas zip writes it: lowercase, what is no word
    character removed ("obrienann"; ``_`` and digits are word characters)."""
    return re.sub(r"\W", "", _nfc(sortable).lower())


def _by_evidence(left: dict) -> None:
    """Narrow ``left`` ({rel: [Split]}) in place by what the files read one way only settle: a
    user id has one name in one zip, and a file id belongs to one file."""
    changed = True
    while changed:
        changed = False
        names, files = {}, {}
        for rel, found in left.items():
            if len(found) == 1:
                names.setdefault(found[0].user_id, set()).add(_nfc(found[0].name))
                files.setdefault(found[0].file_no, set()).add(rel)
        for rel, found in left.items():
            if len(found) < 2:
                continue
            kept = [s for s in found
                    if names.get(s.user_id, {_nfc(s.name)}) == {_nfc(s.name)}
                    and not files.get(s.file_no, set()) - {rel}]
            if kept and len(kept) < len(found):
                left[rel], changed = kept, True


def _settle_splits(splits: dict) -> tuple:
    """({rel: [Split]}, {rel: [Split]}): the readings of each file the whole zip allows (one
    Split where it is certain), and for a file settled only by the rule that a sortable name
    holds no two ids in a row (so ``lab_3_2_final.ipynb`` is a file name, not the end of a
    name), the readings that rule set aside, for its note. The zip's evidence (_by_evidence)
    comes first; then that rule, where it leaves one reading."""
    left = {rel: list(found) for rel, found in splits.items()}
    _by_evidence(left)
    before, set_aside = dict(left), {}
    for rel, found in left.items():
        plain = [s for s in found if not _TWO_IDS.search(s.name)]
        if len(found) > 1 and len(plain) == 1:
            set_aside[rel] = [s for s in found if s not in plain]
            left[rel] = plain
    # what the rule settled is no evidence for others; two files it settled that contradict
    # each other (one user id, two names; one file id, two files) are both uncertain again
    users, file_ids = {}, {}
    for rel, found in left.items():
        if len(found) == 1:
            users.setdefault(found[0].user_id, set()).add(_nfc(found[0].name))
            file_ids.setdefault(found[0].file_no, set()).add(rel)
    for rel in list(set_aside):
        s = left[rel][0]
        if len(users[s.user_id]) > 1 or len(file_ids[s.file_no]) > 1:
            left[rel] = before[rel]
            del set_aside[rel]
    return left, set_aside


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

    def owner_hint(self, students, student_id):
        """The gradebook as the roster: of the readings of an uncertain file's name, the one
        whose user id has a row whose Student, written as Canvas writes a zip name (lowercase,
        what is no word character removed), is the reading's name."""
        rel = unclaimed_rel(student_id)
        if rel is None:
            return ""
        fits = []
        for s in canvas_splits(rel):
            record = students.get(s.user_id)
            if record is not None and zip_name(self.display(record)) == _nfc(s.name):
                fits.append((s, record))
        if len(fits) != 1:
            return ""
        s, record = fits[0]
        return (f"{student_id}: the gradebook's row {self.display(record)!r} (ID {s.user_id}) "
                f"fits its reading as {s.student}: if it is theirs, grade it as theirs (rename "
                "it in the zip so that no other reading is left)")

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
    pattern = (r"^(?P<name>[^/]+?)_(?:(?P<late>LATE|late)_)?(?P<user_id>[1-9]\d*)_"
               r"(?P<file_no>[1-9]\d*)_(?P<file_id>[^/]+)$")
    described = "Canvas: <name>_<user id>_<file id>_<notebook>.ipynb at the top (_LATE_ allowed)"
    gradebook = _Canvas
    late_note, late_source = CANVAS_LATE_NOTE, CANVAS_LATE_SOURCE

    def read(self, rel, found):
        late = bool(found.get("late"))
        return LmsFile(rel, f"{found['name']}_{found['user_id']}", found["file_id"], late=late,
                       note=self.late_note if late else "")

    def settle(self, files, found, read):
        """Each file's owner from every reading of its name the zip allows (module docstring);
        a file left with two owners is its own row, rejected, naming the file and both."""
        left, aside = _settle_splits({f.rel: canvas_splits(f.rel) for f in files})
        out = []
        for f in files:
            readings = left.get(f.rel) or []
            if len(readings) == 1:
                s = readings[0]
                notes = [self.late_note] if s.late else []
                if f.rel in aside:     # no certainty but the name rule: the instructor sees it
                    others = " or ".join(f"{x.student} (Canvas user {x.user_id})"
                                         for x in aside[f.rel])
                    notes.append(f"Canvas file '{f.rel}' read as {s.student} (Canvas user "
                                 f"{s.user_id}), its own file name '{s.file_id}'; it would read "
                                 f"as {others} only if that name held two numbers in a row")
                out.append(LmsFile(f.rel, s.student, s.file_id, late=s.late,
                                   note="; ".join(notes)))
                continue
            owners = " or ".join(f"{s.student} (Canvas user {s.user_id})" for s in readings)
            out.append(LmsFile(f.rel, unclaimed_id(f.rel), readings[-1].file_id if readings else f.file_id,
                               problem=(f"owner not certain: Canvas file '{f.rel}' reads as "
                                        f"{owners}; it is no one's until you decide: rename it in "
                                        "the zip to its owner's <name>_<user id>_<file id>_<file "
                                        "name> and grade again")))
        return out


register(Canvas())
