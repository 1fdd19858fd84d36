"""The room: where the graded calls of a "write it yourself" exercise run (issue 51).

A lesson's test may state that an answer must not use a library module:
``rules.write_it_yourself(fn, ..., forbid=("mlexp.ops",))`` (and ``no_loop``, ``bounded``,
``summed_work``, ``in_time``, ``call`` with ``forbid``). Watching ``fn`` inside the student's
kernel, or reading its source, can only ever be evidence: Python has more routes to a module
than any list of spellings, and a watch inside the student's process reports what that
process allows. So the values that earn such an exercise's points are computed where the
forbidden code does not exist:

- **A second kernel**, in the same OS sandbox as the student's (:mod:`autograder.engine.jail.jail`),
  whose view of the library has each forbidden module replaced by an empty read-only folder or
  file (its source and byte code both: ``sandbox_command(hide=...)``). It is a fresh process, so
  the modules are not in its memory either. Whatever route the student's code takes to the
  library (another module's attributes, text run with ``exec``, a docstring's examples, a
  function that behaves differently while watched) finds nothing there.
- **The student's function is defined in it from the notebook's own statements**: before a test
  cell that uses a ruled name, the trusted side follows that name's bindings as the notebook
  holds them when the test runs (:class:`autograder.engine.audit_names.Bindings`: its ``def``,
  the imports, helpers, classes and constants it reads, in turn, from the student's cells and
  the lesson's) and sends those statements, in notebook order, each on its own so that one that
  fails (an import of the forbidden module, a line that needs a value the room lacks) does not
  stop the rest. A loop over heads, a helper, a class, recursion, ``math`` or ``functools``
  runs as it did in the notebook; statements that are not bindings (experiments, plots, prints,
  ``%timeit``, ``!pip``) are never sent.
- **Every test cell's use of a ruled name** (the rule's own call and every other call the tests
  make of it, visible or hidden) goes to the room; the student's kernel still runs the notebook
  (its experiments, its figures) and answers every other name.

A ruled function that the room cannot define (it was made from text the notebook never binds,
or its definition needs the forbidden module) or that fails there for want of the forbidden
module fails its test with the rule's hint. What this does not decide: a ruled function that
reads a module-level value the notebook changed with a statement that is not a binding
(``box.append(...)`` is followed; ``torch.manual_seed(...)`` before a global ``W = torch.randn(...)``
is not) sees the room's value; the lessons' ruled functions read their arguments.
"""
from __future__ import annotations

import ast
import os
import re
import stat
import subprocess
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from autograder.cells import is_test_cell
from autograder.engine.audit import RULE_HINT, _parse, _rules_of
from autograder.engine.audit_code import code_in_strings
from autograder.engine.audit_names import Bindings, closure, free_loads
from autograder.engine.calls import KernelLink
from autograder.engine.cputime import CpuGroup
from autograder.engine.jail import jail
from autograder.engine.notebook_client import HarnessClient, KernelGone, SandboxKernelManager, StudentTimeout
from autograder.engine.room_guard import STOP_FILE, guard_program

__all__ = ["ruled_names", "room_program", "room_statements", "Room", "RoomLink"]

def ruled_names(nb) -> dict:
    """{function name: (forbid modules, instead)} of every rule with a ``forbid`` in the
    notebook's test cells (a name ruled by several tests: the union of their modules)."""
    found = {}
    for cell in nb.cells:
        if cell.cell_type != "code" or not is_test_cell(cell):
            continue
        for fn, forbid, instead, _rule, _over in _rules_of(cell.source):
            if not forbid:
                continue
            modules, text = found.get(fn, ((), ""))
            found[fn] = (tuple(dict.fromkeys(modules + tuple(forbid))), text or instead)
    return found


# Top-level calls that set how the library computes (threads, default dtype, determinism, seeds):
# not bindings, but a ruled function computes in the room as in the notebook only with them.
_SETTINGS = re.compile(r"^(torch\.(set_\w+|use_\w+|manual_seed)|(np|numpy)\.(random\.seed|set_\w+)|random\.seed)$")


def _setting(stmt) -> bool:
    """A statement like ``torch.set_num_threads(1)`` or ``torch.backends.cudnn.benchmark = False``."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return bool(_SETTINGS.match(ast.unparse(stmt.value.func)))
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute):
        return ast.unparse(stmt.targets[0]).startswith("torch.backends.")
    return False


def _statements(nb):
    """(Bindings of every code cell that is not a test, {id(statement): (cell, part, position,
    statement)}, [the settings statements, as (cell, statement)])."""
    bindings, where, settings = Bindings(), {}, []
    for number, cell in enumerate(nb.cells, start=1):
        if cell.cell_type != "code" or is_test_cell(cell):
            continue
        tree = _parse(cell.source)
        if tree is None:
            continue
        trees = [tree] + [t for t in map(_parse, code_in_strings(tree)) if t is not None]
        for part, t in enumerate(trees):
            for position, stmt in enumerate(t.body):
                where[id(stmt)] = (number, part, position, stmt)
                if _setting(stmt):
                    settings.append((number, stmt))
            bindings.add(t, number, lambda _node: "")
    return bindings, where, settings


def room_program(nb, names, before: int, skip=frozenset()) -> str:
    """:func:`room_statements` as one program."""
    return "".join(code for _name, code in room_statements(nb, names, before, skip))


def room_statements(nb, names, before: int, skip=frozenset()) -> list:
    """The Python that defines ``names`` in a room as the notebook holds them when its cell
    number ``before`` (1-based, the test cell) runs: every statement their bindings are made of,
    followed name by name, in notebook order, each in a ``try`` of its own; and the settings
    made before it (``torch.set_num_threads(1)``, ``torch.manual_seed(0)``, :data:`_SETTINGS`).
    [(name, code)]: each is compiled under its name ``<cell N.part.position>``; ``skip``: such
    names left out (statements the room's guard refused)."""
    bindings, where, settings = _statements(nb)
    chosen, roots = {}, list(names)
    for cell, stmt in settings:
        if cell < before:
            chosen[id(stmt)] = where[id(stmt)]
            roots.extend(n.id for n in free_loads(stmt))
    for _name, b in closure(roots, before, bindings):
        if id(b.node) in where:     # not a function's `global` statement: the function's own binding counts
            chosen[id(b.node)] = where[id(b.node)]
    parts = []
    for cell, part, position, stmt in sorted(chosen.values(), key=lambda p: p[:3]):
        # compiled one by one, so that a statement the room's guard refuses can be left out alone
        name = f"<cell {cell}.{part}.{position}>"
        if name not in skip:
            parts.append((name, f"try:\n    exec(compile({ast.unparse(stmt)!r}, {name!r}, 'exec'), globals())\n"
                                "except Exception:\n    pass\n"))
    return parts


def _rule_hint(name: str, forbid, instead: str, why: str) -> str:
    return (f"Hint: {RULE_HINT}: {name} {why} {', '.join(forbid)}, which this exercise does not allow. "
            + (instead or f"Write it without {', '.join(forbid)}")
            + "; the library is only the reference the test checks against.")


# Unsandboxed (a self-check where bubblewrap cannot run), the room's kernel can only be asked not
# to import the hidden modules: a finder first on sys.meta_path. The student's own code could
# take it away; in a sandbox the modules are not there at all.
_BLOCKER = """
import sys as _s
class _Hidden:
    def find_spec(self, name, path=None, target=None):
        if any(name == h or name.startswith(h + '.') for h in {hide!r}):
            raise ModuleNotFoundError(f"No module named {{name!r}} (this exercise forbids it)", name=name)
        return None
_s.meta_path.insert(0, _Hidden())
del _s, _Hidden
"""


# Imported in a room before its guard, unless a rule forbids one (Room._start).
_PRELOAD = ("math", "numpy", "torch", "torch.nn.functional")
# Run before the guard too: no other process of the sandbox (a child the student's code starts) may
# open the room's memory (/proc/PID/mem needs the right to trace it; the guard refuses the room's own).
_NOT_DUMPABLE = "__import__('ctypes').CDLL(None).prctl(4, 0, 0, 0, 0)"    # PR_SET_DUMPABLE, 0


MAX_RESTARTS = 4          # rooms started again after their guard stopped them, per notebook
_STATEMENT = re.compile(r"<cell \d+\.\d+\.\d+>")     # room_program's name of a statement


class _Stopped(AssertionError):
    """The room's kernel is gone (its guard stopped it, or the student's code killed it)."""


class RoomLink(KernelLink):
    """A KernelLink to the room: a call that fails there for want of a hidden module, or that the
    room's guard stopped, fails with the rule's hint (the function needs what the exercise forbids)."""

    def __init__(self, client, rules: dict, room=None):
        super().__init__(client)
        self.rules, self.room = rules, room

    def request(self, req, what: str, limit=None):
        try:
            return super().request(req, what, limit)
        except KernelGone:      # this test fails; the student's own kernel and the other tests go on
            raise _Stopped(self.room.gone() if self.room is not None else "the room stopped") from None

    def call(self, fn, args, kwargs, watch=None, limit=None):
        forbid, instead = self.rules.get(fn.__name__, ((), ""))
        try:
            return super().call(fn, args, kwargs, watch=watch, limit=limit)
        except _Stopped as exc:
            raise AssertionError(_rule_hint(fn.__name__, forbid or ("the library",), instead,
                                            f"could not be run without ({exc})")) from None
        except Exception as exc:
            named = {m for m in forbid} | {repr(m.rsplit(".", 1)[-1]) for m in forbid}
            if isinstance(exc, NameError):
                said = self.room.refusals() if self.room is not None else ""
                why = f"reads a name ({exc}) that could not be defined{said} without"
            elif any(n in str(exc) for n in named):
                why = "needs"
            else:
                raise
            raise AssertionError(_rule_hint(fn.__name__, forbid or ("the library",), instead, why)) from None


class Room:
    """The second kernel of one notebook's grading (module docstring): started on first use,
    given the ruled names' definitions before each test cell that uses them, shut with the
    harness. ``rules``: :func:`ruled_names` of the notebook."""

    def __init__(self, nb, rules: dict, *, options, job_dir: Path, data_files=(), course_root=None,
                 sandbox=True, mode="autograde", cwd=None, env=None):
        self.nb, self.rules, self.options = nb, rules, options
        self.hide = tuple(dict.fromkeys(m for forbid, _ in rules.values() for m in forbid))
        self.job_dir, self.data_files, self.course_root = Path(job_dir), data_files, course_root
        self.sandbox, self.mode, self.cwd, self.env = sandbox, mode, cwd, env or {}
        self.link = None
        self.failed = ""          # why the room could not be set up ("" while it works)
        self.stopped = ""         # why the room's guard stopped it (room_guard), once it has
        self.skip = set()         # statements (room_program's names) the guard refused: left out
        self.refused = []         # the guard's words for each
        self.restarts = 0
        self._one_by_one = False  # after a stop in the definitions: each statement a request of its own
        self._stopped_at = ""
        self._stack = ExitStack()
        self._defined_at = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False

    def uses(self, source: str) -> set:
        """The ruled names a test cell's source reads."""
        tree = _parse(source)
        if tree is None:
            return {n for n in self.rules if re.search(rf"\b{re.escape(n)}\b", source)}
        return {n.id for n in free_loads(tree) if n.id in self.rules}

    def _start(self, limit: float) -> None:
        n = f"-{self.restarts}" if self.restarts else ""     # a room started again gets folders of its own
        ipc = self.job_dir / f"room-ipc{n}"
        ipc.mkdir(exist_ok=True)
        km = SandboxKernelManager(kernel_name="python3", transport="ipc", ip=str(ipc / "kernel"),
                                  connection_file=str(ipc / "kernel.json"))
        km.kernel_spec.interrupt_mode = "message"
        measure = self.job_dir / f"room-measure{n}"     # a measured call's arguments (KernelLink.measured_call)
        measure.mkdir(mode=0o755, exist_ok=True)
        group = CpuGroup.create() if self.sandbox else None   # the room's CPU count (KernelLink.measured_call)
        if group is not None:
            self._stack.callback(group.close)      # after the kernel's shutdown, which is entered later
        if self.sandbox:
            uid = jail.pick_uid()
            if uid is not None:
                os.chown(ipc, uid, uid)
            km.owner_uid = uid
            room_dir = self.job_dir / f"room{n}"
            room_dir.mkdir(exist_ok=True)
            # one thread: the CPU time a rule reads (mlexp.rules.work_grows) then counts the work, not
            # the spinning of idle worker threads
            km.jail_prefix = jail.sandbox_command(ipc_dir=ipc, job_dir=room_dir,
                                                  data_files=[*self.data_files, measure],
                                                  options=replace(self.options, kernel_threads=1),
                                                  course_root=self.course_root,
                                                  uid=uid, mode=self.mode, hide=self.hide,
                                                  cgroup=group.path if group else None)
            cwd = room_dir
        else:   # unsandboxed (the caller accepted that risk): the modules can only be hidden in a jail
            cwd = self.cwd or self.job_dir
        import nbformat
        client = HarnessClient(nbformat.v4.new_notebook(), self.options, km=km)
        self._stack.enter_context(client.setup_kernel(env=self.env, cwd=str(cwd), stdout=subprocess.DEVNULL,
                                                      stderr=subprocess.DEVNULL))
        self.link = RoomLink(client, self.rules, self)
        self.link.cpu_root = client.cpu_root = km.provisioner.pid
        self.link.cpu_group = group if group is not None and group.holds(km.provisioner.pid) else None
        self.link.measure_dir = (measure, f"{jail.SANDBOX_HOME}/{measure.name}" if self.sandbox else measure)
        self.link.install()
        if not self.sandbox:
            self.link.client.run_request(_BLOCKER.format(hide=self.hide), limit)
        # The libraries every ruled function reads, imported before the guard: its audit hook reads
        # each text compiled after it, and torch's import compiles thousands (about 3 s of a room's start).
        preload = [m for m in _PRELOAD if not any(m == h or m.startswith(h + ".") for h in self.hide)]
        if preload:
            _reply, timed_out, error = self.link.client.run_request(f"import {', '.join(preload)}", limit)
            if timed_out or error:
                raise RuntimeError(f"the room could not import {', '.join(preload)} ({error or 'timed out'})")
        self.link.client.run_request(_NOT_DUMPABLE, limit)
        self.stop_path = ipc / STOP_FILE
        _reply, timed_out, error = self.link.client.run_request(
            guard_program(self.hide, self.stop_path, strict=self.sandbox), limit)
        if timed_out or error:
            raise RuntimeError(f"the room's guard could not be set up ({error or 'timed out'})")


    def _restart(self) -> None:
        """Shut the room's kernel (stopped by its guard) so that the next use starts a fresh one."""
        self._stack.close()
        self._stack = ExitStack()
        self.link, self._defined_at, self.stopped = None, None, ""
        self.restarts += 1
        if getattr(self, "stop_path", None) is not None:
            self.stop_path.unlink(missing_ok=True)

    def prepare(self, before: int, limit: float) -> None:
        """Define the ruled names in the room as the notebook holds them when cell ``before``
        (1-based) runs; on failure ``failed`` says why and the tests that need the room fail.

        A room its guard stopped during an earlier test is started afresh (each test is judged on
        its own); one stopped while the definitions ran is started again without the statement
        the guard refused (the function it defines then fails its test, saying why), up to
        MAX_RESTARTS times a notebook."""
        while not self.failed:
            if self.stopped:
                if self.restarts >= MAX_RESTARTS:
                    self.failed = self.stopped
                    return
                self._restart()
            try:
                if self.link is None:
                    self._start(limit)
                statements = room_statements(self.nb, list(self.rules), before, self.skip)
                program = "".join(code for _name, code in statements)
                if program and self._defined_at != program:
                    self._define(statements, limit)
                    self._defined_at = program
                return
            except StudentTimeout:
                self.failed = "the room did not answer in time"
            except KernelGone:
                why, where = self.gone(), self._stopped_at
                if not where:             # stopped while a statement ran: find which, one by one
                    if self._one_by_one:
                        self.failed = why
                        return
                    self._one_by_one = True
                    continue
                if where in self.skip:
                    self.failed = why
                    return
                self.skip.add(where)
                self.refused.append(why)
            except Exception as exc:      # the room never started: its tests fail, saying why
                self.failed = f"the room could not be set up ({type(exc).__name__}: {exc})"[:300]

    def _define(self, statements, limit) -> None:
        """Send the definitions: as one request, or (``_one_by_one``) a request a statement, so
        that a stop names the statement during which it came."""
        batches = [statements] if not self._one_by_one else [[each] for each in statements]
        for batch in batches:
            try:
                _reply, timed_out, _error = self.link.client.run_request("".join(c for _n, c in batch), limit)
            except KernelGone:
                if self._one_by_one and not self._stopped_at:
                    self.gone()
                    self._stopped_at = self._stopped_at or batch[0][0]
                raise
            if timed_out:
                self.failed = "defining the exercise's functions in the room ran past its time limit"
                return

    def gone(self) -> str:
        """After the room's kernel died: why, in its guard's words when the guard stopped it (the
        file is read as a plain file only, never through a link the room's code could leave)."""
        if not self.stopped:
            self.stopped, self._stopped_at = "the room's kernel stopped", ""
            try:
                fd = os.open(self.stop_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except (OSError, AttributeError):
                return self.stopped
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    lines = os.read(fd, 400).decode("utf-8", "replace").splitlines() + ["", ""]
                    text = "".join(c for c in lines[0] if c.isprintable()).strip()
                    self.stopped = text[:300] or self.stopped
                    self._stopped_at = lines[1] if _STATEMENT.fullmatch(lines[1]) else ""
            finally:
                os.close(fd)
        return self.stopped

    def lookup(self, name: str):
        """``name`` as the room holds it: a proxy whose calls run there. AssertionError with the
        rule's hint when the room could not define it, or its guard stopped it."""
        forbid, instead = self.rules[name]
        if self.stopped:
            raise AssertionError(_rule_hint(name, forbid, instead, f"could not be run without ({self.stopped})"))
        if self.failed:
            raise RuntimeError(f"the grader could not run {name} where {', '.join(forbid)} is absent: "
                               f"{self.failed}")
        try:
            return self.link.lookup(name)
        except _Stopped as exc:
            raise AssertionError(_rule_hint(name, forbid, instead, f"could not be run without ({exc})")) from None
        except KeyError:
            raise AssertionError(_rule_hint(name, forbid, instead,
                                            f"could not be defined{self.refusals()} without")) from None

    def refusals(self) -> str:
        """`` (the guard's words)`` for the statements it refused, or ""."""
        return f" ({'; '.join(dict.fromkeys(self.refused))})" if self.refused else ""
