"""nbgrader's cell metadata, read in one place: what kind of cell it is, its id and its points.

nbgrader writes ``cell.metadata["nbgrader"]`` (``grade``, ``solution``, ``locked``,
``grade_id``, ``points``, ``schema_version``); every module of the grader reads it through these
functions. (The student library keeps its own copy of :func:`is_test_cell` in ``mlexp.check``:
``mlexp`` never imports the grader.) :func:`defined_names` and :func:`read_names` say what a
code cell defines and reads, for the book and the seed tables, which hide what an answer computes.
"""
import ast

__all__ = ["nbgrader_meta", "grade_id_of", "points_of", "is_graded", "is_solution",
           "is_test_cell", "defined_names", "read_names"]


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


# -------------------------------------------- what a code cell defines and reads (ast)

def _code(source: str) -> str:
    """Cell source as plain Python (magics and shell lines turned into calls) for ast."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        return TransformerManager().transform_cell(source)
    except Exception:       # noqa: BLE001  (IPython missing or a cell it cannot read)
        return source


def defined_names(source: str) -> set:
    """Top-level names a cell defines (functions, classes, assignments, imports)."""
    try:
        tree = ast.parse(_code(source))
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        for sub in ast.walk(node) if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign,
                                                       ast.For, ast.With)) else ():
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                names.add(sub.id)
    return names


def read_names(source: str) -> set | None:
    """Names a cell reads; None when it cannot be parsed (then its outputs are not trusted)."""
    try:
        tree = ast.parse(_code(source))
    except SyntaxError:
        return None
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
