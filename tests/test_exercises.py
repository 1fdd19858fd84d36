"""Every graded exercise of lessons 00-05 against right and wrong answers, in seconds, without a kernel.

For each answer the lesson's setup cells and answer cells run in one plain namespace and each test
cell runs as the grader will run it (tests/exercise_runner.py: a namespace of its own, the
student's data copied across, the student's functions behind proxies), and again inside the
student's namespace as the self-check runs it. Both must agree:

- the solution and every documented-correct alternative pass, visible part and hidden part alike;
- each catalogued mistake (autograder/demo/catalog) and each mistake listed here fails with the
  hint that names it, already in the visible part unless marked hidden-only;
- an answer nobody foresaw gets the test's neutral hint, never a diagnosis of another mistake;
- no test cell crashes (every failure is an AssertionError that starts with "Hint:"), and the
  five rules of the grader's trust boundary hold.
"""
from dataclasses import dataclass, field

import pytest

from autograder.demo import load_catalog
from exercise_runner import (blank_answers, names_from_test_cells, run_lesson, solution_answers,
                             solution_notebook, points_per_test, is_test, grade_meta)

LESSONS = ["00_token_mixing", "01_running_sum", "02_fixed_state_recall", "03_gates_and_delta_rule",
           "04_hybrid_kv_cache", "05_inattention"]
CATALOG = load_catalog()
MODES = ("grader", "self")


def sol(lesson: str, grade_id: str, *edits) -> str:
    """The solution's answer cell with each (old, new) text replacement applied (old must occur)."""
    source = solution_answers(lesson)[grade_id]
    for old, new in edits:
        assert old in source, f"{lesson}:{grade_id}: {old!r} is not in the solution"
        source = source.replace(old, new)
    return source


@dataclass
class Case:
    """One answer to one exercise and the verdict its test cell must give.

    hint None: the answer is right (visible and hidden parts pass). Otherwise the full test cell
    fails with a message containing ``hint``; so does the visible part unless ``hidden_only``.
    """
    lesson: str
    test: str
    name: str
    answers: dict = field(default_factory=dict)
    hint: str | None = None
    hidden_only: bool = False

    @property
    def id(self):
        return f"{self.lesson[:2]}-{self.test}-{self.name}"


def check_outcome(outcome, hint, where):
    if hint is None:
        assert outcome.status == "pass", f"{where}: {outcome}"
    else:
        assert outcome.status == "fail", f"{where}: expected a hint with {hint!r}, got {outcome}"
        assert outcome.message.startswith("Hint:"), f"{where}: {outcome}"
        assert hint in outcome.message, f"{where}: expected {hint!r}, got {outcome.message!r}"


CASES = []


# ------------------------------------------------------------------------------ the tests
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_answer_gets_its_verdict(case):
    for mode in MODES:
        run = run_lesson(case.lesson, case.answers, mode=mode, only={case.test})
        assert not run.violations, run.violations
        where = f"{case.id} ({mode})"
        check_outcome(run.outcomes[case.test, "full"], case.hint, where + " full")
        visible_hint = None if case.hidden_only else case.hint
        check_outcome(run.outcomes[case.test, "visible"], visible_hint, where + " visible")


DEMO = [(a, s) for a in LESSONS for s in CATALOG[a]["students"]]


@pytest.mark.parametrize("lesson, student", DEMO, ids=[f"{a[:2]}-{s}" for a, s in DEMO])
def test_catalogued_student_gets_its_score_and_hints(lesson, student):
    spec = CATALOG[lesson]["students"][student]
    answers = {} if spec.get("from_solution") else blank_answers(lesson)
    answers.update(spec.get("answers", {}))
    points = points_per_test(lesson)
    for mode in MODES:
        run = run_lesson(lesson, answers, mode=mode)
        assert not run.violations, run.violations
        score = 0
        for test, pts in points.items():
            hint = spec["expect"]["hints"].get(test)
            check_outcome(run.outcomes[test, "full"], hint, f"{student} {test} ({mode})")
            check_outcome(run.outcomes[test, "visible"], hint, f"{student} {test} visible ({mode})")
            score += pts if run.outcomes[test, "full"].status == "pass" else 0
        assert (score, sum(points.values())) == (spec["expect"]["score"], spec["expect"]["max_score"])


@pytest.mark.parametrize("lesson", LESSONS)
def test_blank_lesson_fails_every_test_with_a_hint(lesson):
    for mode in MODES:
        run = run_lesson(lesson, blank_answers(lesson), mode=mode)
        for (test, part), outcome in run.outcomes.items():
            assert outcome.status == "fail" and outcome.message.startswith("Hint:"), (test, part, mode, outcome)


@pytest.mark.parametrize("lesson", LESSONS)
def test_no_lesson_cell_reads_a_name_only_a_test_cell_defines(lesson):
    """Rule 4: while grading, what a test cell defines never reaches the student's namespace."""
    assert names_from_test_cells(lesson) == []


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_test_cell_imports_the_modules_it_uses(lesson):
    """Rule 1, statically: a module a test cell names is imported in that cell (the solution run
    in grader mode checks the same dynamically, on the paths that run)."""
    import ast
    for cell in solution_notebook(lesson).cells:
        if not is_test(cell):
            continue
        tree = ast.parse(cell.source)
        imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                    if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        modules = {"torch", "F", "math", "nn", "np", "numpy", "hashlib", "mlexp", "kc"}
        missing = (used & modules) - imported
        assert not missing, f"{lesson} {grade_meta(cell)['grade_id']}: uses {sorted(missing)} without importing"
