"""Running one graded test cell on the trusted side, within its time limit, with its output capped
and its partial credit checked (autograder.engine.harness runs each test cell of a notebook with it)."""
import ast
import contextlib
import io
import linecache
import signal
import traceback

import nbformat

from autograder.engine import partial
from autograder.engine.calls import StudentNamespace
from autograder.cells import nbgrader_meta
from autograder.engine.cputime import Budget
from mlexp import rules
from autograder.engine.notebook_client import (TIMEOUT_ENAME, WATCH_S, KernelGone, StudentTimeout, _error,
                                               _timeout_text)

__all__ = ["run_test"]


class _Capped(io.StringIO):
    """A stdout for test cells that keeps at most ``limit`` characters."""

    def __init__(self, limit):
        super().__init__()
        self.limit, self.dropped = limit, 0

    def write(self, s):
        room = self.limit - self.tell()
        if len(s) > room:
            self.dropped += len(s) - max(room, 0)
            s = s[:max(room, 0)]
        return super().write(s)


@contextlib.contextmanager
def _alarm(links, budget, in_process=False):
    """Raise StudentTimeout in this (main) thread once the test has spent ``budget`` (its CPU
    time, autograder.engine.cputime.Budget), except while a request to a kernel (``links``: the
    student's, and the room's when there is one) is running (that request has its own budget,
    the rest of this one). ``in_process``: the student's code runs in this process (the dry run,
    autograder.engine.dryrun), where the alarm rings once, at the limit."""
    import threading
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(*_):
        if not in_process and not budget.exceeded():
            return
        busy = [link for link in links if link.busy]
        if busy:
            for link in busy:
                link.expired = True
        else:
            raise StudentTimeout("the test ran past its time limit")

    old = signal.signal(signal.SIGALRM, ring)
    if in_process:   # the student's code runs in this process (the dry run): one alarm at the limit, so
        signal.setitimer(signal.ITIMER_REAL, max(budget.seconds, 0.01))   # no handler runs inside its watch
    else:
        signal.setitimer(signal.ITIMER_REAL, WATCH_S, WATCH_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_test(cell, link, options, limit, show_call_output=False, room=None) -> str:
    """Run a graded test cell here within ``limit`` seconds, in a fresh StudentNamespace; set its
    outputs. Returns a reason for a person to look at the submission, or "".

    A test that ends in an expression whose value is a number awards that many of its points,
    nbgrader's partial credit: the value is evaluated here and written as the cell's
    ``execute_result`` (what nbgrader's ``determine_grade`` reads), capped at the cell's points
    (autograder.engine.partial.credit). ``room``: where the names an exercise rule guards are
    fetched and called (autograder.engine.room), or None. When the expression may carry a value of the student's
    (autograder.engine.partial.student_derived, with the names this test fetched from the kernel), the
    test fails with PartialCreditRefused instead and the reason is returned.
    """
    meta = nbgrader_meta(cell)
    grade_id = meta.get("grade_id", "test")
    filename = f"<test cell {grade_id}>"
    source = cell.source
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    out = _Capped(options.cell_output_kb * 1024)
    error, result, review = None, None, ""
    said = []          # what the watch found (mlexp.rules.watch_as_hints)
    links = [link] + ([room.link] if room is not None and room.link is not None else [])
    budget = Budget(limit, getattr(link.client, "threads", 1))
    for each in links:
        each.client.request_stdout = []
        each.expired = False
        each.budget = budget
    namespace = StudentNamespace(link, room)
    try:
        tree = ast.parse(source, filename)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) \
            and not partial.ends_silenced(source, tree.body[-1]) else None
        code = compile(tree, filename, "exec")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), rules.watch_as_hints() as said, \
                _alarm(links, budget, in_process=not hasattr(link.client, "threads")):
            exec(code, namespace)
            value = None if last is None else \
                eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
        if value is not None:
            tree.body.append(last)
            points, note, refused = partial.credit(
                value, float(meta.get("points", 0) or 0), last.value,
                partial.student_derived(tree, namespace.fetched))
            if refused:
                error = _error(partial.REFUSED_ENAME, note)
                review = (f"test '{grade_id}' ends in a partial-credit score made from "
                          f"{', '.join(f'`{n}`' for n in refused)}, which may hold the student's "
                          "values: refused (scored 0); see `build --check`")
            elif points is not None:
                result = nbformat.v4.new_output("execute_result", data={"text/plain": f"{points:g}"},
                                                execution_count=None)
                if note:
                    out.write(note + "\n")
    except StudentTimeout as exc:
        error = _error(TIMEOUT_ENAME, exc.hint or f"{_timeout_text(options, limit, 'this test')} ({exc})")
    except KernelGone:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:   # the test failed: its exception is the verdict
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
        lines = ["Traceback (most recent call last):\n"] + traceback.format_list(frames)
        if said:   # the watch named the slip on the way (it decides no point: mlexp.rules.watch_as_hints)
            exc = AssertionError(said[0])
        lines += traceback.format_exception_only(type(exc), exc)
        error = _error(type(exc).__name__, str(exc), [ln.rstrip("\n") for ln in lines])
    finally:
        for each in links:
            each.budget = None
    text = out.getvalue()
    if show_call_output:
        text = "".join(x for each in links for x in each.client.request_stdout) + text
    if out.dropped:
        text += f"\n[output capped: {out.dropped} characters not kept]\n"
    cell.outputs = []
    if text:
        cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=text))
    if error is not None:
        cell.outputs.append(error)
    elif result is not None:
        cell.outputs.append(result)
    return review
