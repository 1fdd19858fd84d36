"""Partial credit (nbgrader's: a test cell ends in a number) scored on the trusted side only.

The fast tests check autograder.engine.partial's data-flow rule and `build --check`; the slow one
grades a toy lesson with four such tests: one that scores 1 of 2 for a half-right answer, one
whose score is over its points (capped), one that ends in a call of the student's function
(refused: a student returning the cell's points must not get them), and one that ends in a
comparison without `assert` (False scores 0, where nbgrader would give full marks).
"""
import ast

import nbformat
import pytest

from autograder.publishing.build import build, check_test_cells
from autograder.cli import main
from autograder.publishing.demo import student_notebook
from autograder.grading.grade import grade_class
from autograder.options import GradingOptions
from autograder.engine.partial import credit, last_expression_problems, student_derived
from toy_course import ADD_SOLUTION, ASSIGNMENT, MEAN_SOLUTION, MUL_SOLUTION, NOTEBOOK, \
    _solution, _test, make_toy_course

TWO_CHECKS = ("score = 0\n"
              "if half(4) == 2:\n    score += 1\n"
              "if half(3) == 1.5:\n    score += 1\n"
              "print('half: checked 2 cases')\n"
              "score")
OVER = "score = 0\nif half(2) == 1:\n    score += 5\nscore"
FORGEABLE = "half(4)"          # the student's own number: must never be the score


def _derived(src):
    return student_derived(ast.parse(src))


@pytest.mark.parametrize("src", [
    "half(4)",
    "x = half(4)\ny = x * 1\nmin(y, 2)",
    "s = []\ns.append(half(1))\nsum(s)",
    "for v in half([1, 2]):\n    t = v\nt",
    "def h(v):\n    global s\n    s = v\nh(half(1))\ns",
    "def g():\n    return half(1)\ng()",
    "try:\n    half(None)\nexcept Exception as e:\n    z = float(str(e))\nz",
    "globals()['q'] = half(1)\nq",
    "q = globals().get('half')(1)\nq",
    "assert 'half' in globals()\nvars()['half'](2)",
    "exec('s = half(1)')\ns",
    # the number of turns of a loop, decided by the student: the loop body's names count it
    "score = 0\nfor _ in half([1, 2]):\n    score += 1\nscore",
    "score = 0\nfor i in range(len(half([1]))):\n    score += 0.5\nscore",
    "score = 0\ni = 0\nwhile half(i) < 10:\n    i += 1\n    score += 1\nmin(score, 2)",
    "n = 0\nfor x in half([1]):\n    if x == 1:\n        n = n + 1\nelse:\n    done = n\ndone",
])
def test_a_score_carrying_a_student_value_is_refused(src):
    assert last_expression_problems(src), src
    last = ast.parse(src).body[-1].value
    points, _, refused = credit(2.0, 2, last, _derived(src))
    assert points is None and refused


EXISTS = "assert \"half\" in globals(), \"define half first\"\n"   # as the course's cells begin


@pytest.mark.parametrize("src", [TWO_CHECKS, OVER, "ok = [half(2) == 1, not half(3)]\nsum(ok)",
                                 "print(half(2))", "assert half(2) == 1", EXISTS + TWO_CHECKS,
                                 "if 'half' not in locals():\n    raise NameError('half')\n" + OVER,
                                 # the test's own loop over its own cases: the count is the test's
                                 "score = 0\nfor x in (2, 4):\n    if half(x) == x / 2:\n        score += 1\nscore",
                                 "score = 0\nfor x in (2, 4):\n    if half(x) != x / 2:\n        break\n"
                                 "    score += 1\nscore"])
def test_a_score_made_by_the_tests_own_checks_is_allowed(src):
    assert last_expression_problems(src) == []
    last = ast.parse(src).body[-1]
    if isinstance(last, ast.Expr) and "score" in src:
        assert credit(1.0, 2, last.value, _derived(src))[0] == 1.0


def test_a_refusal_names_the_reflective_call_not_the_score():
    problems = last_expression_problems("exec('x = 1')\n" + TWO_CHECKS)
    assert len(problems) == 1 and "`exec` (line 1)" in problems[0]
    assert "`score`" not in problems[0] and '"add" in globals()' in problems[0]


def test_credit_caps_clamps_and_ignores_non_numbers():
    expr = ast.parse("score").body[0].value
    assert credit(1, 2, expr, set())[0] == 1.0
    points, note, _ = credit(5, 2, expr, set())
    assert points == 2.0 and "capped" in note
    assert credit(-1, 2, expr, set())[0] == 0.0
    assert credit(float("nan"), 2, expr, set())[0] == 0.0
    assert credit(True, 2, expr, set())[0] == 2.0   # nbgrader: full marks for False as well
    assert credit(False, 2, expr, set())[0] == 0.0
    for value in ("1", None, [1]):   # not a score: the test scores by its errors
        assert credit(value, 2, expr, set()) == (None, "", [])
    assert last_expression_problems("half(4);") == []   # `;`: IPython shows no value


def _partial_course(root):
    """The toy lesson plus `half` and four tests ending in an expression (2, 1, 2, 1 points)."""
    make_toy_course(root)
    path = root / "solutions" / ASSIGNMENT / NOTEBOOK
    nb = nbformat.read(path, as_version=4)
    nb.cells[-1:-1] = [
        _solution("half", "def half(x):\n    ### BEGIN SOLUTION\n    return x / 2\n"
                          "    ### END SOLUTION"),
        _test("test_half_partial", 2, TWO_CHECKS),
        _test("test_half_over", 1, OVER),
        _test("test_half_forgeable", 2, FORGEABLE),
        _test("test_half_bool", 1, "half(6) == 3")]   # no assert: False must not score
    nbformat.write(nb, path)
    return root


def test_build_check_refuses_a_forgeable_score(tmp_path, capsys):
    root = _partial_course(tmp_path)
    problems = check_test_cells(root)
    assert len(problems) == 1 and "'test_half_forgeable'" in problems[0], problems
    assert "`half`" in problems[0] and "partial-credit" in problems[0]
    build(root)
    assert main(["--course", str(root), "build", "--check"]) == 1
    assert "test_half_forgeable" in capsys.readouterr().out


@pytest.mark.slow
def test_partial_credit_is_scored_capped_and_never_forged(tmp_path):
    root = _partial_course(tmp_path / "course")
    build(root)
    lesson = nbformat.read(root / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    base = {"add": ADD_SOLUTION, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION}
    answers = {"floor": "def half(x):\n    return x // 2",          # half(3) == 1: 1 of 2
               "forger": "def half(x):\n    return 2.0"}            # returns the points
    for student, half in answers.items():
        dest = tmp_path / "class" / student / ASSIGNMENT / NOTEBOOK
        dest.parent.mkdir(parents=True)
        nbformat.write(student_notebook(lesson, {**base, "half": half}), dest)
    results = {r.student: r for r in grade_class(root, tmp_path / "class", tmp_path / "out",
                                                 GradingOptions(cell_timeout=30), progress=False)}
    floor, forger = results["floor"], results["forger"]
    assert floor.exercises["test_half_partial"] == 1.0, floor
    assert floor.exercises["test_half_over"] == 1.0          # 5 capped at the cell's 1 point
    assert forger.exercises["test_half_partial"] == 1.0      # half(4) == 2 holds, half(3) not
    assert forger.exercises["test_half_over"] == 0.0
    for r in (floor, forger):
        assert r.exercises["test_half_forgeable"] == 0.0, r  # never the student's 2.0
        assert r.status.startswith("needs manual review"), r.status
        assert "test_half_forgeable" in r.status and "`half`" in r.status
    assert floor.exercises["test_half_bool"] == 1.0 and forger.exercises["test_half_bool"] == 0.0
    assert floor.score == 6 + 1 + 1 + 0 + 1
    page = (tmp_path / "out" / "feedback" / "floor" / ASSIGNMENT / "toy.html").read_text()
    assert "Partial credit: this test gave 1 of 2 points" in page


def test_a_partial_test_shows_the_hints_it_printed():
    """A test that gives partial credit cannot raise (an error scores 0): it prints the hint of
    each part that failed. That is its hint for the class report (hint_shown), the feedback page
    (after the points it gave) and the self-check's FAIL line; a full score shows none."""
    from nbformat.v4 import new_code_cell, new_output

    from autograder.engine.feedback import ExerciseFeedback
    from autograder.mistakes import hint_shown
    from mlexp.check import printed_hints, result_of

    def cell(score, text):
        c = new_code_cell("score", metadata={"nbgrader": {"grade": True, "solution": False,
                                                          "grade_id": "t", "points": 3}})
        c.outputs = [new_output("stream", name="stdout", text=text),
                     new_output("execute_result", data={"text/plain": str(score)}, execution_count=None)]
        return c

    part = cell(1, "Hint: the pair was written as v k^T.\nnot a hint\n  Hint: read is off.\n")
    assert printed_hints(part) == hint_shown(part) == "Hint: the pair was written as v k^T. Hint: read is off."
    result = result_of(part)
    assert not result.passed and result.score == 1
    assert result.message.startswith("partial credit: 1 of 3 points. Hint: the pair was written as v k^T.")
    nb = nbformat.v4.new_notebook(cells=[part])
    part.metadata.nbgrader["score"] = 1
    ExerciseFeedback().preprocess(nb, {})
    assert part.metadata.autograder["hint"] == ("Partial credit: this test gave 1 of 3 points; "
                                                "Hint: the pair was written as v k^T. Hint: read is off.")
    full = cell(3, "write and read: visible tests passed.\n")
    assert hint_shown(full) == "" and result_of(full).passed
