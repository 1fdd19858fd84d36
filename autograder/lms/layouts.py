"""How Canvas, Moodle and Blackboard name the files of a "download all submissions" zip.

Each LMS puts one assignment's submissions in one zip and encodes the student in each file's
name. The names are read with nbgrader's own :class:`FileNameCollectorPlugin` (the plugin
``nbgrader zip_collect`` uses), one regular expression per LMS:

- Canvas: every file loose at the top, ``<name>_[LATE_]<user id>_<file id>_<file name>``, e.g.
  ``smithann_12345_67890_01_running_sum.ipynb`` (a resubmitted file may end in ``-1``). The
  student id is ``<name>_<user id>`` (``smithann_12345``): names alone are not unique.
- Moodle: a folder per student ``<Full Name>_<participant id>_assignsubmission_file_/`` holding
  the files, or (without "download in folders") files named
  ``<Full Name>_<id>_assignsubmission_file_<file name>``. The student id is
  ``<Full Name>_<id>``. Online-text parts (``assignsubmission_onlinetext``) are skipped.
- Blackboard: files ``<assignment>_<user name>_attempt_<YYYY-MM-DD-HH-MM-SS>_<file name>`` and a
  receipt ``<assignment>_<user name>_attempt_<date>.txt`` per attempt, whose first line is
  ``Name: <Full Name> (<user name>)``. The student id is the user name; the attempt's date
  decides which of several attempts is the latest. Both the assignment name and the user name
  may hold ``_`` (``ann_smith``, ``HW_1``), and the file name after the date is the student's
  own, free to hold ``_<someone>_attempt_<date>_``. So the attempt is the *first*
  ``_attempt_<date>`` of the name, and the user name is told from the assignment name by, in
  turn: the attempt's receipt, an assignment name some receipt of the export settled, or the
  one split that every name of the export shares. A name none of these settle is not guessed:
  it is returned with ``problem`` set (it goes to "submissions that need you").

Formats as documented by each LMS and as seen in their exports; an institution's own naming
(anonymous grading, group submissions) may differ and is then reported as an unknown layout.
"""
import logging
import re
from dataclasses import dataclass
from datetime import datetime

from nbgrader.plugins.zipcollect import FileNameCollectorPlugin

__all__ = ["LmsFile", "LAYOUTS", "DESCRIPTIONS", "match_layout", "describe_layouts",
           "moodle_submission_times", "MOODLE_SOURCE", "MOODLE_HEADERS", "moodle_language",
           "moodle_header", "MOODLE_NO"]

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
    """A worksheet's "Last modified" cell as a naive datetime, in the worksheet's language
    (dateparser, the language's day and month names; an all-number date day first outside
    English); None when it cannot be read."""
    import dateparser
    return dateparser.parse(text, languages=[lang] if lang == "en" else [lang, "en"],
                            settings={"DATE_ORDER": _DATE_ORDER.get(lang, "MDY"),
                                      "PARSERS": ["absolute-time"],   # never "yesterday"
                                      "REQUIRE_PARTS": ["day", "month", "year"],
                                      "RETURN_AS_TIMEZONE_AWARE": False})

_QUIET = logging.getLogger("autograder.lms.layouts")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False     # the plugin warns for every name that does not match

LAYOUTS = {
    "Canvas": r"^(?P<name>[^_/]+)_(?:(?P<late>LATE|late)_)?(?P<user_id>\d+)_(?P<file_no>\d+)_"
              r"(?P<file_id>[^/]+)$",
    "Moodle": r"^(?P<student_id>[^/]+?_\d+)_assignsubmission_(?P<part>file|onlinetext)_/?"
              r"(?P<file_id>.+)$",
    # the head (<assignment>_<user name>) ends at the first _attempt_<date>: what follows the date
    # is the student's own file name; the user name is split off the head in _blackboard_users
    "Blackboard": r"^(?P<student_id>[^/]+?)_attempt_"
                  r"(?P<timestamp>\d{4}(?:-\d\d){5})(?:_(?P<file_id>[^/]+)|(?P<receipt>\.txt))?$",
}
DESCRIPTIONS = {
    "folder": "a folder per student: <student>/<assignment>/<notebook>.ipynb (or "
              "<student>/<notebook>.ipynb), inside up to three wrapping folders",
    "Canvas": "Canvas: <name>_<user id>_<file id>_<notebook>.ipynb at the top (_LATE_ allowed)",
    "Moodle": "Moodle: <Full Name>_<id>_assignsubmission_file_/<notebook>.ipynb",
    "Blackboard": "Blackboard: <assignment>_<user>_attempt_<YYYY-MM-DD-HH-MM-SS>_<notebook>.ipynb",
}


@dataclass
class LmsFile:
    """One file of an LMS export, read from its name."""
    rel: str                 # path inside the export, '/'-separated
    student: str
    file_id: str             # the file name as the student uploaded it (may hold folders)
    time: float = None       # upload time from the name (seconds since the epoch), if any
    late: bool = False
    stamp: str = ""          # that time as written (ISO 8601, no zone: the LMS's wall clock)
    problem: str = ""        # why the file cannot be tied to one student; empty when it can


def _plugin(layout: str, rels) -> FileNameCollectorPlugin:
    exts = sorted({"." + r.rsplit(".", 1)[1] if "." in r.rsplit("/", 1)[-1] else "" for r in rels})
    return FileNameCollectorPlugin(named_regexp=LAYOUTS[layout], valid_ext=exts, log=_QUIET)


def _read(layout: str, rel: str, found: dict):
    """``found`` (the plugin's groups) as an LmsFile, or None for a part that holds no file."""
    if layout == "Canvas":
        return LmsFile(rel, f"{found['name']}_{found['user_id']}", found["file_id"],
                       late=bool(found.get("late")))
    if layout == "Moodle":
        return None if found["part"] != "file" else LmsFile(rel, found["student_id"],
                                                             found["file_id"])
    if not found.get("file_id"):    # Blackboard's receipt of an attempt (or a bare attempt)
        return None
    when = datetime.strptime(found["timestamp"], "%Y-%m-%d-%H-%M-%S")
    return LmsFile(rel, found["student_id"], found["file_id"], time=when.timestamp(),
                   stamp=when.isoformat())


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


def _settle_blackboard(files: list, rels, read) -> list:
    """Blackboard's files with the user name split off each head (see the module's notes)."""
    plugin, receipts = _plugin("Blackboard", rels), {}
    for rel in rels:
        found = plugin.collect(rel)
        if found and found.get("receipt") and read is not None:
            text = read(rel)
            user = _receipt_user(text, found["student_id"]) if text else None
            if user:
                receipts[found["student_id"]] = user
    users = _blackboard_users([f.student for f in files], receipts)
    for f in files:
        user, why = users[f.student]
        if user:
            f.student = user
        else:
            f.problem = why
    return files


def match_layout(rels, read=None) -> tuple:
    """(layout, [LmsFile], [unmatched rel]) for the LMS whose names fit most notebooks.

    ``rels`` are the '/'-separated paths of every file in the export; ``read(rel)`` (optional)
    returns the text of a small file of the export, or None: it reads Blackboard's receipts,
    which tell the user name from the assignment name. Returns (None, [], rels) when no LMS's
    names fit a single notebook.
    """
    rels = list(rels)
    best = (None, [], rels, 0)
    for layout in LAYOUTS:
        plugin, files, unmatched = _plugin(layout, rels), [], []
        for rel in rels:
            found = plugin.collect(rel)
            if found is None:
                unmatched.append(rel)
                continue
            item = _read(layout, rel, found)
            if item is not None:     # None: a receipt or an online-text part, not a file
                files.append(item)
        score = sum(f.file_id.lower().endswith(".ipynb") for f in files)
        if score > best[3]:
            best = (layout, files, unmatched, score)
    if best[0] == "Blackboard":
        best = (best[0], _settle_blackboard(best[1], rels, read), best[2], best[3])
    return best[:3]


def describe_layouts() -> str:
    """The layouts collect understands, one per line, for error messages."""
    return "\n".join(f"  - {d}" for d in DESCRIPTIONS.values())



def moodle_submission_times(path, zone) -> dict:
    """{participant id: aware datetime} from a Moodle assignment's grading worksheet (the CSV
    of "Download grading worksheet": ``Identifier`` "Participant 1001", ``Last modified
    (submission)`` "Wednesday, 1 October 2026, 11:59 PM" in the Moodle user's time zone, read
    in ``zone`` (a tzinfo); "-" or empty: no submission, left out), in any language of
    MOODLE_HEADERS, its dates in that language. The id is the number a Moodle zip's student id
    ends with ("Ann Smith_1001"). Raises ValueError naming the file and line when a column is
    missing or a date cannot be read; FileNotFoundError."""
    import csv
    from pathlib import Path

    from autograder.lms.table import delimiter_of
    path = Path(path)
    with open(path, newline="", encoding="utf-8-sig") as f:
        delimiter = delimiter_of(f.readline())    # ',' or, re-saved in many locales, ';'
        f.seek(0)
        reader = csv.reader(f, delimiter=delimiter)
        head = next(reader, [])
        lang = moodle_language(head)
        columns = {k: moodle_header(head, k) for k in ("Identifier", "Last modified (submission)")}
        missing = [MOODLE_HEADERS[k][lang] for k, i in columns.items() if i is None]
        if missing:
            raise ValueError(f"{path}: no column {', '.join(map(repr, missing))}; is it Moodle's "
                             "grading worksheet (Download grading worksheet)?")
        ident_at, when_at = columns["Identifier"], columns["Last modified (submission)"]
        times = {}
        for row in reader:
            if len(row) <= max(ident_at, when_at):
                continue
            ident, text = row[ident_at].strip(), row[when_at].strip()
            number = ident.rsplit(" ", 1)[-1]
            if not number.isdigit() or text in ("", "-"):
                continue
            when = moodle_date(text, lang)
            if when is None:
                raise ValueError(f"{path} line {reader.line_num}: "
                                 f"{MOODLE_HEADERS['Last modified (submission)'][lang]!r} "
                                 f"{text!r} is not a date") from None
            times[number] = when if when.tzinfo else when.replace(tzinfo=zone)
    return times
