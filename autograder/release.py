"""One assignment as released into a grading folder: the one reader of its release.

``grade`` writes each assignment's release into ``DIR/work/release/<assignment>/`` (what the
students got) beside its source, ``DIR/work/source/<assignment>/`` (the instructor's version,
with the answers and hidden tests). The batch grades submissions against a :class:`Release`
(notebook names, release cells, test sources, the digest a regrade compares); the term's grades
read its points (:func:`lesson_maxima`) and the class report its exercises, answers and
mistake catalogue, all from the same object. Not the course's lesson: that is
:class:`autograder.course.Lesson` (id, title, time), one per lesson of ``LESSONS``; a class may
be graded on an assignment the course does not list (the toy course of the tests).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import nbformat

from autograder.cells import grade_id_of, is_graded, is_test_cell, nbgrader_meta
from autograder.journal import digest
from autograder.mistakes import exercise_titles, load_mistakes

__all__ = ["Exercise", "Release", "answer_text", "lesson_maxima"]


@dataclass
class Exercise:
    """One autograded test cell of a lesson."""
    grade_id: str
    title: str
    points: float


class Release:
    """The release of ``assignment`` in the grading folder whose work folder is ``work``.

    ``names``: its notebook file names, sorted; ``release``: {name: notebook} as released. The
    rest is read when first asked for. ``root``: the course, whose mistake catalogue
    (``solutions/<id>/mistakes.json``) :attr:`mistakes` reads. ``earlier``: {name: [release
    cells]} of the releases before this one, filled in by the batch
    (:mod:`autograder.grading.grade`, which reads the course's git history); empty otherwise."""

    def __init__(self, work: Path, assignment: str, root: Path = None):
        self.work, self.assignment, self.root = Path(work), assignment, root
        folder = self.work / "release" / assignment
        self.names = sorted(p.name for p in folder.glob("*.ipynb"))
        self.release = {n: nbformat.read(folder / n, as_version=4) for n in self.names}
        self.earlier = {}

    @property
    def notebooks(self) -> list:
        return self.names

    @property
    def source_dir(self) -> Path:
        return self.work / "source" / self.assignment

    @cached_property
    def source(self) -> dict:
        """{name: notebook} of the instructor's version, for each released notebook it holds."""
        return {n: nbformat.read(self.source_dir / n, as_version=4) for n in self.names
                if (self.source_dir / n).is_file()}

    @cached_property
    def sources(self) -> dict:
        """{grade_id: source} of every cell of the instructor's version that has a grade id."""
        return {grade_id_of(c): c.source for nb in self.source.values() for c in nb.cells
                if grade_id_of(c)}

    @cached_property
    def columns(self) -> list:
        """The grade ids of the graded cells, in notebook order (grades.csv's exercise columns)."""
        return [grade_id_of(c) for n in self.names for c in self.release[n].cells if is_graded(c)]

    @cached_property
    def maxima(self) -> dict:
        """{grade_id: points} of the graded cells."""
        return {grade_id_of(c): float(nbgrader_meta(c).get("points", 0))
                for nb in self.release.values() for c in nb.cells
                if is_graded(c) and grade_id_of(c)}

    @property
    def max_score(self) -> float:
        return float(sum(self.maxima.values()))

    @cached_property
    def digest(self) -> str:
        """A digest of every file of the source folder: a regrade compares it."""
        return digest(*(p.read_bytes() for p in sorted(self.source_dir.rglob("*")) if p.is_file()))

    @cached_property
    def exercises(self) -> list:
        """[Exercise] of the autograded test cells, in notebook order."""
        found = []
        for nb in self.release.values():
            titles = exercise_titles(nb)
            found += [Exercise(grade_id_of(c), titles[grade_id_of(c)],
                               float(nbgrader_meta(c).get("points", 0)))
                      for c in nb.cells if is_test_cell(c)]
        return found

    @cached_property
    def skeleton(self) -> str:
        """The released text of the answer (solution) cells, in order."""
        return answer_text(self.release.values())

    @cached_property
    def reference(self) -> str:
        """The instructor's text of the same cells."""
        return answer_text(self.source.values())

    @cached_property
    def mistakes(self) -> dict:
        """{id: Mistake} of the lesson's catalogue at ``root`` (autograder.mistakes)."""
        return load_mistakes(self.root, self.assignment)


def answer_text(nbs) -> str:
    """The answer (solution) cells of notebooks, in order, as one text."""
    return "\n\n".join(c.source for nb in nbs for c in nb.cells
                       if nbgrader_meta(c).get("solution") and grade_id_of(c))


def lesson_maxima(out: Path, assignments) -> dict:
    """{assignment: {grade_id: points}} of each lesson's graded cells, read from its release in
    ``out/work/release`` (no kernel); a lesson without a release maps to {}."""
    return {a: Release(Path(out) / "work", a).maxima for a in sorted(assignments)}
