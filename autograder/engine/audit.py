"""The exercise rules read from the student's source, on the grader's side (issues 39 and 51).

A lesson's test may state a rule: ``rules.write_it_yourself(fn, ..., forbid=("mlexp.ops",))``
(the answer must not use that library module), and ``rules.no_loop`` / ``rules.bounded`` with
the same ``forbid``. The graded calls of a ruled function run in a room where the forbidden
modules do not exist (autograder.engine.room), so whatever route the student's code takes to the
library finds nothing there. This module reads the notebook's source, in the grader's process,
before anything runs, for what only the source can tell, and for nothing else:

- **A forbidden module reached by name.** For each ruled function, the definitions it is made of
  (its ``def`` or assignment and, in turn, every function, class or name of the notebook's it
  mentions) are searched for a reference that resolves to a ``forbid`` module: ``import`` and
  ``from ... import`` under any alias, attribute chains (``mlexp.ops.linear_attention``),
  ``getattr`` with a constant name, and the library's own re-exports (read from its source
  files, never imported). Found: the test fails with the rule's hint, whatever the kernel said.
- **A loop certain to run over the sequence** in the function a "no loop over t" rule names
  (``for t in range(T)`` with ``T = q.shape[2]``, a tensor unbound along the tokens:
  :func:`autograder.engine.audit_loops.sequence_loops`), or, for a rule over a chunk's tokens, a
  loop certain to take a turn per token (``range(start, end)``, ``map`` over
  ``np.moveaxis(k, 2, 0)``): that test fails with the rule's hint. A loop over heads, the
  batch, the chunks or a fixed range is never one; what the reading is not sure of is not
  judged (the watch in the kernel only names a slip: mlexp.rules.watch_as_hints).
- **An argument never read** that a ``uses_argument`` rule says the function must use
  (``chunk_size``): the ``def`` has a parameter of that name and no line reads it (no
  ``locals()``, ``vars()`` or frame either): that test fails with the rule's hint.
- **The course library's own code run as the student's**: a library function pasted (renamed,
  its comments gone) into what a ruled function is made of, in code given to ``exec`` as text,
  or the library's source read with ``inspect.getsource`` (:mod:`autograder.engine.copies`):
  the submission is held for review, the reason naming the function and the exercise.
- **The grader's own machinery named in the source**: a name of the rules' watch replaced
  (``mlexp.rules.Trace = ...``), the kernel's messaging imported, IPython's display publisher or
  message session replaced (:func:`autograder.engine.audit_code.machinery_touched`): held.

What the code does that the reading cannot follow (``exec``, ``importlib``, ``inspect``, magics,
shell commands, a library's flags: :func:`autograder.engine.audit_code.dynamic_code`) is kept in
:attr:`Audit.dynamic` as what was seen, and never holds a submission: an honest notebook does all
of these, and the room and the watch judge the rules where the code runs.

Only the student's cells are read: every code cell that is not a test cell and whose source is
not one of the lesson's own cells (``lesson_code``: the released notebook's code cells and the
earlier versions the course's git history holds). A cell that does not parse is skipped: it
cannot run either. Cells are numbered as the student sees them: ``In [n]``, the position among
the notebook's non-empty code cells, which is the execution count the harness gives each cell.
"""
from __future__ import annotations

import ast
import builtins
import importlib.util
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from autograder.cells import grade_id_of, is_test_cell, nbgrader_meta
from autograder.engine.audit_code import code_in_strings, dynamic_code, machinery_touched
from autograder.engine.audit_loops import sequence_loops
from autograder.engine.audit_names import FUNCTIONS, Bindings, closure, import_modules, attribute_paths, free_loads
from autograder.engine.copies import copied_in_pieces, copied_library_code, library_source_read
from autograder.engine.rule_args import rule_calls

__all__ = ["Audit", "audit_notebook", "lesson_key", "apply_audit", "RULES"]

RULES = ("write_it_yourself", "in_time", "no_loop", "bounded", "summed_work", "uses_argument", "call")
REFLECTIVE = {"locals", "vars", "eval", "exec", "f_locals", "currentframe", "_getframe"}   # reads a local by name
RULE_HINT = "this exercise asks you to write it yourself"      # as mlexp.rules says it
@dataclass
class Audit:
    """What the source says: ``forbidden`` {test grade id: the hint its test fails with: a
    forbidden module reached}; ``loops`` {test grade id: the hint its test fails with: a loop
    certain to run over the sequence}; ``unused`` {test grade id: the hint its test fails with: the
    argument a ``uses_argument`` rule names is never read}; ``copies`` [(cell, what, test grade id or "")] the
    library's code run as the student's, and ``machinery`` [(cell, what)] the grader's own
    machinery touched, both held for review; ``dynamic`` [(cell, what)] what the reading could
    not follow (never held); ``read`` cells read. Cells are ``In [n]`` numbers."""
    forbidden: dict = field(default_factory=dict)
    loops: dict = field(default_factory=dict)
    unused: dict = field(default_factory=dict)
    dynamic: list = field(default_factory=list)
    copies: list = field(default_factory=list)
    machinery: list = field(default_factory=list)
    ruled: list = field(default_factory=list)     # grade ids of the tests that state a rule
    read: int = 0

    def reasons(self) -> list:
        """The reasons a person should look ([] for an honest notebook)."""
        out = []
        if self.copies:
            shown = "; ".join(f"{what} (your In [{n}]" + (f", exercise '{test}')" if test else ")")
                              for n, what, test in self.copies[:4])
            more = f" and {len(self.copies) - 4} more" if len(self.copies) > 4 else ""
            tests = sorted({t for _, _, t in self.copies if t})
            out.append(f"the notebook runs the course library's own code as the student's: {shown}{more}; "
                       + (f"check the points of {', '.join(repr(t) for t in tests)}, which asks for it to "
                          "be written by hand" if tests else
                          "check the points of the exercises that ask for it to be written by hand"))
        if self.machinery:
            shown = "; ".join(f"your In [{n}] {what}" for n, what in self.machinery[:4])
            more = f" and {len(self.machinery) - 4} more" if len(self.machinery) > 4 else ""
            tests = ", ".join(repr(t) for t in self.ruled) or "the exercises with a rule"
            out.append(f"the notebook's code touches the grader's own machinery ({shown}{more}): check the "
                       f"points of {tests}, whose rules are watched in the kernel")
        return out

    def review(self) -> str:
        """The reasons a person should look, as one line, or "" for an honest notebook."""
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
    """Every import of the notebook's cells, and each top-level name assigned a library object:
    name -> dotted path, the last one wins (what code the grader cannot read is judged by;
    the rules' verdicts follow autograder.engine.audit_names.Bindings, in notebook order)."""

    def __init__(self):
        self.imports = {}

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


def _rules_of(test_source: str, problems: list | None = None) -> list:
    """[(function name, forbid modules, instead, rule, over)] of each rule call in a test cell's
    source (``over``: the ``over=`` of a ``no_loop``, "t" when not given). Arguments are read as
    autograder.engine.rule_args says (literals, f-strings, constants the cell binds before the
    call); a rule call that cannot be read is left out and, with ``problems`` (a list), said
    there, for ``build --check`` to report as the author's error."""
    tree = _parse(test_source)
    return [] if tree is None else rule_calls(tree, RULES, problems)


def audit_notebook(nb, lesson_code=()) -> Audit:
    """Read ``nb`` (the notebook as it is graded: its test cells are the release's) and say what
    its source shows (:class:`Audit`). ``lesson_code``: sources of the lesson's own code cells,
    which are not the student's and are not read for what they do (their imports still count)."""
    lesson = {lesson_key(s) for s in lesson_code}
    names, bindings, student, rules = _Names(), Bindings(), [], {}
    number = 0
    for cell in nb.cells:
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        number += 1          # In [number]: the execution count the harness gives this cell
        if is_test_cell(cell):
            for rule in _rules_of(cell.source):
                rules.setdefault(grade_id_of(cell) or f"In [{number}]", []).append((number, *rule))
            continue
        tree = _parse(cell.source)
        if tree is None:
            continue
        trees = [tree] + [t for t in map(_parse, code_in_strings(tree)) if t is not None]
        for t in trees:
            names.add(t, number)
            bindings.add(t, number, names.dotted)
        if lesson_key(cell.source) not in lesson:
            student.extend((t, number) for t in trees)
    out = Audit(read=len({n for _, n in student}), ruled=list(rules))
    if not rules:            # no rule to protect: what the code does is the tests' to judge
        return out
    student_cells = {n for _, n in student}
    made_of = {}             # test grade id -> names its ruled functions are made of
    unbound = set()          # tests whose functions read a name no cell binds (one exec made?)
    for grade_id, found in rules.items():
        for test_cell, fn, *_ in found:
            for name, b in _closure(fn, test_cell, bindings, student_cells):
                made_of.setdefault(grade_id, set()).add(name)
                if any(not bindings.by_name.get(n.id) and not hasattr(builtins, n.id) for n in free_loads(b.node)):
                    unbound.add(grade_id)
    for tree, number in student:
        out.dynamic.extend((number, what) for what in dynamic_code(tree, names)
                           if (number, what) not in out.dynamic)
        out.machinery.extend((number, what) for what in machinery_touched(tree, names)
                             if (number, what) not in out.machinery)
        pasted = [(what, what.split(" is the code of ")[0]) for what in copied_library_code(tree)]
        pasted += [(what, "") for what in library_source_read(tree, names.dotted)]
        in_exec = set(copied_library_code(tree, exec_only=True))
        for what, fn in pasted:
            test = next((g for g, made in made_of.items() if fn and fn in made), "") or \
                (next((g for g in rules if g in unbound), "") if not fn or what in in_exec else "")
            if (test or not fn or what in in_exec) and not any(w == what for _, w, _ in out.copies):
                out.copies.append((number, what, test))
    for grade_id, found in rules.items():
        for test_cell, fn, *_ in found:
            defs = {id(b.node): b for _, b in _closure(fn, test_cell, bindings, student_cells)
                    if isinstance(b.node, (ast.FunctionDef, ast.AsyncFunctionDef))}
            defs = sorted(defs.values(), key=lambda b: (b.cell, b.node.lineno))
            name = copied_in_pieces([b.node for b in defs]) if len(defs) > 1 else None
            what = f"{fn} and the functions it reads are the code of {name}"
            if name and not any(test == grade_id for _, _, test in out.copies):
                out.copies.append((defs[0].cell, what, grade_id))
        for test_cell, fn, forbid, instead, rule, over in found:
            hint = _forbidden_use(fn, test_cell, forbid, instead, bindings, student_cells)
            if hint:
                out.forbidden.setdefault(grade_id, hint)
            if rule == "no_loop" and grade_id not in out.loops:
                # over t: no loop over the sequence at all; over anything else (a chunk's tokens): a
                # loop over chunks is the method, one that turns once per token is not
                loop = _loop_in(fn, test_cell, bindings, student_cells, per_token=over != "t")
                if loop:
                    out.loops[grade_id] = (f"Hint: {RULE_HINT} without a Python loop over {over}: {loop}. "
                                           + (instead or "Use whole-tensor operations over the sequence") + ".")
            if rule == "uses_argument" and grade_id not in out.unused:
                never = _never_read(fn, over, test_cell, bindings, student_cells)
                if never:
                    out.unused[grade_id] = f"Hint: {over} is not used: {never}. " + (instead or f"Use {over}") + "."
    return out


def _closure(fn, test_cell, bindings: Bindings, student_cells):
    """The student's bindings ``fn`` is made of when the test in ``test_cell`` calls it (audit_names.closure)."""
    return closure([fn], test_cell, bindings, student_cells)


def _loop_in(fn, test_cell, bindings: Bindings, student_cells, per_token=False) -> str:
    """The first loop of ``fn``'s own ``def`` (as the test in ``test_cell`` finds it) that is
    certain to run over the sequence (``per_token``: a turn per token), in words, or ""
    (:func:`sequence_loops`: never a loop over heads, the batch or a fixed range, never a list it
    appends to)."""
    for b in bindings.at(fn, test_cell):
        if b.cell in student_cells and isinstance(b.node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and b.node.name == fn:
            found = sequence_loops(b.node, per_token)
            if found:
                line, what = found[0]
                how = "the tokens one at a time" if per_token else "the sequence"
                return f"{fn} loops over {how} ({what}: your In [{b.cell}], line {line})"
    return ""


def _never_read(fn, argument, test_cell, bindings: Bindings, student_cells) -> str:
    """In words, ``fn``'s own ``def`` (as the test in ``test_cell`` finds it) never reading its
    parameter ``argument``, or "" when it reads it or the reading cannot be sure: no parameter of
    that name, a ``**kwargs``, a name read through ``locals()``, ``vars()``, ``eval`` or a frame."""
    for b in bindings.at(fn, test_cell):
        node = b.node
        if b.cell not in student_cells or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                or node.name != fn:
            continue
        params = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        if argument not in params or node.args.kwarg is not None:
            return ""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and (sub.id in REFLECTIVE or (sub.id == argument and
                                                                       isinstance(sub.ctx, ast.Load))):
                return ""
            if isinstance(sub, ast.Attribute) and sub.attr in REFLECTIVE:
                return ""
        return f"{fn} never reads its argument {argument} (your In [{b.cell}], line {node.lineno})"
    return ""


def _forbidden_use(fn, test_cell, forbid, instead, bindings: Bindings, student_cells) -> str:
    """The hint for ``fn`` reaching a ``forbid`` module when the test in ``test_cell`` calls it,
    through what its names hold then and what the student's cells bind them to, or ""."""
    hit = _reach(fn, test_cell, forbid, bindings, student_cells)
    if not hit:
        return ""
    what, cell = hit
    return (f"Hint: {RULE_HINT}: {fn} uses {what} (your In [{cell}]). "
            + (instead or f"Write it without {', '.join(forbid)}") +
            "; the library is only the reference the test checks against.")


def _reach(fn, test_cell, forbid, bindings: Bindings, student_cells):
    """(forbidden path, cell) of the first use of a ``forbid`` module found by following ``fn``'s
    bindings and the module names they read (only uses in the student's cells count), or None."""
    for _name, b in _closure(fn, test_cell, bindings, student_cells):
        if b.module and _is_forbidden(b.module, forbid):
            return b.module, b.cell
        for sub in ast.walk(b.node):
            if isinstance(sub, (ast.Import, ast.ImportFrom)):
                modules = [sub.module or ""] if isinstance(sub, ast.ImportFrom) else []
                for path in modules + [m for m in import_modules(sub).values()]:
                    if _is_forbidden(path, forbid):
                        return path, b.cell
        loads = free_loads(b.node)
        free = {id(n) for n in loads}
        uses = [(n.id, chain) for n, chain in attribute_paths(b.node) if id(n) in free] + \
            [(n.id, n.id) for n in loads]      # the longest path first: the hint names it
        for base, path in uses:
            for held in bindings.at(base, test_cell):
                full = held.module if path == base else f"{held.module}.{path}" if held.module else ""
                if full and _is_forbidden(full, forbid):
                    return full, b.cell
    return None


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

    Each test cell whose rule the source breaks (a forbidden module reached, a loop certain to
    run over the sequence) fails with the rule's hint, whatever the kernel said (a test that
    already failed keeps its own error: it scores nothing either way); the reasons for a person
    to look (the library's code run as the student's, the grader's machinery touched) go under
    ``report["review"]``, so the submission is held for review. ``nb`` None (nothing came back
    from the harness) takes only the reasons."""
    import nbformat
    for cell in nb.cells if nb is not None else ():
        if not is_test_cell(cell):
            continue
        grade_id = grade_id_of(cell)
        hint = audit.forbidden.get(grade_id) or audit.loops.get(grade_id) or audit.unused.get(grade_id)
        if not hint or any(o.get("output_type") == "error" for o in cell.get("outputs", [])) \
                or _part_scored(cell):
            continue
        cell.outputs = [o for o in cell.get("outputs", []) if o.get("output_type") == "stream"]
        cell.outputs.append(nbformat.v4.new_output("error", ename="AssertionError", evalue=hint,
                                                   traceback=[f"AssertionError: {hint}"]))
    review = report.setdefault("review", [])
    review.extend(r for r in audit.reasons() if r not in review)


def _part_scored(cell) -> bool:
    """The test cell ended in a score below its points (autograder.engine.partial): it judged its parts
    one by one, each call of a ruled function in the room where the forbidden modules are absent, so a
    part that needed one already failed, and the parts that did not keep their points."""
    points = nbgrader_meta(cell).get("points")
    for o in cell.get("outputs", []):
        if o.get("output_type") == "execute_result":
            try:
                return float(o.get("data", {}).get("text/plain", "")) < float(points)
            except (TypeError, ValueError):
                return False
    return False
