"""The course library's own code run as a student's, recognised by its content (issue 39).

An exercise that asks for a method to be written by hand (:mod:`autograder.engine.audit`'s rules)
can be answered with the library's reference pasted into the notebook, renamed, its comments
and docstring gone, or read as text and run with ``exec``. :func:`copied_library_code` finds
those by comparing the code's shape (names blanked, the calls, attributes, numbers and
operators kept) with every function of ``mlexp`` of at least :data:`COPY_MIN_STATEMENTS`
statements, read from the library's source files and never imported. A short function is
what anyone would write; a long one that matches statement for statement is the library's.
"""
from __future__ import annotations

import ast
import importlib.util
from functools import lru_cache
from pathlib import Path

__all__ = ["copied_library_code", "copied_in_pieces", "copy_of", "library_source_read", "COPY_MIN_STATEMENTS"]

COPY_MIN_STATEMENTS = 6      # a library function this small is what anyone would write
COPY_SHARE = 0.85            # of a library function's statements, in its order, that make a copy
BODIES = ("body", "orelse", "finalbody", "handlers", "cases")


def _flat(statements) -> list:
    """Each statement's shape in order, a compound statement's header then its blocks; names,
    argument names, strings and annotations blanked (attribute names, numbers, operators and
    the order of calls stay: they are the method). ``pass`` and bare constants (docstrings) are
    left out, so padding a paste with them changes nothing."""
    import copy
    out = []
    for stmt in statements:
        if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            continue
        blocks, detached = [], {}
        for name in BODIES:         # the blocks are flattened below: copy the header alone
            inner = getattr(stmt, name, None)
            if isinstance(inner, list):
                blocks.append(inner)
                detached[name] = inner
                setattr(stmt, name, [])
        try:
            head = copy.deepcopy(stmt)
        finally:
            for name, inner in detached.items():
                setattr(stmt, name, inner)
        for node in ast.walk(head):
            if isinstance(node, ast.Name):
                node.id = "_"
            elif isinstance(node, ast.arg):
                node.arg, node.annotation = "_", None
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                node.name = "_"
                if not isinstance(node, ast.ClassDef):
                    node.returns = None
            elif isinstance(node, ast.AnnAssign):
                node.annotation = ast.Constant("")
            elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
                node.value = ""
        out.append(ast.dump(head, annotate_fields=False))
        for block in blocks:
            for item in block:      # handlers and match cases hold statements of their own
                out += _flat(item.body) if isinstance(item, (ast.ExceptHandler, ast.match_case)) else _flat([item])
    return out


@lru_cache(maxsize=None)
def _library_shapes(package: str = "mlexp") -> tuple:
    """(flat shapes, dotted name) of every function of the course library with at least
    COPY_MIN_STATEMENTS statements, read from its source files (never imported)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return ()
    if spec is None or not spec.submodule_search_locations:
        return ()
    root = Path(list(spec.submodule_search_locations)[0])
    found = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join((package, *path.relative_to(root).with_suffix("").parts))
        module = module.removesuffix(".__init__")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                shapes = _flat(node.body)
                if len(shapes) >= COPY_MIN_STATEMENTS:
                    found.append((tuple(shapes), f"{module}.{node.name}"))
    return tuple(found)


def _common(a, b) -> int:
    """The length of the longest common subsequence of ``a`` and ``b``."""
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b, start=1):
            prev, row[j] = row[j], prev + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def copied_library_code(tree, exec_only=False) -> list:
    """What in ``tree`` is a function of the course library by its content: the statements of a
    library function of COPY_MIN_STATEMENTS or more, COPY_SHARE of them at least, in its order,
    within a function of ``tree`` (names, strings, comments, ``pass`` and wrapping blocks aside),
    or within code given to ``exec``/``compile`` as a constant string (``exec_only``: only those)."""
    trees = [] if exec_only else [tree]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("exec", "compile") \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            try:
                trees.append(ast.parse(node.args[0].value))
            except (SyntaxError, ValueError, RecursionError):
                continue
    said = []
    library = _library_shapes()
    for t in trees:
        for node in ast.walk(t):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            name = copy_of(_flat(node.body), library)
            what = f"{node.name} is the code of {name}"
            if name and what not in said:
                said.append(what)
    return said


def copied_in_pieces(functions) -> str | None:
    """The library function that ``functions`` (a ruled function and the helpers it reads, as
    ``def`` nodes in notebook order) hold together, COPY_SHARE of its statements in its order
    (a paste split into helpers, each under COPY_SHARE alone), in their order or the reverse
    (a helper defined after its caller); None when they are not one."""
    for order in (functions, functions[::-1]):
        name = copy_of([s for node in order for s in _flat(node.body)], _library_shapes())
        if name:
            return name
    return None


def copy_of(mine, library):
    """The name of the library function whose statements ``mine`` (a function's :func:`_flat`
    shapes) holds, COPY_SHARE of them at least in their order, or None. ``library``: (shapes,
    name) pairs as :func:`_library_shapes` gives them (the room's guard sends them as hashes)."""
    from collections import Counter
    have = Counter(mine)
    for shapes, name in library:
        need = COPY_SHARE * len(shapes)
        if sum(min(c, have[s]) for s, c in Counter(shapes).items()) >= need and _common(shapes, mine) >= need:
            return name
    return None


SOURCE_READERS = ("inspect.getsource", "inspect.getsourcelines")


def library_source_read(tree, dotted) -> list:
    """The course library's functions whose source ``tree`` reads as text to run it
    (``exec(inspect.getsource(mlexp.ops.linear._recurrent))``): ``inspect.getsource`` of a path
    of ``mlexp`` (``dotted(expr)`` names the path an expression reaches, from the notebook's
    imports)."""
    said = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and dotted(node.func) in SOURCE_READERS and node.args:
            path = dotted(node.args[0])
            what = f"the code of {path}, read with {dotted(node.func)}"
            if path.split(".")[0] == "mlexp" and what not in said:
                said.append(what)
    return said
