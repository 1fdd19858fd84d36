"""The grader stays folders of short modules a newcomer can follow (issues 27 and 42).

Every file named in autograder/README.md's map ("Which file owns what") exists and is at most
MAX_LINES long; measured from the code's own imports (tests/grader_layout.py, read with ast:
nothing is imported), the grader's modules import each other without a circle and never up a
floor, imports sit at the top of each file except where a test here shows why, no module is over
500 lines and the kernel folder imports only the standard library; and no module of the
execution path keeps mutable state at module level, except the tables and caches listed here
with the reason they may.
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


# --------------------------------------------------------------- the folders (issue 42)

ROOT = PACKAGE.parent
# Where an import may stay inside a function, and the test that shows why.
ALLOWED_LAZY = {
    "cli": "each command imports what it runs: `import autograder.cli` loads neither torch nor "
           "Dask (test_the_command_line_starts_without_torch_or_dask)",
    "__init__": "the package's face: `import autograder` loads nothing of the grader "
                "(test_the_package_face_imports_nothing)",
    "grading/grade": "Dask is imported only for --scheduler (test_grading_imports_dask_only_for_a_cluster)",
}


def test_the_folders_import_no_circle_and_nothing_upward():
    edges = grader_layout.graph(PACKAGE)
    assert not grader_layout.cycles(edges)
    up = grader_layout.upward(edges)
    assert len(up) <= 1, f"imports running up a floor ({grader_layout.FLOORS}): {up}"


def test_the_floor_check_finds_an_import_running_up(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "grading").mkdir()
    (tmp_path / "engine" / "run.py").write_text("def f():\n    from autograder.grading import batch\n")
    (tmp_path / "grading" / "batch.py").write_text("from autograder.engine.run import f\n")
    edges = grader_layout.graph(tmp_path)
    assert grader_layout.upward(edges) == ["engine/run -> grading/batch"]
    assert grader_layout.cycles(edges) == ["engine/run -> grading/batch -> engine/run"]


def test_no_module_is_over_500_lines():
    long = grader_layout.long_modules(PACKAGE)
    for folder in ("mlexp", "benchmarks", "scripts"):
        long.update({f"{folder}/{p.relative_to(ROOT / folder)}": n for p in (ROOT / folder).rglob("*.py")
                     if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500})
    assert not long, f"modules over 500 lines: {long}"


def test_the_kernel_folder_imports_only_the_standard_library():
    """What is sent into the student's kernel (engine/kernel/) imports nothing of the grader: only
    the standard library, its own folder and what that kernel's environment holds anyway."""
    assert grader_layout.kernel_imports(PACKAGE) == {}


def test_the_kernel_check_finds_a_grader_import(tmp_path):
    (tmp_path / "engine" / "kernel").mkdir(parents=True)
    (tmp_path / "engine" / "kernel" / "k.py").write_text(
        "import json\nfrom . import wire\ndef f():\n    from autograder import options\n"
        "    from ..sandbox import x\n")
    assert grader_layout.kernel_imports(tmp_path) == {"engine/kernel/k": ["autograder", "..sandbox"]}


def test_imports_sit_at_the_top_of_each_file_except_where_a_test_shows_why():
    lazy = {name: sorted({t for t, is_lazy in grader_layout.imports_of(path, PACKAGE) if is_lazy})
            for name, path in grader_layout.modules(PACKAGE).items()}
    lazy = {name: targets for name, targets in lazy.items() if targets and name not in ALLOWED_LAZY}
    assert not lazy, f"grader imports inside a function, with no test that shows why: {lazy}"


def _imported_by(code: str) -> set:
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return set(out.split())


def test_the_command_line_starts_without_torch_or_dask():
    loaded = _imported_by("import autograder.cli")
    assert not {"torch", "dask", "distributed"} & loaded


def test_the_package_face_imports_nothing():
    loaded = _imported_by("import autograder")
    assert not {m for m in loaded if m.startswith("autograder.")}


def test_grading_imports_dask_only_for_a_cluster():
    loaded = _imported_by("import autograder.grading.grade")
    assert not {"dask", "distributed"} & loaded


def test_each_folder_says_what_it_owns_and_may_import_and_the_map_names_it():
    text = (PACKAGE / "README.md").read_text()
    for floor in grader_layout.FLOORS:
        if floor in ("base", "top"):
            continue
        readme = PACKAGE / floor / "README.md"
        assert readme.is_file(), f"autograder/{floor}/ has no README.md"
        assert "## What it may import" in readme.read_text(), f"{readme} does not say what it may import"
        assert f"`{floor}/`" in text, f"autograder/README.md's map does not name {floor}/"
    folders = {p.parent.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("__init__.py")
               if not grader_layout.DATA_FOLDERS & set(p.relative_to(PACKAGE).parts)} - {"."}
    assert folders <= set(grader_layout.FLOORS), f"folders no floor names: {folders - set(grader_layout.FLOORS)}"
