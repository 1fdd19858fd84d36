"""No cell a student sees and no hint states an exercise's expected value (issue 26, "Done when").

For every lesson the expected values are computed by running the reference solution through its own
graded tests (tests/answer_scan.py: every value the tests receive from the solution, visible and
hidden tests alike), then searched for, in their usual renderings, in

- every cell of the released notebook (lessons/<id>/<id>.ipynb): markdown, setup and experiment
  cells, answer stubs and the visible part of every test cell;
- every hint a test cell can print, hidden part included (each string of the cell that holds
  "Hint", an f-string's fields left out), and every hint piece of solutions/<id>/mistakes.json.

What counts as an expected value, and which numbers are too generic to count, is written once, in
tests/answer_scan.py's docstring.
"""
import ast
import json

import pytest

from answer_scan import computed_in_view, expected_values, leaks
from exercise_runner import REPO, is_test, released_notebook, solution_notebook

LESSONS = ["00_token_mixing", "01_running_sum", "02_fixed_state_recall", "03_gates_and_delta_rule",
           "04_hybrid_kv_cache", "05_inattention", "06_recall_per_byte"]


def _strings(node):
    """The text of a string constant or f-string (its fields as "{}")."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def hint_texts(lesson: str) -> list:
    """(where, text) of every hint the lesson's tests and catalogue hold."""
    out = []
    for i, cell in enumerate(solution_notebook(lesson).cells):
        if not is_test(cell):
            continue
        tree = ast.parse("\n".join(ln for ln in cell.source.splitlines() if not ln.lstrip().startswith(("%", "!"))))
        for node in ast.walk(tree):
            text = _strings(node)
            if text and "Hint" in text:
                out.append((f"hint in test cell [{i}]", text))
    mistakes = REPO / "solutions" / lesson / "mistakes.json"
    if mistakes.exists():
        for key, entry in json.loads(mistakes.read_text()).items():
            out.append((f"mistakes.json {key}", entry.get("hint", "")))
    return out


def visible_texts(lesson: str) -> list:
    """(where, text) of every cell of the released notebook."""
    return [(f"released cell [{i}] ({cell.cell_type})", cell.source)
            for i, cell in enumerate(released_notebook(lesson).cells)]


def find_leaks(lesson: str, texts) -> list:
    found = []
    for test, name, value, own in expected_values(lesson):
        for where, text in texts:
            for shown in leaks(text, value, own):
                found.append(f"{where} shows {shown!r}, the value {test} expects from {name}")
    return sorted(set(found))


@pytest.mark.parametrize("lesson", LESSONS)
def test_no_visible_cell_states_an_expected_value(lesson):
    assert expected_values(lesson), f"{lesson}: no expected value was recorded; the scan would scan nothing"
    found = find_leaks(lesson, visible_texts(lesson))
    assert not found, f"{lesson}:\n" + "\n".join(found)


@pytest.mark.parametrize("lesson", LESSONS)
def test_no_hint_states_an_expected_value(lesson):
    found = find_leaks(lesson, hint_texts(lesson))
    assert not found, f"{lesson}:\n" + "\n".join(found)


def test_the_scan_finds_a_stated_answer():
    """The scan can fail: each of these texts states lesson 03's read-back of the plain sum, or
    lesson 05's count of attention pairs, and is found; the same numbers as parts of others are not."""
    plain = next(v for t, n, v, _ in expected_values("03_gates_and_delta_rule") if n == "read_plain")
    assert leaks("The plain sum returns (2, 4), the sum of both values.", plain)
    assert leaks("print([2.0, 4.0])", plain)
    assert not leaks("a (12, 4) matrix, (2, 48) and 2.4", plain)
    pairs = [(v, own) for t, n, v, own in expected_values("05_inattention") if n == "pairs_standard(...)" and v > 10_000]
    value, own = pairs[0]
    assert leaks(f"standard {value:,} pairs", value, own)
    assert not leaks(f"standard {value}0 pairs, {value}.5 and 1{value}", value, own)


# lesson 03's run takes about 9 s (its chunkwise tests): make test runs it, make test-fast the others
@pytest.mark.parametrize("lesson", [pytest.param(x, marks=pytest.mark.slow) if x.startswith("03") else x
                                    for x in LESSONS])
def test_no_visible_test_computes_an_expected_value(lesson):
    found = [f"the visible part of {test} computes {var} = {value!r}, the value it expects from the student"
             for test, var, value in computed_in_view(lesson)]
    assert not found, f"{lesson}:\n" + "\n".join(found)
