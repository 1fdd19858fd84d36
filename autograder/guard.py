"""Code the runner injects into a student's kernel so test cells run against unpatched libraries.

A test cell such as ``assert math.isclose(answer(), 2.5)`` is only as honest as ``math.isclose``.
A student cell can redefine it (``math.isclose = lambda *a, **k: True``), shadow a builtin
(``abs = lambda x: 0``), swap a module in ``sys.modules`` or tell IPython to swallow
AssertionError (``set_custom_exc``). The runner therefore executes, unseen by the student:

- ``setup_source(token, watch)`` once before the first cell: imports the watched modules (those
  the notebook's test cells import, plus builtins, math, operator, numpy, torch and mlexp when
  the notebook mentions them) and snapshots every callable and submodule attribute of each
  watched module and its loaded submodules, the methods of ``torch.Tensor``, the builtins, and
  IPython's exception hooks. The snapshot lives in a closure stored in ``builtins`` under a
  random per-run name.
- ``guard_source(token)`` before and after every graded test cell: puts every snapshotted
  attribute back, deletes user globals that shadow builtins, and prints one marker line
  ``<token>{"changed": [...]}`` listing what it had to undo, which the runner reads and removes.

Limits (documented in the README section on isolation): attributes first created after the
snapshot are not removed; module-level data (non-callables) are not restored; methods of other
classes are not covered; and the kernel runs the student's code, so a student who studies this
module can still reach the snapshot or rewrite the kernel's messaging. The runner and the
parent treat a test cell that reported an error to the kernel as failed even when no error was
displayed, and every undo is reported for manual review.
"""
import secrets

__all__ = ["new_token", "setup_source", "guard_source", "DEFAULT_WATCH"]

DEFAULT_WATCH = ("builtins", "math", "operator", "functools", "cmath", "statistics")
OPTIONAL_WATCH = ("numpy", "torch", "mlexp")




_SETUP = r'''
KERNEL_MANAGED = ("input", "raw_input", "getpass")

def _grader_setup(token, watch, user_ns):
    import builtins, importlib, sys, types

    def _library_rewrap(new, old, modname):
        """True when a library wrapped its own function (torch._dynamo rebinds torch.manual_seed to a
        functools.wraps wrapper on import): the wrapper's code lives inside that library's package."""
        import os
        import sys
        pkg = sys.modules.get(modname.split(".")[0])
        root = os.path.dirname(getattr(pkg, "__file__", "") or "")
        code = getattr(new, "__code__", None)
        return (bool(root) and code is not None and getattr(new, "__wrapped__", None) is old
                and code.co_filename.startswith(root + os.sep))

    for name in watch:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    prefixes = tuple(w + "." for w in watch)
    snap = {}
    for modname, mod in list(sys.modules.items()):
        if mod is None or not (modname in watch or modname.startswith(prefixes)):
            continue
        try:
            attrs = dict(vars(mod))
        except TypeError:
            continue
        snap[modname] = (mod, {k: v for k, v in attrs.items()
                               if callable(v) or isinstance(v, types.ModuleType)})
    classes = []
    if "torch" in sys.modules:
        classes.append(sys.modules["torch"].Tensor)
    class_snap = [(cls, {k: v for k, v in vars(cls).items() if callable(v)}) for cls in classes]
    builtin_names = {k: v for k, v in vars(builtins).items() if not k.startswith("_")}
    for k in KERNEL_MANAGED:   # the kernel itself swaps these at every execution
        snap.get("builtins", (None, {}))[1].pop(k, None)
    user_start = {k: v for k, v in user_ns.items() if k in builtin_names}
    try:
        from IPython import get_ipython
        shell = get_ipython()
    except Exception:
        shell = None
    shell_snap = {k: v for k, v in vars(shell).items() if callable(v)} if shell is not None else {}
    shell_exc = getattr(shell, "custom_exceptions", ())
    missing = object()

    def restore(user_ns):
        changed = []
        for modname, (mod, attrs) in snap.items():
            if sys.modules.get(modname) is not mod:
                sys.modules[modname] = mod
                changed.append("sys.modules[%r]" % modname)
            current = vars(mod)
            for k, v in attrs.items():
                if current.get(k, missing) is not v and not _library_rewrap(current.get(k), v, modname):
                    try:
                        setattr(mod, k, v)
                        changed.append(modname + "." + k)
                    except Exception:
                        pass
        for cls, attrs in class_snap:
            for k, v in attrs.items():
                if vars(cls).get(k, missing) is not v:
                    try:
                        setattr(cls, k, v)
                        changed.append(cls.__name__ + "." + k)
                    except Exception:
                        pass
        for k in list(user_ns):
            if k in user_start:
                if user_ns[k] is not user_start[k]:
                    user_ns[k] = user_start[k]
                    changed.append(k + " (a global that shadowed the builtin)")
            elif k in builtin_names and user_ns[k] is not builtin_names[k] and callable(builtin_names[k]):
                del user_ns[k]
                changed.append(k + " (a global that shadowed the builtin)")
        if shell is not None:
            if getattr(shell, "custom_exceptions", ()) != shell_exc:
                shell.custom_exceptions = shell_exc
                changed.append("IPython custom exception handler")
            for k in list(vars(shell)):
                if k not in shell_snap and callable(getattr(type(shell), k, None)):
                    delattr(shell, k)
                    changed.append("IPython shell." + k)
            for k, v in shell_snap.items():
                if vars(shell).get(k, missing) is not v:
                    setattr(shell, k, v)
                    changed.append("IPython shell." + k)
        return changed

    setattr(builtins, token, restore)

_grader_setup(TOKEN, WATCH, globals())
del _grader_setup, KERNEL_MANAGED
'''

_GUARD = (
    "print(%(token)r + __import__('json').dumps({'changed': "
    "vars(__import__('builtins'))[%(token)r](globals())}))"
)


def new_token() -> str:
    """A fresh name under which the snapshot is stored in the kernel (unguessable per run)."""
    return "_grader_" + secrets.token_hex(8)


def setup_source(token: str, watch) -> str:
    """Python source that imports the ``watch`` modules and snapshots them under ``token``."""
    return _SETUP.replace("TOKEN, WATCH", f"{token!r}, {tuple(sorted(set(watch)))!r}")


def guard_source(token: str) -> str:
    """Python source that restores the snapshot and prints ``token`` + JSON of what changed."""
    return _GUARD % {"token": token}
