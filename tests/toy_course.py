"""A two-exercise nbgrader course written from code, so the grader is tested without torch."""
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ASSIGNMENT = "toy"
NOTEBOOK = "toy.ipynb"
HIDDEN_MARK = "hidden_probe_7"        # appears only in hidden test source
ADD_SOLUTION = "def add(a, b):\n    return a + b"
MUL_SOLUTION = "def mul(a, b):\n    return a * b"
MEAN_SOLUTION = "def mean(xs):\n    return sum(xs) / len(xs)"


def _solution(grade_id, source):
    return new_code_cell(source, metadata={"nbgrader": {
        "grade": False, "solution": True, "locked": False, "grade_id": grade_id,
        "schema_version": 3}})


def _test(grade_id, points, source):
    return new_code_cell(source, metadata={"nbgrader": {
        "grade": True, "solution": False, "locked": True, "points": points,
        "grade_id": grade_id, "schema_version": 3}})


def toy_notebook():
    """Solution notebook: add (2 points, visible + hidden test), mul (3 points) and mean (1 point,
    a test that relies on math.isclose and the builtin abs)."""
    cells = [
        new_markdown_cell("# Toy lesson\nTwo small functions."),
        new_code_cell("import os\nMODE = os.environ.get('NBGRADER_EXECUTION', 'full')"),
        _solution("add", "def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n"
                         "    ### END SOLUTION"),
        _test("test_add", 2,
              "assert add(1, 2) == 3, 'Hint: add(1, 2) should be 3; did you subtract?'\n"
              "### BEGIN HIDDEN TESTS\n"
              f"{HIDDEN_MARK} = add(-5, 5)\n"
              f"assert {HIDDEN_MARK} == 0, 'Hint: add must work for negative numbers'\n"
              "### END HIDDEN TESTS"),
        _solution("mul", "def mul(a, b):\n    ### BEGIN SOLUTION\n    return a * b\n"
                         "    ### END SOLUTION"),
        _test("test_mul", 3, "assert mul(2, 3) == 6, 'Hint: mul(2, 3) should be 6, not ' + "
                             "str(mul(2, 3))"),
        _solution("mean", "def mean(xs):\n    ### BEGIN SOLUTION\n    return sum(xs) / len(xs)\n"
                          "    ### END SOLUTION"),
        _test("test_mean", 1, "import math\n"
                              "assert math.isclose(mean([1, 2, 3, 4]), 2.5), 'Hint: mean([1, 2, 3, 4]) is 2.5'\n"
                              "assert abs(mean([-1, 1])) < 1e-12, 'Hint: mean([-1, 1]) is 0'"),
        new_code_cell("print('experiment mode:', MODE)"),
    ]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def make_toy_course(root: Path) -> Path:
    """Write ``root/solutions/toy/toy.ipynb`` (and an empty lessons/); returns ``root``."""
    root = Path(root)
    (root / "solutions" / ASSIGNMENT).mkdir(parents=True, exist_ok=True)
    (root / "lessons").mkdir(exist_ok=True)
    nbformat.write(toy_notebook(), root / "solutions" / ASSIGNMENT / NOTEBOOK)
    return root
