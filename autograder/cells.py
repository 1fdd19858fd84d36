"""nbgrader's cell metadata, read in one place: what kind of cell it is, its id and its points.

nbgrader writes ``cell.metadata["nbgrader"]`` (``grade``, ``solution``, ``locked``,
``grade_id``, ``points``, ``schema_version``); every module of the grader reads it through these
functions. (The student library keeps its own copy of :func:`is_test_cell` in ``mlexp.check``:
``mlexp`` never imports the grader.)
"""

__all__ = ["nbgrader_meta", "grade_id_of", "points_of", "is_graded", "is_solution",
           "is_test_cell"]


def nbgrader_meta(cell) -> dict:
    """The cell's nbgrader metadata; an empty dict when it has none."""
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def grade_id_of(cell):
    """The cell's nbgrader ``grade_id``, or None."""
    return nbgrader_meta(cell).get("grade_id")


def points_of(cell) -> float:
    """The points of a graded cell (0 when unset)."""
    return float(nbgrader_meta(cell).get("points", 0) or 0)


def is_graded(cell) -> bool:
    """A cell nbgrader scores (``grade``: a test cell, or a manually graded answer)."""
    return bool(nbgrader_meta(cell).get("grade"))


def is_solution(cell) -> bool:
    """A cell the student writes (``solution``)."""
    return bool(nbgrader_meta(cell).get("solution"))


def is_test_cell(cell) -> bool:
    """An autograded test cell: a graded code cell that is not a solution cell."""
    meta = nbgrader_meta(cell)
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")
