"""The trusted harness: a submission's own cells run in its sandboxed kernel, its tests run here.

``run_notebook`` starts the student's kernel inside the OS sandbox (:mod:`autograder.jail`), runs
every cell that is not a graded test there with nbclient, and runs every graded test cell in this
process, in a fresh namespace where each name the test uses but does not define is fetched from
the kernel as data (:mod:`autograder.wire`): values are rebuilt as plain Python types and tensors,
student functions become :class:`StudentFunction` proxies. So nothing the student's process
prints, patches or returns can make a test pass: a test passes only when its own code, here,
runs to the end. A test that ends in a number scores that much (nbgrader's partial credit),
unless the number may carry a student value (:mod:`autograder.partial`): see :func:`run_test`.
Hidden test source never reaches the kernel. Outputs are capped per cell and per notebook; a
cell or a test past its time limit fails with a message that says so.

``python -m autograder.harness JOB.json`` is how the grader runs it (autograder.sandbox): a
separate process per submission, which writes the executed notebook and a JSON report.
"""
import ast
import builtins
import contextlib
import io
import json
import linecache
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

# jsonschema (under nbformat) imports rfc3987_syntax when installed, which builds a grammar for
# seconds at import; notebooks never use that format, so the harness starts without it.
sys.modules.setdefault("rfc3987_syntax", None)

import nbformat  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402
from nbclient import NotebookClient  # noqa: E402
from nbclient.exceptions import DeadKernelError  # noqa: E402
from traitlets import Any, List  # noqa: E402

from . import kernel_server, wire  # noqa: E402
from .wire import WIRE_MIME, Opaque, WireError, decode, encode  # noqa: E402

from . import jail, partial  # noqa: E402
from .config import KERNEL_ARGS  # noqa: E402
from .options import GradingOptions  # noqa: E402
from .protocol import Job, KernelReply, KernelRequest, Report  # noqa: E402

__all__ = ["run_notebook", "is_test_cell", "StudentFunction", "StudentTimeout", "KernelGone",
           "TIMEOUT_ENAME", "main"]

TIMEOUT_ENAME = "CellTimeoutError"
NOT_RUN_ENAME = "NotExecuted"
KERNEL_MODULE = "_autograder_wire"   # the name of autograder.wire's copy inside the kernel
RECOVER_S = 10          # after a time limit, how long an interrupted kernel may take to answer


def is_test_cell(cell) -> bool:
    """An autograded test cell: a graded code cell that is not a solution cell."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")


class StudentTimeout(BaseException):
    """A test, or a student function it called, ran past the cell's time limit.

    A BaseException, so that no ``except Exception`` in a test can swallow it."""


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


# ---------------------------------------------------------------------------------------------
# Values and functions of the student's notebook, as the trusted side sees them


class StudentFunction:
    """A student function or callable, called through the kernel; arguments and results cross as
    data (:mod:`autograder.wire`). An exception inside it is raised here as the same built-in type
    with its message. A tensor argument changed in place fails the call (AssertionError with a
    hint) and never changes the test's own tensor; autograd flows through the call when the
    arguments require grad."""

    def __init__(self, link, ref: int, type_name: str, name: str):
        self._link, self._ref, self._type = link, ref, type_name
        self.__name__ = name or type_name

    def __call__(self, *args, **kwargs):
        return self._link.call(self, args, kwargs)

    def _watched_call(self, args, kwargs, forbid):
        """The call watched in the kernel by mlexp.rules (the exercise's stated rules): returns
        (result, the trace as data, or None when the kernel sent none)."""
        return self._link.call(self, tuple(args), dict(kwargs), watch=[str(m) for m in forbid])

    def __repr__(self):
        return f"<{self._type} {self.__name__} from the student's notebook>"


class StudentNamespace(dict):
    """The globals of one test cell: what the test defines, else the student's names, fetched
    from the kernel on first use. Built-in names and dunder names are never fetched, so a student
    global called ``abs`` or ``print`` does not replace the built-in in a test."""

    def __init__(self, link):
        super().__init__(__builtins__=builtins, __name__="__main__")
        self._link = link
        self.fetched = set()     # the names whose value came from the kernel (autograder.partial)

    def _fetch(self, name):
        if not isinstance(name, str) or name.startswith("__") or hasattr(builtins, name):
            raise KeyError(name)
        value = self._link.lookup(name)
        dict.__setitem__(self, name, value)
        self.fetched.add(name)
        return value

    def __missing__(self, name):
        return self._fetch(name)

    def __contains__(self, name):
        if dict.__contains__(self, name):
            return True
        try:
            self._fetch(name)
        except KeyError:
            return False
        return True

    def get(self, name, default=None):
        try:
            return self[name]
        except KeyError:
            return default


class _RemoteBackward:
    """Builds the torch.autograd.Function that sends a backward pass to the kernel."""
    fn = None

    @classmethod
    def get(cls):
        if cls.fn is None:
            import torch

            class RemoteBackward(torch.autograd.Function):
                @staticmethod
                def forward(ctx, link, graph, n_in, *tensors):
                    ctx.link, ctx.graph, ctx.n_in = link, graph, n_in
                    return tuple(t.detach().clone() for t in tensors[n_in:])

                @staticmethod
                def backward(ctx, *grads):
                    got = ctx.link.backward(ctx.graph, grads, ctx.n_in)
                    return (None, None, None, *got, *([None] * len(grads)))

            cls.fn = RemoteBackward
        return cls.fn


def _replace_tensors(value, mapping):
    """``value`` with each tensor found in ``mapping`` (by identity) replaced."""
    if id(value) in mapping:
        return mapping[id(value)]
    if isinstance(value, (list, tuple)):
        items = [_replace_tensors(v, mapping) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {k: _replace_tensors(v, mapping) for k, v in value.items()}
    return value


class KernelLink:
    """The harness's channel to the kernel: one request cell per lookup or call (not stored in
    the kernel's history), one reply read from the display message of type WIRE_MIME."""

    def __init__(self, client):
        self.client = client
        self.deadline = None     # the current test's end (time.monotonic())
        self.busy = False        # a request is running (it has its own time limit)
        self.expired = False     # the test's alarm rang while a request was running
        self.blocked = False     # a request ran but sent no reply: the notebook intercepted it
        self.module = KERNEL_MODULE   # the name of the kernel side's copy the requests go to

    def request(self, req: KernelRequest, what: str) -> KernelReply:
        """Send ``req`` to the kernel within the test's time; its reply. Raises StudentTimeout
        past the limit and RuntimeError when no reply came (the channel was blocked)."""
        remaining = None if self.deadline is None else self.deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise StudentTimeout(f"time ran out before {what}")
        code = (f"__import__('sys').modules[{self.module!r}]"
                f".kernel_request({req.to_json()!r})")
        self.busy = True
        try:
            reply, timed_out, error = self.client.run_request(code, remaining)
        finally:
            self.busy = False
        if timed_out or self.expired:
            raise StudentTimeout(f"{what} did not finish within the time limit")
        if not isinstance(reply, dict):   # no reply, or not one the kernel side writes
            self.blocked = True
            raise RuntimeError(f"the grader could not read {what} from the notebook's kernel"
                               + (f" ({error})" if error else "") + ": was the grader's channel "
                               f"(sys.modules[{KERNEL_MODULE!r}]) removed or replaced by a cell?")
        return KernelReply.from_dict(reply)

    def install(self, module: str = KERNEL_MODULE) -> None:
        """Put the kernel side (:mod:`autograder.wire`'s codec and :mod:`autograder.kernel_server`)
        into the kernel, before any student cell.

        The student library ``mlexp`` carries nothing of the grader, so the module's source is
        sent as one request cell (no file of the grader is mounted into the sandbox) and kept
        as ``sys.modules[KERNEL_MODULE]``. It is the untrusted side's copy: a student cell may
        replace it, which can only change what the student's own names look like, and a request
        it then fails to answer is reported as blocked."""
        source = "\n".join(Path(m.__file__).read_text(encoding="utf-8") for m in (wire, kernel_server))
        setup = ", m.kernel_safe_messages()" if module == KERNEL_MODULE else ""   # once per kernel
        code = (f"(lambda m: (__import__('builtins').exec(__import__('builtins').compile("
                f"{source!r}, '<autograder.wire>', 'exec'), m.__dict__), "
                f"__import__('sys').modules.__setitem__(m.__name__, m){setup}))"
                f"(__import__('types').ModuleType({module!r}));")
        _reply, timed_out, error = self.client.run_request(code, RECOVER_S)
        if timed_out or error:
            self.blocked = True
            raise RuntimeError("the grader could not set up its channel in the notebook's kernel"
                               + (f" ({error})" if error else " (timed out)"))
        self.module = module

    def lookup(self, name: str):
        """The student's global ``name`` as data or a proxy; KeyError when it has none (or it
        is a module)."""
        reply = self.request(KernelRequest.lookup(name), f"`{name}`")
        if reply.missing or reply.is_module:
            raise KeyError(name)
        if reply.error is not None:
            raise RuntimeError(f"the grader could not read `{name}`: {reply.error.get('message', '')}")
        return self._decode(reply.value, f"`{name}`")

    def _decode(self, node, where, leaves=None):
        try:
            value = decode(node, leaves=leaves, ref_factory=lambda i, t, n: StudentFunction(self, i, t, n))
        except WireError as exc:
            raise TypeError(f"{where} could not be read from the notebook: {exc}") from None
        if isinstance(value, Opaque):
            value._where = where
        return value

    def call(self, fn: StudentFunction, args: tuple, kwargs: dict, watch=None):
        """Call ``fn`` in the kernel. ``watch`` (a list of module names): run it under
        mlexp.rules.watching there and return (value, trace data) instead of the value."""
        import torch
        grad_leaves = [] if torch.is_grad_enabled() else None
        try:
            args_node = encode(tuple(args), grad_leaves=grad_leaves)
            kwargs_node = encode(dict(kwargs), grad_leaves=grad_leaves)
        except WireError as exc:
            raise TypeError(f"the test passed {fn.__name__} something that cannot be sent to the "
                            f"notebook ({exc}); this is a fault of the test") from None
        grad = bool(grad_leaves)
        req = KernelRequest.call(fn._ref, args_node, kwargs_node, grad, watch)
        reply = self.request(req, f"the call of {fn.__name__}")
        if reply.error is not None:
            raise reply.raised()
        out_leaves = {}
        value = self._decode(reply.value, f"the value returned by {fn.__name__}",
                             leaves=out_leaves if grad else None)
        self._refuse_in_place(fn, args, kwargs, reply)
        if grad and reply.graph and out_leaves:
            outputs = [out_leaves[i].detach() for i in sorted(out_leaves)]
            linked = _RemoteBackward.get().apply(self, reply.graph, len(grad_leaves),
                                                 *grad_leaves, *outputs)
            value = _replace_tensors(value, {id(out_leaves[i]): t
                                             for i, t in zip(sorted(out_leaves), linked)})
        if watch is not None:
            trace = reply.watch
            return value, (trace if isinstance(trace, dict) else None)
        return value

    def _refuse_in_place(self, fn, args, kwargs, reply):
        """Fail the call when the student function changed a tensor argument in place.

        The arguments the kernel received are its own copies; what it did to them never flows
        back into the test's tensors (a test that computes its expected value after the call
        must see the inputs it made). Changing an argument is the exercise's mistake, not a
        value the test can use, so the call raises AssertionError with a hint naming the
        parameter. Raises nothing when no tensor argument changed.
        """
        import torch
        try:
            new_args = decode(reply.args)
            new_kwargs = decode(reply.kwargs)
        except WireError:
            return
        names = reply.names
        names = [n if isinstance(n, str) and n.isidentifier() else "" for n in names]
        pairs = [(names[i] if i < len(names) and names[i] else f"argument {i + 1}", old, new)
                 for i, (old, new) in enumerate(zip(args, new_args or []))]
        pairs += [(str(k) if str(k).isidentifier() else "an argument", kwargs.get(k), v)
                  for k, v in (new_kwargs or {}).items()]
        for name, old, new in pairs:
            if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and (
                    old.shape != new.shape or old.dtype != new.dtype or not torch.equal(old, new)):
                raise AssertionError(f"Hint: {fn.__name__} changed {name} in place. Return a new "
                                     "tensor and leave the arguments as they were given.")

    def backward(self, graph, grads, n_in):
        """Send the gradients of call ``graph``'s outputs; the ``n_in`` input gradients."""
        reply = self.request(KernelRequest.backward(graph, encode(list(grads))),
                             "the backward pass through the notebook's function")
        if reply.error is not None:
            raise reply.raised()
        got = self._decode(reply.value, "the gradients")
        if not isinstance(got, list) or len(got) != n_in:
            return [None] * n_in
        return got


# ---------------------------------------------------------------------------------------------
# Running a notebook


class HarnessClient(NotebookClient):
    """nbclient with output caps, request cells, and the record of each cell's reply."""

    def __init__(self, nb, options: GradingOptions, **kw):
        super().__init__(nb, timeout=options.cell_timeout, allow_errors=True,
                         interrupt_on_timeout=True, kernel_name="python3",
                         extra_arguments=list(KERNEL_ARGS), record_timing=False,
                         error_on_timeout={"ename": TIMEOUT_ENAME, "evalue": "",
                                           "traceback": [TIMEOUT_ENAME]}, **kw)
        self.options = options
        self.cell_left = 0
        self.notebook_left = options.notebook_output_kb * 1024
        self.dropped = 0
        self.truncated = []           # notes: which cells lost output
        self.last_reply = None
        self.request_mode = False
        self.request_reply = None
        self.request_stdout = []
        self.on_cell_executed = self._record_reply

    def _record_reply(self, execute_reply=None, **_):
        self.last_reply = execute_reply

    def _timed_out(self) -> bool:
        content = (self.last_reply or {}).get("content", {})
        return content.get("ename") == TIMEOUT_ENAME

    def output(self, outs, msg, display_id, cell_index):
        if self.request_mode:
            content = msg.get("content", {})
            if msg["msg_type"] == "display_data" and WIRE_MIME in content.get("data", {}):
                self.request_reply = content["data"][WIRE_MIME]
            elif msg["msg_type"] == "stream" and sum(map(len, self.request_stdout)) < 65536:
                self.request_stdout.append(str(content.get("text", ""))[:65536])
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
        new = _data_size(msg.get("content", {}).get("data", {}))
        growth = sum(new - _data_size(self.nb.cells[c].outputs[i].get("data", {})) for c, i in targets)
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
        before = self.notebook_left
        self.timeout = max(1, int(limit + 0.999))
        try:
            self.execute_cell(cell, index)
        finally:
            self.timeout = self.options.cell_timeout
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
        """Execute a request cell; returns (reply or None, timed out?, error text)."""
        cell = nbformat.v4.new_code_cell(code)
        self.request_mode, self.request_reply = True, None
        self.last_reply = None
        saved = self.timeout
        if timeout is not None:
            self.timeout = max(1, int(timeout + 0.999))
        try:
            self._execute_aside(cell)
        except DeadKernelError:
            raise KernelGone("during a call from a test") from None
        finally:
            self.request_mode = False
            self.timeout = saved
        if self._timed_out():
            return None, True, ""
        content = (self.last_reply or {}).get("content", {})
        error = f"{content.get('ename')}: {content.get('evalue')}" if content.get("status") == "error" else ""
        return self.request_reply, False, error

    def _execute_aside(self, cell):
        """Execute a cell that is not part of the notebook (nbclient stores each executed cell
        back at its index, so it gets a temporary place at the end), without history."""
        self.nb.cells.append(cell)
        try:
            self.execute_cell(cell, len(self.nb.cells) - 1, store_history=False)
        finally:
            self.nb.cells.pop()

    def responsive(self) -> bool:
        """After a time limit: does the interrupted kernel answer again within RECOVER_S?"""
        saved = self.timeout
        self.timeout = RECOVER_S
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


def _output_size(msg) -> int:
    content = msg.get("content", {})
    if msg["msg_type"] == "stream":
        return len(str(content.get("text", "")))
    if msg["msg_type"] == "error":
        return sum(len(str(x)) for x in content.get("traceback", [])) + len(str(content.get("evalue", "")))
    return _data_size(content.get("data", {}))


def _data_size(data) -> int:
    """Characters of a display's data bundle, as the caps count them."""
    return sum(len(v) if isinstance(v, str) else len(json.dumps(v)) for v in data.values())


def _timeout_text(options, limit, what="this cell") -> str:
    if limit < options.cell_timeout:
        return (f"{what} was stopped when the whole notebook reached its time limit "
                f"({options.notebook_timeout} s)")
    return (f"{what} ran longer than its time limit ({options.cell_timeout} s) and was stopped: "
            "look for an endless loop or a computation far larger than the exercise needs")


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
def _alarm(link, seconds):
    """Raise StudentTimeout in this (main) thread after ``seconds``, except while a request to
    the kernel is running (that request has its own time limit)."""
    import threading
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(*_):
        if link.busy:
            link.expired = True
        else:
            raise StudentTimeout("the test ran past its time limit")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_test(cell, link, options, limit, show_call_output=False) -> str:
    """Run a graded test cell here within ``limit`` seconds, in a fresh StudentNamespace; set its
    outputs. Returns a reason for a person to look at the submission, or "".

    A test that ends in an expression whose value is a number awards that many of its points,
    nbgrader's partial credit: the value is evaluated here and written as the cell's
    ``execute_result`` (what nbgrader's ``determine_grade`` reads), capped at the cell's points
    (autograder.partial.credit). When the expression may carry a value of the student's
    (autograder.partial.student_derived, with the names this test fetched from the kernel), the
    test fails with PartialCreditRefused instead and the reason is returned.
    """
    meta = cell.metadata.get("nbgrader", {})
    grade_id = meta.get("grade_id", "test")
    filename = f"<test cell {grade_id}>"
    source = cell.source
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    out = _Capped(options.cell_output_kb * 1024)
    error, result, review = None, None, ""
    link.client.request_stdout = []
    link.expired = False
    link.deadline = time.monotonic() + limit
    namespace = StudentNamespace(link)
    try:
        tree = ast.parse(source, filename)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) \
            and not partial.ends_silenced(source, tree.body[-1]) else None
        code = compile(tree, filename, "exec")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), \
                _alarm(link, limit):
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
        error = _error(TIMEOUT_ENAME, f"{_timeout_text(options, limit, 'this test')} ({exc})")
    except KernelGone:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:   # the test failed: its exception is the verdict
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
        lines = ["Traceback (most recent call last):\n"] + traceback.format_list(frames)
        lines += traceback.format_exception_only(type(exc), exc)
        error = _error(type(exc).__name__, str(exc), [ln.rstrip("\n") for ln in lines])
    finally:
        link.deadline = None
    text = out.getvalue()
    if show_call_output:
        text = "".join(link.client.request_stdout) + text
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


def _watch_list(nb) -> list:
    """Modules the tamper snapshot imports first: those the notebook mentions (so that their own
    import-time changes, such as matplotlib's inline hooks, are not blamed on the student)."""
    import re
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    wanted = ["math", "operator", "functools", "json"]
    for mod, pattern in (("numpy", r"\bnumpy\b|\bnp\."), ("torch", r"\btorch\b"),
                         ("torch.nn.functional", r"\bF\.|functional"),
                         ("matplotlib.pyplot", r"matplotlib|plt\."),
                         ("mlexp", r"\bmlexp\b"), ("mlexp.ops", r"mlexp\.ops")):
        if re.search(pattern, text):
            wanted.append(mod)
    return wanted


CHANNEL_NAMES = (KERNEL_MODULE, "kernel_request", WIRE_MIME)   # what only the grader's code names


def _tamper_reports(link) -> list:
    """What the student's code changed in its kernel, asked twice: of the copy of the kernel
    side that took the snapshot, and of a fresh copy sent in now under a random name (the
    notebook cannot have replaced it in advance). A report that cannot be read is itself a
    finding, so silencing the channel flags the submission instead of clearing it."""
    import secrets
    found = []
    for fresh in (False, True):
        try:
            if fresh:
                link.install(f"{KERNEL_MODULE}_{secrets.token_hex(8)}")
            reply = link.request(KernelRequest.tamper_report(), "the kernel's tamper report")
        except RuntimeError:
            continue   # blocked: said by the caller
        value = reply.value
        if not isinstance(value, list):
            found.append("the kernel's tamper report (it could not be read)")
            continue
        found += [str(x)[:200] for x in value if str(x)[:200] not in found]
    return found


def _names_the_channel(cell) -> bool:
    """A student cell whose code names the grader's channel (read here, on the trusted side)."""
    return any(name in cell.source for name in CHANNEL_NAMES)


def run_notebook(nb, *, options: GradingOptions, job_dir: Path, data_files=(), course_root=None,
                 sandbox=True, show_call_output=False, mode="autograde", cwd=None):
    """Execute ``nb`` (its tests here, the rest in a sandboxed kernel); returns (nb, report).

    ``job_dir``: a folder of this run (0711 or private); ``data_files``: files put read-only in
    the kernel's working folder; ``sandbox=False`` runs the kernel as a plain local process in
    ``cwd`` (only where the caller accepts that risk). ``mode`` is the kernel's
    NBGRADER_EXECUTION ("autograde" or "validate"); ``show_call_output`` keeps what student
    functions print while tests call them (the self-check) in the tests' output. The report has ``review`` (reasons a person should look),
    ``timeouts`` (cells that ran out of time), ``kernel`` (why the kernel ended early, or ""),
    ``capped`` (cell indexes whose output was cut), ``tampered`` (what the student's code changed).
    """
    job_dir = Path(job_dir)
    for cell in nb.cells:   # nothing of an earlier run counts
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    ipc = job_dir / "ipc"
    ipc.mkdir(exist_ok=True)
    uid = jail.pick_uid() if sandbox else None
    km = SandboxKernelManager(kernel_name="python3", transport="ipc", ip=str(ipc / "kernel"),
                              connection_file=str(ipc / "kernel.json"))
    km.kernel_spec.interrupt_mode = "message"
    # The jail's own environment (the kernel's is cleared by bubblewrap): nothing of the grader's.
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG", "LC_ALL")}
    if sandbox:
        if uid is not None:
            os.chown(ipc, uid, uid)
        km.owner_uid = uid
        km.jail_prefix = jail.sandbox_command(ipc_dir=ipc, job_dir=job_dir, data_files=data_files,
                                              options=options, course_root=course_root, uid=uid,
                                              mode=mode)
        cwd = job_dir
    else:
        env = {**os.environ, "NBGRADER_EXECUTION": mode, "MPLBACKEND": jail.INLINE_BACKEND}
        cwd = cwd or job_dir
    client = HarnessClient(nb, options, km=km)
    link = KernelLink(client)
    report = Report()
    deadline = time.monotonic() + options.notebook_timeout
    count = 0
    stopped = ""
    channel_cell = None   # the first student cell that names the grader's channel
    try:
        with client.setup_kernel(env=env, cwd=str(cwd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
            link.install()
            link.request(KernelRequest.snapshot(_watch_list(nb)), "the kernel's snapshot")
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                if stopped:
                    if is_test_cell(cell):
                        cell.outputs = [_error(NOT_RUN_ENAME, f"this test did not run: {stopped}")]
                    continue
                limit = min(options.cell_timeout, deadline - time.monotonic())
                if limit <= 0.5:
                    stopped = f"the notebook ran past its {options.notebook_timeout} s limit"
                    report.review.append(stopped + " and was stopped")
                    if is_test_cell(cell):
                        cell.outputs = [_error(NOT_RUN_ENAME, f"this test did not run: {stopped}")]
                    continue
                timed_out = False
                if is_test_cell(cell):
                    review = run_test(cell, link, options, limit, show_call_output)
                    if review:
                        report.review.append(review)
                    timed_out = any(o.get("ename") == TIMEOUT_ENAME for o in cell.outputs)
                elif cell.source.strip():
                    if _names_the_channel(cell) and channel_cell is None:
                        channel_cell = index + 1
                    timed_out = client.run_cell(cell, index, limit)
                if cell.source.strip():
                    count += 1
                    cell.execution_count = count
                if timed_out:
                    grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
                    report.timeouts.append(grade_id or f"cell {index + 1}")
                    if limit < options.cell_timeout:
                        stopped = f"the notebook ran past its {options.notebook_timeout} s limit"
                        report.review.append(stopped + " and was stopped")
                    if not client.responsive():
                        stopped = ("the kernel did not stop after a cell ran past its time limit, "
                                   "so it was shut down")
                        report.kernel = stopped
            if not stopped:
                report.tampered = _tamper_reports(link)
            if link.blocked:
                report.tampered.append("the grader's requests to the kernel (they were "
                                          "blocked or rewritten)")
            if channel_cell is not None:
                report.tampered.append(f"the grader's channel to the kernel (cell {channel_cell} "
                                          "names it)")
    except (KernelGone, DeadKernelError) as exc:
        report.kernel = f"the kernel died {exc}" if isinstance(exc, KernelGone) else "the kernel died"
        for cell in nb.cells:
            if is_test_cell(cell) and cell.get("execution_count") is None:
                cell.outputs = [_error(NOT_RUN_ENAME, f"this test did not run: {report.kernel}")]
    except StudentTimeout as exc:   # the snapshot or the report: the kernel is stuck
        report.kernel = f"the kernel stopped answering ({exc})"
    except Exception as exc:   # the kernel never started, a broken channel: report it
        import traceback as _tb; _tb.print_exc()
        report.kernel = f"{type(exc).__name__}: {exc}"[:300]
    for cell in nb.cells:    # a test that never ran scores nothing
        if is_test_cell(cell) and cell.get("execution_count") is None and not any(
                o.get("output_type") == "error" for o in cell.get("outputs", [])):
            cell.outputs = [_error(NOT_RUN_ENAME, "this test did not run: "
                                   + (report.kernel or stopped or "the grader stopped before it"))]
    report.capped = client.truncated
    return nb, report.to_dict()


def main(argv=None) -> int:
    """``python -m autograder.harness JOB.json``: run the job's notebook, write its results."""
    argv = sys.argv[1:] if argv is None else argv
    job = Job.read(argv[0])
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # die with the grader (PR_SET_PDEATHSIG)
    except (OSError, AttributeError):
        pass
    if job.parent_pid and os.getppid() != job.parent_pid:
        return 3   # the grader is already gone
    nb = nbformat.read(job.input, as_version=4)
    nb, report = run_notebook(nb, options=job.options, job_dir=Path(job.job_dir),
                              data_files=[Path(p) for p in job.data_files],
                              course_root=job.course_root, sandbox=job.sandbox,
                              show_call_output=job.show_call_output, mode=job.mode, cwd=job.cwd)
    # A string the notebook made may hold lone surrogates (an assertion's message quoting a
    # returned value): written out as text, since a file of UTF-8 text cannot hold them.
    nbformat.write(nbformat.from_dict(wire.visible(nb)), job.output)
    Path(job.report).write_text(json.dumps(wire.visible(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
