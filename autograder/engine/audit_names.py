"""What a name of a notebook is bound to when a test calls a student's function (autograder.engine.audit).

The harness runs a notebook's cells top to bottom, so when the test of cell P calls a student's
function, each global name the function uses holds what the cells before P last bound to it.
:class:`Bindings` records every binding of a name made at a notebook's module level, in order:

- **unconditional**: an ``import``, a ``def``/``class``, an assignment, made by a statement at
  the top of a cell: it replaces what the name held;
- **conditional**: anything else that may bind or change a name at module level: a statement
  nested in ``if``/``for``/``while``/``try``/``with``/``match`` (their targets, a walrus, an
  ``except ... as``, a ``match`` capture, a nested ``def`` or ``import``), a function that
  declares the name ``global`` and assigns it, and a change to the object a name holds
  (``box.append(x)``, ``box[0] = x``, ``box.attr = x``, ``setattr(box, ...)``, ``cfg.update(...)``).

:meth:`Bindings.at` gives a name's candidates before cell P: its last unconditional binding and
every conditional one made after it. :func:`free_loads` gives the names an expression or a
function reads from the module (a function's parameters and locals are its own), so following
a function's names never wanders into another place's local variables.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

__all__ = ["Binding", "Bindings", "closure", "free_loads", "attribute_paths", "import_modules"]

MUTATORS = {"append", "extend", "insert", "update", "setdefault", "add", "__setitem__"}
COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.With, ast.AsyncWith, ast.Match)
if hasattr(ast, "TryStar"):
    COMPOUND = COMPOUND + (ast.TryStar,)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


@dataclass
class Binding:
    """One binding of a name: ``module`` the dotted path it imports ("" if none), ``node`` the
    statement (or function) that binds it, ``cell`` its cell number, ``conditional`` as above."""
    module: str
    node: object
    cell: int
    conditional: bool


def _targets(node) -> list:
    """Names a statement stores directly (its targets), not inside nested scopes."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    return []


def _stores(node) -> set:
    """Every name a module-level statement may bind, nested blocks included (not function bodies)."""
    found = set()

    def visit(n):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(n.name)
            return
        if isinstance(n, ast.Lambda):
            return
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            found.add(n.id)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            found.add(n.name)
        elif isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
            found.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            found.add(n.rest)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            found.update((a.asname or a.name).split(".")[0] for a in n.names if a.name != "*")
        for child in ast.iter_child_nodes(n):
            visit(child)
    visit(node)
    return found


def _changed(node) -> set:
    """Names whose objects a module-level statement changes (``box.append(x)``, ``box[0] = x``,
    ``box.attr = x``, ``setattr(box, ...)``), nested blocks included (not function bodies)."""
    found = set()
    for n in _walk_module_level(node):
        target = None
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS:
            target = n.func.value
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setattr" and n.args:
            target = n.args[0]
        elif isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                if isinstance(t, (ast.Attribute, ast.Subscript)):
                    found.update(_base_names(t))
        if target is not None:
            found.update(_base_names(target))
    return found


def _base_names(node) -> set:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return {node.id} if isinstance(node, ast.Name) else set()


def _walk_module_level(node):
    """ast.walk without entering function or class bodies."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        if n is not node and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        todo.extend(ast.iter_child_nodes(n))


def _globals_assigned(fn) -> set:
    """Names a function declares ``global`` (and so may bind at module level)."""
    return {name for n in ast.walk(fn) if isinstance(n, ast.Global) for name in n.names}


def import_modules(node) -> dict:
    """name -> dotted module path for an Import/ImportFrom statement."""
    out = {}
    if isinstance(node, ast.Import):
        for a in node.names:
            out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        for a in node.names:
            if a.name != "*":
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


class Bindings:
    """Every module-level binding of the notebook's names, in notebook order (module docstring)."""

    def __init__(self):
        self.by_name = {}

    def _add(self, name, binding):
        self.by_name.setdefault(name, []).append(binding)

    def add(self, tree, cell: int, dotted) -> None:
        """Record the bindings of one cell's parsed code; ``dotted(expr)`` names a library path."""
        for stmt in tree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for name, module in import_modules(stmt).items():
                    self._add(name, Binding(module, stmt, cell, False))
                continue
            direct = set(_targets(stmt))
            value = getattr(stmt, "value", None)
            alias = dotted(value) if isinstance(stmt, ast.Assign) and value is not None else ""
            for name in direct:
                self._add(name, Binding(alias, stmt, cell, False))
            for n in _walk_module_level(stmt):
                if n is not stmt and isinstance(n, (ast.Import, ast.ImportFrom)):
                    for name, module in import_modules(n).items():
                        self._add(name, Binding(module, stmt, cell, True))
            for name in (_stores(stmt) | _changed(stmt)) - direct:
                self._add(name, Binding("", stmt, cell, True))
            for n in ast.walk(stmt):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for name in _globals_assigned(n):
                        self._add(name, Binding("", n, cell, True))

    def at(self, name: str, before: int) -> list:
        """The bindings ``name`` may hold when cell ``before`` runs (module docstring)."""
        found = [b for b in self.by_name.get(name, []) if b.cell < before]
        last = max((i for i, b in enumerate(found) if not b.conditional), default=None)
        return found if last is None else found[last:]


def closure(roots, before: int, bindings: Bindings, cells=None):
    """The bindings the names ``roots`` are made of when cell ``before`` runs: their own, then
    those of every module name they read, in turn (each name once), as (name, Binding); only the
    bindings made in ``cells`` (cell numbers; None: any) are followed."""
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for b in bindings.at(name, before):
            if cells is None or b.cell in cells:
                yield name, b
                todo.extend(n.id for n in free_loads(b.node) if n.id not in seen)


def _locals_of(fn) -> set:
    """A function's (or lambda's) own names: parameters, what its body binds, minus ``global``."""
    a = fn.args
    names = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs} | \
        {x.arg for x in (a.vararg, a.kwarg) if x is not None}
    body = fn.body if isinstance(fn.body, list) else [fn.body]
    for stmt in body:
        names |= _stores(stmt) if not isinstance(stmt, ast.expr) else set()
        for n in ast.walk(stmt):
            if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name):
                names.add(n.target.id)
    return names - _globals_assigned(fn)


def free_loads(node) -> list:
    """The Name nodes ``node`` reads from the module: not a parameter or local of a function or
    lambda inside it, nor a comprehension's own variable."""
    out = []

    def visit(n, scope):
        if isinstance(n, FUNCTIONS):
            outer = list(n.args.defaults) + [d for d in n.args.kw_defaults if d is not None]
            if not isinstance(n, ast.Lambda):
                outer += n.decorator_list
            for d in outer:
                visit(d, scope)
            inner = scope | _locals_of(n)
            for b in (n.body if isinstance(n.body, list) else [n.body]):
                visit(b, inner)
            return
        if isinstance(n, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = scope | {t.id for g in n.generators for t in ast.walk(g.target) if isinstance(t, ast.Name)}
            for child in ast.iter_child_nodes(n):
                visit(child, inner)
            return
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in scope:
            out.append(n)
        for child in ast.iter_child_nodes(n):
            visit(child, scope)
    visit(node, frozenset())
    return out


def attribute_paths(node) -> list:
    """(Name node, attribute chain) for each attribute access or constant ``getattr`` in ``node``
    whose object is built from a name in any way (``[mlexp][0].ops.f`` gives (mlexp, "ops.f"))."""
    out = []
    for n in ast.walk(node):
        chain, base = [], None
        if isinstance(n, ast.Attribute):
            base = n
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" \
                and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str):
            chain, base = [n.args[1].value], n.args[0]
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
        if base is not None and chain:
            for name in ast.walk(base):
                if isinstance(name, ast.Name):
                    out.append((name, ".".join(chain)))
    return out
