"""Check your own notebook: run it from the top and print PASS/FAIL and the hint of each test.

From a terminal, in the course folder (or anywhere, with the notebook's path)::

    python -m mlexp.check lessons/01_running_sum/01_running_sum.ipynb

or from a notebook cell: ``!python -m mlexp.check 01_running_sum.ipynb``. The notebook runs in a
fresh kernel exactly as the grader runs it (``NBGRADER_EXECUTION=validate``: the experiments at
their token size, so it takes seconds), and every graded test cell is judged the way the grader
judges it: it passes when it runs to its end, and a failing ``assert`` shows its hint. When the
released lesson is found (``lessons/<id>/<id>.ipynb`` in the course folder above the notebook,
also for a copy named ``Copy of <id> (2).ipynb`` or ``<id>-Copy1.ipynb``), a test cell you
deleted, edited, turned into markdown or raw, or duplicated is put back from it first, by the
rule grading uses (:mod:`mlexp.restore`), so what you see is what the tests say. Only the
visible tests are here: the instructor's hidden tests run when the course grades your notebook,
so a full PASS is necessary, not sufficient.

This is the student side and needs only ``nbclient``, ``nbformat`` and ``ipykernel`` (JupyterLab
and Colab have them; ``pip install "mlexp[check]"`` adds them). It runs your code as you, like
Jupyter does; the course's grader runs it in a sandbox and its tests outside your kernel.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from .restore import find_lesson, nbgrader_meta as _nbgrader, normal_text, restore_cells
from .runtime import temporary_environ

__all__ = ["ExerciseResult", "CheckError", "check_notebook", "output_widgets_read_only", "judge_test_cell", "partial_score", "printed_hints",
           "result_of", "format_report", "terminal_safe", "normal_text", "is_test_cell", "main"]

HIDDEN_NOTE = "hidden tests run only when the course grades it"


class CheckError(ValueError):
    """The file is missing, is not a notebook, or the tools to run it are not installed."""


@dataclass
class ExerciseResult:
    """One graded test cell after running the notebook: its id, points, and what it said."""
    grade_id: str
    points: float
    passed: bool
    message: str = ""     # the "Hint: ..." of a failing assert, or "ErrorType: message"
    timed_out: bool = False
    score: float = None   # points scored: all or none, or the test's partial credit

    def __post_init__(self):
        if self.score is None:
            self.score = self.points if self.passed else 0.0


def is_test_cell(cell) -> bool:
    """A graded test cell: nbgrader metadata ``grade`` true, ``solution`` false, a code cell."""
    meta = _nbgrader(cell)
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")


def judge_test_cell(cell, special=None) -> tuple:
    """(passed, message, timed out) from an executed test cell's outputs: an error output fails.

    ``special`` maps other error names to (message prefix, timed out), e.g. the grader's names
    for a cell that ran out of time or never ran.
    """
    special = {"CellTimeoutError": ("timed out", True), **(special or {})}
    for out in cell.get("outputs", []):
        if out.get("output_type") != "error":
            continue
        ename, evalue = out.get("ename", ""), str(out.get("evalue", ""))
        if ename in special:
            prefix, timed_out = special[ename]
            return False, f"{prefix}: {evalue}".rstrip(": "), timed_out
        if ename == "AssertionError":
            return False, evalue.strip() or "an assert failed (it carries no hint message)", False
        if ename == "NotImplementedError":
            return False, "NotImplementedError: not done yet (a solution cell still raises it)", False
        return False, f"{ename}: {evalue}", False
    return True, "", False


def partial_score(cell):
    """The partial credit an executed test cell gave (its last expression's number, shown as an
    ``execute_result``, nbgrader's convention), or None when it gave none."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "execute_result":
            try:
                return float(out.get("data", {}).get("text/plain", ""))
            except (TypeError, ValueError):
                return None
    return None


def printed_hints(cell) -> str:
    """The hints a test cell printed (each line of its stdout that starts with ``Hint:``), joined
    by spaces on one line as a raised hint is, "" when none: a test that gives partial credit
    cannot raise, since an error scores 0, so it prints the hint of each part that failed and
    ends in the points of those that passed."""
    lines = [ln.strip() for out in cell.get("outputs", [])
             if out.get("output_type") == "stream" and out.get("name") == "stdout"
             for ln in "".join(out.get("text", "")).splitlines() if ln.strip().startswith("Hint:")]
    return " ".join(lines)


def result_of(cell, special=None) -> ExerciseResult:
    """The :class:`ExerciseResult` of an executed test cell; partial credit below the cell's
    points is a FAIL that says how many points it gave (capped at the points)."""
    meta = _nbgrader(cell)
    passed, message, timed_out = judge_test_cell(cell, special)
    points = float(meta.get("points", 0))
    score = partial_score(cell) if passed else None
    if score is not None:
        score = min(max(score, 0.0), points) if score == score else 0.0
        if score < points:
            hints = printed_hints(cell)
            passed, message = False, f"partial credit: {score:g} of {points:g} points" + \
                (f". {hints}" if hints else "")
    return ExerciseResult(meta.get("grade_id", "?"), points, passed, message, timed_out, score)


def find_release(path: Path):
    """The released lesson that ``path`` is a copy of (:func:`mlexp.restore.find_lesson`, the rule
    the grader uses: ``Copy of 01_running_sum (2).ipynb`` and JupyterLab's
    ``01_running_sum-Copy1.ipynb`` are ``01_running_sum.ipynb``) in the ``lessons/`` folder of the
    notebook's folder or of a folder above it; None when there is none."""
    for base in [path.parent, *path.parent.parents]:
        found = find_lesson(path.name, base / "lessons")
        if found is not None:
            return found    # (the notebook itself when it is the released lesson)
    return None


def restore_tests(nb, release) -> list:
    """Put the released lesson's test cells back into ``nb`` as grading does
    (:func:`mlexp.restore.restore_cells`, the grader's own rule): a test cell deleted, turned
    markdown or raw, duplicated (the last copy counts) or edited is run as released.
    Returns notes saying what was restored."""
    return restore_cells(nb, release)


def output_widgets_read_only(client):
    """Make nbclient ``client`` keep an Output widget's outputs without writing them back to the
    kernel; returns ``client``. Use it on every client that runs a lesson.

    nbclient plays the browser's part for ``ipywidgets.Output``: each print inside ``with out:``
    reaches it, and it sends the widget's new outputs to the kernel as a comm message on the
    shell channel, from the coroutine that reads outputs, while another coroutine waits on that
    same socket for the cell's reply. A ZeroMQ socket signals a waiting reader once per arrival
    (edge-triggered); a send that handles the reply's arrival first leaves the waiter asleep, and
    the cell then waits out its whole time limit though its reply is there (nbclient#312,
    nbconvert#1921). Lesson 04's cache calculator prints into an Output: in 25 runs of 20 such
    cells, 17 runs had a cell wait its limit with the write, none without it. The outputs are
    still kept where nbclient keeps them (``client.widget_state``), which is all a check or a
    feedback page reads; only the kernel's copy (``out.outputs``) stays empty, as it does in a
    static view of the notebook."""
    from nbclient.output_widget import OutputWidget

    class RecordingOutput(OutputWidget):
        def send(self, data=None, metadata=None, buffers=None):
            pass   # nothing goes to the kernel: see output_widgets_read_only

    client.widget_registry = {"@jupyter-widgets/output": {"OutputModel": RecordingOutput}}
    return client


def check_notebook(path, timeout: int = 300) -> tuple:
    """Run the notebook at ``path`` in a fresh kernel; returns (ExerciseResults, notes).

    ``timeout``: seconds per cell. Each visible graded test cell gives one
    :class:`ExerciseResult`; ``notes`` says which tests were restored from the released lesson.
    Raises CheckError for a missing or unreadable file, or when nbclient is not installed.
    """
    path = Path(path).expanduser().resolve()
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError:
        raise CheckError("The self-check needs nbclient and nbformat (JupyterLab and Colab have "
                         "them): pip install \"mlexp[check]\"") from None
    if not path.is_file():
        raise CheckError(f"No such notebook: {path}. Give the path of your .ipynb file, e.g. "
                         "lessons/01_running_sum/01_running_sum.ipynb.")
    try:
        with warnings.catch_warnings():   # nbformat's own note on a copied cell's id: restore_cells
            warnings.simplefilter("ignore")    # gives each cell a unique id and says what it did
            nb = nbformat.read(path, as_version=4)
    except Exception as exc:   # not JSON, not a notebook
        raise CheckError(f"{path.name} is not a readable notebook ({type(exc).__name__}: "
                         f"{str(exc)[:200]}). Re-download the lesson, or in Jupyter use File > Save "
                         "and try again.") from None
    notes = []
    release = find_release(path)
    if release is not None:
        notes += restore_tests(nb, nbformat.read(release, as_version=4))
    else:
        notes.append("the released lesson was not found above this notebook: its tests were run "
                     "as they are")
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    with temporary_environ(NBGRADER_EXECUTION="validate"):    # the experiments at their token size
        # The kernel runs on this machine for this one check; its own log (ipykernel's notice that
        # a local kernel talks over TCP, as JupyterLab's do) would read as a problem with the lesson.
        output_widgets_read_only(NotebookClient(
            nb, timeout=timeout, allow_errors=True, kernel_name="python3", interrupt_on_timeout=True,
            extra_arguments=["--IPKernelApp.log_level=ERROR"],
            error_on_timeout={"ename": "CellTimeoutError", "evalue": f"this cell ran longer than {timeout} s",
                              "traceback": []},
            resources={"metadata": {"path": str(path.parent)}})).execute()
    return [result_of(cell) for cell in nb.cells if is_test_cell(cell)], notes


def terminal_safe(text) -> str:
    """``text`` as one line a terminal shows as it is: every character that is not printable
    (newlines, carriage returns, tabs, escape codes, other control and format characters such
    as bidirectional overrides, lone surrogates) written as its Python escape (``\\x1b``)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace")
                   .decode("ascii") for c in str(text))


def format_report(name: str, results: list, notes=()) -> str:
    """Lines ``PASS  grade_id  2/2`` or ``FAIL  grade_id  0/2  Hint: ...`` and a summary.

    Each name, note and message comes from the notebook, so each is printed through
    :func:`terminal_safe`: one line, no escape code, so no text can pose as a PASS line or
    hide a FAIL line."""
    name = terminal_safe(name)
    lines = [f"note: {terminal_safe(n)}" for n in notes]
    if not results:
        return "\n".join(lines + [f"{name}: no autograded test cells found (is this a lesson notebook?)"])
    ids = [terminal_safe(r.grade_id) for r in results]
    width = max(map(len, ids))
    lines.append(f"{name}: {len(results)} graded test cells")
    for r, grade_id in zip(results, ids):
        pts = f"{r.score:g}/{r.points:g}"
        line = f"{'PASS' if r.passed else 'FAIL'}  {grade_id.ljust(width)}  {pts:>7}"
        lines.append(line + (f"  {terminal_safe(r.message)}" if r.message else ""))
    got = sum(r.score for r in results)
    total = sum(r.points for r in results)
    lines.append(f"visible tests: {sum(r.passed for r in results)}/{len(results)} passed, "
                 f"{got:g}/{total:g} points ({HIDDEN_NOTE})")
    return "\n".join(lines)


def main(argv=None) -> int:
    """``python -m mlexp.check NOTEBOOK``: exit 0 when every visible test passes, 1 when one
    fails, 2 when the notebook cannot be checked."""
    p = argparse.ArgumentParser(prog="python -m mlexp.check", description=__doc__.split("\n")[0])
    p.add_argument("notebook", help="path of the .ipynb to check")
    p.add_argument("--timeout", type=int, default=300, metavar="S",
                   help="seconds each cell may run (default 300)")
    args = p.parse_args(argv)
    try:
        results, notes = check_notebook(args.notebook, timeout=args.timeout)
    except CheckError as exc:
        print(f"error: {terminal_safe(exc)}", file=sys.stderr)
        return 2
    print(format_report(Path(args.notebook).name, results, notes))
    return 0 if results and all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
