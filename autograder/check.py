"""`check`: a student's self-check, run exactly as `grade` runs a submission, visible tests only.

The notebook is repaired against the released lesson (so a deleted or edited test cell is put
back), then run by the same harness as `grade` (:mod:`autograder.sandbox`): the student's cells in
their own kernel, sandboxed where bubblewrap can run, and every test cell outside it. A patched
`showtraceback`, a swallowed exception or a deleted test cannot turn a FAIL into a PASS, and a
cell that runs out of time is a FAIL row that says so.
"""
from dataclasses import dataclass, replace
from pathlib import Path

import nbformat

from .options import GradingOptions
from .repair import SubmissionRejected, normalise_name, read_notebook_text, repair_notebook

__all__ = ["ExerciseResult", "NotebookError", "check_notebook", "format_report", "find_release"]

MAX_BYTES = 50 * 2**20


class NotebookError(ValueError):
    """The file is missing or is not a notebook."""


@dataclass
class ExerciseResult:
    """One autograded test cell after running the notebook."""
    grade_id: str
    points: float
    passed: bool
    message: str = ""     # the "Hint: ..." of a failing assert, or "ErrorType: message"
    timed_out: bool = False
    score: float = None   # points scored: all or none, or the test's partial credit

    def __post_init__(self):
        if self.score is None:
            self.score = self.points if self.passed else 0.0


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
    same file name, once browser and LMS additions are undone ("Copy of x (1).ipynb")."""
    from .config import find_course_root
    try:
        root = find_course_root(course)
    except FileNotFoundError:
        return None, None
    want = normalise_name(path.name)
    for candidate in sorted((root / "lessons").glob("*/*.ipynb")):
        if normalise_name(candidate.name) == want:
            return root, nbformat.read(candidate, as_version=4)
    return root, None


def _outcome(cell, timeout: int) -> tuple:
    """(passed, message, timed out) from a test cell's outputs, judged as `grade` does: an error
    output fails the cell."""
    from .harness import NOT_RUN_ENAME, TIMEOUT_ENAME
    for out in cell.get("outputs", []):
        if out.output_type != "error":
            continue
        if out.ename == TIMEOUT_ENAME:
            return False, f"timed out: {out.evalue}", True
        if out.ename == "AssertionError":
            return False, out.evalue.strip() or "an assert failed (it carries no hint message)", False
        if out.ename == "NotImplementedError":
            return False, "NotImplementedError: not done yet (a solution cell still raises it)", False
        if out.ename == NOT_RUN_ENAME:
            return False, f"not run: {out.evalue}", False
        return False, f"{out.ename}: {out.evalue}", False
    return True, "", False


def _partial(cell):
    """The partial-credit score the harness wrote (an execute_result), or None."""
    for out in cell.get("outputs", []):
        if out.output_type == "execute_result":
            try:
                return float(out.get("data", {}).get("text/plain", ""))
            except ValueError:
                return None
    return None


def check_notebook(path, options: GradingOptions = None, course=None) -> tuple:
    """Run the notebook at ``path``; return (ExerciseResults per visible test cell, notes).

    The kernel runs with ``NBGRADER_EXECUTION=validate`` (experiments at token size). ``notes``
    lists the repairs made and the cells that ran out of time. Raises NotebookError for a
    missing or unreadable file.
    """
    from .harness import is_test_cell
    from .jail import probe
    from .sandbox import run_submission
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
    executed, report = run_submission(nb, path.parent, options, root, mode="validate",
                                      show_call_output=True,
                                      cwd=None if sandboxed else path.parent)
    if executed is None:
        raise NotebookError(f"{path.name} could not be run: {'; '.join(report.get('review', []))}")
    results = []
    for cell in executed.cells:
        if is_test_cell(cell):
            meta = cell.metadata["nbgrader"]
            passed, message, timed_out = _outcome(cell, options.cell_timeout)
            points = float(meta.get("points", 0))
            score = _partial(cell) if passed else None
            if score is not None and score < points:   # partial credit: not a PASS
                passed, message = False, f"partial credit: {score:g} of {points:g} points"
            results.append(ExerciseResult(meta.get("grade_id", "?"), points, passed, message,
                                          timed_out, score))
    for what in report.get("timeouts", []):
        if not any(r.grade_id == what for r in results):
            notes.append(f"{what} ran longer than its time limit ({options.cell_timeout} s) and "
                         "was stopped")
    if report.get("kernel"):
        notes.append(report["kernel"])
    return results, notes


def format_report(name: str, results: list, notes=()) -> str:
    """Lines ``PASS  grade_id  2/2`` or ``FAIL  grade_id  0/2  Hint: ...`` and a summary."""
    lines = [f"note: {n}" for n in notes]
    if not results:
        return "\n".join(lines + [f"{name}: no autograded test cells found (is this a lesson "
                                  "notebook?)"])
    width = max(len(r.grade_id) for r in results)
    lines.append(f"{name}: {len(results)} graded test cells")
    for r in results:
        pts = f"{r.score:g}/{r.points:g}"
        line = f"{'PASS' if r.passed else 'FAIL'}  {r.grade_id.ljust(width)}  {pts:>7}"
        lines.append(line + (f"  {r.message}" if r.message else ""))
    got = sum(r.score for r in results)
    total = sum(r.points for r in results)
    lines.append(f"visible tests: {sum(r.passed for r in results)}/{len(results)} passed, "
                 f"{got:g}/{total:g} points (hidden tests run only when the course grades it)")
    return "\n".join(lines)
