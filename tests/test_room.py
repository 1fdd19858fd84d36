"""The room (autograder.engine.room): a ruled exercise's graded calls run where the module its rule
forbids does not exist, so no route to the library earns its points, and honest code runs there
as it did in the notebook.

One notebook holds many small exercises, each a function of the student's with a test that
forbids ``mlexp.kvcache`` (``kv_bytes_per_token(n_attn_layers, n_kv_heads, head_dim, bytes)``
written by hand: 2 * layers * heads * dim * bytes); it is run once through the real harness,
sandboxed, and each exercise's verdict is read from its test cell.
"""
import ast
import inspect
import json
import marshal
import os
import tempfile
from pathlib import Path

import mlexp.kvcache as kvcache
import nbformat
import pytest

from autograder.cells import grade_id_of, is_test_cell
from autograder.engine.jail import jail
from autograder.engine.room import room_program, ruled_names

REPO = Path(__file__).resolve().parent.parent

_PASTE = inspect.getsource(kvcache.hybrid_memory_bytes).replace("def hybrid_memory_bytes", "def _copy")
_MARSHALLED = marshal.dumps(compile("def f(L, H, D, b):\n    return 2 * L * H * D * b\n", "f", "exec").co_consts[0])

# name -> the student's cells that define it (honest or not)
HONEST = {
    "plain": ["def plain(L, H, D, b):\n    return 2 * L * H * D * b\n"],
    "loop_over_layers": ["def loop_over_layers(L, H, D, b):\n    total = 0\n    for layer in range(L):\n"
                         "        for head in range(H):\n            total += 2 * D * b\n    return total\n"],
    "helper_in_another_cell": ["import math\nBYTES_PER_PAIR = 2\n\ndef _per_head(D, b):\n"
                               "    return BYTES_PER_PAIR * D * b\n",
                               "def helper_in_another_cell(L, H, D, b):\n    return math.prod([L, H]) * _per_head(D, b)\n"],
    "class_with_attributes": ["class Budget:\n    def __init__(self, b):\n        self.budget = b\n"
                              "    def __repr__(self):\n        return repr(self.__dict__)\n"
                              "    def per(self, D):\n        return 2 * D * self.budget\n\n"
                              "def class_with_attributes(L, H, D, b):\n    return L * H * Budget(b).per(D)\n"],
    "recursive": ["def recursive(L, H, D, b):\n    return 0 if L == 0 else 2 * H * D * b + recursive(L - 1, H, D, b)\n"],
    "colab_habits": ["try:\n    import google.colab  # noqa\n    IN_COLAB = True\nexcept ImportError:\n    IN_COLAB = False\n"
                     "%cd /tmp\n!pip list 2>/dev/null | grep -i torch\n",
                     "%%time\nimport functools, operator\ncalls = []\n"
                     "def colab_habits(L, H, D, b):\n    calls.append(L)\n    return functools.reduce(operator.mul, [2, L, H, D, b])\n"],
    "scratch_cell_compares": ["def scratch_cell_compares(L, H, D, b):\n    return 2 * L * H * D * b\n",
                              "from mlexp.kvcache import kv_bytes_per_token as ref\n"
                              "print(ref(4, 2, 8, 2), scratch_cell_compares(4, 2, 8, 2))\n"],
}
DISHONEST = {
    "imports_it": ["from mlexp.kvcache import kv_bytes_per_token\n\n"
                   "def imports_it(L, H, D, b):\n    return kv_bytes_per_token(L, H, D, b)\n"],
    "spelled_in_pieces": ["import importlib\n\ndef spelled_in_pieces(L, H, D, b):\n"
                          "    m = importlib.import_module('mlexp.' + 'kv' + 'cache')\n"
                          "    return m.kv_bytes_per_token(L, H, D, b)\n"],
    "from_text": ["SRC = 'import mlexp.kvcache as K\\ndef from_text(L, H, D, b):\\n    return K.kv_bytes_per_token(L, H, D, b)\\n'\n"
                  "exec(SRC)\n"],
    "through_another_module": ["import mlexp, sys\n\ndef through_another_module(L, H, D, b):\n"
                               "    __import__('mlexp.kvcache')\n"
                               "    return vars(vars(sys)['modules']['mlexp'])['kv' + 'cache'].kv_bytes_per_token(L, H, D, b)\n"],
    "differs_when_watched": ["import sys\n\ndef differs_when_watched(L, H, D, b):\n"
                             "    if sys.getprofile() is None and sys.gettrace() is None:\n"
                             "        import mlexp.kvcache as K\n        return K.kv_bytes_per_token(L, H, D, b)\n"
                             "    return 2 * L * H * D * b\n"],
    "sys_modules_key": ["import os\n\ndef sys_modules_key(L, H, D, b):\n"
                        "    return os.sys.modules['mlexp.kvcache'].kv_bytes_per_token(L, H, D, b)\n"],
    "reads_the_source": ["import mlexp, pathlib\n\ndef reads_the_source(L, H, D, b):\n"
                         "    text = (pathlib.Path(mlexp.__file__).parent / 'kvcache.py').read_text()\n"
                         "    ns = {}\n    exec(compile(text, 'k', 'exec'), ns)\n"
                         "    return ns['kv_bytes_per_token'](L, H, D, b)\n"],
}
# The library's code carried in (autograder/engine/room_guard.py): the room's guard stops the room, which
# starts again without the refused statement, so the function that needed it fails its test and the one
# defined after them (HONEST_LAST) passes. A notebook of their own (each stop costs a room's start).
STOPPED = {
    "pasted_helper": [_PASTE + "\ndef pasted_helper(L, H, D, b):\n    assert callable(_copy)\n"
                      "    return 2 * L * H * D * b\n"],
    "marshal_code": ["import marshal, types\n\n"
                     f"marshal_code = types.FunctionType(marshal.loads({_MARSHALLED!r}), globals())\n"],
}
HONEST_LAST = {"after_a_stop": ["def after_a_stop(L, H, D, b):\n    return 2 * L * H * D * b\n"]}


def _test_cell(name):
    source = (f"from mlexp import rules\n"
              f"got = rules.write_it_yourself({name}, 4, 2, 8, 2, forbid=(\"mlexp.kvcache\",), "
              f"instead=\"Multiply it out yourself\")\n"
              f"assert got == 256, f'Hint: {name} gave {{got}}'\n"
              f"assert {name}(3, 1, 16, 4) == 384, 'Hint: try other sizes'\n")
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": f"test_{name}", "points": 1, "locked": True,
                                 "solution": False, "schema_version": 3}
    return cell


def _notebook(functions=None):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells.append(nbformat.v4.new_code_cell("import mlexp  # the lesson's Setup\nimport mlexp.kvcache"))
    for name, cells in (functions or {**HONEST, **DISHONEST}).items():
        nb.cells.append(nbformat.v4.new_markdown_cell(f"## {name}"))
        nb.cells.extend(nbformat.v4.new_code_cell(c) for c in cells)
        nb.cells.append(_test_cell(name))
    return nb


def test_the_program_holds_a_functions_bindings_and_nothing_else():
    nb = _notebook()
    names = ruled_names(nb)
    assert set(names) == set(HONEST) | set(DISHONEST)
    assert names["plain"] == (("mlexp.kvcache",), "Multiply it out yourself")
    index = next(i for i, c in enumerate(nb.cells) if grade_id_of(c) == "test_helper_in_another_cell")
    program = room_program(nb, ["helper_in_another_cell"], index + 1)
    ast.parse(program)
    for wanted in ("import math", "BYTES_PER_PAIR = 2", "def _per_head", "def helper_in_another_cell"):
        assert wanted in program
    assert "def plain" not in program and "mlexp" not in program
    index = next(i for i, c in enumerate(nb.cells) if grade_id_of(c) == "test_colab_habits")
    program = room_program(nb, ["colab_habits"], index + 1)
    assert "def colab_habits" in program and "calls = []" in program     # the %%time cell's body
    assert "pip" not in program                                        # not a binding: never sent


def test_a_name_is_defined_as_the_notebook_holds_it_when_the_test_runs():
    nb = _notebook()
    nb.cells.append(nbformat.v4.new_code_cell("def plain(L, H, D, b):\n    return 0\n"))   # after every test
    index = next(i for i, c in enumerate(nb.cells) if grade_id_of(c) == "test_plain")
    assert "return 0" not in room_program(nb, ["plain"], index + 1)
    assert "return 0" in room_program(nb, ["plain"], len(nb.cells) + 1)


def test_hidden_paths_cover_a_package_a_module_and_its_byte_code(tmp_path):
    lib = tmp_path / "mlexp"
    (lib / "ops").mkdir(parents=True)
    (lib / "kvcache.py").write_text("x = 1\n")
    (lib / "__pycache__").mkdir()
    (lib / "__pycache__" / "kvcache.cpython-312.pyc").write_bytes(b"")
    (lib / "__pycache__" / "other.cpython-312.pyc").write_bytes(b"")
    found = jail.hidden_paths(["mlexp.ops", "mlexp.kvcache"], [tmp_path])
    assert found == [lib / "ops", lib / "kvcache.py", lib / "__pycache__" / "kvcache.cpython-312.pyc"]
    for bad in ("torch.nn", "mlexp", "mlexp.nothing_here", "mlexp.ops;rm"):
        with pytest.raises(ValueError):
            jail.hidden_paths([bad], [tmp_path])


def _graded(nb):
    if not jail.probe()["ok"]:
        pytest.skip("bubblewrap cannot run here: " + jail.probe()["why"])
    from autograder.engine.harness import run_notebook
    from autograder.options import GradingOptions
    with tempfile.TemporaryDirectory(prefix="room-") as job:
        os.chmod(job, 0o711)
        nb, report = run_notebook(nb, options=GradingOptions(), job_dir=Path(job), course_root=REPO)
    verdicts = {}
    for cell in nb.cells:
        if is_test_cell(cell):
            errors = [o for o in cell.outputs if o.get("output_type") == "error"]
            verdicts[grade_id_of(cell)[len("test_"):]] = errors[0]["evalue"] if errors else "passed"
    return verdicts, report


@pytest.fixture(scope="module")
def graded():
    return _graded(_notebook())


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_code_runs_in_the_room_as_in_the_notebook(graded, name):
    verdicts, report = graded
    assert verdicts[name] == "passed", verdicts[name]


@pytest.mark.parametrize("name", sorted(DISHONEST))
def test_no_route_to_the_forbidden_module_earns_the_points(graded, name):
    verdicts, _ = graded
    assert verdicts[name] != "passed"
    if name != "reads_the_source":    # an empty file's text defines nothing: a KeyError of its own
        assert verdicts[name].startswith("Hint: this exercise asks you to write it yourself"), verdicts[name]
        assert "Multiply it out yourself" in verdicts[name], verdicts[name]


@pytest.mark.slow
def test_a_room_its_guard_stopped_starts_again_without_the_refused_statement():
    verdicts, report = _graded(_notebook({**STOPPED, **HONEST_LAST}))
    for name in STOPPED:
        assert verdicts[name].startswith("Hint: this exercise asks you to write it yourself"), verdicts[name]
    assert "the room was given the code of mlexp.kvcache.hybrid_memory_bytes" in verdicts["pasted_helper"], verdicts
    assert "the room was given byte code to load" in verdicts["marshal_code"], verdicts
    assert verdicts["after_a_stop"] == "passed", verdicts
    assert not report.get("kernel") and not report.get("tampered"), json.dumps(report)[:500]


def test_the_room_leaves_no_report_of_its_own(graded):
    _, report = graded
    assert not report.get("kernel") and not report.get("tampered"), json.dumps(report)[:500]


def test_the_lessons_settings_come_along_but_not_its_experiments():
    nb = _notebook()
    nb.cells.insert(1, nbformat.v4.new_code_cell(
        "import torch\ntorch.set_num_threads(1)\ntorch.manual_seed(0)\ntorch.backends.cudnn.benchmark = False\n"
        "model = torch.nn.Linear(4, 4)\nprint(model(torch.ones(4)))\n"))
    index = next(i for i, c in enumerate(nb.cells) if grade_id_of(c) == "test_plain")
    program = room_program(nb, ["plain"], index + 1)
    for wanted in ("import torch", "torch.set_num_threads(1)", "torch.manual_seed(0)", "cudnn.benchmark = False"):
        assert wanted in program
    assert "Linear" not in program and "print" not in program


GUARD_CASES = {   # name -> (Python run after the guard, the start of the guard's reason or "" when it must run)
    "own code": ("def mine(q):\n    return q + 1\nimport fractions, statistics\n"
                 "compile(kvcache, '<kvcache>', 'exec')\n", ""),
    "pasted": ("exec(compile(text, '<x>', 'exec'), {})", "the room was given the code of mlexp.ops.linear."),
    "packed": ("exec(zlib.decompress(base64.b64decode(packed)).decode(), {})", "the room was given the code of"),
    "a body without its def line, in a tree built in code": ("""tree = ast.parse(body)
args = ast.parse("lambda q, k, v, S0, z0, eps: 0").body[0].value.args
fn = ast.FunctionDef(name="mine", args=args, body=tree.body, decorator_list=[], returns=None)
exec(compile(ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[])), "<x>", "exec"), {})""",
                                                              "the room was given the code of"),
    "marshal": ("types.FunctionType(marshal.loads(code), {})", "the room was given byte code"),
    "a code object built by hand": ("(lambda: 1).__code__.replace(co_consts=(2,))", "the room was given a code object"),
    "ast.parse replaced": ("ast.parse = lambda *a, **k: ast.Module(body=[], type_ignores=[])\n"
                           "exec(compile(text, '<x>', 'exec'), {})", "the room was given the code of"),
    "a future flag that widens the grammar": ("exec(compile('assert 0 <> 1\\n' + text, '<x>', 'exec', "
                                              "flags=0x400000, dont_inherit=True), {})", "the room was given the code of"),
    "a coding line the compile of a str ignores": ("exec('# coding: bogus\\n' + text, {})",
                                                    "the room was given the code of"),
    "a key of a node's attributes that compares equal only outside the guard": (
        """class Key(str):
    __hash__ = str.__hash__
    def __eq__(self, other):
        f = sys._getframe(1)
        while f is not None:
            if f.f_globals.get("__name__") == "_room_guard":
                return False
            f = f.f_back
        return str.__eq__(self, other)
tree = parsed     # parsed before the guard: a parse of the text alone would be stopped
fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_parallel")
fn.__dict__[Key("body")] = fn.__dict__.pop("body")
fn.__dict__["body"] = [ast.Pass(lineno=1, col_offset=0, end_lineno=1, end_col_offset=4)]
exec(compile(tree, "<x>", "exec"), {})""", "the room's guard could not read what it was given"),
    "gc": ("import gc\ngc.get_objects()", "the room's code reached for the grader's guard (gc.get_objects)"),
    "its own memory": ("open('/proc/self/mem', 'rb')", "the room opened its own memory"),
    "a syntax tree class changed": ("ast.FunctionDef.body = property(lambda self: [])\ncompile('x = 1', '<x>', 'exec')",
                                    "a class of Python's syntax tree was changed"),
    "a signal handler": ("import signal\nsignal.signal(signal.SIGUSR1, print)\ncompile('x = 1', '<x>', 'exec')",
                         "a signal handler was added"),
}


@pytest.mark.parametrize("case", sorted(GUARD_CASES))
def test_the_guard_stops_the_room_given_the_forbidden_modules_code_however_it_is_carried(tmp_path, case):
    """room_guard: once added (in a process of its own here: an audit hook stays for good), the
    forbidden module's code given as text, as a syntax tree built in code or as byte code stops the
    process, saying why in the stop file, and so does a reach for the guard itself; the student's own
    code, an import and the other modules' code run."""
    import subprocess
    import sys
    from autograder.engine.room_guard import STOP_EXIT, guard_program
    run, wanted = GUARD_CASES[case]
    stop = tmp_path / "stop"
    script = tmp_path / "guard.py"
    script.write_text(f'''import ast, base64, marshal, sys, textwrap, types, zlib
linear = open({str(REPO / "mlexp" / "ops" / "linear.py")!r}).read()    # read, never imported (no torch here)
kvcache = open({str(REPO / "mlexp" / "kvcache.py")!r}).read()
text = linear.replace("_recurrent", "mine")
packed = base64.b64encode(zlib.compress(text.encode()))
parallel = next(n for n in ast.parse(linear).body if getattr(n, "name", "") == "_parallel")
body = textwrap.dedent("\\n".join(ast.get_source_segment(linear, parallel).splitlines()[1:]))
code = marshal.dumps(compile(ast.Module([parallel], []), "linear.py", "exec").co_consts[0])
parsed = ast.parse(linear)
{guard_program(("mlexp.ops",), stop, strict=False)}
{run}
print("ran")
''')
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    if not wanted:
        assert out.returncode == 0 and out.stdout.strip() == "ran", (out.stdout, out.stderr[-2000:])
        assert not stop.exists()
    else:
        assert out.returncode == STOP_EXIT, (out.returncode, out.stdout, out.stderr[-2000:])
        assert stop.read_text().startswith(wanted), stop.read_text()


def test_no_other_thread_changes_a_syntax_tree_between_the_guards_reading_and_the_compilers(tmp_path):
    """Another thread swaps a function's body in a tree for the library's while the guard reads
    the tree (late in its reading, where the compiler reads next): the guard reads the tree the
    compiler reads (no other thread runs from its reading to the compiled code's run), so the
    library's body is never compiled unseen."""
    import subprocess
    import sys
    from autograder.engine.room_guard import STOP_EXIT, guard_program
    stop = tmp_path / "stop"
    script = tmp_path / "race.py"
    script.write_text(f'''import ast, threading, time
linear = open({str(REPO / "mlexp" / "ops" / "linear.py")!r}).read()
fn = next(n for n in ast.parse(linear).body if isinstance(n, ast.FunctionDef) and n.name == "_parallel")
pads = ast.parse("\\n".join(f"def pad{{i}}(x):\\n" + "    x = x + 1\\n" * 40 + "    return x" for i in range(150)))
tree = ast.Module(body=[fn] + pads.body, type_ignores=[])
library, benign = fn.body, [ast.Pass(lineno=1, col_offset=0, end_lineno=1, end_col_offset=4)]
fn.body = benign
import queue
asks = queue.Queue()
def flip():            # started before the guard, as ipykernel's threads are
    while True:
        time.sleep(asks.get())
        fn.body = library
threading.Thread(target=flip, daemon=True).start()
{guard_program(("mlexp.ops",), stop, strict=False)}
start = time.perf_counter()
compile(tree, "<x>", "exec")          # how long the guard takes to read the tree
took = time.perf_counter() - start
for share in (0.95, 0.9, 0.8, 0.7, 0.5):
    fn.body = benign
    asks.put(share * took)
    code = compile(tree, "<x>", "exec")
    parallel = next(c for c in code.co_consts if getattr(c, "co_name", "") == "_parallel")
    if "tril_" in parallel.co_names:
        print("the library compiled unseen")
print("ran")
''')
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "unseen" not in out.stdout, out.stdout
    assert out.returncode == STOP_EXIT, (out.returncode, out.stdout, out.stderr[-2000:])
    assert stop.read_text().startswith("the room was given the code of mlexp.ops.linear._parallel"), stop.read_text()


def test_the_guard_reads_no_global_name():
    """Every name the guard's hook calls is one it took before the student's code ran (a closure):
    none is a global or builtin that the student's code could rebind."""
    import dis
    from autograder.engine.room_guard import _make
    inner = [c for c in _make.__code__.co_consts if hasattr(c, "co_code")]
    seen = []
    while inner:
        code = inner.pop()
        seen.append(code.co_name)
        inner += [c for c in code.co_consts if hasattr(c, "co_code")]
        for ins in dis.get_instructions(code):
            if code.co_name != "Strange":
                assert ins.opname not in ("LOAD_GLOBAL", "LOAD_NAME"), (code.co_name, ins.argval)
    assert {"hook", "judge", "flat", "dump", "genuine"} <= set(seen)
