"""Each exercise's expected values, computed by running its reference solution, and a scan of text for them.

:func:`expected_values` runs a lesson the way tests/exercise_runner.py does (setup cells and the
solution's answer cells in the student's namespace, each graded test cell, hidden part included, in
a grader namespace of its own) and records what the tests receive from the solution: the result of
every call a test cell makes to a student function, and the student data it reads. Those are the
exercise's expected values on the tests' own inputs, computed, never typed.

:func:`renderings` writes a value the ways a notebook or a hint would show it, and :func:`leaks`
finds them in a text. What counts as an answer (the rule, in one place):

- a tuple or list of numbers is always an answer, whatever its entries: "(2, 4)" states a read-back
  even though 2 and 4 alone say nothing;
- a single number is an answer unless it is generic: a number of one significant digit (0.5, 10,
  100, 2000), an integer below 100 in magnitude or a power of two up to 4,096 (the shapes, head
  counts, widths, lengths and steps every lesson's text names for reasons of its own), or a value
  equal to one of the call's own arguments, or for a value the student sets, to one the answer
  stub hands them (stating an input gives nothing away, even when the answer is that input:
  ``pairs_inattention(T) == T``). A float whose rounding reads as a generic integer (15.9 as "16")
  is not looked for in that rounding;
- a number is rendered as written in the course: an integer plain, with thousands commas and with
  underscores; a float rounded to 2, 3 and 4 significant digits (and as an integer when it is whole).
  A match must stand alone: no digit, decimal point, digit separator, minus sign or letter right
  before or after it (5.2f is a format, -1.25 another number).

:func:`computed_in_view` finds the other way a visible test gives an answer away: a variable its
visible part leaves behind (in the self-check it stays in the student's namespace) that holds a value
it expects from the student, computed without the student's answer. Tensor results are left out (a
student cannot type a tensor); values the student sets and numbers a function returns are in.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import io
import functools
import math
import re

import torch

from autograder.engine.kernel.wire import Opaque
from exercise_runner import _exec, _names, blank_answers, graded_cells, grader_namespace, solution_answers

MAX_ITEMS = 8          # a tensor or sequence with more numbers than this is not written out in text


def _numbers(value):
    """``value`` as a number or a flat tuple of at most MAX_ITEMS numbers, or None."""
    if isinstance(value, (bool, Opaque)) or value is None:   # Opaque: a student object, no data
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() == 0 or value.numel() > MAX_ITEMS or value.is_complex():
            return None
        flat = tuple(value.detach().double().reshape(-1).tolist())
        return flat[0] if value.dim() == 0 else flat
    if isinstance(value, (int, float)):
        return value if math.isfinite(value) else None
    if hasattr(value, "item") and getattr(value, "size", None) == 1:         # a numpy scalar
        return _numbers(value.item())
    if isinstance(value, (tuple, list)) and 0 < len(value) <= MAX_ITEMS:
        items = [_numbers(v) for v in value]
        if all(isinstance(v, (int, float)) for v in items):
            return tuple(items)
    return None


def _scalars(args, kwargs):
    out = set()
    for v in list(args) + list(kwargs.values()):
        n = _numbers(v)
        if isinstance(n, tuple):
            out.update(n)
        elif n is not None:
            out.add(n)
    return out


def _source_tree(source):
    return ast.parse("\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))))


def _given_names(stub: str) -> set:
    """Names the released answer stub binds itself (the inputs it hands the student)."""
    try:
        return _names(_source_tree(stub))[0]
    except SyntaxError:
        return set()


def _read_names(source: str) -> set:
    """Names a test cell takes from the student: those it reads without binding, and those it
    names in a string (``globals()[name]``)."""
    tree = _source_tree(source)
    bound, read = _names(tree)
    words = {w for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
             for w in re.findall(r"[A-Za-z_]\w*", node.value)}
    return (read - bound) | words


def _recorder(fn, name, found, test):
    def call(*args, **kwargs):
        result = fn(*args, **kwargs)
        value = _numbers(result)
        if value is None and isinstance(result, tuple) and len(result) <= 4:   # (k, v), (output, state): each part
            parts = [_numbers(r) for r in result]
        else:
            parts = [value]
        for part in parts:
            if part is not None:
                found.append((test, f"{name}(...)", part, _scalars(args, kwargs)))
        return result
    call.__name__ = call.__qualname__ = name
    if hasattr(fn, "_watched_call"):
        def watched(args, kwargs, forbid, **extra):
            result, trace = fn._watched_call(args, kwargs, forbid, **extra)
            value = _numbers(result)
            if value is not None:
                found.append((test, f"{name}(...)", value, _scalars(args, kwargs)))
            return result, trace
        call._watched_call = watched
    if hasattr(fn, "_measured_call"):      # a measured call returns only its cost: nothing to record
        call._measured_call = fn._measured_call
    return call


def _test_cells(lesson: str):
    """Run the lesson's setup and (reference) answer cells in a student namespace; at each graded
    test cell yield ``(cell, grade_id, student, answer_names, given)``: the names the answer cells
    bound so far and the numbers their released stubs hand the student (the exercises' inputs)."""
    sources, blank = solution_answers(lesson), blank_answers(lesson)
    student = {"__name__": "__main__", "__builtins__": builtins}
    answer_names, given = set(), set()
    for kind, cell, gid in graded_cells(lesson, student):
        if kind == "answer":
            before = dict(student)
            _exec(sources[gid], student, lesson)
            answer_names |= {n for n, v in student.items() if n not in before or before[n] is not v}
            given |= {v for n in _given_names(blank.get(gid, "")) if (v := _numbers(student.get(n))) is not None}
        else:
            yield cell, gid, student, answer_names, frozenset(given)


def _record(ns, names, found, test, given):
    """Put a recorder on each student function in ``names``; note each student value as found."""
    for name in sorted(names & set(ns)):
        if isinstance(ns[name], Opaque):    # a student object the grader cannot look into
            continue
        if callable(ns[name]):
            ns[name] = _recorder(ns[name], name, found, test)
        elif (value := _numbers(ns[name])) is not None:
            found.append((test, name, value, given))


@functools.lru_cache(maxsize=None)
def expected_values(lesson: str) -> tuple:
    """(test grade_id, where, value, the call's own argument numbers) for every value the lesson's
    graded tests receive from its reference solution."""
    found: list = []
    for cell, test, student, answer_names, given in _test_cells(lesson):
        ns = grader_namespace(student, [])
        _record(ns, answer_names & _read_names(cell.source), found, test, given)
        try:
            _exec(cell.source, ns, f"{lesson}:{test}")
        except AssertionError as exc:       # the reference must pass; say so rather than scan less
            raise AssertionError(f"{lesson}:{test}: the reference solution fails: {exc}") from None
    return tuple(found)


def _generic(x, own_args) -> bool:
    if any(x == a for a in own_args):
        return True
    if isinstance(x, tuple):
        return False
    if x == 0 or math.isclose(abs(x), float(f"{abs(x):.1g}"), rel_tol=1e-9):
        return True                                   # one significant digit: 0.5, 10, 100, 2000
    if float(x).is_integer():
        n = abs(int(x))
        return n < 100 or (n <= 4096 and n & (n - 1) == 0)
    return False


def _scalar_renderings(x) -> set:
    if float(x).is_integer():
        n = int(x)
        return {str(n), f"{n:,}", f"{n:_}", f"{n}.0"}
    out = {f"{x:.{d}g}" for d in (2, 3, 4)} | {f"{x:.{d}f}".rstrip("0") for d in (2, 3, 4) if abs(x) >= 1}
    return {r for r in out if "e" in r or not _generic(float(r), ())}    # 15.9 written "16" reads as a generic 16


def renderings(value, own_args=()) -> set:
    """The texts that would state ``value`` (empty when it is generic; see the module docstring)."""
    if isinstance(value, tuple):
        if _generic(value, own_args):
            return set()
        shortest = [str(int(v)) if float(v).is_integer() else f"{v:.3g}" for v in value]
        floats = [f"{float(v)}" if float(v).is_integer() else f"{v:.2g}" for v in value]
        out = set()
        for parts in (shortest, floats):
            for sep in (", ", ","):
                body = sep.join(parts)
                out |= {f"({body})", f"[{body}]"}
        return out
    if _generic(value, own_args):
        return set()
    return _scalar_renderings(value)


def leaks(text: str, value, own_args=()) -> list:
    """The renderings of ``value`` that occur in ``text`` as whole numbers (see the module docstring)."""
    found = []
    for r in sorted(renderings(value, own_args)):
        sign = "" if r.startswith("-") else "-"       # -1.25 is another number than 1.25
        pattern = (rf"(?<![\d.,_{sign}])" + re.escape(r).replace(r"\ ", r"\s*")
                   + r"(?![\d_A-Za-z]|[.,]\d)")      # 5.2f is a format, 9.2e3 another number
        if re.search(pattern, text):
            found.append(r)
    return found


# ------------------------------------------------------------------------------ computed in view
class _NoAsserts(ast.NodeTransformer):
    def visit_Assert(self, node):
        return ast.Pass()


def _perturbed(value):
    """A wrong answer of the same form as ``value``: every number moved."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value + 7919
    if isinstance(value, float):
        return value * 1.5 + 0.37
    if isinstance(value, torch.Tensor):
        return value + 0.37 if value.is_floating_point() else value + 7
    if isinstance(value, (tuple, list)):
        return type(value)(_perturbed(v) for v in value)
    return value


def _moved(fn):
    def call(*args, **kwargs):
        return _perturbed(fn(*args, **kwargs))
    call.__name__ = call.__qualname__ = getattr(fn, "__name__", "student")
    if hasattr(fn, "_watched_call"):
        def watched(args, kwargs, forbid, **extra):
            result, trace = fn._watched_call(args, kwargs, forbid, **extra)
            return _perturbed(result), trace
        call._watched_call = watched
    if hasattr(fn, "_measured_call"):      # a measured call returns only its cost: nothing to record
        call._measured_call = fn._measured_call
    return call


def _same(a, b) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(map(_same, a, b))
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@functools.lru_cache(maxsize=None)
def computed_in_view(lesson: str) -> tuple:
    """(test, variable, value) for every variable a test cell's visible part leaves holding one of
    the cell's expected values whatever the student answered: the visible part runs twice, asserts
    left out, once with the reference answers and once with every answer moved to a wrong value;
    a variable with the same value both times that equals an expected value (not one of the call's
    own inputs) was computed by the visible cell itself."""
    from exercise_runner import visible_part
    flagged = []
    for cell, test, student, answer_names, given in _test_cells(lesson):
        code = compile(ast.fix_missing_locations(_NoAsserts().visit(_source_tree(visible_part(cell.source)))),
                       f"<{lesson}:{test}:visible>", "exec")
        names = answer_names & _read_names(cell.source)
        runs, seen = [], []
        for move in (False, True):
            ns = grader_namespace(student, [])
            if move:
                for name in {n for n in names & set(ns) if not isinstance(ns[n], Opaque)}:
                    ns[name] = _moved(ns[name]) if callable(ns[name]) else _perturbed(ns[name])
            else:
                _record(ns, names, seen, test, given)
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(code, ns)
            except Exception:                # the namespace as far as the cell got
                pass
            runs.append(ns)
        inputs = set().union(given, *(own for *_, own in seen))      # what the cell hands the student
        for var, value in runs[0].items():
            if var in answer_names or var.startswith("__"):
                continue
            a, b = _numbers(value), _numbers(runs[1].get(var))
            if a is None or b is None or not _same(a, b):
                continue
            if any(_same(a, o) for o in inputs if isinstance(o, tuple) == isinstance(a, tuple)):
                continue
            if any(_same(a, v) for _t, n, v, _own in seen if n in answer_names or not isinstance(v, tuple)):
                flagged.append((test, var, a))
    return tuple(flagged)
