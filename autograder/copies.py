"""The course library's own code run as a student's, recognised by its content (issue 39).

An exercise that asks for a method to be written by hand (:mod:`autograder.audit`'s rules)
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

__all__ = ["copied_library_code", "COPY_MIN_STATEMENTS"]

COPY_MIN_STATEMENTS = 5      # a library function this small is what anyone would write


def _shape(statements) -> str:
    """Statements with every name, argument name, string and type annotation blanked: the same
    for a library function's body and a renamed, re-commented paste of it (attribute names,
    numbers, operators and the order of calls stay: they are the method)."""
    import copy
    module = ast.Module(body=copy.deepcopy(list(statements)), type_ignores=[])
    for node in ast.walk(module):
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
    return ast.dump(module, annotate_fields=False)


def _body(fn):
    """A function's statements without its docstring."""
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body


@lru_cache(maxsize=None)
def _library_shapes(package: str = "mlexp") -> tuple:
    """(shape of each statement, dotted name) of every function of the course library with at
    least COPY_MIN_STATEMENTS statements, read from its source files (never imported)."""
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
                body = _body(node)
                if sum(isinstance(n, ast.stmt) for b in body for n in ast.walk(b)) >= COPY_MIN_STATEMENTS:
                    found.append((tuple(_shape([b]) for b in body), f"{module}.{node.name}"))
    return tuple(found)


def copied_library_code(tree) -> list:
    """What in ``tree`` is a function of the course library by its content: a function whose
    body holds the whole body of a library function (of COPY_MIN_STATEMENTS statements or more)
    as a run of its statements, names, strings and comments aside; also in code given to
    ``exec``/``compile`` as a constant string."""
    trees = [tree]
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
            mine = [_shape([b]) for b in _body(node)]
            for shapes, name in library:
                n = len(shapes)
                if any(tuple(mine[i:i + n]) == shapes for i in range(len(mine) - n + 1)):
                    what = f"{node.name} is the code of {name}"
                    if what not in said:
                        said.append(what)
                    break
    return said
