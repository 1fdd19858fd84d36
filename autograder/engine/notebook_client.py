"""The harness's side of the student's kernel: a kernel manager that starts it in the jail, and
an nbclient client with output caps, time limits and request cells (autograder.engine.harness).

Also the names every part of the harness shares: the exceptions that end a test or a kernel,
the error outputs' names and the time an interrupted kernel gets to answer.
"""
import asyncio
import html
import json
import os
import re

import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError
from nbclient.util import ensure_async
from traitlets import Any, List
from mlexp.check import output_widgets_read_only

from autograder.config import KERNEL_ARGS
from autograder.options import GradingOptions
from autograder.engine.cputime import WALL_CEILING, Budget
from autograder.engine.jail.jail import kernel_threads
from autograder.engine.kernel.wire import WIRE_MIME

__all__ = ["SandboxKernelManager", "HarnessClient", "StudentTimeout", "KernelGone",
           "TIMEOUT_ENAME", "NOT_RUN_ENAME", "KERNEL_MODULE", "RECOVER_S"]

TIMEOUT_ENAME = "CellTimeoutError"
NOT_RUN_ENAME = "NotExecuted"
KERNEL_MODULE = "_autograder_wire"   # the name of autograder.engine.kernel.wire's copy inside the kernel
# After a cell's reply, how long its remaining output may take to arrive (nbclient waits 4 s, and a
# loop that flushes thousands of small prints on a busy machine is still sending then); what has
# not arrived by then is lost, and the cell and the report say so.
OUTPUT_WAIT_S = 30
REQUEST_STDOUT_CHARS = 65536   # what a request cell printed, kept for a test (the rest dropped)
INTERACTIVE_FIGURES = re.compile(r"^\s*%matplotlib\s+(notebook|widget|ipympl|nbagg)\b", re.M)
RECOVER_S = 10          # after a time limit, how long an interrupted kernel may take to answer
WATCH_S = 0.25          # how often a running cell's CPU time is read


class StudentTimeout(BaseException):
    """A test, or a student function it called, ran past the cell's time limit, or past the
    shorter limit a test set for one call (``hint``: what the test says then, else "").

    A BaseException, so that no ``except Exception`` in a test can swallow it."""

    def __init__(self, message: str = "", hint: str = ""):
        super().__init__(message)
        self.hint = hint


class KernelGone(BaseException):
    """The student's kernel died or stopped answering; nothing more can run in it."""


def _error(ename: str, evalue: str, traceback_lines=None):
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue,
                                  traceback=traceback_lines or [f"{ename}: {evalue}"])


class SandboxKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel runs inside the jail's command, interrupted by message."""
    jail_prefix = List()
    owner_uid = Any(None)

    def format_kernel_cmd(self, extra_arguments=None):
        return list(self.jail_prefix) + super().format_kernel_cmd(extra_arguments)

    def write_connection_file(self, **kwargs):
        super().write_connection_file(**kwargs)
        if self.owner_uid is not None:   # the sandbox's uid must read it
            os.chown(self.connection_file, self.owner_uid, self.owner_uid)


class HarnessClient(NotebookClient):
    """nbclient with output caps, request cells, and the record of each cell's reply."""

    def __init__(self, nb, options: GradingOptions, **kw):
        super().__init__(nb, timeout=options.cell_timeout, allow_errors=True,
                         interrupt_on_timeout=True, kernel_name="python3",
                         extra_arguments=list(KERNEL_ARGS), record_timing=False,
                         iopub_timeout=OUTPUT_WAIT_S,
                         error_on_timeout={"ename": TIMEOUT_ENAME, "evalue": "",
                                           "traceback": [TIMEOUT_ENAME]}, **kw)
        output_widgets_read_only(self)   # an Output's prints never write to the kernel (a lost reply)
        self.options = options
        self.cell_left = 0
        self.notebook_left = options.notebook_output_kb * 1024
        self.dropped = 0
        self.truncated = []           # notes: which cells lost output
        self.unfinished = []          # cells whose output still arriving after OUTPUT_WAIT_S was lost
        self.output_cut = False
        self.last_reply = None
        self.request_mode = False
        self.request_replies = []     # every WIRE_MIME reply of the running request cell
        self.request_stdout = []
        self.on_cell_executed = self._record_reply
        self.threads = kernel_threads(options)   # a kernel on n threads may use n CPU seconds a second
        self.budget = None            # the CPU time of the cell or request running (cputime.Budget)
        self.over_budget = ""         # why it was stopped ("cpu", "hang", "ceiling"), or ""
        self.cpu_root = None          # the kernel launcher's pid, once started (None: this process)

    async def _async_poll_for_reply(self, msg_id, cell, timeout, task_poll_output_msg,
                                    task_poll_kernel_alive):
        watch = asyncio.ensure_future(self._watch_budget()) if self.budget is not None else None
        try:
            reply = await super()._async_poll_for_reply(msg_id, cell, timeout, task_poll_output_msg,
                                                        task_poll_kernel_alive)
        finally:
            if watch is not None:
                watch.cancel()
        # nbclient gave up waiting for the rest of the output (it cancels the wait) and went on
        self.output_cut = task_poll_output_msg.cancelled()
        return reply

    def note_interactive_figures(self, cell) -> None:
        """A note under a cell that switches matplotlib to a backend drawn by JavaScript in the
        browser (``%matplotlib notebook``, ``widget``, ``ipympl``): a feedback page runs no script,
        so its figures would be missing without a word."""
        if INTERACTIVE_FIGURES.search(cell.source):
            cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=(
                "[a note from the grader: this cell draws figures with an interactive backend (%matplotlib "
                "notebook or widget), which a feedback page cannot show; %matplotlib inline shows them here]\n")))

    def settle_widget_text(self, nb) -> None:
        """Give each widget view in ``nb`` the text its widget shows at the end (widget_text),
        where the widget can be drawn as text; the view itself is kept as it was."""
        for cell in nb.cells:
            for output in cell.get("outputs", []):
                view = output.get("data", {}).get(WIDGET_VIEW)
                if isinstance(view, dict):
                    model_id = str(view.get("model_id", ""))
                    text = widget_text(self.widget_state, model_id)
                    if text is not None:   # no longer than the capped text it replaces, or 200
                        before = str(output["data"].get("text/plain", ""))      # (an Output's prints: more)
                        room = WIDGET_TEXT_CHARS if self.widget_state.get(model_id, {}).get(
                            "_model_name") == "OutputModel" else 200
                        output["data"]["text/plain"] = text[:max(room, len(before))]

    async def _watch_budget(self):
        """While a cell runs: interrupt the kernel once the cell's CPU budget is spent, or it
        hangs (autograder.engine.cputime.Budget); nbclient's own wall-clock timeout is the
        budget's ceiling."""
        while True:
            await asyncio.sleep(WATCH_S)
            why = self.budget.exceeded()
            if why:
                self.over_budget = why
                await ensure_async(self.km.interrupt_kernel())
                return

    def _limit(self, seconds):
        """Start the budget of one cell or request: ``seconds`` of CPU time (None: no limit but
        the cell's, on the wall clock, WALL_CEILING times over)."""
        self.over_budget = ""
        self.budget = None if seconds is None else Budget(seconds, self.threads, self.cpu_root)
        self.timeout = self.options.cell_timeout * WALL_CEILING if self.budget is None else \
            max(1, int(self.budget.wall_ceiling() + 0.999))

    def _record_reply(self, execute_reply=None, **_):
        self.last_reply = execute_reply

    def _timed_out(self) -> bool:
        content = (self.last_reply or {}).get("content", {})
        return content.get("ename") == TIMEOUT_ENAME or bool(self.over_budget)

    def output(self, outs, msg, display_id, cell_index):
        if self.request_mode:
            content = msg.get("content", {})
            if msg["msg_type"] in ("display_data", "execute_result") and WIRE_MIME in content.get("data", {}):
                self.request_replies.append(content["data"][WIRE_MIME])
            elif msg["msg_type"] == "stream" and sum(map(len, self.request_stdout)) < REQUEST_STDOUT_CHARS:
                self.request_stdout.append(str(content.get("text", ""))[:REQUEST_STDOUT_CHARS])
            return None
        size = _output_size(msg)
        allowed = max(0, min(self.cell_left, self.notebook_left))
        if size > allowed:
            content = msg.get("content", {})
            if msg["msg_type"] == "stream" and allowed > 0:
                content["text"] = str(content.get("text", ""))[:allowed]
                self.dropped += size - allowed
                size = allowed
            else:
                self.dropped += size
                return None
        self.cell_left -= size
        self.notebook_left -= size
        return super().output(outs, msg, display_id, cell_index)

    def _update_display_id(self, display_id, msg):
        """An update of an earlier display (``update_display_data``, or a display with the same
        id) replaces its data in every output that shows it, which nbclient does without
        passing through :meth:`output`: here the growth is charged to the same caps, and an
        update that does not fit is dropped (and noted like any capped output)."""
        if self.request_mode:
            return
        targets = [(c, i) for c, idxs in self._display_id_map.get(display_id, {}).items()
                   for i in idxs if c < len(self.nb.cells) and i < len(self.nb.cells[c].outputs)]
        new = _data_size(msg.get("content", {}))
        growth = sum(new - _data_size(self.nb.cells[c].outputs[i]) for c, i in targets)
        if growth > max(0, min(self.cell_left, self.notebook_left)):
            self.dropped += growth
            return
        self.cell_left -= growth
        self.notebook_left -= growth
        super()._update_display_id(display_id, msg)

    def run_cell(self, cell, index, limit):
        """Execute one of the student's cells within ``limit`` seconds; cap its output; mark a
        time limit."""
        self.cell_left = self.options.cell_output_kb * 1024
        self.dropped = 0
        self.last_reply = None
        self.output_cut = False
        before = self.notebook_left
        self._limit(limit)
        try:
            self.execute_cell(cell, index)
        finally:
            self.budget = None
        if self.output_cut:
            cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=(
                f"[output lost: the rest of this cell's output was still arriving {self.iopub_timeout} s "
                "after the cell finished and was not kept]\n")))
            self.unfinished.append(index)
        kept = before - self.notebook_left
        if self.cell_left <= 0 or self.notebook_left <= 0 or self.dropped:
            note = (f"[output capped: only {kept // 1024} KiB of this cell's output were kept "
                    f"(limits: {self.options.cell_output_kb} KiB per cell, "
                    f"{self.options.notebook_output_kb} KiB per notebook)]\n")
            cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=note))
            self.truncated.append(index)
        if self._timed_out():
            cell.outputs = [o for o in cell.outputs if not (
                o.get("output_type") == "error" and o.get("ename") == "KeyboardInterrupt")]
            cell.outputs.append(_error(TIMEOUT_ENAME, _timeout_text(self.options, limit)))
            return True
        return False

    def run_request(self, code: str, timeout):
        """Execute a request cell within ``timeout`` seconds of CPU time (None: see _limit); returns (its replies, timed out?, error text: why the cell
        did not end cleanly, "" when its execute_reply has status ok)."""
        cell = nbformat.v4.new_code_cell(code)
        self.request_mode, self.request_replies = True, []
        self.last_reply = None
        self._limit(timeout)
        try:
            self._execute_aside(cell)
        except DeadKernelError:
            raise KernelGone("during a call from a test") from None
        finally:
            self.request_mode = False
            self.budget = None
        if self._timed_out():
            return None, True, ""
        content = (self.last_reply or {}).get("content", {})
        status = content.get("status")
        error = "" if status == "ok" else f"{content.get('ename')}: {content.get('evalue')}" \
            if status == "error" else f"the cell ended with status {status!r}"
        return list(self.request_replies), False, error

    def _execute_aside(self, cell):
        """Execute a cell that is not part of the notebook (nbclient stores each executed cell
        back at its index, so it gets a temporary place at the end), without history."""
        self.nb.cells.append(cell)
        try:
            self.execute_cell(cell, len(self.nb.cells) - 1, store_history=False)
        finally:
            self.nb.cells.pop()

    def responsive(self) -> bool:
        """After a time limit: does the interrupted kernel answer again within RECOVER_S (on the
        wall clock: an answer, not work)?"""
        saved = self.timeout
        self.timeout = RECOVER_S
        self.budget, self.over_budget = None, ""
        try:
            self.last_reply = None
            self.request_mode = True
            self._execute_aside(nbformat.v4.new_code_cell("None"))
            return not self._timed_out()
        except DeadKernelError:
            return False
        finally:
            self.request_mode = False
            self.timeout = saved


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_TEXT_CHARS = 4000   # of a widget's text written in place of its view (an Output's prints)
_TAG = re.compile(r"<[^>]*>")


def widget_text(states: dict, model_id: str, depth: int = 0):
    """What a widget shows, as text, from the kernel's last word on its state (``states``:
    nbclient's widget_state, {model id: state}); None for a widget this cannot draw.

    A feedback page runs no script, so a widget view shows its output's text/plain, which is the
    widget's text when it was first displayed: a tqdm bar read "0/5" after the loop had finished.
    Drawn here: text and HTML labels (tags dropped), progress bars (as a bar of ten cells),
    boxes of those (tqdm's notebook bar is a box of a label, a bar and a label) and an
    ``ipywidgets.Output``'s captured text (what was printed into it, and its displays' plain text)."""
    state = states.get(model_id) or {}
    name = state.get("_model_name", "")
    if depth > 4 or not name:
        return None
    if name == "OutputModel":
        outputs = state.get("outputs") if isinstance(state.get("outputs"), list) else []
        return "".join(str(o.get("text", "")) if o.get("output_type") == "stream" else
                       str((o.get("data") or {}).get("text/plain", "")) + "\n"
                       for o in outputs if isinstance(o, dict))
    if name in ("HTMLModel", "LabelModel", "TextModel", "HTMLMathModel"):
        return html.unescape(_TAG.sub("", str(state.get("value", "")))).replace("\xa0", " ").replace("\u2007", " ")
    if name in ("FloatProgressModel", "IntProgressModel"):
        try:
            low, high, value = (float(state.get(k, d)) for k, d in (("min", 0), ("max", 100), ("value", 0)))
        except (TypeError, ValueError):
            return None
        filled = round(10 * min(1.0, max(0.0, (value - low) / (high - low)))) if high > low else 0
        return "|" + "█" * filled + " " * (10 - filled) + "|"
    if name in ("HBoxModel", "VBoxModel", "BoxModel"):
        parts = [widget_text(states, str(c).removeprefix("IPY_MODEL_"), depth + 1)
                 for c in state.get("children", [])]
        if any(p is None for p in parts):
            return None
        return ("\n" if name == "VBoxModel" else "").join(parts)
    return None


def _output_size(msg) -> int:
    """Characters of everything an output message keeps in the notebook, as the caps count them:
    a stream's text; an error's name, value and traceback; a display's data and its metadata
    (a display of one character can carry megabytes of metadata)."""
    content = msg.get("content", {})
    if msg["msg_type"] == "stream":
        return len(str(content.get("text", "")))
    if msg["msg_type"] == "error":
        return (sum(len(str(x)) for x in content.get("traceback", []))
                + len(str(content.get("ename", ""))) + len(str(content.get("evalue", ""))))
    return _data_size(content)


def _data_size(bundle) -> int:
    """Characters of a display's data and metadata (``bundle``: a message's content or an
    output), as the caps count them."""
    def size(v):
        return len(v) if isinstance(v, str) else len(json.dumps(v, default=str))
    return (sum(size(v) for v in (bundle.get("data") or {}).values())
            + (size(bundle["metadata"]) if bundle.get("metadata") else 0))


def _timeout_text(options, limit, what="this cell") -> str:
    if limit < options.cell_timeout:
        return (f"{what} was stopped when the whole notebook reached its time limit "
                f"({options.notebook_timeout} s of CPU time)")
    return (f"{what} ran longer than its time limit ({options.cell_timeout} s of CPU time, as the operating "
            "system counts it, whatever else the machine was doing) and was stopped: look for an endless "
            "loop, a computation far larger than the exercise needs, or a wait that never ends")
