"""`check`: a student's self-check that runs a notebook and reports each graded test cell."""
import json
import os
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbformat.reader import NotJSONError

from .config import CELL_TIMEOUT_S, KERNEL_ARGS

__all__ = ["ExerciseResult", "NotebookError", "check_notebook", "format_report"]


class NotebookError(ValueError):
    """The file is missing or is not a notebook."""


@dataclass
class ExerciseResult:
    """One autograded test cell after running the notebook."""
    grade_id: str
    points: float
    passed: bool
    message: str = ""     # the "Hint: ..." of a failing assert, or "ErrorType: message"


def _read(path: Path):
    if not path.is_file():
        raise NotebookError(f"No such notebook: {path}. Give the path of your .ipynb file, "
                            "e.g. lessons/01_running_sum/01_running_sum.ipynb.")
    try:
        return nbformat.read(path, as_version=4)
    except (NotJSONError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise NotebookError(f"{path} is not valid notebook JSON ({exc}). Re-download the lesson, "
                            "or in Jupyter use File > Save and try again.") from exc
    except Exception as exc:   # nbformat's own validation / reader errors
        raise NotebookError(f"{path} could not be read as a notebook: {exc}") from exc


def _outcome(cell) -> tuple:
    """(passed, message) from a test cell's outputs, judged as `grade` does: an error output
    fails the cell; output on stderr (a library warning) does not (autograder.sandbox)."""
    for out in cell.get("outputs", []):
        if out.output_type == "error":
            if out.ename == "AssertionError":
                hint = out.evalue.strip() or "an assert failed (it carries no hint message)"
                return False, hint
            if out.ename == "NotImplementedError":
                return False, "NotImplementedError: not done yet (a solution cell still raises it)"
            return False, f"{out.ename}: {out.evalue}"
    return True, ""


def check_notebook(path, timeout: int = CELL_TIMEOUT_S) -> list:
    """Execute the notebook at ``path`` and return an ExerciseResult per autograded test cell.

    The kernel runs in the notebook's folder with ``NBGRADER_EXECUTION=validate``, so experiment
    cells run at token size (``mlexp.budget``). Every cell runs even after an error, as in
    grading. Only the tests present in the file are run: a released lesson has no hidden tests.
    Raises NotebookError for a missing or unreadable file.
    """
    path = Path(path)
    nb = _read(path)
    env = {**os.environ, "NBGRADER_EXECUTION": "validate"}
    client = NotebookClient(nb, timeout=timeout, allow_errors=True, kernel_name="python3",
                            extra_arguments=list(KERNEL_ARGS),
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    client.execute(env=env)
    results = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            passed, message = _outcome(cell)
            results.append(ExerciseResult(meta.get("grade_id", "?"), float(meta.get("points", 0)),
                                          passed, message))
    return results


def format_report(name: str, results: list) -> str:
    """Lines ``PASS  grade_id  2/2`` or ``FAIL  grade_id  0/2  Hint: ...`` and a summary."""
    if not results:
        return f"{name}: no autograded test cells found (is this a lesson notebook?)"
    width = max(len(r.grade_id) for r in results)
    lines = [f"{name}: {len(results)} graded test cells"]
    for r in results:
        pts = f"{r.points:g}/{r.points:g}" if r.passed else f"0/{r.points:g}"
        line = f"{'PASS' if r.passed else 'FAIL'}  {r.grade_id.ljust(width)}  {pts:>7}"
        lines.append(line + (f"  {r.message}" if r.message else ""))
    got = sum(r.points for r in results if r.passed)
    total = sum(r.points for r in results)
    lines.append(f"visible tests: {sum(r.passed for r in results)}/{len(results)} passed, "
                 f"{got:g}/{total:g} points (hidden tests run only when the course grades it)")
    return "\n".join(lines)
