"""`check`: a student's self-check, run exactly as `grade` runs a submission, visible tests only.

The notebook is repaired against the released lesson (so a deleted or edited test cell is put
back), then run by the same harness as `grade` (:mod:`autograder.engine.sandbox`): the student's cells in
their own kernel, sandboxed where bubblewrap can run, and every test cell outside it. A patched
`showtraceback`, a swallowed exception or a deleted test cannot turn a FAIL into a PASS, and a
cell that runs out of time is a FAIL row that says so.
"""
from dataclasses import replace
from pathlib import Path

import nbformat

from mlexp.check import ExerciseResult, format_report, result_of
from mlexp.restore import find_lesson

from autograder.options import GradingOptions
from autograder.intake.repair import SubmissionRejected, read_notebook_text, repair_notebook
from autograder.config import find_course_root
from autograder.cells import is_test_cell
from autograder.engine.jail.jail import probe
from autograder.engine.protocol import Report
from autograder.engine.sandbox import run_submission
from autograder.engine.notebook_client import NOT_RUN_ENAME, TIMEOUT_ENAME

__all__ = ["ExerciseResult", "NotebookError", "check_notebook", "format_report", "find_release"]

MAX_BYTES = 50 * 2**20


class NotebookError(ValueError):
    """The file is missing or is not a notebook."""


def _read(path: Path):
    if not path.is_file():
        raise NotebookError(f"No such notebook: {path}. Give the path of your .ipynb file, "
                            "e.g. lessons/01_running_sum/01_running_sum.ipynb.")
    try:
        return read_notebook_text(path.read_bytes(), MAX_BYTES)
    except SubmissionRejected as exc:
        raise NotebookError(f"{path}: {exc}. Re-download the lesson, or in Jupyter use File > "
                            "Save and try again.") from exc


def find_release(path: Path, course=None):
    """The released lesson notebook that ``path`` is a copy of, or None when no course is found.

    Looks in ``course`` (or the course this package belongs to) for lessons/<id>/<name> with the
    same file name, once browser, JupyterLab and LMS additions are undone ("Copy of x (1).ipynb",
    "x-Copy1.ipynb"): :func:`mlexp.restore.find_lesson`, the rule ``mlexp.check`` and ``grade``
    use."""
    try:
        root = find_course_root(course)
    except FileNotFoundError:
        return None, None
    found = find_lesson(path.name, root / "lessons")
    return root, (nbformat.read(found, as_version=4) if found is not None else None)


def check_notebook(path, options: GradingOptions = None, course=None) -> tuple:
    """Run the notebook at ``path``; return (ExerciseResults per visible test cell, notes).

    The kernel runs with ``NBGRADER_EXECUTION=validate`` (experiments at token size). ``notes``
    lists the repairs made and the cells that ran out of time. Raises NotebookError for a
    missing or unreadable file.
    """
    path = Path(path).resolve()
    nb, notes = _read(path)
    root, release = find_release(path, course)
    if release is not None:
        notes += repair_notebook(nb, release, {})
    else:
        notes.append("the released lesson was not found (run from the course checkout): the "
                     "tests in your file were run as they are")
    options = options or GradingOptions()
    # On the student's own machine the sandbox is a safety net, not a requirement.
    options = replace(options, unsandboxed=True)
    sandboxed = probe()["ok"]
    executed, raw = run_submission(nb, path.parent, options, root, mode="validate",
                                      show_call_output=True,
                                      cwd=None if sandboxed else path.parent)
    report = Report.from_dict(raw)
    if executed is None:
        raise NotebookError(f"{path.name} could not be run: {'; '.join(report.review)}")
    special = {TIMEOUT_ENAME: ("timed out", True), NOT_RUN_ENAME: ("not run", False)}
    results = [result_of(cell, special) for cell in executed.cells if is_test_cell(cell)]
    for what in report.timeouts:
        if not any(r.grade_id == what for r in results):
            notes.append(f"{what} ran longer than its time limit ({options.cell_timeout} s) and "
                         "was stopped")
    if report.kernel:
        notes.append(report.kernel)
    return results, notes
