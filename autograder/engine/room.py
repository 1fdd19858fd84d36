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
from autograder.engine.notebook_client import HarnessClient, SandboxKernelManager, StudentTimeout
from autograder.engine.room_guard import guard_program

__all__ = ["ruled_names", "room_program", "Room", "RoomLink"]

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


def room_program(nb, names, before: int) -> str:
    """The Python that defines ``names`` in a room as the notebook holds them when its cell
    number ``before`` (1-based, the test cell) runs: every statement their bindings are made of,
    followed name by name, in notebook order, each in a ``try`` of its own; and the settings
    made before it (``torch.set_num_threads(1)``, ``torch.manual_seed(0)``, :data:`_SETTINGS`)."""
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
    for cell, _part, _position, stmt in sorted(chosen.values(), key=lambda p: p[:3]):
        # compiled one by one, so that the room's guard (room_guard) refuses a statement alone
        parts.append(f"try:\n    exec(compile({ast.unparse(stmt)!r}, '<cell {cell}>', 'exec'), globals())\n"
                     "except Exception:\n    pass\n")
    return "".join(parts)


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


class RoomLink(KernelLink):
    """A KernelLink to the room: a call that fails there for want of a hidden module fails with
    the rule's hint (the function needs what the exercise forbids)."""

    def __init__(self, client, rules: dict):
        super().__init__(client)
        self.rules = rules

    def call(self, fn, args, kwargs, watch=None, limit=None):
        try:
            return super().call(fn, args, kwargs, watch=watch, limit=limit)
        except Exception as exc:
            forbid, instead = self.rules.get(fn.__name__, ((), ""))
            named = {m for m in forbid} | {repr(m.rsplit(".", 1)[-1]) for m in forbid}
            if isinstance(exc, NameError):
                why = f"reads a name ({exc}) that could not be defined without"
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
        ipc = self.job_dir / "room-ipc"
        ipc.mkdir(exist_ok=True)
        km = SandboxKernelManager(kernel_name="python3", transport="ipc", ip=str(ipc / "kernel"),
                                  connection_file=str(ipc / "kernel.json"))
        km.kernel_spec.interrupt_mode = "message"
        measure = self.job_dir / "room-measure"     # a measured call's arguments (KernelLink.measured_call)
        measure.mkdir(mode=0o755, exist_ok=True)
        group = CpuGroup.create() if self.sandbox else None   # the room's CPU count (KernelLink.measured_call)
        if group is not None:
            self._stack.callback(group.close)      # after the kernel's shutdown, which is entered later
        if self.sandbox:
            uid = jail.pick_uid()
            if uid is not None:
                os.chown(ipc, uid, uid)
            km.owner_uid = uid
            room_dir = self.job_dir / "room"
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
        self.link = RoomLink(client, self.rules)
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
        _reply, timed_out, error = self.link.client.run_request(guard_program(self.hide), limit)
        if timed_out or error:
            raise RuntimeError(f"the room's guard could not be set up ({error or 'timed out'})")


    def prepare(self, before: int, limit: float) -> None:
        """Define the ruled names in the room as the notebook holds them when cell ``before``
        (1-based) runs; on failure ``failed`` says why and the tests that need the room fail."""
        if self.failed:
            return
        try:
            if self.link is None:
                self._start(limit)
            program = room_program(self.nb, list(self.rules), before)
            if program and self._defined_at != program:
                _reply, timed_out, _error = self.link.client.run_request(program, limit)
                if timed_out:
                    self.failed = "defining the exercise's functions in the room ran past its time limit"
                self._defined_at = program
        except StudentTimeout:
            self.failed = "the room did not answer in time"
        except Exception as exc:      # the room never started: its tests fail, saying why
            self.failed = f"the room could not be set up ({type(exc).__name__}: {exc})"[:300]

    def lookup(self, name: str):
        """``name`` as the room holds it: a proxy whose calls run there. AssertionError with the
        rule's hint when the room could not define it."""
        forbid, instead = self.rules[name]
        if self.failed:
            raise RuntimeError(f"the grader could not run {name} where {', '.join(forbid)} is absent: "
                               f"{self.failed}")
        try:
            return self.link.lookup(name)
        except KeyError:
            raise AssertionError(_rule_hint(name, forbid, instead, "could not be defined without")) from None
