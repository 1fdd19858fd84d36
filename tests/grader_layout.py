"""The grader's layout measured from its own imports (issue 42), read with ast: nothing is imported.

A module is named by its path in the package without the suffix (``engine/sandbox``; a folder's
``__init__.py`` by the folder). Every import of an autograder module counts, at the top of a file
or inside a function: a lazy import is still an arrow between two modules.

The floors, lowest first: a module may import its own floor and those below it. An import that
runs to a higher floor is "upward". The base files at the package root are the lowest floor; the
command line (``cli``, ``__main__``) and the package's face (``__init__``) are the top.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "autograder"
DATA_FOLDERS = {"demo", "templates", "__pycache__"}      # data of the grader, not its code
TOP = {"cli", "__main__", "__init__"}
FLOORS = ["base", "lms", "intake", "engine/kernel", "engine/jail", "engine", "term", "reporting",
          "publishing", "grading", "top"]
KERNEL = "engine/kernel"
# What the kernel folder's modules may import besides the standard library and each other: they
# run inside the student's kernel, whose own environment holds these.
KERNEL_ENVIRONMENT = {"IPython", "jupyter_client", "torch", "numpy", "mlexp"}


def modules(package: Path = PACKAGE) -> dict:
    """{name: path} for every module of the package (data folders and egg-info left out)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        if DATA_FOLDERS & set(parts[:-1]) or any(p.endswith(".egg-info") for p in parts):
            continue
        name = "/".join(parts)[:-3]
        found[name[:-len("/__init__")] if name.endswith("/__init__") else name] = path
    return found


def _name_of(path: Path, package: Path) -> str:
    name = path.relative_to(package).as_posix()[:-3]
    return name[:-len("/__init__")] if name.endswith("/__init__") else name


def imports_of(path: Path, package: Path = PACKAGE) -> list:
    """[(module, lazy)] for each import of a grader module in ``path``; ``lazy`` when it sits
    inside a function or a class (run when called, not when the file is imported)."""
    known = modules(package)
    name = _name_of(path, package)
    here = name.split("/") if path.name == "__init__.py" else name.split("/")[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    for node in tree.body:        # guarded imports (if/try) at module level run at import too
        if isinstance(node, (ast.If, ast.Try)):
            top.update(id(n) for n in ast.walk(node))
    found = []

    def resolve(parts: list, node) -> None:
        while parts and "/".join(parts) not in known:
            parts = parts[:-1]
        target = "/".join(parts) if parts else "__init__"
        if target != name and (parts or "__init__" in known):
            found.append((target, id(node) not in top))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "autograder":
                    resolve(alias.name.split(".")[1:], node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)] if node.level > 1 else list(here)
                module = base + (node.module.split(".") if node.module else [])
            elif (node.module or "").split(".")[0] == "autograder":
                module = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:
                resolve(module + [alias.name], node)
    return found


def graph(package: Path = PACKAGE) -> dict:
    """{module: {module it imports}} for the whole package."""
    return {name: {t for t, _ in imports_of(path, package)} for name, path in modules(package).items()}


def cycles(edges: dict) -> list:
    """Each import circle found by a depth-first walk, as "a -> b -> a"."""
    state, found = {}, []

    def walk(node, path):
        state[node] = "open"
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == "open":
                found.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                walk(dep, path + [dep])
        state[node] = "done"
    for node in sorted(edges):
        if node not in state:
            walk(node, [node])
    return found


def floor_of(name: str) -> str:
    """The floor a module stands on: its folder (the deepest one FLOORS names), the root's base
    files "base", the command line and the package face "top"."""
    if "/" not in name:
        return "top" if name in TOP else name if name in FLOORS else "base"
    parts = name.split("/")
    for depth in range(len(parts), 0, -1):
        if "/".join(parts[:depth]) in FLOORS:
            return "/".join(parts[:depth])
    raise ValueError(f"autograder/{name}.py stands in a folder that FLOORS does not name")


def upward(edges: dict) -> list:
    """Each import from a module to one on a higher floor, as "a -> b"."""
    rank = {floor: i for i, floor in enumerate(FLOORS)}
    return [f"{a} -> {b}" for a in sorted(edges) for b in sorted(edges[a])
            if rank[floor_of(b)] > rank[floor_of(a)]]


def long_modules(package: Path = PACKAGE, limit: int = 500) -> dict:
    """{module: lines} for each module over ``limit`` lines."""
    lines = {n: len(p.read_text(encoding="utf-8").splitlines()) for n, p in modules(package).items()}
    return {n: k for n, k in lines.items() if k > limit}


def kernel_imports(package: Path = PACKAGE) -> dict:
    """{module: [import]} for each import in the kernel folder of something that is neither the
    standard library, the folder itself (relative) nor KERNEL_ENVIRONMENT."""
    found = {}
    for name, path in modules(package).items():
        if not (name + "/").startswith(KERNEL + "/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else \
                ["." * node.level + (node.module or "")] if isinstance(node, ast.ImportFrom) \
                and node.level > 1 else []     # from ..x: out of the folder
            bad = [n for n in names if n.startswith("..") or n.split(".")[0] not in sys.stdlib_module_names
                   and n.split(".")[0] not in KERNEL_ENVIRONMENT]
            if bad:
                found.setdefault(name, []).extend(bad)
    return found
