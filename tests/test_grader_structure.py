"""The grader's execution core stays a few short modules a newcomer can follow (issue 27).

Every file named in autograder/README.md's map ("Which file owns what") exists and is at most
MAX_LINES long; the grader's modules import each other without a cycle (module-level imports,
read with ast: nothing is imported); and no module of the execution path keeps mutable state at
module level, except the tables and caches listed here with the reason they may.
"""
import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "autograder"
MAX_LINES = 400
# What may look mutable at module level in the execution path, and why it is not grading state.
ALLOWED_STATE = {
    ("jail", "_PROBE"): "what bubblewrap can do on this machine: one answer per process",
    ("jail", "_supports"): "whether the installed bubblewrap knows an option (lru_cache)",
    ("seccomp", "_NUMBERS"): "a constant table of system call numbers",
    ("seccomp", "ARCHES"): "a constant table built from _NUMBERS",
    ("seccomp", "DENIED"): "a constant table built from _NUMBERS",
    ("sandbox", "_LESSON_CODE"): "the lesson's own code cells, read once per release file (keyed by "
                                 "its path and modification time) for the source reading (audit)",
}


def core_files() -> list:
    """The files of autograder/README.md's map of the execution core."""
    text = (PACKAGE / "README.md").read_text()
    table = text.split("## Which file owns what", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(\w+\.py)` \|", table, flags=re.M)


def module_imports(path: Path) -> set:
    """The autograder modules ``path`` imports when it is imported (not those imported inside
    a function or a class)."""
    found = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[1] for a in node.names
                             if a.name.startswith("autograder."))
            elif isinstance(node, ast.ImportFrom):
                absolute = node.level == 0 and (node.module or "").startswith("autograder")
                if node.level == 1 or absolute:
                    parts = (node.module or "").split(".")[1 if absolute else 0:]
                    if parts and parts[0]:
                        found.add(parts[0])
                    else:   # from . import a, b
                        found.update(a.name for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):   # guarded imports run at import too
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "finalbody", []))
    visit(ast.parse(path.read_text()).body)
    return {m for m in found if (PACKAGE / f"{m}.py").is_file()} - {path.stem}


def test_the_map_names_the_core_and_each_file_is_short():
    files = core_files()
    assert {"grade.py", "wire.py", "sandbox.py", "harness.py", "protocol.py"} <= set(files), files
    long = {}
    for name in files:
        assert (PACKAGE / name).is_file(), f"autograder/README.md names {name}, which is gone"
        lines = len((PACKAGE / name).read_text().splitlines())
        if lines > MAX_LINES:
            long[name] = lines
    assert not long, f"modules of the execution core over {MAX_LINES} lines: {long}"


def test_the_graders_modules_import_each_other_without_a_cycle():
    graph = {p.stem: module_imports(p) for p in sorted(PACKAGE.glob("*.py"))}
    state, cycles = {}, []

    def walk(node, path):
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                cycles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                walk(dep, path + [dep])
        state[node] = "done"
    for node in graph:
        if node not in state:
            walk(node, [node])
    assert not cycles, "import cycles among autograder's modules:\n" + "\n".join(cycles)


def test_the_cycle_check_finds_a_cycle(tmp_path, monkeypatch):
    """The check above can fail: two modules that import each other are one cycle."""
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("if True:\n    from .a import x\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path)
    assert module_imports(tmp_path / "a.py") == {"b"}
    assert module_imports(tmp_path / "b.py") == {"a"}
    with pytest.raises(AssertionError, match="a -> b -> a"):
        test_the_graders_modules_import_each_other_without_a_cycle()


MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque",
                 "local", "WeakValueDictionary", "WeakKeyDictionary"}


def mutable_state(path: Path) -> list:
    """Module-level names bound to a mutable container or cache, and ``global`` statements."""
    tree = ast.parse(path.read_text())
    found = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else []
        value = getattr(node, "value", None)
        called = ast.unparse(value.func).rpartition(".")[2] if isinstance(value, ast.Call) else ""
        mutable = called in MUTABLE_CALLS or isinstance(value, (ast.List, ast.Dict, ast.Set,
                                                                ast.ListComp, ast.DictComp,
                                                                ast.SetComp))
        found += [t.id for t in targets if mutable and isinstance(t, ast.Name) and t.id != "__all__"]
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            for deco in node.decorator_list:
                name = ast.unparse(deco)
                if "cache" in name:
                    found.append(node.name)
    found += [f"global {', '.join(n.names)}" for n in ast.walk(tree) if isinstance(n, ast.Global)]
    return found


EXECUTION_PATH = ["sandbox", "harness", "calls", "notebook_client", "testcell", "kernel_server",
                  "wire", "wire_format", "wire_encode", "wire_decode", "protocol", "jail", "grade",
                  "autograde", "releases", "distributed", "ipcfs", "seccomp", "cells"]


def test_the_execution_path_keeps_no_mutable_state_at_module_level():
    found = {(m, name) for m in EXECUTION_PATH for name in mutable_state(PACKAGE / f"{m}.py")}
    assert not found - set(ALLOWED_STATE), \
        f"module-level mutable state in the execution path: {sorted(found - set(ALLOWED_STATE))}"
    assert not set(ALLOWED_STATE) - found, "ALLOWED_STATE names what is no longer there"


def test_the_state_check_finds_a_module_cache(tmp_path):
    (tmp_path / "m.py").write_text("import functools\nCACHE = {}\nNAMES = frozenset({1})\n"
                                   "@functools.lru_cache(None)\ndef f():\n    global CACHE\n")
    assert mutable_state(tmp_path / "m.py") == ["CACHE", "f", "global CACHE"]
