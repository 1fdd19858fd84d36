"""The mistakes each lesson's tests catch: the catalogue, hint -> mistake id, exercise titles.

Every graded test cell fails with a hint (``AssertionError: Hint: ...``) that names what went
wrong. Each lesson catalogues the mistakes its tests detect once, next to those tests, in
``solutions/<id>/mistakes.json``::

    {"z_not_updated": {"test": "test_your_turn", "hint": "z was not updated"}, ...}

A mistake id is a stable short name; ``test`` is the grade_id of the test cell that detects it
and ``hint`` a distinctive piece of that cell's hint text, copied from the cell's source (so
:func:`stale_mistakes` can tell when a rewritten hint no longer carries it). A failing test is
matched to the catalogued mistake of the same test cell whose ``hint`` occurs in the hint shown
(the longest such piece wins), and to :data:`NO_MATCH` when none does: an unforeseen wrong
answer. The file is never released to students (build and nbgrader ignore it) and changing it
regrades nothing: ``python -m autograder report DIR`` re-matches a graded class.
"""
import json
import re
from dataclasses import dataclass
from pathlib import Path

from mlexp.check import printed_hints

from autograder.cells import grade_id_of, is_test_cell

__all__ = ["MISTAKES_FILE", "NO_MATCH", "NOT_GRADED", "Mistake", "load_mistakes",
           "match_mistake", "stale_mistakes", "hint_shown", "is_test_cell", "exercise_titles"]

MISTAKES_FILE = "mistakes.json"
NO_MATCH = "no_hint_matched"      # a failed exercise whose hint matches no catalogued mistake
NOT_GRADED = "not_graded"         # the submission was not graded (rejected, grading failed)
_ID = re.compile(r"[a-z][a-z0-9_]*", re.IGNORECASE)


@dataclass(frozen=True)
class Mistake:
    """One catalogued mistake: its id, the test cell that detects it, a piece of its hint."""
    id: str
    test: str
    hint: str


def load_mistakes(root: Path, assignment: str) -> dict:
    """The catalogue ``root/solutions/<assignment>/mistakes.json`` as {id: Mistake}, in file order.

    Returns {} when the lesson has no catalogue. Raises ValueError naming the file and the entry
    when it is not a JSON object of ``{"test": str, "hint": str}`` entries with short ids.
    """
    path = Path(root) / "solutions" / assignment / MISTAKES_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object of mistake id -> {{test, hint}}")
    found = {}
    for mid, spec in data.items():
        ok = isinstance(spec, dict) and all(isinstance(spec.get(k), str) and spec[k].strip()
                                            for k in ("test", "hint"))
        if not ok or not _ID.fullmatch(mid) or mid in (NO_MATCH, NOT_GRADED):
            raise ValueError(f"{path}: entry '{mid}' needs a short id (letters, digits, _) and "
                             f"non-empty \"test\" and \"hint\" strings; got {spec!r}")
        found[mid] = Mistake(mid, spec["test"], spec["hint"])
    return found


def match_mistake(mistakes: dict, test: str, hint: str):
    """The id of the catalogued mistake of test cell ``test`` whose hint piece occurs in
    ``hint`` (the longest piece when several do), or None."""
    hits = [m for m in mistakes.values() if m.test == test and m.hint in (hint or "")]
    return max(hits, key=lambda m: len(m.hint)).id if hits else None


def stale_mistakes(mistakes: dict, notebooks) -> list:
    """One message per catalogued mistake that its test cell can no longer show: the test cell
    is gone, or its source no longer contains the hint piece (a hint was rewritten).
    ``notebooks``: the lesson's solution notebooks (NotebookNodes)."""
    sources = {grade_id_of(c): c.source for nb in notebooks for c in nb.cells
               if is_test_cell(c)}
    problems = []
    for m in mistakes.values():
        if m.test not in sources:
            problems.append(f"{m.id}: no test cell '{m.test}' (test cells: {sorted(sources)})")
        elif m.hint not in sources[m.test]:
            problems.append(f"{m.id}: the hint piece {m.hint!r} is no longer in the source of "
                            f"'{m.test}'; copy a distinctive piece of the new hint into "
                            f"{MISTAKES_FILE}")
    return problems


def hint_shown(cell, limit: int = 1000) -> str:
    """What a failed test cell told the student: the message of its first error (the hint
    itself for an AssertionError, else ``Type: message``); else the hints it printed (a test
    that gave partial credit: it cannot raise, so it prints the hint of each part that failed,
    ``mlexp.check.printed_hints``); "" when it shows neither."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            ename, evalue = str(out.get("ename", "")), str(out.get("evalue", ""))
            text = evalue if ename == "AssertionError" and evalue else f"{ename}: {evalue}"
            return text.strip()[:limit]
    return printed_hints(cell)[:limit]


_TEST_LINE = re.compile(r"^\s*#\s*Test:\s*(.+?)(?:\s*\(\d+(?:\.\d+)?\s*points?\))?\s*(?:\.\s.*|\.)?$",
                        re.IGNORECASE)
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$")
_GRADED_NOTE = re.compile(r"\s*\((?:graded[^)]*|\d+(?:\.\d+)?\s*points?)\)", re.IGNORECASE)


def _first_upper(text: str) -> str:
    return text[:1].upper() + text[1:]


def exercise_titles(nb) -> dict:
    """{grade_id: title} for each autograded test cell of ``nb``.

    The title is the cell's first line ``# Test: <title> (N points). ...``; else the last
    heading in the markdown since the previous test cell (for "Your turn (graded, 3 points):
    the parallel form", the part after the colon); else the grade_id.
    """
    titles, heading = {}, None
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                m = _HEADING.match(line)
                if m:   # "Your turn (graded, 3 points): the parallel form" -> "the parallel form"
                    text, graded = _GRADED_NOTE.subn("", m.group(1))
                    heading = (text.split(":", 1)[-1] if graded else text).strip(" :-")
        elif is_test_cell(cell):
            first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
            m = _TEST_LINE.match(first)
            gid = grade_id_of(cell)
            titles[gid] = _first_upper((m.group(1).strip() if m else "") or heading or "")[:120] or gid
            heading = None     # a heading names the exercise that follows it, not the next one
    return titles
