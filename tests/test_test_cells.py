"""Every graded test cell can run in the grader's trusted harness as it runs in the notebook.

The harness (autograder.engine.harness) runs a test cell in a fresh namespace of its own and fetches
from the student's kernel only the names the test uses but does not define. So a test cell must
import every module it uses, may use no name that only another test or a lesson cell defines,
and no lesson cell may depend on a name that a test cell defines (while grading, test names
never reach the kernel). This file checks those rules statically, for every lesson; it runs in
a second.
"""
import ast
import builtins
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((REPO / "solutions").glob("*/*.ipynb"))


def _is_test(cell) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def _is_solution(cell) -> bool:
    return cell.cell_type == "code" and bool(cell.metadata.get("nbgrader", {}).get("solution"))


def _code(cell) -> str:
    """The cell's Python (IPython magics and shell lines dropped)."""
    return "\n".join(ln for ln in cell.source.splitlines() if not ln.lstrip().startswith(("%", "!")))


def bound_and_used(source: str):
    """(names the code binds anywhere, names it reads anywhere)."""
    bound, used = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound, used


def free_names(source: str) -> set:
    bound, used = bound_and_used(source)
    return {n for n in used - bound if not hasattr(builtins, n)}


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.parent.name)
def test_test_cells_use_only_their_own_names_and_the_answers(path):
    nb = nbformat.read(path, as_version=4)
    answers = set()
    for cell in nb.cells:
        if _is_solution(cell):
            answers |= bound_and_used(_code(cell))[0]
    problems = []
    for cell in filter(_is_test, nb.cells):
        gid = cell.metadata["nbgrader"]["grade_id"]
        compile(cell.source, gid, "exec")          # plain Python: no magics in a test
        stray = free_names(cell.source) - answers
        if stray:
            problems.append(f"{gid} uses {sorted(stray)}: import them (modules) or compute them "
                            "in the test; only the answers' names come from the notebook")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.parent.name)
def test_no_lesson_cell_needs_a_name_only_a_test_defines(path):
    nb = nbformat.read(path, as_version=4)
    from_tests, from_lesson, problems = set(), set(), []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        bound, used = bound_and_used(_code(cell))
        if _is_test(cell):
            from_tests |= bound - from_lesson
            continue
        needs = (used - bound - from_lesson) & from_tests
        if needs:
            problems.append(f"cell {i + 1} uses {sorted(needs)}, defined only by a test cell")
        from_lesson |= bound
    assert not problems, "\n".join(problems)


def test_the_rules_can_fail():
    assert free_names("import torch\nassert torch.equal(f(x), y)") == {"f", "x", "y"}
    assert free_names("g = lambda a: a + b\nfor k in range(3):\n    print(k)") == {"b"}
