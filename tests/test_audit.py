"""The exercise rules read from the student's source on the trusted side (autograder.engine.audit).

Issue 39: the rules' watcher (mlexp.rules) runs in the student's kernel, where the student's code
can change its report. autograder.engine.audit reads the submitted cells in the grader's process instead.
These tests hold it to the attacks of the issue (built in tests/corpus/build_corpus.py, which the
grader corpus also grades end to end) and to every answer the course already has: no solution,
demo student or lesson cell is flagged, and the demo students that call the library op are the
ones it names. Issue 51: what the reading cannot follow (exec, inspect, magics, a library's
flags) is seen but never holds a notebook; only the library's code run as the student's and the
grader's own machinery do, and a loop fails a "no loop" rule only when it certainly runs over the
sequence (tests/test_honest_class.py grades an honest class end to end).
"""
import copy
import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from autograder.engine.audit import apply_audit, audit_notebook, lesson_key
from autograder.engine.copies import copied_library_code
from autograder.cells import grade_id_of, is_test_cell

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "corpus"))
import build_corpus as corpus  # noqa: E402

L01 = corpus.L01


def lesson_code(nb) -> list:
    return [c.source for c in nb.cells if c.cell_type == "code" and not is_test_cell(c)]


@pytest.fixture(scope="module")
def l01():
    lesson = nbformat.read(REPO / "lessons" / L01 / f"{L01}.ipynb", as_version=4)
    solution = nbformat.read(REPO / "solutions" / L01 / f"{L01}.ipynb", as_version=4)
    return lesson, solution, corpus._answer(lesson, corpus.solved_answers(solution))


def with_answer(nb, source, grade_id="recurrent_form"):
    nb = copy.deepcopy(nb)
    nb.cells[corpus._index(nb, grade_id)].source += "\n\n" + source
    return nb


def test_the_issues_attacks_are_caught_by_reading(l01):
    lesson, solution, good = l01
    cases = corpus.lesson01_rule_cases(lesson, solution, REPO)
    found = {s: audit_notebook(f[f"{L01}/{L01}.ipynb"], lesson_code(lesson)) for s, f in cases.items()}
    # the watcher swapped for one whose report hides the call: the call is read in the source
    swap = found["l01_swaps_trace"]
    assert list(swap.forbidden) == ["test_recurrent_form"]
    assert "mlexp.ops.linear_attention" in swap.forbidden["test_recurrent_form"]
    assert swap.forbidden["test_recurrent_form"].startswith("Hint: this exercise asks you to write it yourself")
    assert any("replaces mlexp.rules.Trace" in what for _, what in swap.dynamic)
    assert any("replaces mlexp.rules.Trace, a name of the grader's rule watch" in what for _, what in swap.machinery)
    # the library's source read with inspect and run through exec under another file name
    execs = found["l01_execs_library_source"]
    said = " ".join(what for _, what in execs.dynamic)
    assert "inspect" in said and "exec" in said and "compile" in said
    assert [(what, test) for _, what, test in execs.copies] == [
        ("the code of mlexp.ops.linear._recurrent, read with inspect.getsource", "test_recurrent_form")]
    # the library's function pasted under other names, no comment or docstring: held, named as
    # such, with the exercise whose function is made of it
    paste = found["l01_pastes_library"]
    assert [(what, test) for _, what, test in paste.copies] == [
        ("_scan is the code of mlexp.ops.linear._recurrent", "test_recurrent_form")]
    assert not paste.forbidden and not paste.dynamic
    assert "'test_recurrent_form'" in paste.review() and "_scan is the code of" in paste.review()
    # the report scrubbed on its way out while the swapped watcher runs, both put back at the end
    scrub = found["l01_rewrites_the_report"]
    assert list(scrub.forbidden) == ["test_recurrent_form"]
    assert any("IPython's shell" in what for _, what in scrub.dynamic)
    assert any("ip.display_pub.publish" in what for _, what in scrub.machinery)
    for student, audit in found.items():
        assert audit.reasons() or audit.forbidden, f"{student}: each attack fails its rule or is held"
    assert all(found[s].reasons() for s in ("l01_swaps_trace", "l01_execs_library_source",
                                            "l01_pastes_library", "l01_rewrites_the_report"))


@pytest.mark.parametrize("answer, reached", [
    ("from mlexp import ops as O\ndef recurrent_linear_attention(q, k, v, normalize=True):\n"
     "    return O.linear_attention(q, k, v, normalize=normalize)[0]", "mlexp.ops.linear_attention"),
    ("import mlexp.ops\ndef recurrent_linear_attention(q, k, v, normalize=True):\n"
     "    return getattr(mlexp.ops, 'linear_attention')(q, k, v, normalize=normalize)[0]",
     "mlexp.ops.linear_attention"),
    ("from mlexp.mixers import linear_attention as la\ndef _inner(q, k, v, n):\n    return la(q, k, v, normalize=n)[0]\n"
     "def recurrent_linear_attention(q, k, v, normalize=True):\n    return _inner(q, k, v, normalize)",
     "mlexp.mixers.linear_attention"),
    ("from mlexp.ops.linear import _recurrent as recurrent_linear_attention", "mlexp.ops.linear._recurrent"),
    ("import mlexp\nmine = mlexp.ops.linear_attention\ndef recurrent_linear_attention(q, k, v, normalize=True):\n"
     "    return mine(q, k, v, normalize=normalize)[0]", "mlexp.ops.linear_attention"),
])
def test_a_forbidden_module_reached_by_any_name_fails_the_rule(l01, answer, reached):
    """Aliases, constant getattr, a helper in between, a re-export (mlexp.mixers imports it from
    mlexp.ops: read from its source), an import under the answer's name."""
    lesson, _, good = l01
    audit = audit_notebook(with_answer(good, answer), lesson_code(lesson))
    assert list(audit.forbidden) == ["test_recurrent_form"]
    assert reached in audit.forbidden["test_recurrent_form"]


@pytest.mark.parametrize("code, said", [
    ("import importlib\nops = importlib.import_module('mlexp.' + 'ops')", "importlib"),
    ("import mlexp.rules\nsetattr(mlexp.rules, 'Trace', object)", "setattr"),
    ("name = 'linear' + '_attention'\nimport mlexp.ops\nf = getattr(mlexp.ops, name)", "computed name"),
    ("import sys\nsys.modules['mlexp.rules'] = None", "sys.modules"),
    ("def f():\n    pass\nf.__code__ = (lambda: 1).__code__", "__code__"),
    ("import mlexp.rules\nT = mlexp.rules.Trace\nT.to_dict = lambda self: {}", "replaces mlexp.rules.Trace.to_dict"),
    ("eval('1 + 1')", "eval"),
    ("get_ipython().run_line_magic('load', 'x.py')", "%load"),
    ("!cp /tmp/x .", "shell command"),
    ("import mymodule_written_by_the_notebook", "does not install"),
    # issue 39, item 3: what passes the tamper report on its way out
    ("ip = get_ipython()\nreal = ip.display_pub.publish\nip.display_pub.publish = lambda *a, **k: real(*a, **k)",
     "IPython's shell"),
    ("from IPython import get_ipython as g\ng().kernel.session.send = print", "imports IPython"),
    ("import ipykernel.kernelbase", "imports ipykernel"),
    ("def recurrent_linear_attention(q, k, v, normalize=True):\n"
     "    return globals()['linear' + '_attention'](q, k, v, normalize=normalize)[0]", "by string (globals())"),
    ("from mlexp.ops import *", "imports every name of mlexp.ops"),
])
def test_code_the_grader_cannot_read_is_seen_and_held_only_for_the_graders_machinery(l01, code, said):
    """Seen (Audit.dynamic); held only where it names the grader's own machinery: the rules'
    watch, the kernel's messaging, IPython's display publisher or message session (issue 51)."""
    lesson, _, good = l01
    audit = audit_notebook(with_answer(good, code, "parallel_form"), lesson_code(lesson))
    assert any(said in what for _, what in audit.dynamic), audit.dynamic
    machinery = any(m in code for m in ("mlexp.rules", "display_pub", "kernel.session", "ipykernel"))
    assert bool(audit.review()) == machinery, (code, audit.review())
    if machinery:
        assert "the grader's own machinery" in audit.review() and "In [" in audit.review()


def test_dynamic_code_in_a_lesson_without_rules_is_not_flagged():
    """Lesson 02 states no rule: what its cells do is for its tests to judge."""
    lesson = nbformat.read(REPO / "lessons" / "02_fixed_state_recall" / "02_fixed_state_recall.ipynb",
                           as_version=4)
    nb = copy.deepcopy(lesson)
    nb.cells.insert(3, new_code_cell("exec('x = 1')"))
    assert audit_notebook(nb, lesson_code(lesson)).reasons() == []


def test_lesson_cells_count_as_the_lessons_even_from_another_edition(l01):
    """The setup cell of a student edition built with ``build --repo`` differs in a string only."""
    lesson, _, good = l01
    nb = copy.deepcopy(good)
    setup = next(c for c in nb.cells if 'COURSE_REPO = "' in c.source)
    setup.source = setup.source.replace('COURSE_REPO = "OWNER/REPO"', 'COURSE_REPO = "school/course-2027"')
    assert 'school/course-2027' in setup.source
    assert lesson_key(setup.source) in {lesson_key(s) for s in lesson_code(lesson)}
    assert audit_notebook(nb, lesson_code(lesson)).reasons() == []
    assert audit_notebook(nb, ()).dynamic, "read as the student's, the setup cell's importlib is seen"
    assert audit_notebook(nb, ()).reasons() == [], "and never held: it is what the course wrote"


@pytest.mark.slow     # reads every solution and demo notebook (about 15 s)
def test_no_answer_of_the_course_is_flagged():
    """Every solution notebook and every demo student: nothing dynamic, nothing copied; a rule
    broken only where the demo catalogue expects the rule's hint on that test."""
    releases = {p.name: lesson_code(nbformat.read(p, as_version=4)) for p in REPO.glob("lessons/*/*.ipynb")}
    expects = {}
    for path in (REPO / "autograder" / "demo" / "catalog").glob("*.json"):
        for student, entry in json.loads(path.read_text())["students"].items():
            expects[student] = entry.get("expect", {}).get("hints", {})
    checked = 0
    for path in sorted(REPO.glob("solutions/*/*.ipynb")) + \
            sorted((REPO / "autograder" / "demo" / "submissions").glob("*/*/*.ipynb")):
        audit = audit_notebook(nbformat.read(path, as_version=4), releases[path.name])
        assert not audit.dynamic and not audit.copies, (path, audit)
        student = path.parent.parent.name if "submissions" in path.parts else None
        for grade_id in audit.forbidden:
            assert student and "library" in expects[student].get(grade_id, ""), (path, audit.forbidden)
        for grade_id in audit.loops:      # only students whose test fails on its loop anyway
            assert student and "loop" in expects[student].get(grade_id, ""), (path, audit.loops)
        checked += 1
    assert checked > 100


SPLIT_PASTE = """def _part_one(q, k, v, S0):
    A = (q @ k.transpose(-1, -2)).tril_()
    o = A @ v + q @ S0
    S = S0 + k.transpose(-1, -2) @ v
    return A, o, S


def _part_two(q, k, v, S0, z0, eps):
    A, o, S = _part_one(q, k, v, S0)
    z = None
    if z0 is not None:
        den = A.sum(-1) + (q @ z0[..., None])[..., 0]
        o = o / (den[..., None] + eps)
        z = z0 + k.sum(2)
    return o, S, z


def parallel_linear_attention(q, k, v, normalize=True):
    S0 = q.new_zeros(q.shape[:2] + (q.shape[-1], v.shape[-1]))
    z0 = q.new_zeros(q.shape[:2] + q.shape[-1:]) if normalize else None
    return _part_two(q, k, v, S0, z0, 1e-6)[0]
"""


def test_a_paste_split_into_helpers_is_found_as_one(l01):
    """mlexp.ops.linear._parallel's statements in two helpers (each under COPY_SHARE of it alone) that
    the ruled function reads: found as the code of _parallel, for the exercise whose function reads
    them, in either order of definition; the honest answer with helpers of its own is not."""
    lesson, _solution, good = l01
    one, two, caller = SPLIT_PASTE.split("\n\n\n")
    for source in (SPLIT_PASTE, "\n\n\n".join((two, one, caller))):
        nb = copy.deepcopy(good)
        nb.cells[corpus._index(nb, "parallel_form")].source = source
        audit = audit_notebook(nb, lesson_code(lesson))
        assert [(what, test) for _, what, test in audit.copies] == [
            ("parallel_linear_attention and the functions it reads are the code of mlexp.ops.linear._parallel",
             "test_parallel_form")], audit.copies
    assert audit_notebook(good, lesson_code(lesson)).copies == []


def test_copies_are_found_in_code_given_to_exec_as_text():
    paste = corpus.pasted_library_function(REPO / "mlexp" / "ops" / "gated.py", "_chunk", "mine")
    import ast
    tree = ast.parse(f"exec({paste!r})")
    assert copied_library_code(tree) == ["mine is the code of mlexp.ops.gated._chunk"]


def test_the_audit_outranks_the_kernel(l01):
    """A ruled test that passed in the kernel fails with the audit's hint; one that failed keeps
    its error; the reasons go to the report's review."""
    lesson, solution, good = l01
    nb = corpus.lesson01_rule_cases(lesson, solution, REPO)["l01_swaps_trace"][f"{L01}/{L01}.ipynb"]
    audit = audit_notebook(nb, lesson_code(lesson))
    executed = copy.deepcopy(nb)
    for cell in executed.cells:
        if is_test_cell(cell):
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ok\n")]
    report = {"review": []}
    apply_audit(executed, report, audit)
    by_id = {grade_id_of(c): c for c in executed.cells if is_test_cell(c)}
    failed = [g for g, c in by_id.items() if any(o.output_type == "error" for o in c.outputs)]
    assert failed == ["test_recurrent_form"]
    assert by_id["test_recurrent_form"].outputs[-1].evalue == audit.forbidden["test_recurrent_form"]
    assert report["review"] == audit.reasons() and report["review"]
    assert "replaces mlexp.rules.Trace" in report["review"][0] and "In [" in report["review"][0]
    apply_audit(None, report, audit)      # nothing came back: the reasons still stand, once
    assert report["review"] == audit.reasons()


def test_magics_and_displays_a_lesson_uses_are_not_flagged(l01):
    lesson, _, good = l01
    code = ("%matplotlib inline\nfrom IPython.display import display, Markdown\n"
            "if 'x' not in globals():\n    x = 1\n"
            "%time x = sum(range(10))\ndisplay(Markdown('**done**'))")
    assert audit_notebook(with_answer(good, code, "parallel_form"), lesson_code(lesson)).reasons() == []


# A red-team pass (a helper playing dishonest students, 60 answers): each of these got the
# library's result past the reading before it followed bindings in notebook order.
D = "def recurrent_linear_attention(q, k, v, normalize=True):\n"
CALL = "    return la(q, k, v, normalize=normalize)[0]\n"
HIDDEN_BINDINGS = {
    "def in an if": "if True:\n    " + D.replace("\n", "\n    ") + "    return linear_attention(q, k, v, normalize=normalize)[0]\n",
    "def in a try": "try:\n    " + D.replace("\n", "\n    ") + "    return linear_attention(q, k, v, normalize=normalize)[0]\n"
                    "except Exception:\n    pass\n",
    "list append": "tools = []\ntools.append(linear_attention)\n" + D + "    return tools[0](q, k, v, normalize=normalize)[0]\n",
    "dict update": "cfg = {}\ncfg.update(la=linear_attention)\n" + D + "    return cfg['la'](q, k, v, normalize=normalize)[0]\n",
    "setattr on a class": "class Box:\n    pass\nsetattr(Box, 'la', staticmethod(linear_attention))\n" + D
                          + "    return Box.la(q, k, v, normalize=normalize)[0]\n",
    "for target": "for la in (linear_attention,):\n    pass\n" + D + CALL,
    "with target": "import contextlib\nwith contextlib.nullcontext(linear_attention) as la:\n    pass\n" + D + CALL,
    "walrus": "(la := linear_attention)\n" + D + CALL,
    "except as": "try:\n    raise LookupError(linear_attention)\nexcept LookupError as e:\n    la = e.args[0]\n" + D + CALL,
    "match capture": "match linear_attention:\n    case la:\n        pass\n" + D + CALL,
    "global in a function": "def _setup():\n    global la\n    la = linear_attention\n_setup()\n" + D + CALL,
    "through a list": "import mlexp\n" + D + "    return [mlexp][0].ops.linear_attention(q, k, v, normalize=normalize)[0]\n",
    "through an or": "import mlexp\n" + D + "    return (None or mlexp).ops.linear_attention(q, k, v, normalize=normalize)[0]\n",
    "shadowed by a later local import": D + "    return linear_attention(q, k, v, normalize=normalize)[0]\n"
                                        "def _unused():\n    from math import sqrt as linear_attention\n",
}


@pytest.mark.parametrize("answer", list(HIDDEN_BINDINGS.values()), ids=list(HIDDEN_BINDINGS))
def test_every_binding_of_a_name_before_the_test_is_followed(l01, answer):
    lesson, _, good = l01
    audit = audit_notebook(with_answer(good, answer), lesson_code(lesson))
    assert "test_recurrent_form" in audit.forbidden, audit


def test_a_name_rebound_after_the_test_does_not_hide_what_it_held(l01):
    lesson, _, good = l01
    nb = with_answer(good, "from mlexp.ops import linear_attention as la\n" + D + CALL)
    nb = with_answer(nb, "import math as la", "parallel_form")        # a cell after the test
    assert "test_recurrent_form" in audit_notebook(nb, lesson_code(lesson)).forbidden


HONEST = {   # honest notebooks the first reading failed or flagged
    "a scratch comparison that binds the solution's local names": (
        "o, S = linear_attention(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))\n"
        "print(o.shape, S.shape)"),
    "the student's own function named like the library's": (
        "def linear_attention(q, k, v, normalize=True):\n    return parallel_linear_attention(q, k, v, normalize)\n"
        "print(linear_attention(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2)).shape)"),
    "a module imported as a scratch name that a function uses as a local": (
        "from mlexp import ops\nprint(ops.linear_attention)\n"
        "def count_ops(T):\n    ops = 0\n    for t in range(T):\n        ops += 1\n    return ops"),
    "display, magics and shell commands a lesson reader uses": (
        "from IPython import display\ndisplay.clear_output()\n%config InlineBackend.figure_format = 'retina'\n"
        "%load_ext autoreload\n%autoreload 2\n!nvidia-smi\n%pip install tqdm\nlinear_attention?\n"
        "import gc\ngc.collect()\nprint(S.__class__.__name__ if 'S' in globals() else None)\n"
        "class Cfg:\n    lr = 1e-3\nprint(vars(Cfg()))"),
}


@pytest.mark.parametrize("code", list(HONEST.values()), ids=list(HONEST))
def test_honest_code_is_neither_failed_nor_flagged(l01, code):
    lesson, _, good = l01
    audit = audit_notebook(with_answer(good, code, "parallel_form"), lesson_code(lesson))
    assert not audit.forbidden and audit.reasons() == [], audit
    audit = audit_notebook(with_answer(good, code), lesson_code(lesson))       # before the first test too
    assert not audit.forbidden and audit.reasons() == [], audit


@pytest.mark.parametrize("code, said", [
    ("def f():\n    return importlib.import_module('mlexp.ops')", "uses importlib.import_module"),
    ("def f():\n    return getattr(sys, 'modules')['mlexp.ops']", "uses sys.modules"),
    ("import pkgutil\nf = pkgutil.resolve_name('mlexp.ops:linear_attention')", "pkgutil"),
    ("import operator, mlexp\nf = operator.attrgetter('ops.linear_attention')(mlexp)", "operator.attrgetter"),
    ("import functools, mlexp\nf = functools.reduce(getattr, ['ops', 'linear_attention'], mlexp)", "getattr around"),
    ("import mlexp\nf = mlexp.__getattr__('ops')", "__getattr__"),
    ("run = exec", "exec around"),
    ("f = [eval][0]('linear_attention')", "eval around"),
    ("def f(q, k, v):\n    box = []\n    import timeit\n    timeit.Timer('box.append(1)', globals=locals()).timeit(1)\n"
     "    return box", "as text (Timer)"),
    ("import cProfile\ncProfile.run('x = 1')", "cProfile"),
    ("def f():\n    return subprocess.run(['python', '-c', 'print(1)'])", "subprocess"),
    ("import mlexp.rules\nbox = [mlexp.rules]\nbox[0].Trace = object", "replaces Trace on an object"),
])
def test_more_ways_to_run_code_the_grader_cannot_read_are_flagged(l01, code, said):
    lesson, _, good = l01
    audit = audit_notebook(with_answer(good, code, "parallel_form"), lesson_code(lesson))
    assert any(said in what for _, what in audit.dynamic), audit.dynamic


@pytest.mark.parametrize("edit", ["pass", "if True", "an extra statement"])
def test_a_padded_paste_is_still_the_librarys_code(edit):
    """One `pass`, a wrapping block or one extra line made an exact match miss a paste (red team)."""
    import ast
    paste = corpus.pasted_library_function(REPO / "mlexp" / "ops" / "linear.py", "_recurrent", "_scan")
    head, body = paste.split("\n", 1)
    if edit == "pass":
        body = "    pass\n" + body
    elif edit == "if True":
        body = "    if True:\n" + "\n".join("    " + line for line in body.splitlines())
    else:
        body = "    scale = 1.0\n" + body
    assert copied_library_code(ast.parse(head + "\n" + body)) == ["_scan is the code of mlexp.ops.linear._recurrent"]


LOOPED = {
    "for over the tokens": "def parallel_linear_attention(q, k, v, normalize=True):\n"
        "    out = []\n    for t in range(q.shape[2]):\n"
        "        A = q[:, :, t:t + 1] @ k[:, :, :t + 1].transpose(-1, -2)\n"
        "        o = A @ v[:, :, :t + 1]\n        out.append(o / A.sum(-1, keepdim=True) if normalize else o)\n"
        "    return torch.cat(out, 2)",
    "a comprehension over T from an unpacking": "def step(q, k, v, t):\n"
        "    A = q[:, :, t:t + 1] @ k[:, :, :t + 1].transpose(-1, -2)\n"
        "    return A @ v[:, :, :t + 1] / A.sum(-1, keepdim=True)\n"
        "def parallel_linear_attention(q, k, v, normalize=True):\n    B, H, T, D = q.shape\n"
        "    return torch.cat([step(q, k, v, t) for t in range(T)], 2)",
    "a while to the length": "def parallel_linear_attention(q, k, v, normalize=True):\n    n = q.size(-2)\n"
        "    t, out = 0, []\n    while t < n:\n        out.append(v[:, :, t])\n        t += 1\n"
        "    return torch.stack(out, 2)",
    "tokens unbound": "def parallel_linear_attention(q, k, v, normalize=True):\n"
        "    return torch.stack([x * 2 for x in v.unbind(dim=2)], 2)",
    "chunks derived from T": "def parallel_linear_attention(q, k, v, normalize=True):\n    T = q.shape[-2]\n"
        "    n = (T + 3) // 4\n    for c in range(n):\n        pass\n    return v",
    "functools.reduce over the tokens": "import functools\ndef parallel_linear_attention(q, k, v, normalize=True):\n"
        "    return functools.reduce(lambda acc, t: acc, range(q.shape[2]), q)",
    "chunks split along the tokens": "def parallel_linear_attention(q, k, v, normalize=True):\n"
        "    return torch.cat([c * 1 for c in v.split(4, dim=-2)], 2)",
}


@pytest.mark.parametrize("code", list(LOOPED.values()), ids=list(LOOPED))
def test_a_loop_certain_to_run_over_the_sequence_fails_the_no_loop_rule(l01, code):
    """A loop whose range is the sequence's length (or computed from it) in the function a "no
    loop over t" rule names: that test fails with the rule's hint, whatever the kernel said; a
    test that already failed keeps its own error; nothing is held for review."""
    lesson, _, good = l01
    nb = with_answer(good, code, "parallel_form")
    audit = audit_notebook(nb, lesson_code(lesson))
    assert list(audit.loops) == ["test_parallel_form"], audit
    hint = audit.loops["test_parallel_form"]
    assert hint.startswith("Hint: this exercise asks you to write it yourself without a Python loop over t: "
                           "parallel_linear_attention loops over the sequence"), hint
    assert "your In [" in hint and "line " in hint
    assert audit.reasons() == []
    for failed in (False, True):
        executed = copy.deepcopy(nb)
        for cell in executed.cells:
            if is_test_cell(cell):
                cell.outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="Hint: x", traceback=[])
                                if failed else nbformat.v4.new_output("stream", name="stdout", text="ok\n")]
        report = {"review": []}
        apply_audit(executed, report, audit)
        assert report["review"] == []
        test = next(c for c in executed.cells if grade_id_of(c) == "test_parallel_form")
        assert test.outputs[-1].evalue == ("Hint: x" if failed else hint)


@pytest.mark.parametrize("code", [
    "def parallel_linear_attention(q, k, v, normalize=True):\n    q, k = (x.double() for x in (q, k))\n"
    "    A = (q @ k.transpose(-1, -2)).tril().to(v.dtype)\n    o = A @ v\n"
    "    return o / A.sum(-1, keepdim=True) if normalize else o",
    "def parallel_linear_attention(q, k, v, normalize=True):\n    for _ in range(1):\n"
    "        A = (q @ k.transpose(-1, -2)).tril()\n    return A @ v / A.sum(-1, keepdim=True) if normalize else A @ v",
    "def parallel_linear_attention(q, k, v, normalize=True):\n    for i, x in enumerate([q, k]):\n        pass\n"
    "    A = (q @ k.transpose(-1, -2)).tril()\n    return A @ v / A.sum(-1, keepdim=True) if normalize else A @ v",
    "def parallel_linear_attention(q, k, v, normalize=True):\n    B, H, T, D = q.shape\n    outs = []\n"
    "    for h in range(H):\n        A = (q[:, h] @ k[:, h].transpose(-1, -2)).tril()\n"
    "        outs.append(A @ v[:, h] / A.sum(-1, keepdim=True) if normalize else A @ v[:, h])\n"
    "    return torch.stack(outs, 1)",
    "def one(q, k, v):\n    A = (q @ k.transpose(-1, -2)).tril()\n    return A @ v / A.sum(-1, keepdim=True)\n"
    "def parallel_linear_attention(q, k, v, normalize=True):\n"
    "    return torch.stack([one(q[b], k[b], v[b]) for b in range(q.shape[0])])",
    "SEEN = []\ndef parallel_linear_attention(q, k, v, normalize=True):\n    SEEN.append(q.shape)\n"
    "    A = (q @ k.transpose(-1, -2)).tril()\n    return A @ v / A.sum(-1, keepdim=True) if normalize else A @ v",
    "def parallel_linear_attention(q, k, v, normalize=True):\n    for d in range(q.shape[-1]):\n        pass\n"
    "    A = (q @ k.transpose(-1, -2)).tril()\n    return A @ v / A.sum(-1, keepdim=True) if normalize else A @ v",
    "def parallel_linear_attention(q, k, v, normalize=True):\n    def one(q, k, v):\n"
    "        for d in range(q.shape[2]):\n            pass\n        A = (q @ k.transpose(-1, -2)).tril()\n"
    "        return A @ v / A.sum(-1, keepdim=True)\n"
    "    return torch.stack([one(q[b], k[b], v[b]) for b in range(q.shape[0])])",
], ids=["generator over (q, k)", "range(1)", "enumerate of a list", "over heads", "over the batch in a helper",
        "appends to a module-level list", "over the features", "a nested helper's own q"])
def test_loops_not_over_the_sequence_are_not_flagged(l01, code):
    lesson, _, good = l01
    audit = audit_notebook(with_answer(good, code, "parallel_form"), lesson_code(lesson))
    assert audit.loops == {} and audit.reasons() == [], audit


def test_cells_are_numbered_as_the_student_sees_them(l01):
    """In [n]: the position among non-empty code cells (the execution count the harness gives),
    never counting markdown cells."""
    lesson, _, good = l01
    nb = with_answer(good, "from mlexp.ops import linear_attention as la\n" + D + CALL)
    code_cells = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    n = next(i for i, c in enumerate(code_cells, start=1) if grade_id_of(c) == "recurrent_form")
    assert n != next(i for i, c in enumerate(nb.cells, start=1) if grade_id_of(c) == "recurrent_form")
    assert f"(your In [{n}])" in audit_notebook(nb, lesson_code(lesson)).forbidden["test_recurrent_form"]


# Issue 51, item 7: the chunkwise exercises' rules the watch used to decide, read from the source instead. A small
# notebook of one student cell and one test cell stating the lesson's two rules ("no loop over the tokens of a
# chunk", chunk_size used).
CHUNK_TEST = '''from mlexp import rules
rules.no_loop(chunked, lambda n: (n,), over="the tokens of a chunk", lengths=(16, 64), forbid=("mlexp.ops",),
              instead="Loop over the T / C chunks only")
rules.uses_argument(chunked, (1, 4), (1, 64), name="chunk_size", forbid=("mlexp.ops",), instead="Split into chunks")
'''
CHUNK_HEAD = "import itertools, math, operator\nimport numpy as np\nimport torch\n\n"


def _chunk_notebook(code):
    test = new_code_cell(CHUNK_TEST, metadata={"nbgrader": {"grade": True, "solution": False, "locked": True,
                                                            "grade_id": "test_chunked", "points": 3}})
    return nbformat.v4.new_notebook(cells=[new_code_cell(CHUNK_HEAD + code), test])


CHUNK_HONEST = {
    "over the chunks": "    T = q.shape[2]\n    for start in range(0, T, chunk_size):\n        pass\n    return q",
    "a count of chunks": "    T = q.shape[2]\n    return [q for c in range(math.ceil(T / chunk_size))]",
    "chunk starts, reversed": "    starts = list(range(0, q.shape[2], chunk_size))\n"
                              "    for i in reversed(range(len(starts))):\n        pass\n    return q",
    "T // C chunks": "    B, H, T, D = q.shape\n    return [q for c in range(T // chunk_size)]",
    "over the heads": "    for h in range(q.shape[1]):\n        pass\n    return q * chunk_size",
    "chunk_size read through locals": "    return q * locals()['chunk_size']",
}
CHUNK_KWARGS = "def chunked(q, k, v, chunk_size, **kw):\n    return q"     # chunk_size may be read from kw
CHUNK_LOOPED = {
    "for over T": "    B, H, T, D = q.shape\n    for t in range(T):\n        pass\n    return q",
    "for over a chunk's tokens": "    for s in range(0, q.shape[2], chunk_size):\n        Qc = q[:, :, s:s + chunk_size]\n"
                                 "        for t in range(Qc.shape[2]):\n            pass\n    return q",
    "map over numpy's moved axis": "    kn = k.numpy()\n    w = map(np.negative, np.moveaxis(kn, 2, 0)[..., None])\n"
                                   "    return list(itertools.accumulate(w, operator.add)) and chunk_size",
    "a transposed tensor iterated": "    return [x for x in q.transpose(0, 2)] and chunk_size",
    "unbound along the tokens": "    return list(map(torch.neg, q.unbind(2))) and chunk_size",
}


@pytest.mark.parametrize("code", ["def chunked(q, k, v, chunk_size):\n" + b for b in CHUNK_HONEST.values()]
                         + [CHUNK_KWARGS], ids=[*CHUNK_HONEST, "a **kwargs"])
def test_a_loop_over_chunks_is_not_a_loop_over_tokens(code):
    audit = audit_notebook(_chunk_notebook(code))
    assert audit.loops == {} and audit.unused == {}, audit


@pytest.mark.parametrize("body", list(CHUNK_LOOPED.values()), ids=list(CHUNK_LOOPED))
def test_a_loop_certain_to_take_a_turn_per_token_fails_a_rule_over_a_chunks_tokens(body):
    audit = audit_notebook(_chunk_notebook("def chunked(q, k, v, chunk_size):\n" + body))
    hint = audit.loops.get("test_chunked", "")
    assert hint.startswith("Hint: this exercise asks you to write it yourself without a Python loop over the tokens "
                           "of a chunk: chunked loops over the tokens one at a time ("), audit
    assert "your In [1], line " in hint and hint.endswith("Loop over the T / C chunks only.")


def test_an_argument_never_read_fails_the_rule_that_it_is_used():
    """uses_argument, read from the source: chunk_size never read (a fixed block of 128 instead) fails with the
    rule's words; rebinding it first, as a default, still reads it."""
    ignored = audit_notebook(_chunk_notebook("def chunked(q, k, v, chunk_size):\n    C = 128\n    return q[:, :, :C]"))
    assert ignored.unused == {"test_chunked": "Hint: chunk_size is not used: chunked never reads its argument "
                                              "chunk_size (your In [1], line 5). Split into chunks."}
    read = audit_notebook(_chunk_notebook("def chunked(q, k, v, chunk_size):\n    C = chunk_size or 128\n    return q"))
    assert read.unused == {}
    executed = _chunk_notebook("def chunked(q, k, v, chunk_size):\n    return q")
    executed.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="ok\n")]
    apply_audit(executed, {}, ignored)
    assert executed.cells[1].outputs[-1].evalue == ignored.unused["test_chunked"]


def test_a_cell_that_scored_its_parts_keeps_them():
    """A partial-credit test cell's parts each called the ruled function in the room, where the forbidden module is
    absent: the part that needed it failed there, and the others keep their points (lesson 05's library used for
    one count only: 2 of 3)."""
    nb = _chunk_notebook("def chunked(q, k, v, chunk_size):\n    from mlexp.ops import linear_attention\n"
                         "    return linear_attention(q, k, v)")
    audit = audit_notebook(nb)
    assert "test_chunked" in audit.forbidden
    for value, kept in (("2", True), ("3", False)):
        executed = copy.deepcopy(nb)
        executed.cells[1].outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": value},
                                                            execution_count=2)]
        apply_audit(executed, {}, audit)
        assert (executed.cells[1].outputs[-1].output_type == "execute_result") is kept, executed.cells[1].outputs
