"""The exercise rules read from the student's source, on the grader's side (issue 39).

A lesson's test may state a rule: ``rules.write_it_yourself(fn, ..., forbid=("mlexp.ops",))``
(the answer must not use that library module), and ``rules.no_loop`` / ``rules.bounded`` with
the same ``forbid``. :mod:`mlexp.rules` checks them by watching ``fn`` run, inside the student's
kernel, where the student's own code could change what the watch reports. This module reads
the notebook's source instead, in the grader's process, before anything runs, so no code of the
student's can change its verdict:

- **A forbidden module reached by name.** For each ruled function, the definitions it is made of
  (its ``def`` or assignment and, in turn, every function, class or name of the notebook's it
  mentions) are searched for a reference that resolves to a ``forbid`` module: ``import`` and
  ``from ... import`` under any alias, attribute chains (``mlexp.ops.linear_attention``),
  ``getattr`` with a constant name, and the library's own re-exports (read from its source
  files, never imported). Found: the test fails with the rule's hint, whatever the kernel said.
- **Code the grader cannot read before it runs** (anywhere in the student's cells): ``exec``,
  ``eval``, ``compile``, ``__import__``, ``vars``; ``getattr``/``setattr``/``delattr`` with a
  computed name or on a module; modules that load or rewrite code (``importlib``, ``inspect``,
  ``ctypes``, ``types``, ``marshal``, ``pickle``, ``gc``, ``builtins``, ...); ``sys.modules``,
  ``sys.settrace``/``setprofile``/``_getframe`` and ``torch._C``; assignments to or deletions of a
  library's names (``mlexp.rules.Trace = ...``, ``torch.matmul = ...``); dunder attributes that
  reach code or namespaces (``__globals__``, ``__code__``, ``__dict__``, ``__builtins__``, ...);
  IPython magics and shell commands other than ``%time``/``%timeit``/``%%capture`` (whose code is
  read as the cell's); and importing a module the grader's environment does not have (a file the
  notebook wrote). Found: the submission is flagged for a person's review, naming the cell and
  what it does, since a rule's verdict can no longer be trusted; the points are not changed here.

Only the student's cells are read: every code cell that is not a test cell and whose source is
not one of the lesson's own cells (``lesson_code``: the released notebook's code cells and the
earlier versions the course's git history holds). A cell that does not parse is skipped: it
cannot run either. What this does not catch: names reached through a value the source does not
spell (an object passed in from a lesson cell that holds a library function), and anything a
C extension does; those stay with the in-kernel watch and its tamper report.
"""
from __future__ import annotations

import ast
import importlib.util
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .cells import grade_id_of, is_test_cell
from .copies import copied_library_code

__all__ = ["Audit", "audit_notebook", "lesson_key", "apply_audit", "RULES"]

RULES = ("write_it_yourself", "no_loop", "bounded", "call")
RULE_HINT = "this exercise asks you to write it yourself"      # as mlexp.rules says it
DYNAMIC_CALLS = {"exec": "runs code from a string (exec)", "eval": "runs code from a string (eval)",
                 "compile": "compiles code from a string (compile)",
                 "__import__": "imports by a computed name (__import__)",
                 "vars": "reads or changes a namespace (vars)"}
DYNAMIC_MODULES = {"importlib", "inspect", "ctypes", "types", "marshal", "pickle", "dill",
                   "cloudpickle", "gc", "builtins", "runpy", "code", "codeop", "imp", "dis",
                   "_thread", "copyreg",
                   # the kernel's own machinery: how cells run and how replies leave the kernel
                   "IPython", "ipykernel", "jupyter_client", "zmq", "traitlets", "comm"}
SAFE_SUBMODULES = ("IPython.display",)     # display(), Markdown(), HTML(): a lesson's own tools
SYS_NAMES = {"sys.modules", "sys.settrace", "sys.setprofile", "sys._getframe", "sys.meta_path",
             "sys.path_hooks", "sys.addaudithook", "sys.setrecursionlimit", "threading.settrace",
             "threading.setprofile"}
DUNDERS = {"__globals__", "__code__", "__dict__", "__builtins__", "__subclasses__", "__closure__",
           "__getattribute__", "__setattr__", "__delattr__", "__import__", "__loader__", "__spec__",
           "__wrapped__", "__func__", "__self__", "__defaults__", "__kwdefaults__", "__mro__",
           "__bases__", "__base__", "__class__", "__reduce__", "__reduce_ex__", "f_globals",
           "f_locals", "f_back", "f_trace", "gi_frame", "tb_frame", "co_code"}
SAFE_MAGICS = {"time", "timeit", "capture", "matplotlib", "precision", "pprint"}
CODE_MAGICS = {"time", "timeit", "capture"}    # their argument (line) or body (cell) is code


@dataclass
class Audit:
    """What the source says: ``forbidden`` {test grade id: the hint its test fails with};
    ``dynamic`` [(cell number, what the code does)], for review; ``read`` cells read."""
    forbidden: dict = field(default_factory=dict)
    dynamic: list = field(default_factory=list)
    copies: list = field(default_factory=list)
    read: int = 0

    def reasons(self) -> list:
        """The reasons a person should look ([] when the source hides nothing)."""
        out = []
        if self.dynamic:
            shown = "; ".join(f"cell {n}: {what}" for n, what in self.dynamic[:4])
            more = f" and {len(self.dynamic) - 4} more" if len(self.dynamic) > 4 else ""
            out.append(f"the notebook's code does what the grader cannot check before it runs ({shown}"
                       f"{more}): an exercise rule's verdict (a library op forbidden, no loop, a size "
                       "bound) cannot be trusted, so check the points those rules guard")
        if self.copies:
            shown = "; ".join(f"cell {n}: {what}" for n, what in self.copies[:4])
            more = f" and {len(self.copies) - 4} more" if len(self.copies) > 4 else ""
            out.append(f"the notebook runs the course library's own code as the student's ({shown}{more}): "
                       "check the points of the exercises that ask for it to be written by hand")
        return out

    def review(self) -> str:
        """The reasons a person should look, as one line, or "" when the source hides nothing."""
        return "; ".join(self.reasons())


@lru_cache(maxsize=4096)
def _python(source: str) -> str:
    """The cell as Python: IPython's own transforms (magics, ``!`` commands)."""
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager().transform_cell(source)


def _parse(source: str):
    try:
        return ast.parse(_python(source))
    except (SyntaxError, ValueError, RecursionError):
        return None


class _Names:
    """Imports and definitions of the notebook's cells: name -> dotted module path (an import),
    and name -> the nodes that define it (def, class, assignment)."""

    def __init__(self):
        self.imports, self.defs = {}, {}

    def add(self, tree, cell):
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.imports[a.asname] = a.name
                    else:
                        self.imports[a.name.split(".")[0]] = a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if a.name != "*":
                        self.imports[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in tree.body:
            for name in _bound(node):
                self.defs.setdefault(name, []).append((node, cell))
            # a library object kept under another name (`T = mlexp.rules.Trace`) is that object
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                    isinstance(node.targets[0], ast.Name) and self.dotted(node.value):
                self.imports[node.targets[0].id] = self.dotted(node.value)

    def dotted(self, node) -> str:
        """The dotted path an expression names (``mlexp.ops.f``), or ""."""
        if isinstance(node, ast.Name):
            return self.imports.get(node.id, "")
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else ""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str):
            base = self.dotted(node.args[0])
            return f"{base}.{node.args[1].value}" if base else ""
        return ""


def _bound(node) -> list:
    """Names a top-level statement binds (a def, a class, an assignment's plain names)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


@lru_cache(maxsize=None)
def _module_tree(module: str):
    """(file, parsed source) of a module of the library, found without running it; None."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError, AttributeError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    try:
        return spec.origin, ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


def origin(dotted: str, depth: int = 0) -> str:
    """``dotted`` with the library's re-exports followed: ``mlexp.mixers.linear_attention`` is
    ``mlexp.ops.linear.linear_attention`` when mlexp/mixers.py imports it from there (its source
    is read, never run; a lazy ``_LAZY`` map of a package's ``__init__`` is read too)."""
    parts = dotted.split(".")
    if depth > 8 or len(parts) < 2:
        return dotted
    for i in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:i])
        found = _module_tree(module)
        if found is None:
            continue
        path, tree = found
        name, rest = parts[i], parts[i + 1:]
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
                    for _ in range(node.level - 1):
                        package = package.rsplit(".", 1)[0]
                    base = f"{package}.{base}" if base else package
                for a in node.names:
                    if (a.asname or a.name) == name:
                        return origin(".".join([base, a.name, *rest]), depth + 1)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY"
                                                      for t in node.targets):
                try:
                    lazy = ast.literal_eval(node.value)
                except ValueError:
                    continue
                if isinstance(lazy, dict) and name in lazy:
                    return origin(".".join([module, str(lazy[name]), name, *rest]), depth + 1)
        return dotted
    return dotted


def _is_forbidden(dotted: str, forbid) -> str:
    """The forbid module ``dotted`` reaches (after re-exports), or ""."""
    if not dotted:
        return ""
    roots = {f.split(".")[0] for f in forbid}
    candidates = [dotted]
    if dotted.split(".")[0] in roots:
        candidates.append(origin(dotted))
    for name in candidates:
        for f in forbid:
            if name == f or name.startswith(f + "."):
                return f
    return ""


def _rules_of(test_source: str) -> list:
    """[(function name, forbid modules, instead)] of each rule call in a test cell's source."""
    tree = _parse(test_source)
    found = []
    for node in ast.walk(tree) if tree is not None else ():
        if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Name):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name not in RULES:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        try:
            forbid = tuple(ast.literal_eval(kw["forbid"])) if "forbid" in kw else ()
            instead = ast.literal_eval(kw["instead"]) if "instead" in kw else ""
        except (ValueError, TypeError, SyntaxError):
            continue
        if forbid and all(isinstance(m, str) for m in forbid):
            found.append((node.args[0].id, forbid, instead if isinstance(instead, str) else ""))
    return found


def _magic_code(tree) -> list:
    """The code strings of ``%time``/``%timeit`` lines and ``%%time``/``%%timeit``/``%%capture``
    bodies in a transformed cell (read as the cell's own code)."""
    out = []
    for node in ast.walk(tree):
        call = _ipython_call(node)
        if call and call[0] in ("run_line_magic", "run_cell_magic") and call[1] in CODE_MAGICS:
            args = node.args
            code = args[2] if call[0] == "run_cell_magic" and len(args) > 2 else \
                args[1] if call[0] == "run_line_magic" and len(args) > 1 else None
            if isinstance(code, ast.Constant) and isinstance(code.value, str):
                out.append(code.value)
    return out


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


def _dynamic(tree, names: _Names) -> list:
    """What the code does that the grader cannot check by reading it (module docstring)."""
    said, magic_shells = [], set()

    def say(what):
        if what not in said:
            said.append(what)
    asked = set()      # globals() in `"name" in globals()`: asks whether a name exists, moves nothing
    for node in ast.walk(tree):
        call = _ipython_call(node)
        if call is not None and call[0] in ("run_line_magic", "run_cell_magic") and call[1] in SAFE_MAGICS:
            magic_shells.add(id(node.func.value))     # IPython's own call for %time and the like
        if isinstance(node, ast.Compare) and all(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            asked.update(id(c) for c in node.comparators)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("globals", "locals") and id(node) not in asked:
            say(f"reaches the notebook's names by string ({node.func.id}())")
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
                if method in ("run_line_magic", "run_cell_magic") and magic in SAFE_MAGICS:
                    continue
                what = {"system": "runs a shell command (!)", "getoutput": "runs a shell command (!!)",
                        "run_line_magic": f"runs the magic %{magic}",
                        "run_cell_magic": f"runs the cell magic %%{magic}"}.get(method)
                say(what or f"calls IPython's {method}")
                continue
            if isinstance(node.func, ast.Name):
                fn = node.func.id
                if fn in DYNAMIC_CALLS:
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
            if node.attr in DUNDERS:
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
                elif isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Call) and \
                        isinstance(sub.value.func, ast.Name) and sub.value.func.id in ("globals", "locals"):
                    say(f"writes into {sub.value.func.id}() by key")
    return said


def _reachable(fn: str, names: _Names) -> list:
    """The definitions (node, cell) ``fn`` is made of: its own, then every one it mentions."""
    seen, todo, out = set(), [fn], []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node, cell in names.defs.get(name, []):
            out.append((node, cell, name))
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and sub.id in names.defs and sub.id not in seen:
                    todo.append(sub.id)
    return out


def audit_notebook(nb, lesson_code=()) -> Audit:
    """Read ``nb`` (the notebook as it is graded: its test cells are the release's) and say what
    its source shows (:class:`Audit`). ``lesson_code``: sources of the lesson's own code cells,
    which are not the student's and are not read for dynamic code (their imports still count)."""
    lesson = {lesson_key(s) for s in lesson_code}
    names, student, rules = _Names(), [], {}
    for number, cell in enumerate(nb.cells, start=1):
        if cell.cell_type != "code":
            continue
        if is_test_cell(cell):
            for rule in _rules_of(cell.source):
                rules.setdefault(grade_id_of(cell) or f"cell {number}", []).append(rule)
            continue
        tree = _parse(cell.source)
        if tree is None:
            continue
        trees = [tree] + [t for t in map(_parse, _magic_code(tree)) if t is not None]
        for t in trees:
            names.add(t, number)
        if lesson_key(cell.source) not in lesson:
            student.extend((t, number) for t in trees)
    out = Audit(read=len({n for _, n in student}))
    if not rules:            # no rule to protect: what the code does is the tests' to judge
        return out
    for tree, number in student:
        out.dynamic.extend((number, what) for what in _dynamic(tree, names)
                           if (number, what) not in out.dynamic)
        out.copies.extend((number, what) for what in copied_library_code(tree)
                          if (number, what) not in out.copies)
    student_cells = {n for _, n in student}
    for grade_id, found in rules.items():
        for fn, forbid, instead in found:
            hint = _forbidden_use(fn, forbid, instead, names, student_cells)
            if hint:
                out.forbidden.setdefault(grade_id, hint)
    return out


def _forbidden_use(fn, forbid, instead, names: _Names, student_cells) -> str:
    """The hint for ``fn`` reaching a ``forbid`` module by name in the student's cells, or ""."""
    hits = []
    if fn in names.imports and _is_forbidden(names.imports[fn], forbid):
        hits.append((names.imports[fn], None))
    for node, cell, _ in _reachable(fn, names):
        if cell not in student_cells:
            continue
        for sub in ast.walk(node):
            dotted = names.dotted(sub) if isinstance(sub, (ast.Name, ast.Attribute, ast.Call)) else ""
            if dotted and _is_forbidden(dotted, forbid):
                hits.append((dotted, cell))
                break
        if hits:
            break
    if not hits:
        return ""
    what, cell = hits[0]
    where = f" (your cell {cell})" if cell else " (imported under that name)"
    return (f"Hint: {RULE_HINT}: {fn} uses {what}{where}. "
            + (instead or f"Write it without {', '.join(forbid)}") +
            "; the library is only the reference the test checks against.")


@lru_cache(maxsize=4096)
def lesson_key(source: str) -> str:
    """What makes a cell the lesson's own: its code with every string constant blanked (so a
    release made with ``build --repo`` that sets ``COURSE_REPO`` is the same cell), or its
    stripped text where it does not parse."""
    tree = _parse(source)
    if tree is None:
        return "\n".join(line.rstrip() for line in source.strip().splitlines())
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            node.value = ""
    return ast.dump(tree)


def apply_audit(nb, report: dict, audit: Audit) -> None:
    """Put ``audit``'s verdicts into an executed notebook and its harness report (in place).

    Each test cell whose rule the source breaks fails with the rule's hint, whatever the kernel
    said (a test that already failed keeps its own error: it scores nothing either way); the
    reasons for a person to look go under ``report["review"]``, so the submission is held for
    review (and kept out of an LMS export until someone decides). ``nb`` None (nothing came
    back from the harness) takes only the reasons."""
    import nbformat
    if nb is not None:
        for cell in nb.cells:
            hint = audit.forbidden.get(grade_id_of(cell)) if is_test_cell(cell) else None
            if not hint or any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
                continue
            cell.outputs = [o for o in cell.get("outputs", []) if o.get("output_type") == "stream"]
            cell.outputs.append(nbformat.v4.new_output("error", ename="AssertionError", evalue=hint,
                                                       traceback=[f"AssertionError: {hint}"]))
    review = report.setdefault("review", [])
    review.extend(r for r in audit.reasons() if r not in review)
