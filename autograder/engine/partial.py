"""Partial credit from a test cell's last expression, nbgrader's way, but only from the test.

nbgrader awards part of a test cell's points when the cell ends in an expression whose value is
a number (``nbgrader.utils.determine_grade`` reads the cell's ``execute_result``). In this course
the test runs in the trusted harness (:mod:`autograder.engine.harness`) and the student's values reach
it as data, so a number could still come from the student: a test ending in ``f(x)`` would
score whatever the student's ``f`` returns. This module decides whether a last expression may
be a score:

- :func:`student_derived` finds, in the test's source, every name whose value may carry a value
  of the student's (data flow only: assignments, loops, ``with``, calls that may store an
  argument, functions whose body uses one, exception objects). A student value deciding an
  ``if`` or an ``assert`` is how a test is meant to work and is not data flow: ``score += 1``
  under ``if close(f(1), 1):`` is the test's own number, and so is a comparison's result
  (``sum([f(1) == 1, f(2) == 4])``: bools the harness computed). A loop whose number of turns a
  student value decides (``for x in student_list``, ``while f(i) < 10``) is different: every name
  its body assigns may count those turns, and counts as the student's. A test that uses ``globals``, ``exec``
  and the like could move a value in ways the source does not show: then every name counts as
  the student's. Asking whether a name exists (``"add" in globals()``, as every test cell of
  the course does) moves nothing and does not count.
- :func:`credit` turns the value into points: a real number, capped at the cell's points,
  negative or NaN as 0; a bool all or nothing (nbgrader would give full marks for ``False``
  too: a test ending in ``f(1) == 2`` without ``assert``); refused when the expression uses a
  student-derived name (the harness then fails the test with :data:`REFUSED_ENAME` and asks
  for a person to look, never full marks). An expression ending in ``;`` shows nothing in
  IPython, so it is not a score (:func:`ends_silenced`).

:func:`last_expression_problems` is the same check without running anything (``build
--check``): the names a test does not define itself are the student's.
"""
import ast
import builtins
import math
import numbers

__all__ = ["student_derived", "free_names", "credit", "last_expression_problems",
           "ends_silenced", "reflective_uses", "REFUSED_ENAME"]

REFUSED_ENAME = "PartialCreditRefused"
REFLECTIVE = {"globals", "locals", "vars", "exec", "eval", "compile", "setattr", "delattr",
              "__import__", "__dict__", "__builtins__"}


def _names(node) -> set:
    """Every plain name mentioned in ``node`` (a node or a list of nodes), loaded or stored."""
    nodes = node if isinstance(node, list) else [node]
    return {n.id for root in nodes if root is not None for n in ast.walk(root)
            if isinstance(n, ast.Name)}


def _flow(node) -> set:
    """The names whose value may flow into ``node``'s value: those of ``_names`` except inside a
    comparison or a ``not`` (their result is a bool the harness computed: a student value may
    decide it, as it decides an ``if``, but it is not the student's number)."""
    out, todo = set(), list(node) if isinstance(node, list) else [node]
    while todo:
        n = todo.pop()
        if n is None or isinstance(n, ast.Compare) or \
                isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            continue
        if isinstance(n, ast.Name):
            out.add(n.id)
        todo.extend(ast.iter_child_nodes(n))
    return out


def _defined(tree) -> set:
    """Names the test binds itself: assigned, imported, defined, loop and handler names."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
            a = node.args if not isinstance(node, ast.ClassDef) else None
            if a is not None:
                out |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
                out |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
        elif isinstance(node, ast.Lambda):
            a = node.args
            out |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(al.asname or al.name).split(".")[0] for al in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
    return out


def _stored(nodes) -> set:
    """Every name ``nodes`` (statements) assign, augment or delete: in a loop whose number of
    turns the student's values decide, each such name may count those turns (``score += 1``
    once per item of the student's list)."""
    return {n.id for root in nodes for n in ast.walk(root)
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}


def free_names(tree) -> set:
    """Names the test uses but neither defines nor finds among the built-ins: the student's."""
    return {n for n in _names(tree) if n not in _defined(tree) and not hasattr(builtins, n)}


def _membership_checks(tree) -> set:
    """The ``globals()``/``locals()``/``vars()`` calls (no arguments) that are only asked
    whether a name is there: ``"add" in globals()``. The answer is a bool the harness computes,
    like any comparison's, and no value moves: these are not reflective."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and all(isinstance(op, (ast.In, ast.NotIn))
                                                 for op in node.ops):
            for right in node.comparators:
                if isinstance(right, ast.Call) and isinstance(right.func, ast.Name) and \
                        right.func.id in ("globals", "locals", "vars") and \
                        not right.args and not right.keywords:
                    out.add(id(right.func))
    return out


def reflective_uses(tree) -> list:
    """``[(name, line)]`` of each reflective built-in (``globals``, ``exec``, ``setattr``, a
    ``__dict__``, ...) the test uses in a way that can move a value unseen in its source; a
    membership check like ``"add" in globals()`` is not one (:func:`_membership_checks`)."""
    checks = _membership_checks(tree)
    uses = []
    for n in ast.walk(tree):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if name in REFLECTIVE and id(n) not in checks:
            uses.append((name, getattr(n, "lineno", 0)))
    return sorted(set(uses), key=lambda u: (u[1], u[0]))


def _reflective(tree) -> bool:
    return bool(reflective_uses(tree))


def student_derived(tree, outside=()) -> set:
    """The names of ``tree`` (a parsed test cell) whose value may carry a student value.

    ``outside``: names known to come from the student (the harness adds those it fetched from
    the kernel); the test's free names always count. Taint spreads until nothing changes.
    With a reflective built-in (``globals``, ``exec``, ...) every name of the test counts.
    """
    tainted = set(outside) | free_names(tree)
    if _reflective(tree):
        return tainted | _names(tree)
    params = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            names = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
            names |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
            params[getattr(node, "name", None)] = names
    while True:
        new = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if node.value is not None and _flow(node.value) & tainted:
                    new |= _names(targets)          # d[k] = v taints d
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                if _flow(node.iter) & tainted:
                    new |= _names(node.target)
                    if not isinstance(node, ast.comprehension):   # the student sets the count
                        new |= _stored(node.body + node.orelse)
            elif isinstance(node, ast.While):   # a comparison too: it decides how often the body runs
                if _names(node.test) & tainted:
                    new |= _stored(node.body + node.orelse)
            elif isinstance(node, ast.withitem):
                if node.optional_vars is not None and _flow(node.context_expr) & tainted:
                    new |= _names(node.optional_vars)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                new.add(node.name)                  # an exception may quote a student value
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if _flow(node.body) & tainted:
                    new.add(node.name)
            elif isinstance(node, ast.Call):
                args = node.args + [k.value for k in node.keywords]
                if _flow(args) & tainted:   # the callee may keep it: scores.append(f(1))
                    new |= {n for n in _names(node.func) if not hasattr(builtins, n)}
                    new |= {a.id for a in args if isinstance(a, ast.Name)}
                    if isinstance(node.func, ast.Name):
                        new |= params.get(node.func.id, set())
        if new <= tainted:
            return tainted
        tainted |= new


def credit(value, points: float, expression, tainted: set):
    """Points from the value of a test's last expression: (points or None, note, refused).

    ``None`` points: not a score (not a real number or a bool), the test scores by its errors
    as before. ``refused``: the student-derived names (in ``tainted``) the expression uses, so
    the number may be the student's; the caller fails the test (``note`` says why, without
    quoting the test: it may be hidden). ``note``: else what was done to the value, for the
    test's output ("" when it is used as it is).
    """
    is_bool = isinstance(value, bool) or type(value).__name__ == "bool_"   # numpy's too
    if not is_bool and not isinstance(value, numbers.Real):
        return None, "", []
    used = sorted(_flow(expression) & tainted)
    if used:
        return None, ("this test ends in a partial-credit score that may be a value of the "
                      "notebook's own code, so the grader did not use it: the test scored 0 "
                      "until the course staff look at it"), used
    if is_bool:
        return (float(points), "", []) if value else \
            (0.0, "[the test ended in False: scored 0 (a check is written `assert ...`)]", [])
    x = float(value)
    if math.isnan(x):
        return 0.0, "[partial credit: the test's score was NaN: scored 0]", []
    if x > points:
        return float(points), (f"[partial credit: the test's score {x:g} is over the cell's "
                               f"{points:g} points: capped at {points:g}]"), []
    if x < 0:
        return 0.0, f"[partial credit: the test's score {x:g} is below 0: scored 0]", []
    return x, "", []


def ends_silenced(source: str, last) -> bool:
    """Whether the statement ``last`` (a test's last) is followed by ``;`` on its line: IPython
    then shows no value, so nbgrader sees no score."""
    lines = source.splitlines()
    if last.end_lineno is None or last.end_lineno > len(lines):
        return False
    return lines[last.end_lineno - 1][last.end_col_offset:].lstrip().startswith(";")


def last_expression_problems(source: str) -> list:
    """Why a test cell's partial credit would be refused when grading ([] when it would not).

    Static: the student's names are those the test does not define (no kernel to ask)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [f"the test does not parse ({exc.msg}, line {exc.lineno})"]
    if not tree.body or not isinstance(tree.body[-1], ast.Expr) or \
            ends_silenced(source, tree.body[-1]):
        return []
    last = tree.body[-1].value
    if isinstance(last, ast.Constant) and not isinstance(last.value, (int, float)) or \
            isinstance(last, ast.Call) and isinstance(last.func, ast.Name) and last.func.id == "print":
        return []   # a string, or print(...) (None), is not a score
    used = sorted(_flow(last) & student_derived(tree))
    if not used:
        return []
    reflective = reflective_uses(tree)
    if reflective:
        shown = ", ".join(f"`{name}` (line {line})" for name, line in reflective)
        return [f"its last statement is an expression, which nbgrader reads as a partial-credit "
                f"score, and the test uses {shown}, which can move a value of the student's "
                "where the test's source does not show it; so the grader counts every name of "
                "the test as the student's and would refuse that score (the test would score "
                "0). A check whether a name exists (`\"add\" in globals()`) is fine; other uses "
                "of these need the test to end in a statement (e.g. `assert ...`)"]
    return [f"its last statement is an expression, which nbgrader reads as a partial-credit "
            f"score, and it uses {', '.join(f'`{u}`' for u in used)}, which may come from the "
            "student's code: the grader would refuse that score and give the test 0. End the "
            "test with a statement (e.g. `assert ...` or `_ = ...`), or compute the score from "
            "the test's own checks (`score += 1` under an `if`)"]
