"""The lessons an earlier run graded into the same folder: one folder holds a whole term."""
from __future__ import annotations

from pathlib import Path

from autograder.journal import load_result, read_manifest
from autograder.release import lesson_maxima
from autograder.results import Result

__all__ = ["EarlierLessons"]


class EarlierLessons:
    """The lessons graded into ``out`` by earlier runs that this run does not grade: a folder
    holds a term, so grading lesson 01 keeps lesson 04 in the class (class.json, grades.csv,
    overrides, report and export). A lesson this run grades replaces its own entries whole."""

    def __init__(self, out: Path, graded_now: set):
        try:
            entries, columns = read_manifest(out)
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            entries, columns = [], {}
        self.entries = [e for e in entries if e[1] not in graded_now]
        lessons = {a for _, a, _ in self.entries}
        self.columns = {a: c for a, c in columns.items() if a in lessons}
        self.maxima = lesson_maxima(out, lessons)
        self.results = []
        for student, assignment, _ in self.entries:
            found = load_result(out, assignment, student)
            if found is not None:
                res = Result.from_dict(found)
                if not res.max_score:   # rejected: what it could have scored
                    res.max_score = float(sum(self.maxima.get(assignment, {}).values()))
                self.results.append(res)

    def known(self) -> dict:
        """{(student, assignment): {grade_id: points}} for read_overrides."""
        return {(s, a): self.maxima.get(a, {}) for s, a, _ in self.entries}
