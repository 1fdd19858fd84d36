"""Run a lesson's graded exercises in plain Python namespaces, the way the grader will, in seconds.

No Jupyter kernel: a lesson's setup cells and the answer cells run in one namespace (the
student's), and each graded test cell runs in a fresh namespace of its own (the grader's), which
receives the student's names only as the grader's trust boundary passes them: through the
grader's own code, not a copy of it. The namespace is the harness's
(``autograder.engine.calls.StudentNamespace``), its channel the in-process one of the dry run
(``autograder.engine.dryrun.LocalLink``: ``KernelLink`` and the ``autograder.engine.kernel.wire`` codec, with a
``KernelServer`` answering from the student's namespace), so

- data is copied through the codec; modules do not cross, so a test cell must import what it
  uses (rule 1);
- a function the student defined becomes a proxy: its arguments must be data or torch.nn
  modules (rule 3; a call that cannot be sent is recorded as a violation), tensors cross as
  copies (autograd still flows), a tensor argument changed in place fails the call with a hint,
  and an exception raised inside comes back as the nearest built-in exception type with the
  same message.

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
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")

import nbformat  # noqa: E402
import torch  # noqa: E402

from autograder.cells import is_solution, is_test_cell, nbgrader_meta  # noqa: E402
from autograder.engine.audit import audit_notebook  # noqa: E402
from autograder.engine.calls import StudentNamespace  # noqa: E402
from autograder.engine.dryrun import LocalLink  # noqa: E402
from mlexp import rules  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SETUP_CELL = "course-setup"
# Cells besides the two setup cells that the exercises need (they define names the answers read).
PRELUDE = {"01_running_sum": ("worked-attention", "worked-folded")}
HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[^\n]*\n?", re.S | re.M)
STUDENT_MODULE = "__main__"   # the student namespace's __name__, as in a kernel


@dataclass
class Outcome:
    """One test cell's verdict: "pass", "fail" (AssertionError), "error" (any other exception) or
    "partial": it ran to its end but its last expression, nbgrader's partial credit, gave
    ``score`` points, fewer than the cell's; its ``message`` is then the hints it printed."""
    status: str
    message: str = ""
    score: float | None = None

    def __str__(self):
        shown = f"{self.status} ({self.score:g} points)" if self.status == "partial" else self.status
        return f"{shown}: {self.message}" if self.message else shown


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


grade_meta = nbgrader_meta
is_test = is_test_cell


def is_answer(cell) -> bool:
    return cell.cell_type == "code" and is_solution(cell)


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
class _Link(LocalLink):
    """The in-process channel of the dry run (autograder.engine.dryrun.LocalLink: the grader's
    KernelLink and codec, a KernelServer answering from the student's namespace), noting each
    call a test could not send (rule 3: an argument that is not data)."""

    def __init__(self, ns: dict, violations: list):
        super().__init__(ns)
        self.violations = violations

    def call(self, fn, args, kwargs, watch=None, limit=None):
        try:
            return super().call(fn, args, kwargs, watch, limit)
        except TypeError as exc:
            if "cannot be sent to the notebook" in str(exc):
                self.violations.append(f"rule 3: {exc}")
            raise


def grader_namespace(student_ns: dict, violations: list) -> StudentNamespace:
    """A fresh namespace for one test cell, the harness's own (autograder.engine.calls.StudentNamespace)
    over the in-process channel: every student name is fetched as the grader fetches it (data
    copied through the codec, functions as proxies, modules and private names left out)."""
    ns = StudentNamespace(_Link(student_ns, violations))
    for name in list(student_ns):
        name in ns   # noqa: B015 (fetches it)
    return ns


# ------------------------------------------------------------------------------ running
def _exec(source: str, ns: dict, name: str):
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(source, f"<{name}>", "exec"), ns)


def run_test_cell(source: str, ns: dict, name: str, points: float = None) -> Outcome:
    """Run a test cell; one that ends in a number below ``points`` (partial credit, as the
    harness reads it: autograder.engine.testcell) is "partial", with the "Hint:" lines it printed."""
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    printed = io.StringIO()
    said = []
    try:
        with contextlib.redirect_stdout(printed), rules.watch_as_hints() as said:
            exec(compile(tree, f"<{name}>", "exec"), ns)
            value = None if last is None else eval(compile(ast.Expression(last.value), f"<{name}>", "eval"), ns)
    except AssertionError as exc:
        return Outcome("fail", said[0] if said else str(exc))
    except Exception as exc:   # a test cell must turn every mistake into a hint, never crash
        return Outcome("fail", said[0]) if said else Outcome("error", f"{type(exc).__name__}: {exc}")
    if points is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and value < points:
        hints = [ln.strip() for ln in printed.getvalue().splitlines() if ln.strip().startswith("Hint:")]
        return Outcome("partial", " ".join(hints), max(float(value), 0.0))
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


def run_lesson(lesson: str, answers: dict | None = None, *, mode: str = "grader", only=None,
               share: bool = False) -> LessonRun:
    """Run ``lesson``'s setup cells, answer cells and test cells in order.

    answers: {grade_id: source} for answer cells; the others keep the solution's source (pass
    ``blank_answers(lesson)`` merged in for a student who left them untouched). mode: "grader"
    (each test cell in its own namespace across the boundary) or "self" (in a copy of the
    student's namespace). only: test grade_ids to run (default all). Each test cell runs twice,
    as released (visible part) and in full (with its hidden tests). share: a test cell whose
    :func:`inputs_of_test` this process has run already takes that run's outcome instead of running
    again (the demo students of a lesson mostly share the answers a costly test reads).
    """
    if mode not in ("grader", "self"):
        raise ValueError(f"mode must be 'grader' or 'self', got {mode!r}")
    sources = {**solution_answers(lesson), **(answers or {})}
    run = LessonRun()
    student = {"__name__": STUDENT_MODULE, "__builtins__": builtins}
    before = []                                 # (grade_id, source) of the answer cells run so far
    for kind, cell, gid in graded_cells(lesson, student):
        if kind == "answer":
            before.append((gid, sources[gid]))
            try:
                _exec(sources[gid], student, f"{lesson}:{gid}")
            except Exception as exc:           # the notebook goes on after a failing cell
                run.answer_errors[gid] = f"{type(exc).__name__}: {exc}"
        elif only is None or gid in only:
            for part, source in (("visible", visible_part(cell.source)), ("full", cell.source)):
                key = (lesson, mode, source, inputs_of_test(source, before)) if share else None
                if key in _SHARED:
                    run.outcomes[gid, part], seen = _SHARED[key]
                    run.violations += seen
                    continue
                if mode == "grader":
                    ns = grader_namespace(student, run.violations)
                else:
                    ns = dict(student)
                already = len(run.violations)
                run.outcomes[gid, part] = run_test_cell(source, ns, f"{lesson}:{gid}:{part}",
                                                        grade_meta(cell).get("points"))
                if key is not None:
                    _SHARED[key] = run.outcomes[gid, part], run.violations[already:]
    if mode == "grader":
        _source_verdicts(lesson, sources, run)
    return run


def _source_verdicts(lesson: str, sources: dict, run: LessonRun) -> None:
    """What the grader reads from the notebook's source before anything runs (autograder.engine.audit,
    as the sandbox applies it): a test whose rule the source breaks (a forbidden module reached, a loop
    certain to run over the sequence, an argument it must use never read) fails with the rule's hint,
    whatever its run said. In grading the watch in the student's process decides no point
    (mlexp.rules.watch_as_hints), so these are the rules' verdicts there, with the OS-measured bounds
    the test cells read themselves."""
    nb = solution_notebook(lesson)
    lesson_code = [c.source for c in nb.cells if c.cell_type == "code" and not is_answer(c) and not is_test(c)]
    for cell in nb.cells:
        if is_answer(cell):
            cell.source = sources[grade_meta(cell)["grade_id"]]
        elif is_test(cell):
            cell.source = visible_part(cell.source)
    audit = audit_notebook(nb, lesson_code)
    for (gid, part), outcome in list(run.outcomes.items()):
        hint = audit.forbidden.get(gid) or audit.loops.get(gid) or audit.unused.get(gid)
        if hint and outcome.status == "pass":      # a part-scored cell keeps its parts (audit._part_scored)
            run.outcomes[gid, part] = Outcome("fail", hint)



_SHARED = {}    # run_lesson(share=True): {(lesson, mode, test source, inputs_of_test): (Outcome, violations)}
# Calls and names by which a cell may change what it does not bind: torch's and numpy's settings,
# the random generators, a global, an attribute of anything by name, a module, builtins, text run.
_REACHES_OUT = re.compile(r"\bset(_\w+|err|printoptions)\(|\buse_\w+\(|seed|\brand\w*\(|\brandom\b|normal_|uniform_"
                          r"|multinomial|bernoulli|shuffle|permutation|dropout|\bglobal\b|\bnonlocal\b"
                          r"|\b(set|del)attr\b|\bglobals\b|\bvars\b|__import__|\bsys\b|\bexec\b|\beval\b"
                          r"|\bimportlib\b|\bbuiltins\b|\bos\b")
# A test cell that reads the namespace by a name it computes (``globals()`` with a literal name is
# read as that name: the test's identifier-like strings count as names it reads).
_BY_TEXT = re.compile(r"\b(locals|vars|eval|exec)\b|__dict__|__main__|sys\.modules")
_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "add", "discard",
             "sort", "reverse", "popitem"}


def _changes_outside(node, local: set) -> bool:
    """Whether ``node`` may change an object that is not one of the names in ``local``: an item or
    attribute stored into, or a mutating method (``append``, a tensor's ``add_``) called on, a
    name outside ``local`` (an over-approximation: ``self.x = ...`` counts as outside)."""
    def base(n):
        while isinstance(n, (ast.Attribute, ast.Subscript)):
            n = n.value
        return n.id if isinstance(n, ast.Name) else None

    for n in ast.walk(node):
        if isinstance(n, (ast.Attribute, ast.Subscript)) and isinstance(n.ctx, (ast.Store, ast.Del)):
            if base(n) not in local:
                return True
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            attr = n.func.attr
            if (attr in _MUTATORS or attr.endswith("_") and not attr.startswith("_")) and base(n.func.value) not in local:
                return True
    return False


def _function_locals(fn) -> set:
    args = fn.args
    names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a}
    return names | {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _top_bound(tree) -> set:
    """The names the top level of a cell binds (not a function's locals)."""
    bound = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(stmt.name)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in stmt.names)
        else:
            bound.update(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return bound


def _plain(tree) -> bool:
    """A cell whose statements only bind names: defs and classes without decorators (a class
    with no bases) whose bodies change nothing outside their own names, imports, and assignments
    to names and calls (a ``print``) that change nothing outside what the cell binds."""
    top = _top_bound(tree)
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defaults = [d for d in (*stmt.args.defaults, *stmt.args.kw_defaults) if d is not None]
            if stmt.decorator_list or not all(isinstance(d, ast.Constant) for d in defaults) \
                    or _changes_outside(stmt, _function_locals(stmt)):
                return False
        elif isinstance(stmt, ast.ClassDef):
            if stmt.decorator_list or stmt.bases or stmt.keywords or not all(
                    isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                    or isinstance(s, ast.FunctionDef) and _plain(ast.Module(body=[s], type_ignores=[]))
                    for s in stmt.body):
                return False
        elif isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
            continue
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr)):
            if _changes_outside(stmt, top):
                return False
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            if not all(t is None or all(isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.Load, ast.Store))
                                        for n in ast.walk(t)) for t in targets):
                return False
        else:
            return False
    return True


def _cell_names(source: str):
    """(plain, names bound, names read) of an answer cell: a plain cell (:func:`_plain`, and none
    of :data:`_REACHES_OUT`) binds only what its top level binds; None if it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    bound, read = _names(tree)
    plain = not _REACHES_OUT.search(source) and _plain(tree)
    return plain, (_top_bound(tree) if plain else bound), read


def inputs_of_test(test_source: str, answers: list) -> tuple:
    """The answer cells, of ``answers`` ([(grade_id, source)] in notebook order, those run before
    the test), that can change what the test cell ``test_source`` computes: each that binds a
    name the test reads, or that such a cell reads, and so on; and each that is not plain (it
    does more than bind names: :func:`_plain`, :data:`_REACHES_OUT`) or does not
    parse, whatever it binds; every cell if the test reads the namespace by a computed name.
    Two runs whose setup cells are the lesson's and whose test inputs are equal run the test
    alike, unless an answer reaches an object another cell bound through a name of its own."""
    cells = [_cell_names(source) for _, source in answers]
    if _BY_TEXT.search(test_source):     # it reads the namespace by a name it computes: all of it
        return tuple(answers)
    chosen = {i for i, c in enumerate(cells) if c is None or not c[0]}
    tree = ast.parse(test_source)
    needed = set(_names(tree)[1]) | {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                                     and isinstance(n.value, str) and n.value.isidentifier()}
    for i in chosen:
        needed |= cells[i][2] if cells[i] is not None else set()
    grew = True
    while grew:
        grew = False
        for i, c in enumerate(cells):
            if i not in chosen and c[1] & needed:
                chosen.add(i)
                needed |= c[2]
                grew = True
    return tuple(answers[i] for i in sorted(chosen))


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
