"""Grade a notebook's exercises in this process, without a kernel: a second per demo student.

The real grader (autograder.engine.harness) runs a submission's cells in a sandboxed kernel and each
graded test cell in the trusted harness, which reaches the student's names through
``autograder.engine.kernel.wire``'s wire format. This module keeps the second half exactly (the same
``autograder.engine.testcell.run_test`` in a fresh ``StudentNamespace``, the same encode/decode of
every value and every call of a student function) and replaces the kernel by a plain namespace
in this process, with a ``KernelServer`` of its own (autograder.engine.kernel.kernel_server),
so a course author can check in seconds what each catalogued demo student is told
(``python -m autograder demo --check-hints``). It is a check of the course, not a grader: student
code runs here unsandboxed, so use it only on answers you wrote yourself.

Only the cells the exercises need are run: the two setup cells, every answer cell, every test
cell, and, transitively, each earlier lesson cell that binds a name one of those reads (so a
lesson's training runs and timing loops are skipped unless a test reads what they compute).
Experiments run at grading size (NBGRADER_EXECUTION=autograde), as under the grader.
"""
from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import shutil
import signal
import symtable
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import nbformat

from mlexp.check import partial_score, printed_hints
from mlexp.runtime import temporary_environ

from autograder.engine.kernel.kernel_server import KernelServer

from autograder.engine.calls import KernelLink
from autograder.cells import is_test_cell, nbgrader_meta
from autograder.engine.testcell import run_test
from autograder.options import GradingOptions
from autograder.engine.protocol import KernelReply

__all__ = ["Outcome", "needed_cells", "run_exercises"]



@dataclass
class Outcome:
    """One test cell's verdict: passed, and the error it raised ("" when it passed); a test that
    gave partial credit did not pass, its ``error`` is the hints it printed and ``score`` the
    points it gave (default: ``points`` when it passed, else 0)."""
    passed: bool
    error: str = ""
    points: float = 0.0
    score: float = None

    def __post_init__(self):
        if self.score is None:
            self.score = self.points if self.passed else 0.0


def _meta(cell) -> dict:
    return nbgrader_meta(cell) if cell.cell_type == "code" else {}


def _code(source: str) -> str:
    """A cell's Python: IPython magics and shell lines (``%``, ``!``) dropped."""
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())


def _names(source: str) -> tuple:
    """(names the cell binds at top level, names it reads as globals anywhere, functions included)."""
    try:
        table = symtable.symtable(_code(source), "cell", "exec")
    except SyntaxError:
        return set(), set()
    bound = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    read, todo = set(), [table]
    while todo:
        scope = todo.pop()
        top = scope is table
        read |= {s.get_name() for s in scope.get_symbols()
                 if s.is_referenced() and (top or s.is_global())}
        todo += scope.get_children()
    return bound, read - set(vars(builtins))


def needed_cells(nb) -> list:
    """Indices of the code cells the graded tests depend on, in notebook order (see module doc)."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    names = {i: _names(nb.cells[i].source) for i in code}
    needed = set(code[:2]) | {i for i in code if _meta(nb.cells[i]).get("solution")
                              or is_test_cell(nb.cells[i])}
    todo = sorted(needed)
    while todo:
        i = todo.pop()
        for j in code:
            if j < i and j not in needed and names[j][0] & names[i][1]:
                needed.add(j)
                todo.append(j)
    return sorted(needed)


class _Client:
    """What run_test needs of the harness's notebook client: where request output would go."""

    def __init__(self):
        self.request_stdout = []


class LocalLink(KernelLink):
    """KernelLink whose "kernel" is the namespace ``ns`` in this process: each request is
    answered by a KernelServer of its own (autograder.engine.kernel.kernel_server), through a JSON round trip
    as on the wire."""

    def __init__(self, ns: dict):
        super().__init__(_Client())
        self.ns = ns
        self.server = KernelServer(namespace=lambda: ns)
        # a measured call (mlexp.rules.work_grows): this process's CPU time, its arguments in a folder of its own
        self._measure = tempfile.TemporaryDirectory(prefix="autograder-dryrun-")
        self.cpu_root, self.measure_dir = os.getpid(), (self._measure.name, self._measure.name)

    def request(self, req, what: str, limit=None):
        # limit: a call's own time limit (rules.in_time, KernelLink.request); the dry run answers
        # in this process, where only the cell's timer (_limit) can stop it.
        reply = self.server.answer(json.loads(req.to_json()))
        return KernelReply.from_dict(json.loads(json.dumps(reply, allow_nan=True)))


class _CellTimeout(Exception):
    pass


@contextlib.contextmanager
def _limit(seconds):
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def ring(*_):
        raise _CellTimeout(f"ran longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def _lesson_run(folder: Path):
    """Run in a scratch copy of the lesson folder at grading size; put back what cells change
    in this process (working folder, NBGRADER_EXECUTION, torch threads, open figures)."""
    import torch
    cwd = os.getcwd()
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="autograder-dryrun-") as tmp:
        work = Path(tmp) / "lesson"
        shutil.copytree(folder, work, ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints"))
        os.chdir(work)
        try:
            with temporary_environ(NBGRADER_EXECUTION="autograde"):
                yield
        finally:
            os.chdir(cwd)
            torch.set_num_threads(threads)
            if "matplotlib.pyplot" in sys.modules:
                sys.modules["matplotlib.pyplot"].close("all")


def run_exercises(student_nb, source_nb, folder: Path, options: GradingOptions = None) -> dict:
    """Run ``student_nb``'s needed cells in a fresh namespace here and each graded test cell of
    ``source_nb`` (the instructor's version, hidden tests included) as the harness runs it.

    folder: the lesson's folder (its data files are copied next to the run). Returns
    {grade_id: Outcome} for every graded test cell of ``source_nb``; a test cell missing from
    the student's notebook is run in its place, as the grader's repair puts it back.
    """
    options = options or GradingOptions()
    os.environ.setdefault("MPLBACKEND", "Agg")
    tests = {_meta(c)["grade_id"]: c for c in source_nb.cells if is_test_cell(c)}
    nb = nbformat.from_dict(json.loads(json.dumps(student_nb)))     # a copy: outputs are set
    for cell in nb.cells:                                           # tests come from the source
        gid = _meta(cell).get("grade_id")
        if gid in tests:
            cell.source = tests[gid].source
    ns = {"__name__": "__main__", "__builtins__": builtins}
    link = LocalLink(ns)
    outcomes = {}

    def test(cell, gid):
        run_test(cell, link, options, options.cell_timeout)
        errors = [o for o in cell.outputs if o.get("output_type") == "error"]
        points = float(_meta(tests[gid]).get("points", 0))
        score = None if errors else partial_score(cell)      # nbgrader's partial credit, as capped
        if score is not None and score < points:
            outcomes[gid] = Outcome(False, printed_hints(cell), points, score)
        else:
            outcomes[gid] = Outcome(not errors, f"{errors[0].ename}: {errors[0].evalue}" if errors else "",
                                    points)

    with _lesson_run(Path(folder)):
        for i in needed_cells(nb):
            cell = nb.cells[i]
            gid = _meta(cell).get("grade_id")
            if gid in tests:
                test(cell, gid)
                continue
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                        _limit(options.cell_timeout):
                    exec(compile(_code(cell.source), f"<cell {i}>", "exec"), ns)
            except Exception:   # as in the notebook: the cell failed, the next ones still run
                pass
        for gid in tests.keys() - outcomes.keys():
            test(nbformat.from_dict(json.loads(json.dumps(tests[gid]))), gid)
    return outcomes
