"""Grading one question across the class: answers grouped, rubric items applied to a group, an
item's points changed for everyone who has it (issue 53, item 3; the review page's "by question").

A rubric item belongs to one exercise of one lesson: points and a comment, kept in
``DIR/rubric.json``. Applying it to students writes, for each, the usual overrides.csv row (the
exercise set to the item's points, stamped with the attempt graded) whose comment starts with the
item's tag, ``[rubric r2]``; so export, push and the feedback page read it like any decision, and
changing the item's points rewrites every row that carries its tag. A student's own decision
(another item, or points typed on their page) replaces the group's for that student only.

Groups are the answers the grader found alike: the catalogued mistake of the exercise
(insights.csv, as the class report reads it), "full points" for an answer that passed, and the
tests' points where no mistake was recorded.
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from autograder.journal import atomic_write, folder_in_use, load_results
from autograder.release import lesson_maxima
from autograder.reporting.decisions import decide
from autograder.reporting.report import write_class_outputs
from autograder.term.policy import OVERRIDES_FILE

__all__ = ["RUBRIC_FILE", "rubric_items", "add_item", "groups", "apply_item", "set_item_points", "tag_of"]

RUBRIC_FILE = "rubric.json"        # {lesson: {exercise: [{"id", "points", "comment"}]}}
_TAG = re.compile(r"^\[rubric (r\d+)\] ")
FULL = "full points"


def tag_of(comment: str) -> str:
    """The rubric item id a decision's comment carries ("" for none)."""
    found = _TAG.match(comment or "")
    return found.group(1) if found else ""


def _load(out: Path) -> dict:
    path = Path(out) / RUBRIC_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def rubric_items(out: Path, lesson: str, exercise: str) -> list:
    """The items of ``lesson``'s ``exercise``: [{"id", "points", "comment"}], in the order made."""
    return _load(out).get(lesson, {}).get(exercise, [])


def _maximum(out: Path, lesson: str, exercise: str) -> float:
    maxima = lesson_maxima(Path(out), {lesson}).get(lesson, {})
    if exercise not in maxima:
        raise ValueError(f"{lesson} has no exercise {exercise!r}")
    return maxima[exercise]


def _points(text, most: float) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"points must be a number, got {text!r}") from None
    if not 0 <= value <= most:
        raise ValueError(f"points must be between 0 and {most:g}, got {text}")
    return value


def add_item(out: Path, lesson: str, exercise: str, points, comment: str) -> dict:
    """A new item for ``lesson``'s ``exercise``; returns it. Raises ValueError for an unknown
    exercise, points outside 0 to its maximum, or an empty comment (the student reads it)."""
    value = _points(points, _maximum(out, lesson, exercise))
    if not comment.strip():
        raise ValueError("a rubric item needs a comment: it is what the student reads")
    with folder_in_use(out, "review"):
        data = _load(out)
        items = data.setdefault(lesson, {}).setdefault(exercise, [])
        item = {"id": f"r{1 + max((int(i['id'][1:]) for i in items), default=0)}", "points": value,
                "comment": comment.strip()}
        items.append(item)
        atomic_write(Path(out) / RUBRIC_FILE, json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return item


def groups(out: Path, lesson: str, exercise: str) -> dict:
    """{group name: [student ids]} of the graded answers to ``lesson``'s ``exercise``: by the
    catalogued mistake insights.csv records, else by the tests' points; FULL for a passed one."""
    mistakes = {}
    path = Path(out) / "insights.csv"
    if path.exists():
        for row in csv.DictReader(path.open(encoding="utf-8", newline="")):
            if (row["assignment"], row["exercise"]) == (lesson, exercise) and row["mistake"]:
                mistakes[row["student_id"].lstrip("'")] = row["mistake"]
    most = _maximum(out, lesson, exercise)
    found = {}
    for res in load_results(Path(out)):
        if res["assignment"] != lesson or exercise not in res.get("exercises", {}):
            continue
        points = float(res["exercises"][exercise])
        name = FULL if points >= most else mistakes.get(res["student"]) or f"{points:g} of {most:g} points"
        found.setdefault(name, []).append(res["student"])
    return dict(sorted(found.items(), key=lambda kv: (kv[0] == FULL, -len(kv[1]), kv[0])))


def apply_item(out: Path, lesson: str, exercise: str, item_id: str, students: list, by: str,
               root=None) -> int:
    """Decide ``exercise`` of each of ``students`` with the item (autograder.reporting.review's
    ``decide``, the comment tagged); then the class outputs once, when ``root`` is given.
    Returns how many rows were written."""
    item = next((i for i in rubric_items(out, lesson, exercise) if i["id"] == item_id), None)
    if item is None:
        raise ValueError(f"{lesson} {exercise} has no rubric item {item_id!r}")
    for student in students:
        decide(out, student, lesson, "exercise", by, f"[rubric {item_id}] {item['comment']}", exercise,
               f"{item['points']:g}")
    if root is not None and students:
        write_class_outputs(Path(root), Path(out))
    return len(students)


def set_item_points(out: Path, lesson: str, exercise: str, item_id: str, points, root=None) -> int:
    """Change an item's points: rubric.json and every overrides.csv row of ``lesson``'s
    ``exercise`` that carries its tag; then the class outputs, when ``root`` is given. Returns
    the rows changed."""
    value = _points(points, _maximum(out, lesson, exercise))
    out = Path(out)
    with folder_in_use(out, "review"):
        data = _load(out)
        item = next((i for i in data.get(lesson, {}).get(exercise, []) if i["id"] == item_id), None)
        if item is None:
            raise ValueError(f"{lesson} {exercise} has no rubric item {item_id!r}")
        item["points"] = value
        atomic_write(out / RUBRIC_FILE, json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        path, changed = out / OVERRIDES_FILE, 0
        rows = list(csv.reader(path.open(encoding="utf-8-sig", newline=""))) if path.exists() else []
        for r in rows[1:]:
            if len(r) >= 5 and (r[1], r[2]) == (lesson, exercise) and tag_of(r[4]) == item_id:
                r[3], changed = f"{value:g}", changed + 1
        if changed:
            with open(path.with_suffix(".csv.tmp"), "w", encoding="utf-8", newline="") as f:
                csv.writer(f).writerows(rows)
            path.with_suffix(".csv.tmp").replace(path)
        if root is not None:
            write_class_outputs(Path(root), out)
    return changed
