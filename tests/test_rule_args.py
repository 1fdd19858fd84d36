"""Every exercise rule is read (issue 51, item 6).

The trusted side reads a rule's function and arguments from the test cell's source
(autograder.engine.audit._rules_of, autograder.engine.rule_args). A rule whose arguments were
names (lesson 05 passes ``instead=RULE``) used to be skipped without a word, so lesson 05's rule
was never read. Now names the test cell binds to constants before the call are read, and a rule
the trusted side still cannot read is an authoring error of ``build --check`` (and ``build``),
naming the lesson, the cell and the argument.
"""
import contextlib
import copy
import io
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.cells import grade_id_of, is_test_cell
from autograder.cli import main
from autograder.engine.audit import _rules_of, apply_audit, audit_notebook
from autograder.publishing.build import BuildError, build, check_test_cells, unread_rules

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from toy_course import _test, make_toy_course  # noqa: E402

L05 = "05_inattention"


def lesson_code(nb) -> list:
    return [c.source for c in nb.cells if c.cell_type == "code" and not is_test_cell(c)]


def test_lesson_05s_rules_are_read_and_a_forbidden_use_fails_with_its_hint():
    lesson = nbformat.read(REPO / "lessons" / L05 / f"{L05}.ipynb", as_version=4)
    [test] = [c for c in lesson.cells if is_test_cell(c) and grade_id_of(c) == "test_attention_pairs"]
    rules = _rules_of(test.source)
    assert [(fn, forbid, rule) for fn, forbid, _, rule, _ in rules] == [
        ("pairs_standard", ("mlexp.inattention",), "write_it_yourself"),
        ("pairs_inattention", ("mlexp.inattention",), "write_it_yourself")]
    assert all(instead.startswith("Count the pairs yourself") for _, _, instead, _, _ in rules)

    nb = copy.deepcopy(lesson)
    [answer] = [c for c in nb.cells if grade_id_of(c) == "attention_pairs"]
    answer.source = ("from mlexp.inattention import attention_pairs\n\n\n"
                     "def pairs_standard(T):\n    return attention_pairs(T, 'standard')\n\n\n"
                     "def pairs_inattention(T):\n    return T\n")
    audit = audit_notebook(nb, lesson_code(lesson))
    assert list(audit.forbidden) == ["test_attention_pairs"], audit
    hint = audit.forbidden["test_attention_pairs"]
    assert hint.startswith("Hint: this exercise asks you to write it yourself") and "mlexp.inattention" in hint
    assert "Count the pairs yourself" in hint, hint
    executed = copy.deepcopy(nb)          # the kernel passed the test: the audit's hint decides
    for cell in executed.cells:
        if is_test_cell(cell):
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ok\n")]
    apply_audit(executed, {"review": []}, audit)
    [cell] = [c for c in executed.cells if grade_id_of(c) == "test_attention_pairs"]
    assert cell.outputs[-1].output_type == "error" and cell.outputs[-1].evalue == hint


def test_every_rule_of_the_course_is_read():
    assert unread_rules(REPO) == []
    assert not [p for p in check_test_cells(REPO) if "cannot be read" in p]


RULED = "from mlexp import rules\nrules.write_it_yourself(mul, 2, 3, forbid={forbid}, instead={instead})\n"


@pytest.mark.parametrize("prelude, forbid, instead, expect", [
    ("", "('mlexp.ops',)", "'x'", (("mlexp.ops",), "x")),
    ("F = ('mlexp.ops',)\nI = 'Write it' + ' yourself'\n", "F", "I", (("mlexp.ops",), "Write it yourself")),
    ("T, C = 1024, 8\n", "('mlexp.ops',)", "f'At T = {T} and C = {C}: {2 * T * C ** 2:,} numbers'",
     (("mlexp.ops",), "At T = 1024 and C = 8: 131,072 numbers")),
    ("M = 'mlexp.ops'\nF = (M, 'mlexp.kvcache')\n", "F", "f'{M!r}'", (("mlexp.ops", "mlexp.kvcache"), "'mlexp.ops'")),
])
def test_names_the_cell_binds_to_constants_before_the_call_are_read(prelude, forbid, instead, expect):
    problems = []
    [(fn, got_forbid, got_instead, rule, over)] = _rules_of(prelude + RULED.format(forbid=forbid, instead=instead),
                                                            problems)
    assert (fn, rule, over, problems) == ("mul", "write_it_yourself", "t", [])
    assert (got_forbid, got_instead) == expect


@pytest.mark.parametrize("source, said", [
    (RULED.format(forbid="FORBID", instead="'x'"), "forbid=FORBID: `FORBID` is not bound in the test cell"),
    ("FORBID = ('mlexp.ops',)\nFORBID = ()\n" + RULED.format(forbid="FORBID", instead="'x'"),
     "`FORBID` is not bound once"),
    (RULED.format(forbid="FORBID", instead="'x'") + "FORBID = ('mlexp.ops',)\n",
     "`FORBID` is bound after the statement that reads it"),
    ("for RULE in ['a']:\n    pass\n" + RULED.format(forbid="('mlexp.ops',)", instead="RULE"),
     "instead=RULE: `RULE` is not bound once"),
    ("import mlexp\n" + RULED.format(forbid="(mlexp.ops,)", instead="'x'"), "forbid=(mlexp.ops,)"),
    (RULED.format(forbid="'mlexp.ops'", instead="'x'"), "not a tuple of module names"),
    (RULED.format(forbid="('mlexp.ops',)", instead="hint()"), "instead=hint()"),
    ("from mlexp import rules\nrules.write_it_yourself(mul, 2, 3, **options)\n", "its ** may hold forbid= or instead="),
    ("from mlexp import rules\nrules.no_loop(ns.mul, make, forbid=('mlexp.ops',))\n", "not a plain name"),
    ("from mlexp import rules\nrules.uses_argument(f, (1, 2), (1, 3), forbid=(), instead='x')\n", "which argument"),
    ("from mlexp import rules\nrules.uses_argument(f, (1, 2), (1, 3), name=arg, instead='x')\n", "name=arg"),
])
def test_a_rule_that_cannot_be_read_is_said_never_skipped(source, said):
    problems = []
    assert _rules_of(source, problems) == []
    [problem] = problems
    assert problem.startswith("the rule rules.") and "cannot be read" in problem and said in problem, problem


@pytest.mark.parametrize("source, said", [
    ("from mlexp.rules import write_it_yourself as mine\nmine(mul, 2, forbid=('mlexp.ops',), instead='x')\n",
     "the rule write_it_yourself is imported as mine"),
    ("from mlexp import rules\ncheck = rules.no_loop\ncheck(mul, make)\n", "the rule rules.no_loop is used other"),
    ("import mlexp.rules as R\nfor rule in (R.bounded,):\n    rule(mul, 2, limit=4, bound='b')\n",
     "the rule R.bounded is used other"),
])
def test_a_rule_called_under_another_name_is_said(source, said):
    problems = []
    assert _rules_of(source, problems) == []
    [problem] = problems
    assert problem.startswith(said), problem


def test_the_argument_a_rule_says_is_used_is_read():
    source = ("from mlexp import rules\nC = 'chunk_size'\n"
              "rules.uses_argument(f, (1, 4), (1, 64), name=C, forbid=('mlexp.ops',), instead='Split it')\n")
    assert _rules_of(source) == [("f", ("mlexp.ops",), "Split it", "uses_argument", "chunk_size")]


def test_calls_that_state_no_rule_are_not_problems():
    problems = []
    source = ("import subprocess\nfrom mlexp import rules\nsubprocess.call(['true'])\n"
              "got, trace = rules.call(mul, 2, 3)\nrules.write_it_yourself(mul, 2, 3, forbid=(), instead='x')\n"
              "bounded = all(x <= 1 for x in [0.5])\nassert bounded\n")
    assert _rules_of(source, problems) == [] and problems == []


def test_a_rule_that_cannot_be_read_is_an_error_of_build_check_and_build(tmp_path):
    root = make_toy_course(tmp_path / "course")
    path = root / "solutions" / "toy" / "toy.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(_test("test_mul_rule", 1, "from mlexp import rules\n"
                                              "assert rules.write_it_yourself(mul, 2, 3, forbid=FORBID) == 6\n"))
    nbformat.write(nb, path)
    number = len(nb.cells)
    [problem] = check_test_cells(root)
    assert problem.startswith(f"solutions/toy/toy.ipynb: test cell 'test_mul_rule' (cell {number}): "
                              "the rule rules.write_it_yourself(mul, ...) cannot be read: its forbid=FORBID"), problem
    with pytest.raises(BuildError, match="cannot be read: its forbid=FORBID"):
        build(root)
    assert not (root / "lessons" / "toy").exists(), "nothing is written"

    for command, exit_code in ((["build"], 2), (["build", "--check"], 1)):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = main(["--course", str(root), *command])
        said = out.getvalue()
        assert code == exit_code and "test cell 'test_mul_rule'" in said and "its forbid=FORBID" in said, (command, said)
