"""Blackboard: its "download all submissions" zip names (with the attempt's date, and a receipt
per attempt) and its Grade Centre download.

- The zip: files ``<assignment>_<user name>_attempt_<YYYY-MM-DD-HH-MM-SS>_<file name>`` and a
  receipt ``<assignment>_<user name>_attempt_<date>.txt`` per attempt, whose first line is
  ``Name: <Full Name> (<user name>)``. The student id is the user name; the attempt's date
  decides which of several attempts is the latest, and is the submission's time
  (:data:`BLACKBOARD_SOURCE`). Both the assignment name and the user name
  may hold ``_`` (``ann_smith``, ``HW_1``), and the file name after the date is the student's
  own, free to hold ``_<someone>_attempt_<date>_``. So the attempt is the *first*
  ``_attempt_<date>`` of the name, and the user name is told from the assignment name by, in
  turn: the attempt's receipt, an assignment name some receipt of the export settled, or the
  one split that every name of the export shares. A name none of these settle is not guessed:
  it is returned with ``problem`` set (it goes to "submissions that need you").
- The gradebook: Grade Centre > Full Grade Centre > Work Offline > Download, students keyed by
  ``Username``, a column per item named ``<name> [Total Pts: N Score] |<id>``
  (:class:`_Blackboard`). A number-only user name that a spreadsheet's re-save stripped of its
  leading zeros (``0012345`` -> ``12345``) is matched, noted and written back whole.
"""
import re
from datetime import datetime

from autograder.lms.base import Lms, LmsFile, register
from autograder.lms.gradebooks import Column, _Gradebook, _no_column, decimal_comma, number_of

__all__ = ["Blackboard", "BLACKBOARD_SOURCE"]

BLACKBOARD_SOURCE = "Blackboard attempt date"


_RECEIPT_NAME = re.compile(r"^\s*Name:.*\(([^()\s]+)\)\s*$")


def _receipt_user(text: str, head: str):
    """The user name a Blackboard receipt's first line gives, when ``head`` (the receipt's own
    file name up to ``_attempt_``) is ``<assignment>_<that user name>``; else None."""
    first = text.lstrip("\ufeff").splitlines()[0] if text.strip() else ""
    m = _RECEIPT_NAME.match(first)
    if m and head.endswith("_" + m.group(1)) and len(head) > len(m.group(1)) + 1:
        return m.group(1)
    return None


def _blackboard_users(heads, receipts: dict) -> dict:
    """{head: (user name, "") or ("", why not)} for the ``<assignment>_<user name>`` heads of
    one Blackboard export; ``receipts`` maps a head to its receipt's user name."""
    settled = {h: u for h, u in receipts.items() if u}
    assignments = {h[:-len(u) - 1] for h, u in settled.items()}
    heads = sorted(set(heads))
    common = heads[0] if heads else ""
    for h in heads[1:]:
        while not h.startswith(common):
            common = common[:-1]
    # every split point the whole export agrees on: '_' inside the common prefix, each head
    # keeping a non-empty user name after it
    splits = [i for i, c in enumerate(common) if c == "_" and i > 0
              and all(len(h) > i + 1 for h in heads)]
    out = {}
    for h in heads:
        if h in settled:
            out[h] = (settled[h], "")
            continue
        known = [a for a in assignments if h.startswith(a + "_") and len(h) > len(a) + 1]
        if len(known) == 1:
            out[h] = (h[len(known[0]) + 1:], "")
        elif not known and len(splits) == 1:
            out[h] = (h[splits[0] + 1:], "")
        else:
            out[h] = ("", f"Blackboard file name '{h}_attempt_...': the assignment name and the "
                          "user name cannot be told apart (either may hold '_'), and the "
                          "export has no receipt (.txt) for this attempt that names the user")
    return out


class _Blackboard(_Gradebook):
    name, kind, id_column = "Blackboard", "Grade Centre download", "Username"
    how = ("In Blackboard: Grade Centre > Full Grade Centre > Work Offline > Download (Full Grade "
           "Centre, tab or comma delimited).")
    matched_by = "the user name, which a Blackboard submissions zip gives, in the Username column"
    HEADER = re.compile(r"(?P<name>.*?)\s*\[Total Pts: (?P<up>up to )?(?P<pts>[\d.,]+) "
                        r"(?P<kind>[^\]]+)\]\s*\|(?P<id>\d+)\Z")
    SUFFIX = re.compile(r"\s*\|(\d+)\Z")

    def normal(self, key):
        return key.casefold()

    def key(self, student_id):
        return student_id.strip().casefold()

    def lookup(self, students, student_id):
        """By the user name; a number-only user name with leading zeros (``0012345``) is also
        found where a spreadsheet dropped them (Excel reads ``0012345`` as 12345), noted."""
        key = self.key(student_id)
        if key in students or not key.isdigit() or not key.startswith("0"):
            return students.get(key), ""
        record = students.get(key.lstrip("0") or "0")
        if record is None:
            return None, ""
        return record, (f"{student_id}: matched the Username {self.display_key(record)!r} "
                        f"(line {self.table.records[record].line}): a spreadsheet dropped its "
                        f"leading zeros; the upload writes it back as {student_id!r}, the user "
                        "name Blackboard knows")

    def display_key(self, record):
        return self.table.records[record].values[self.id_index]

    def repair(self, record, student_id):
        """The Username cell as Blackboard wrote it, where a spreadsheet dropped its zeros."""
        if self.key(self.display_key(record)) != self.key(student_id):
            return {self.id_index: student_id.strip()}
        return {}

    def display(self, record):
        last, first = self.cell(record, "Last Name"), self.cell(record, "First Name")
        return f"{last}, {first}" if last or first else super().display(record)

    def column(self, lesson, wanted):
        i = self.find(wanted)
        if i is None:
            return None, _no_column(wanted, [h for h in self.head if self.HEADER.match(h)])
        m = self.HEADER.match(self.head[i])
        if not m:
            return None, f"column {self.head[i]!r} has no '[Total Pts: N Score] |id' in its name"
        if m["up"] or m["kind"] != "Score":
            return None, (f"column {self.head[i]!r} is {'a calculated' if m['up'] else 'a ' + m['kind']}"
                          " column; only a Score column takes grades (set the column's primary "
                          "display to Score in Blackboard)")
        return Column(i, self.head[i], number_of(m["pts"]), decimal_comma(m["pts"])), ""


class Blackboard(Lms):
    name, title = "blackboard", "Blackboard"
    # the head (<assignment>_<user name>) ends at the first _attempt_<date>: what follows the date
    # is the student's own file name; the user name is split off the head in _blackboard_users
    pattern = (r"^(?P<student_id>[^/]+?)_attempt_"
               r"(?P<timestamp>\d{4}(?:-\d\d){5})(?:_(?P<file_id>[^/]+)|(?P<receipt>\.txt))?$")
    described = ("Blackboard: <assignment>_<user>_attempt_<YYYY-MM-DD-HH-MM-SS>_<notebook>"
                 ".ipynb")
    gradebook = _Blackboard
    stamp_source = BLACKBOARD_SOURCE

    def read(self, rel, found):
        if not found.get("file_id"):    # the receipt of an attempt (or a bare attempt)
            return None
        when = datetime.strptime(found["timestamp"], "%Y-%m-%d-%H-%M-%S")
        return LmsFile(rel, found["student_id"], found["file_id"], time=when.timestamp(),
                       stamp=when.isoformat())

    def settle(self, files, found, read):
        """The files with the user name split off each head (see the module's notes)."""
        receipts = {}
        for rel, groups in found.items():
            if groups and groups.get("receipt") and read is not None:
                text = read(rel)
                user = _receipt_user(text, groups["student_id"]) if text else None
                if user:
                    receipts[groups["student_id"]] = user
        users = _blackboard_users([f.student for f in files], receipts)
        for f in files:
            user, why = users[f.student]
            if user:
                f.student = user
            else:
                f.problem = why
        return files


register(Blackboard())
