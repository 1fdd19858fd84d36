"""Run a lesson's graded exercises in plain Python namespaces, the way the grader will, in seconds.

No Jupyter kernel: a lesson's setup cells and the answer cells run in one namespace (the
student's), and each graded test cell runs in a fresh namespace of its own (the grader's), which
receives the student's names only as the grader's trust boundary passes them (README, "The
grader's new trust boundary" in the helpers' guide):

- data is copied: None, bool, int, float, str, tuples / lists / dicts of these, torch tensors
  (detached copies), numpy arrays; modules and other objects do not cross, so a test cell must
  import what it uses (rule 1);
- a function the student defined becomes a proxy: its arguments must be data or torch.nn
  modules (rule 3; anything else is recorded as a violation), tensors cross as copies (autograd
  still flows), and an exception raised inside comes back as the nearest built-in exception
  type with the same message.

``mode="self"`` runs the same test cell in (a copy of) the student's namespace instead, as the
self-check does in a student's own notebook (rule 5). Every cell's printed output is discarded.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import io
import os
import re
import types
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")

import nbformat  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from autograder.wire import Opaque, decode, encode  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SETUP_CELL = "course-setup"
# Cells besides the two setup cells that the exercises need (they define names the answers read).
PRELUDE = {"01_running_sum": ("worked-attention", "worked-folded")}
HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[^\n]*\n?", re.S | re.M)
STUDENT_MODULE = "__main__"


@dataclass
class Outcome:
    """One test cell's verdict: "pass", "fail" (AssertionError) or "error" (any other exception)."""
    status: str
    message: str = ""

    def __str__(self):
        return f"{self.status}: {self.message}" if self.message else self.status


@dataclass
class LessonRun:
    """What one pass through a lesson produced: test outcomes keyed by (grade_id, "visible"/"full"),
    errors raised by answer cells, and breaches of the boundary rules."""
    outcomes: dict = field(default_factory=dict)
    answer_errors: dict = field(default_factory=dict)
    violations: list = field(default_factory=list)


def solution_notebook(lesson: str):
    return nbformat.read(REPO / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)


def released_notebook(lesson: str):
    return nbformat.read(REPO / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)


def grade_meta(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def is_test(cell) -> bool:
    meta = grade_meta(cell)
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def is_answer(cell) -> bool:
    return cell.cell_type == "code" and bool(grade_meta(cell).get("solution"))


def visible_part(source: str) -> str:
    """A test cell as the released lesson has it: the hidden block removed."""
    return HIDDEN.sub("", source)


def solution_answers(lesson: str) -> dict:
    """{grade_id: source} of every answer cell as the solution notebook has it."""
    return {grade_meta(c)["grade_id"]: c.source for c in solution_notebook(lesson).cells if is_answer(c)}


def blank_answers(lesson: str) -> dict:
    """{grade_id: source} of every answer cell as the released lesson has it."""
    return {grade_meta(c)["grade_id"]: c.source for c in released_notebook(lesson).cells if is_answer(c)}


def points_per_test(lesson: str) -> dict:
    return {grade_meta(c)["grade_id"]: grade_meta(c).get("points", 0)
            for c in solution_notebook(lesson).cells if is_test(c)}


# ------------------------------------------------------------------------------ the boundary
class NotData(TypeError):
    """A value that the grader's channel cannot carry."""


def copy_data(value, depth=0):
    """A copy of ``value`` as the channel carries data; raises NotData for anything else."""
    if depth > 20:
        raise NotData("nested too deeply")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, (tuple, list)):
        return type(value)(copy_data(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return {copy_data(k, depth + 1): copy_data(v, depth + 1) for k, v in value.items()}
    raise NotData(type(value).__name__)


def _argument(value, violations, where, depth=0):
    """An argument on its way to a student function: data or a torch.nn module (autograd kept)."""
    if isinstance(value, torch.nn.Module):
        return value
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_argument(v, violations, where, depth + 1) for v in value)
    if isinstance(value, dict):
        return {k: _argument(v, violations, where, depth + 1) for k, v in value.items()}
    try:
        return copy_data(value)
    except NotData:
        violations.append(f"rule 3: {where} was passed a {type(value).__name__}, which is not data")
        return value


def _builtin_twin(exc: BaseException) -> BaseException:
    """The nearest built-in exception type of ``exc``, with the same message."""
    builtin_types = {v for v in vars(builtins).values() if isinstance(v, type)}
    cls = next(c for c in type(exc).__mro__ if c in builtin_types)
    try:
        return cls(str(exc))
    except TypeError:
        return RuntimeError(str(exc))


def _result(value):
    """A student function's result as the harness receives it: plain data through autograder.wire's
    wire format (an object that is not data becomes an Opaque that fails every use); tensors that
    carry autograd stay as they are, since the harness links the backward pass to the kernel."""
    if isinstance(value, torch.Tensor) and value.requires_grad:
        return value
    if isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) and v.requires_grad
                                                for v in value):
        return type(value)(_result(v) for v in value)
    return decode(encode(value, kernel=True, refs=[]),
                  ref_factory=lambda i, t, n: Opaque(t, "a function returned by the student"))


def proxy(fn, name: str, violations: list):
    """The student's function ``fn`` as the grader sees it: arguments copied (a tensor changed in
    place fails the call with a hint, as in the harness), exceptions as their built-in type, the
    result as data."""
    def invoke(args, kwargs, watch=None):
        where = f"student function {name}"
        sent = [_argument(a, violations, where) for a in args]
        sent_kw = {k: _argument(v, violations, where) for k, v in kwargs.items()}
        trace = None
        try:
            if watch is None:
                result = fn(*sent, **sent_kw)
            else:                          # as the kernel's side of the wire runs a watched call
                from mlexp.rules import watching
                with watching(watch) as trace:
                    result = fn(*sent, **sent_kw)
        except Exception as exc:
            raise _builtin_twin(exc) from None
        import inspect
        try:
            params = [p.name for p in inspect.signature(fn).parameters.values()]
        except (TypeError, ValueError):
            params = []
        pairs = [(params[i] if i < len(params) else f"argument {i + 1}", old, new)
                 for i, (old, new) in enumerate(zip(args, sent))]
        pairs += [(k, kwargs[k], v) for k, v in sent_kw.items()]
        for pname, old, new in pairs:
            if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and new is not old \
                    and (old.shape != new.shape or not torch.equal(old, new)):
                raise AssertionError(f"Hint: {name} changed {pname} in place. Return a new "
                                     "tensor and leave the arguments as they were given.")
        return _result(result) if watch is None else (_result(result), trace.as_dict())

    def call(*args, **kwargs):
        return invoke(args, kwargs)
    call.__name__ = call.__qualname__ = name
    call._watched_call = lambda args, kwargs, forbid: invoke(args, kwargs, list(forbid))
    return call


def grader_namespace(student_ns: dict, violations: list) -> dict:
    """A fresh namespace for one test cell: the student's data copied, their functions proxied."""
    ns = {"__name__": "__grader__", "__builtins__": builtins}
    for name, value in student_ns.items():
        if name.startswith("__") or isinstance(value, types.ModuleType):
            continue
        if isinstance(value, types.FunctionType):
            if value.__module__ == STUDENT_MODULE:
                ns[name] = proxy(value, name, violations)
            continue
        try:
            ns[name] = copy_data(value)
        except NotData:
            pass
    return ns


# ------------------------------------------------------------------------------ running
def _exec(source: str, ns: dict, name: str):
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(source, f"<{name}>", "exec"), ns)


def run_test_cell(source: str, ns: dict, name: str) -> Outcome:
    try:
        _exec(source, ns, name)
    except AssertionError as exc:
        return Outcome("fail", str(exc))
    except Exception as exc:   # a test cell must turn every mistake into a hint, never crash
        return Outcome("error", f"{type(exc).__name__}: {exc}")
    return Outcome("pass")


def graded_cells(lesson: str, student: dict):
    """Walk the solution notebook of ``lesson``: run its setup and worked-example cells in
    ``student`` and yield ``(kind, cell, grade_id)`` for each graded cell, kind "answer" or "test"
    (the caller runs those). Torch's thread count is restored when the walk ends."""
    nb = solution_notebook(lesson)
    prelude = {SETUP_CELL, nb.cells[2].get("id"), *PRELUDE.get(lesson, ())}
    threads = torch.get_num_threads()
    try:
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            if cell.get("id") in prelude:
                _exec(cell.source, student, f"{lesson}:{cell.get('id')}")
            elif is_answer(cell):
                yield "answer", cell, grade_meta(cell)["grade_id"]
            elif is_test(cell):
                yield "test", cell, grade_meta(cell)["grade_id"]
    finally:
        torch.set_num_threads(threads)


def run_lesson(lesson: str, answers: dict | None = None, *, mode: str = "grader", only=None) -> LessonRun:
    """Run ``lesson``'s setup cells, answer cells and test cells in order.

    answers: {grade_id: source} for answer cells; the others keep the solution's source (pass
    ``blank_answers(lesson)`` merged in for a student who left them untouched). mode: "grader"
    (each test cell in its own namespace across the boundary) or "self" (in a copy of the
    student's namespace). only: test grade_ids to run (default all). Each test cell runs twice,
    as released (visible part) and in full (with its hidden tests).
    """
    if mode not in ("grader", "self"):
        raise ValueError(f"mode must be 'grader' or 'self', got {mode!r}")
    sources = {**solution_answers(lesson), **(answers or {})}
    run = LessonRun()
    student = {"__name__": STUDENT_MODULE, "__builtins__": builtins}
    for kind, cell, gid in graded_cells(lesson, student):
        if kind == "answer":
            try:
                _exec(sources[gid], student, f"{lesson}:{gid}")
            except Exception as exc:           # the notebook goes on after a failing cell
                run.answer_errors[gid] = f"{type(exc).__name__}: {exc}"
        elif only is None or gid in only:
            for part, source in (("visible", visible_part(cell.source)), ("full", cell.source)):
                if mode == "grader":
                    ns = grader_namespace(student, run.violations)
                else:
                    ns = dict(student)
                run.outcomes[gid, part] = run_test_cell(source, ns, f"{lesson}:{gid}:{part}")
    return run


# ------------------------------------------------------------------------------ static rule 4
def _names(tree) -> tuple:
    """(names a cell binds anywhere, names it reads anywhere), a deliberate over-approximation."""
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    return bound, read


def names_from_test_cells(lesson: str) -> list:
    """Rule 4: (cell id, name) for every lesson or answer cell that reads a name which only an
    earlier graded test cell binds. Such a name is missing while grading."""
    found, lesson_bound, test_bound = [], set(vars(builtins)), set()
    for cell in solution_notebook(lesson).cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(ln for ln in cell.source.splitlines() if not ln.lstrip().startswith(("%", "!")))
        bound, read = _names(ast.parse(source))
        if is_test(cell):
            test_bound |= bound
            continue
        lesson_bound |= bound
        found += [(cell.get("id"), n) for n in sorted(read & test_bound - lesson_bound)]
    return found
