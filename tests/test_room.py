"""The room (autograder.engine.room): a ruled exercise's graded calls run where the module its rule
forbids does not exist, so no route to the library earns its points, and honest code runs there
as it did in the notebook.

One notebook holds many small exercises, each a function of the student's with a test that
forbids ``mlexp.kvcache`` (``kv_bytes_per_token(n_attn_layers, n_kv_heads, head_dim, bytes)``
written by hand: 2 * layers * heads * dim * bytes); it is run once through the real harness,
sandboxed, and each exercise's verdict is read from its test cell.
"""
import ast
import json
import os
import tempfile
from pathlib import Path

import nbformat
import pytest

from autograder.cells import grade_id_of, is_test_cell
from autograder.engine.jail import jail
from autograder.engine.room import room_program, ruled_names

REPO = Path(__file__).resolve().parent.parent

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


def _notebook():
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells.append(nbformat.v4.new_code_cell("import mlexp  # the lesson's Setup\nimport mlexp.kvcache"))
    for name, cells in {**HONEST, **DISHONEST}.items():
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


@pytest.fixture(scope="module")
def graded():
    if not jail.probe()["ok"]:
        pytest.skip("bubblewrap cannot run here: " + jail.probe()["why"])
    from autograder.engine.harness import run_notebook
    from autograder.options import GradingOptions
    with tempfile.TemporaryDirectory(prefix="room-") as job:
        os.chmod(job, 0o711)
        nb, report = run_notebook(_notebook(), options=GradingOptions(), job_dir=Path(job), course_root=REPO)
    verdicts = {}
    for cell in nb.cells:
        if is_test_cell(cell):
            errors = [o for o in cell.outputs if o.get("output_type") == "error"]
            verdicts[grade_id_of(cell)[len("test_"):]] = errors[0]["evalue"] if errors else "passed"
    return verdicts, report


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


def test_the_guard_refuses_the_forbidden_modules_code_however_it_is_carried(tmp_path):
    """room_guard: once added (in a process of its own here: an audit hook stays for good), a
    compile of text holding a function of a forbidden module fails, compressed and renamed or not,
    while the student's own code and the other modules' code compile."""
    import subprocess
    import sys
    from autograder.engine.room_guard import guard_program
    script = tmp_path / "guard.py"
    script.write_text(f'''import base64, inspect, zlib
import mlexp.ops.linear as linear, mlexp.kvcache as kvcache
text = inspect.getsource(linear).replace("_recurrent", "mine")
packed = base64.b64encode(zlib.compress(text.encode()))
{guard_program(("mlexp.ops",))}
for name, source in (("pasted", text), ("packed", zlib.decompress(base64.b64decode(packed)).decode())):
    try:
        exec(compile(source, "<x>", "exec"), {{}})
        print(name, "ran")
    except RuntimeError as exc:
        print(name, "refused:", exc)
compile(inspect.getsource(kvcache), "<kvcache>", "exec")
exec(compile("def mine(q):\\n    return q + 1\\n", "<own>", "exec"), {{}})
print("others ran")
''')
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("pasted refused: ") and "is the code of mlexp.ops.linear." in lines[0], lines
    assert lines[1].startswith("packed refused: "), lines
    assert lines[2] == "others ran", lines
