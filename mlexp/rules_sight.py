"""What the watch of :mod:`mlexp.rules` tells apart in the code it watches run.

:func:`mlexp.rules.watching` asks a few questions of each frame, call and thread while a function
runs; each is answered here, with no state of its own (the watch's state, its hooks and the audit
hook, stays in :mod:`mlexp.rules`):

- whose code a frame runs: a forbidden library module's (:class:`_Forbidden`, and the entry point's
  name, :func:`_entry_name`) or the notebook's own (:class:`_Sources`);
- how large the tensors an operation took or returned are (:func:`_elements`, :func:`_total`);
- what takes work out of the watch's sight: torch's function handling switched off
  (:func:`_on_stack`), a thread or process started (:func:`_starters`), work handed to another
  thread or process (:func:`_handoffs`, :data:`_HANDOFF_BUILTINS`), another thread that could be
  doing the notebook's work and the CPU time it used (:func:`_may_work`, :func:`_thread_clocks`).

:mod:`mlexp.rules` imports these names into its own namespace and the watch calls them from
there: the grader's tamper report watches that module's names, so replacing one is reported.
"""
from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time


class _Forbidden:
    """Which ``forbid`` module a frame runs the code of, or "": known by the file its code comes
    from (the module's own file, or any file of its folder for a package), whatever name its
    globals give, so that code which only calls itself ``mlexp.ops`` (``exec`` with made-up
    globals) is the notebook's, and the library's own files loaded again under another module
    name are still the library. A module not imported yet is known by its name."""

    def __init__(self, forbid):
        self.places, self.by_name = [], []
        for name in forbid:
            path = getattr(sys.modules.get(name), "__file__", None)
            if not path:
                self.by_name.append(name)
                continue
            path = os.path.realpath(path)
            is_package = os.path.basename(path) == "__init__.py"
            self.places.append((os.path.join(os.path.dirname(path), "") if is_package else path, name))
        self.known = {}

    def __call__(self, frame) -> str:
        filename = frame.f_code.co_filename
        root = self.known.get(filename)
        if root is None:
            real = os.path.realpath(filename) if not filename.startswith("<") else filename
            root = next((name for p, name in self.places
                         if real == p or (p.endswith(os.sep) and real.startswith(p))), "")
            self.known[filename] = root
        if not root and self.by_name:
            module = frame.f_globals.get("__name__", "")
            root = next((m for m in self.by_name if module == m or module.startswith(m + ".")), "")
        return root


def _elements(value, depth: int = 2) -> int:
    """The most elements of one tensor in ``value``: a tensor, or a tuple or list of them (as
    ``torch.split`` and ``torch.linalg.eigh`` return), two levels deep; 0 for anything else."""
    import torch
    if isinstance(value, torch.Tensor):
        return value.numel()
    if depth and isinstance(value, (tuple, list)):
        return max((_elements(v, depth - 1) for v in value[:64]), default=0)
    return 0


def _total(value, depth: int = 2) -> int:
    """All elements of the tensors in ``value`` (a tensor, or a tuple or list of them)."""
    import torch
    if isinstance(value, torch.Tensor):
        return value.numel()
    if depth and isinstance(value, (tuple, list)):
        return sum(_total(v, depth - 1) for v in value[:64])
    return 0


def _entry_name(frame, root: str) -> str:
    code = frame.f_code
    name = f"{root}.{getattr(code, 'co_qualname', code.co_name)}"
    impl = frame.f_locals.get("impl") if "impl" in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount] else None
    return f"{name}(impl={impl!r})" if isinstance(impl, str) else name



def _on_stack(mode) -> bool:
    import torch
    return any(torch._C._get_function_stack_at(i) is mode for i in range(torch._C._len_torch_function_stack()))


def _starters() -> dict:
    """The builtins that start work a watch cannot follow, with what to call it: a new thread has
    torch modes and ``sys`` hooks of its own, a new process is another interpreter."""
    import _thread
    found = {_thread.start_new_thread: "started a thread"}
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve"):
        if hasattr(os, name):
            found[getattr(os, name)] = "started a process"
    try:
        import _posixsubprocess
        found[_posixsubprocess.fork_exec] = "started a process"
    except (ImportError, AttributeError):
        pass
    return found


class _Sources:
    """Which code is the notebook's own: a file outside the Python installation's library folders
    and mlexp (a cell's code, which ipykernel compiles into a file under the kernel's temporary
    folder, or a module the student wrote), or code compiled from a string (``exec``, a
    dataclass's generated methods: the few lines of the latter do not grow with a sequence)."""

    def __init__(self):
        paths = sysconfig.get_paths()
        roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
        roots.add(os.path.dirname(os.path.abspath(__file__)))
        # Packages may also come from other folders on sys.path: a base environment's site-packages
        # seen through --system-site-packages, Debian's and Colab's dist-packages, the user's site.
        roots.update(p for p in sys.path if os.path.basename(os.path.normpath(p)) in ("site-packages", "dist-packages"))
        for name in ("torch", "numpy", "IPython", "ipykernel"):
            origin = getattr(sys.modules.get(name), "__file__", None)
            if origin:
                roots.add(os.path.dirname(os.path.dirname(origin)))
        self.roots = tuple(os.path.join(os.path.realpath(r), "") for r in roots)
        self.known = {}

    def own(self, filename: str) -> bool:
        mine = self.known.get(filename)
        if mine is None:
            if filename.startswith("<frozen ") and filename.endswith(">"):
                module = sys.modules.get(filename[len("<frozen "):-1])   # the interpreter's own frozen modules
                mine = getattr(getattr(module, "__spec__", None), "origin", None) != "frozen"
            elif filename.startswith("<"):
                mine = True
            else:
                mine = not os.path.realpath(filename).startswith(self.roots)
            self.known[filename] = mine
        return mine


def _handoffs() -> dict:
    """The code of the functions that hand work to another thread or process (an executor's
    ``submit``, a pool's ``apply_async``, a queue's ``put``, an event's ``set``), by code object,
    for those of their modules already imported. A call to one counts when the notebook's own
    code makes it (a library may use them for itself: ipykernel when a cell prints)."""
    found = {}
    wanted = {"concurrent.futures._base": ("Executor.map",),
              "concurrent.futures.thread": ("ThreadPoolExecutor.submit",),
              "concurrent.futures.process": ("ProcessPoolExecutor.submit",),
              "multiprocessing.pool": ("Pool.apply", "Pool.apply_async", "Pool.map", "Pool.starmap", "Pool._map_async",
                                      "Pool.imap", "Pool.imap_unordered"),
              "multiprocessing.queues": ("Queue.put", "SimpleQueue.put"),
              "multiprocessing.connection": ("_ConnectionBase.send", "_ConnectionBase.send_bytes"),
              "queue": ("Queue.put",),
              "threading": ("Event.set", "Condition.notify", "Semaphore.release", "Barrier.wait")}
    for modname, names in wanted.items():
        module = sys.modules.get(modname)
        for name in names:
            owner, _, attr = name.partition(".")
            code = getattr(getattr(getattr(module, owner, None), attr, None), "__code__", None)
            if code is not None:
                found[code] = "handed work to another thread or process"
    return found


# The builtin methods that do the same (called from the notebook's code: importing a module inside
# a function releases import locks too, from importlib's code).
_HANDOFF_BUILTINS = frozenset({"SimpleQueue.put", "SimpleQueue.put_nowait", "lock.release", "RLock.release"})


_POOLS = ("concurrent.futures", "multiprocessing", "joblib")   # whose threads run work handed to them


def _may_work(thread, sources: _Sources) -> bool:
    """Whether a thread could be doing the notebook's work: it runs the notebook's own code, or
    it is a thread or process pool's (not, say, a progress bar's monitor or the kernel's own)."""
    if not isinstance(thread, threading.Thread):
        return False
    target, run = getattr(thread, "_target", None), getattr(type(thread), "run", None)
    modules = [getattr(f, "__module__", None) or "" for f in (target, type(thread))]
    codes = [getattr(f, "__code__", None) for f in (target, run)]
    return (any(m.startswith(_POOLS) for m in modules)
            or any(c is not None and sources.own(c.co_filename) for c in codes))


def _thread_clocks(sources: _Sources) -> dict:
    """CPU seconds used so far by each other thread that could be doing the notebook's work
    (:func:`_may_work`). Empty where the OS gives no per-thread clock."""
    clocks = {}
    for thread in threading.enumerate():
        if thread.ident == threading.get_ident() or not _may_work(thread, sources):
            continue
        try:
            clocks[thread.ident] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (AttributeError, OSError):
            pass
    return clocks
