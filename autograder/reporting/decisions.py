"""A person's decision on a graded submission, written where ``report``, ``export`` and ``canvas
push`` read it: a row of ``DIR/overrides.csv`` (its usual format, stamped with the attempt it
decides, replacing an earlier decision of the same exercise and attempt) and a line of
``DIR/decisions.jsonl`` with who and when (issue 53, item 4). The review page and the rubric
(autograder.reporting.review, autograder.reporting.rubric) write through :func:`decide`.
"""
from __future__ import annotations

import csv
import datetime
import json
from pathlib import Path

from autograder.journal import folder_in_use, load_result
from autograder.release import lesson_maxima
from autograder.reporting.report import write_class_outputs
from autograder.term.policy import ATTEMPT_COLUMN, KEEP, OVERRIDE_COLUMNS, OVERRIDES_FILE

__all__ = ["DECISIONS_LOG", "decide", "decide_pair", "pair_decisions", "exercise_maxima", "PAIR_VERDICTS"]

DECISIONS_LOG = "decisions.jsonl"     # who decided what, when, for which attempt (one JSON a line)


def decide(out: Path, student: str, lesson: str, action: str, by: str, comment: str = "",
           exercise: str = "", points: str = "", root=None) -> dict:
    """Write one decision on ``student``'s ``lesson``: ``action`` "keep" (the tests' score
    stands), "exercise" (``exercise`` set to ``points``) or "total" (the lesson total set to
    ``points``). Appends a row to overrides.csv (its header written when the file is new; the
    attempt column added when the file has none) stamped with the attempt graded now, and a line
    to decisions.jsonl; then writes the class outputs again when ``root`` (the course) is given.
    Returns the decision as logged. Raises ValueError for an unknown submission, action,
    exercise or points that are not a number within the exercise's or lesson's maximum."""
    out = Path(out)
    res = load_result(out, lesson, student)
    if res is None:
        raise ValueError(f"no graded submission of {lesson} by {student} in {out}")
    attempt = res.get("attempt") or res.get("digest", "")
    if action == "keep":
        exercise, value = "", KEEP
    elif action in ("exercise", "total"):
        most = float(res.get("max_score") or 0)
        if action == "exercise":
            maxima = exercise_maxima(out, lesson)
            if exercise not in maxima:
                raise ValueError(f"{lesson} has no exercise {exercise!r}")
            most = maxima[exercise]
        else:
            exercise = ""
        try:
            number = float(points)
        except ValueError:
            raise ValueError(f"points must be a number, got {points!r}") from None
        if not 0 <= number <= most:
            raise ValueError(f"points must be between 0 and {most:g}, got {points}")
        value = f"{number:g}"
    else:
        raise ValueError(f"unknown decision {action!r}: keep, exercise or total")
    by = by.strip() or "instructor"
    row = [student, lesson, exercise, value, comment.strip(), by]
    when = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    with folder_in_use(out, "review"):
        _append_override(out / OVERRIDES_FILE, row, attempt)
        with open(out / DECISIONS_LOG, "a", encoding="utf-8") as f:
            record = {"when": when, "by": by, "student": student, "lesson": lesson, "exercise": exercise,
                      "points": value, "comment": comment.strip(), "attempt": attempt}
            f.write(json.dumps(record) + "\n")
        if root is not None:
            write_class_outputs(Path(root), out)
    return record


PAIR_VERDICTS = {"no concern": "looked at: no concern", "refer": "referred for an academic integrity review"}


def decide_pair(out: Path, lesson: str, a: str, b: str, verdict: str, by: str, note: str = "",
                digest: str = "") -> dict:
    """Record a person's look at a pair of similar answers (autograder.reporting.similarity):
    ``verdict`` a key of PAIR_VERDICTS, for the answers whose mark is ``digest`` (Pair.digest),
    so the pair comes back when either answer changes. Writes only decisions.jsonl: a pair is
    never a grade. Raises ValueError for an unknown verdict."""
    if verdict not in PAIR_VERDICTS:
        raise ValueError(f"unknown verdict {verdict!r}: {' or '.join(PAIR_VERDICTS)}")
    by = by.strip() or "instructor"
    record = {"when": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "by": by,
              "pair": sorted([a, b]), "lesson": lesson, "verdict": verdict, "comment": note.strip(),
              "answers": digest}
    with folder_in_use(Path(out), "review"):
        with open(Path(out) / DECISIONS_LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    return record


def pair_decisions(out: Path) -> dict:
    """{(lesson, a, b, answers' mark): the last decision on that pair} from decisions.jsonl."""
    found = {}
    try:
        lines = (Path(out) / DECISIONS_LOG).read_text(encoding="utf-8").splitlines()
    except OSError:
        return found
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and isinstance(d.get("pair"), list) and len(d["pair"]) == 2:
            found[(d.get("lesson"), *sorted(map(str, d["pair"])), d.get("answers", ""))] = d
    return found


def exercise_maxima(out: Path, lesson: str) -> dict:
    return lesson_maxima(out, {lesson}).get(lesson, {})


def _append_override(path: Path, row: list, attempt: str) -> None:
    """Add ``row`` (the six columns) with ``attempt`` to overrides.csv, in place of an earlier
    row for the same student, lesson and exercise of this attempt (or of no attempt yet): a
    decision made again replaces the one before, as overrides.csv allows one."""
    header = list(OVERRIDE_COLUMNS) + [ATTEMPT_COLUMN]
    if not path.exists() or not path.read_text(encoding="utf-8-sig").strip():
        rows = [header]
    else:
        rows = list(csv.reader(path.open(encoding="utf-8-sig", newline="")))
        if rows and ATTEMPT_COLUMN not in [h.strip() for h in rows[0]]:   # an older file: add the column
            rows = [rows[0] + [ATTEMPT_COLUMN]] + [r + [""] * (len(rows[0]) + 1 - len(r)) for r in rows[1:]]

    def same(r):
        cells = [c.strip() for c in r] + [""] * 7
        return (cells[0].lstrip("'"), cells[1], cells[2]) == tuple(row[:3]) and attempt.startswith(cells[6])
    rows = rows[:1] + [r for r in rows[1:] if not same(r)] + [row + [attempt]]
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows(rows)
    tmp.replace(path)
