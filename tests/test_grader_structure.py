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

import grader_layout

PACKAGE = Path(__file__).resolve().parent.parent / "autograder"
MAX_LINES = 400
# What may look mutable at module level in the execution path, and why it is not grading state.
ALLOWED_STATE = {
    ("engine/jail/jail", "_PROBE"): "what bubblewrap can do on this machine: one answer per process",
    ("engine/jail/jail", "_supports"): "whether the installed bubblewrap knows an option (lru_cache)",
    ("engine/jail/seccomp", "_NUMBERS"): "a constant table of system call numbers",
    ("engine/jail/seccomp", "ARCHES"): "a constant table built from _NUMBERS",
    ("engine/jail/seccomp", "DENIED"): "a constant table built from _NUMBERS",
    ("engine/sandbox", "_LESSON_CODE"): "the lesson's own code cells, read once per release file (keyed by "
                                 "its path and modification time) for the source reading (audit)",
}


def core_files() -> list:
    """The files of autograder/README.md's map of the execution core."""
    text = (PACKAGE / "README.md").read_text()
    table = text.split("## Which file owns what", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([\w/]+\.py)` \|", table, flags=re.M)


def module_imports(path: Path) -> set:
    """The autograder modules ``path`` imports (anywhere in the file), as paths relative to the
    package with no suffix (``engine/sandbox``); see tests/grader_layout.py."""
    return {target for target, _lazy in grader_layout.imports_of(path, PACKAGE)}


def test_the_map_names_the_core_and_each_file_is_short():
    files = core_files()
    assert {"grading/grade.py", "engine/kernel/wire.py", "engine/sandbox.py", "engine/harness.py",
            "engine/protocol.py"} <= set(files), files
    long = {}
    for name in files:
        assert (PACKAGE / name).is_file(), f"autograder/README.md names {name}, which is gone"
        lines = len((PACKAGE / name).read_text().splitlines())
        if lines > MAX_LINES:
            long[name] = lines
    assert not long, f"modules of the execution core over {MAX_LINES} lines: {long}"


def test_the_graders_modules_import_each_other_without_a_cycle():
    cycles = grader_layout.cycles(grader_layout.graph(PACKAGE))
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


EXECUTION_PATH = ["engine/sandbox", "engine/harness", "engine/calls", "engine/notebook_client",
                  "engine/testcell", "engine/kernel/kernel_server", "engine/kernel/wire",
                  "engine/kernel/wire_format", "engine/kernel/wire_encode",
                  "engine/kernel/wire_decode", "engine/protocol", "engine/jail/jail", "grading/grade",
                  "engine/autograde", "publishing/releases", "engine/distributed",
                  "engine/jail/ipcfs", "engine/jail/seccomp", "cells"]


def test_the_execution_path_keeps_no_mutable_state_at_module_level():
    found = {(m, name) for m in EXECUTION_PATH for name in mutable_state(PACKAGE / f"{m}.py")}
    assert not found - set(ALLOWED_STATE), \
        f"module-level mutable state in the execution path: {sorted(found - set(ALLOWED_STATE))}"
    assert not set(ALLOWED_STATE) - found, "ALLOWED_STATE names what is no longer there"


def test_the_state_check_finds_a_module_cache(tmp_path):
    (tmp_path / "m.py").write_text("import functools\nCACHE = {}\nNAMES = frozenset({1})\n"
                                   "@functools.lru_cache(None)\ndef f():\n    global CACHE\n")
    assert mutable_state(tmp_path / "m.py") == ["CACHE", "f", "global CACHE"]
