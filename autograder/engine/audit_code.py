"""Code the grader cannot read before it runs, found in a notebook's source (autograder.engine.audit).

:func:`dynamic_code` lists what a cell does that could change an exercise rule's verdict in ways
its source does not show (the module docstring of :mod:`autograder.engine.audit` lists the kinds);
:func:`code_in_strings` gives the code a cell runs from constant strings (magics, timers), which
is read as the cell's own. Both read the parsed cell; ``names.dotted(expr)`` (the notebook's
imports, :class:`autograder.engine.audit._Names`) names the library path an expression reaches.
"""
from __future__ import annotations

import ast
import importlib.util
import sys
from functools import lru_cache
from pathlib import Path

__all__ = ["dynamic_code", "code_in_strings", "machinery_touched", "DYNAMIC_MODULES",
           "CODE_CALLS"]

DYNAMIC_CALLS = {"exec": "runs code from a string (exec)", "eval": "runs code from a string (eval)",
                 "compile": "compiles code from a string (compile)",
                 "__import__": "imports by a computed name (__import__)",
                 "vars": "reads or changes a namespace (vars)"}
DYNAMIC_MODULES = {"importlib", "inspect", "ctypes", "types", "marshal", "pickle", "dill",
                   "cloudpickle", "builtins", "runpy", "code", "codeop", "imp", "dis",
                   "_thread", "copyreg", "pkgutil", "pydoc", "_frozen_importlib", "_imp", "zipimport",
                   "_frozen_importlib_external", "_pickle", "shelve", "multiprocessing", "subprocess",
                   "cProfile", "profile", "pdb", "bdb", "trace",
                   # the kernel's own machinery: how cells run and how replies leave the kernel
                   "IPython", "ipykernel", "jupyter_client", "zmq", "traitlets", "comm"}
SAFE_SUBMODULES = ("IPython.display",)     # display(), Markdown(), HTML(): a lesson's own tools
# names that look code or modules up by a string, start a process or walk the interpreter's objects
DYNAMIC_NAMES = ("operator.attrgetter", "operator.methodcaller", "string.Formatter", "logging.config",
                 "os.system", "os.popen", "os.exec", "os.spawn", "os.posix_spawn", "os.fork",
                 "gc.get_referrers", "gc.get_referents", "gc.get_objects", "sys.modules", "sys._getframe")
DYNAMIC_BUILTINS = {"exec", "eval", "compile", "__import__", "getattr", "setattr", "delattr",
                    "globals", "locals", "vars"}
SYS_NAMES = {"sys.modules", "sys.settrace", "sys.setprofile", "sys._getframe", "sys.meta_path",
             "sys.path_hooks", "sys.addaudithook", "sys.setrecursionlimit", "threading.settrace",
             "threading.setprofile"}
DUNDERS = {"__globals__", "__code__", "__dict__", "__builtins__", "__subclasses__", "__closure__",
           "__getattribute__", "__setattr__", "__delattr__", "__import__", "__loader__", "__spec__",
           "__wrapped__", "__func__", "__self__", "__defaults__", "__kwdefaults__", "__mro__",
           "__bases__", "__base__", "__class__", "__reduce__", "__reduce_ex__", "f_globals", "__getattr__",
           "f_locals", "f_back", "f_trace", "gi_frame", "tb_frame", "co_code"}
SAFE_MAGICS = {"time", "timeit", "capture", "matplotlib", "precision", "pprint", "config", "autoreload",
               "pinfo", "pinfo2", "who", "whos", "pip"}
SAFE_SHELL = {"nvidia-smi", "pip", "pip3", "ls", "pwd", "nproc", "free", "df", "lscpu", "uname", "echo",
              "which", "du", "date", "hostname"}
CODE_MAGICS = {"time", "timeit", "capture"}    # their argument (line) or body (cell) is code
CODE_CALLS = {"Timer", "timeit", "repeat", "run", "runctx", "autorange", "blocked_autorange"}


def code_in_strings(tree) -> list:
    """Code a cell runs from a constant string, read as the cell's own: ``%time``/``%timeit``
    lines and ``%%time``/``%%timeit``/``%%capture`` bodies, and the statements given to timers and
    profilers (``timeit``, ``torch.utils.benchmark.Timer``, ``cProfile.run``, ...) as text."""
    out = []
    for node in ast.walk(tree):
        call = _ipython_call(node)
        if call and call[0] in ("run_line_magic", "run_cell_magic") and call[1] in CODE_MAGICS:
            args = node.args
            code = args[2] if call[0] == "run_cell_magic" and len(args) > 2 else \
                args[1] if call[0] == "run_line_magic" and len(args) > 1 else None
            if isinstance(code, ast.Constant) and isinstance(code.value, str):
                out.append(code.value)
        elif isinstance(node, ast.Call) and _call_name(node) in CODE_CALLS:
            out += [a.value for a in list(node.args) + [k.value for k in node.keywords]
                    if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return out


@lru_cache(maxsize=None)
def library_names() -> frozenset:
    """The names of the course library's module-level functions and classes, from its source."""
    try:
        spec = importlib.util.find_spec("mlexp")
    except (ImportError, ValueError):
        return frozenset()
    found = set()
    for path in Path(list(spec.submodule_search_locations or [""])[0]).rglob("*.py"):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        found.update(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                     and not n.name.startswith("_"))
    return frozenset(found)


def _call_name(node) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _safe_ipython_call(node) -> bool:
    """A magic or shell command that only measures, shows or configures (SAFE_MAGICS, SAFE_SHELL,
    ``%load_ext autoreload``)."""
    call = _ipython_call(node)
    if call is None:
        return False
    method, magic = call
    if method in ("run_line_magic", "run_cell_magic") and magic in SAFE_MAGICS:
        return True
    first = node.args[1] if method != "system" and len(node.args) > 1 else node.args[0] if node.args else None
    argument = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""
    words = argument.split()
    if method == "system":
        return bool(words) and words[0] in SAFE_SHELL and not set("|;&`$<>()") & set(argument)
    return method == "run_line_magic" and magic == "load_ext" and words == ["autoreload"]


def _ipython_call(node):
    """(method, magic name) of a ``get_ipython().method('name', ...)`` call, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name) \
            and node.func.value.func.id == "get_ipython":
        first = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else ""
        return node.func.attr, first if isinstance(first, str) else ""
    return None


def _installed(top: str) -> bool:
    if top in sys.builtin_module_names or top in sys.stdlib_module_names:
        return True
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def dynamic_code(tree, names) -> list:
    """What the code does that the grader cannot check by reading it (module docstring)."""
    said, magic_shells = [], set()

    def say(what):
        if what not in said:
            said.append(what)
    asked = set()      # globals() in `"name" in globals()`: asks whether a name exists, moves nothing
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}   # a.b of a.b.c
    named = {id(n.value) for n in ast.walk(tree)        # x.__class__.__name__: a type's name, no more
             if isinstance(n, ast.Attribute) and n.attr in ("__name__", "__qualname__")}
    in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f) if n is not f}
    for node in ast.walk(tree):
        if _safe_ipython_call(node):
            magic_shells.add(id(node.func.value))     # IPython's own call for %time and the like
        if isinstance(node, ast.Compare) and all(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            asked.update(id(c) for c in node.comparators)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("globals", "locals") and id(node) not in asked:
            say(f"reaches the notebook's names by string ({node.func.id}())")
        if isinstance(node, ast.Name) and node.id in DYNAMIC_BUILTINS and id(node) not in called \
                and isinstance(node.ctx, ast.Load):
            say(f"passes {node.id} around as a value, so the grader cannot see what it runs")
        if isinstance(node, (ast.Name, ast.Attribute, ast.Call)) and id(node) not in inner:
            used = names.dotted(node)
            safe = used.startswith(tuple(f"{m}." for m in SAFE_SUBMODULES)) or used in SAFE_SUBMODULES
            if not safe and (used.split(".")[0] in DYNAMIC_MODULES or used.startswith(DYNAMIC_NAMES)):
                say(f"uses {used}")
        if isinstance(node, ast.Call) and id(node) in in_function and _call_name(node) in CODE_CALLS and any(
                isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args):
            say(f"runs code given as text ({_call_name(node)}) inside a function")
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names) and node.module \
                and node.module.split(".")[0] in ("mlexp", "torch", "numpy"):
            say(f"imports every name of {node.module} (*), so the grader cannot tell which one a "
                "function uses")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "get_ipython" and id(node) not in magic_shells:
            say("uses IPython's shell (get_ipython()), which decides how cells run and how "
                "replies leave the kernel")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if not node.level else ["(a relative import)"]
            if isinstance(node, ast.ImportFrom) and node.module == "IPython" and \
                    all(a.name == "display" for a in node.names):
                continue            # from IPython import display: the same module as IPython.display
            for m in mods:
                top = m.split(".")[0]
                if m in SAFE_SUBMODULES or m.startswith(tuple(f"{x}." for x in SAFE_SUBMODULES)):
                    continue
                if top in DYNAMIC_MODULES:
                    say(f"imports {m}, which can load, read or change code")
                elif m.startswith("("):
                    say("imports a module relative to the notebook")
                elif not _installed(top):
                    say(f"imports {top}, a module the course does not install (a file the notebook "
                        "wrote?), whose code the grader cannot read")
            if isinstance(node, ast.ImportFrom) and node.module in ("sys", "threading"):
                for a in node.names:
                    if f"{node.module}.{a.name}" in SYS_NAMES:
                        say(f"uses {node.module}.{a.name}")
        elif isinstance(node, ast.Call):
            call = _ipython_call(node)
            if call is not None:
                method, magic = call
                if _safe_ipython_call(node):
                    continue
                what = {"system": "runs a shell command (!)", "getoutput": "runs a shell command (!!)",
                        "run_line_magic": f"runs the magic %{magic}",
                        "run_cell_magic": f"runs the cell magic %%{magic}"}.get(method)
                say(what or f"calls IPython's {method}")
                continue
            if isinstance(node.func, ast.Name):
                fn = node.func.id
                if fn == "vars" and node.args and not names.dotted(node.args[0]):
                    pass        # vars(obj) of the notebook's own object: its fields, as a dict
                elif fn in DYNAMIC_CALLS:
                    say(DYNAMIC_CALLS[fn])
                elif fn in ("getattr", "setattr", "delattr", "hasattr") and len(node.args) >= 2:
                    computed = not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str))
                    on_module = bool(names.dotted(node.args[0]))
                    if computed and fn != "hasattr":
                        say(f"looks up an attribute by a computed name ({fn})")
                    elif on_module and fn in ("setattr", "delattr"):
                        say(f"changes a library's name with {fn} ({names.dotted(node.args[0])})")
                elif fn == "get_ipython":
                    pass
        elif isinstance(node, ast.Attribute):
            dotted = names.dotted(node)
            if node.attr in DUNDERS and not (node.attr == "__class__" and id(node) in named):
                say(f"reaches {node.attr}, which exposes code or namespaces")
            elif dotted in SYS_NAMES or dotted.startswith("torch._C"):
                say(f"uses {dotted if not dotted.startswith('torch._C') else 'torch._C'}")
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__import__", "__loader__", "__spec__"):
            say(f"reaches {node.id}")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = list(node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target])
            while any(isinstance(t, (ast.Tuple, ast.List, ast.Starred)) for t in targets):
                targets = [e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List))
                                                        else [t.value] if isinstance(t, ast.Starred) else [t])]
            for sub in targets:     # what is bound: `mlexp.rules.Trace = x` changes Trace, not rules
                if isinstance(sub, ast.Attribute) and names.dotted(sub.value):
                    verb = "deletes" if isinstance(node, ast.Delete) else "replaces"
                    say(f"{verb} {names.dotted(sub)}, a library's name")
                elif isinstance(sub, ast.Attribute) and sub.attr in library_names():
                    say(f"replaces {sub.attr} on an object, a name of the course library")
                elif isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Call) and \
                        isinstance(sub.value.func, ast.Name) and sub.value.func.id in ("globals", "locals"):
                    say(f"writes into {sub.value.func.id}() by key")
    return said


# The grader's own machinery as the notebook's source can name it: the rules' watch (its module
# objects are what the in-kernel rules report with), and the kernel's messaging, which carries
# the grader's channel (ipykernel, jupyter_client, zmq, comm) and its replies (IPython's display
# publisher, the kernel's message session).
WATCH_MODULES = ("mlexp.rules",)           # mlexp.rules and mlexp.rules_sight
CHANNEL_MODULES = {"ipykernel", "jupyter_client", "zmq", "comm"}
CHANNEL_PARTS = ("display_pub", "kernel.session")


def machinery_touched(tree, names) -> list:
    """What the code does to the grader's own machinery (never what an honest answer does):
    replacing or deleting a name of the rules' watch (``mlexp.rules.Trace = ...``, ``setattr``,
    ``sys.modules['mlexp.rules'] = ...``), importing the kernel's messaging, or replacing the
    parts of IPython's shell that the grader's replies leave through."""
    said = []

    def say(what):
        if what not in said:
            said.append(what)

    def watch(dotted):
        return dotted.startswith(WATCH_MODULES)

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if not node.level else []
            for m in mods:
                if m.split(".")[0] in CHANNEL_MODULES:
                    say(f"imports {m}, the kernel's own messaging, which carries the grader's channel")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = list(node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target])
            while any(isinstance(t, (ast.Tuple, ast.List, ast.Starred)) for t in targets):
                targets = [e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List))
                                                        else [t.value] if isinstance(t, ast.Starred) else [t])]
            verb = "deletes" if isinstance(node, ast.Delete) else "replaces"
            for sub in targets:
                if isinstance(sub, ast.Attribute) and watch(names.dotted(sub)):
                    say(f"{verb} {names.dotted(sub)}, a name of the grader's rule watch")
                elif isinstance(sub, ast.Attribute) and any(p in ast.unparse(sub) for p in CHANNEL_PARTS):
                    say(f"{verb} {ast.unparse(sub)[:60]}, part of IPython's shell through which the grader's "
                        "replies leave the kernel")
                elif isinstance(sub, ast.Subscript) and names.dotted(sub.value) == "sys.modules" and \
                        isinstance(sub.slice, ast.Constant) and watch(str(sub.slice.value)):
                    say(f"{verb} sys.modules[{sub.slice.value!r}], the grader's rule watch")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("setattr", "delattr") and node.args and watch(names.dotted(node.args[0])):
            say(f"changes {names.dotted(node.args[0])} with {node.func.id}, the grader's rule watch")
    return said
