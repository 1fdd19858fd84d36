"""An honest class: correct answers written the way students write them (issue 51, items 3 and 4).

Each student starts from the instructor's answers of one lesson (tests/corpus/build_corpus.py's
``solved_answers``) and adds one habit the grader must not hold: a loop over heads or over the
batch in a "no loop over the tokens" exercise, Colab habits (a guarded ``google.colab`` import,
``%cd``, ``!pip list | grep torch``), one line added to the lesson's Setup or imports cell, the
student's own attributes (``self.budget``), ordinary standard-library use (``inspect.signature``,
``types.SimpleNamespace``, ``pickle.dump``, ``timeit(globals=globals())``,
``sys.setrecursionlimit``, ``__dict__`` in a ``__repr__``), cudnn flags, a function that appends
to a module-level list, scratch cells comparing with the library, ``%timeit`` and plots. Every
one must be graded full marks with the status "graded" (tests/test_honest_class.py).

``python tests/honest_class/build_honest_class.py DEST --course COURSE`` writes the class from a
built course (COURSE/lessons and COURSE/solutions of LESSONS).
"""
import copy
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "corpus"))
import build_corpus as corpus  # noqa: E402

L01, L03, L06 = "01_running_sum", "03_gates_and_delta_rule", "06_recall_per_byte"
LESSONS = (L01, L03, L06)

COLAB_GUARD = """\
try:
    import google.colab
    from google.colab import drive
    IN_COLAB = True
except ImportError:
    IN_COLAB = False
if IN_COLAB:
    drive.mount('/content/drive')
    %cd /content/drive/MyDrive/course
!pip list | grep torch
%pwd
"""

HEADS_LOOP = """\
def parallel_linear_attention(q, k, v, normalize=True):
    B, H, T, D = q.shape
    heads = []
    for h in range(H):                        # one head at a time: fewer numbers at once
        A = (q[:, h] @ k[:, h].transpose(-1, -2)).tril()
        o = A @ v[:, h]
        if normalize:
            o = o / A.sum(-1, keepdim=True)
        heads.append(o)
    return torch.stack(heads, dim=1)
"""

BATCH_LOOP = """\
def _one_sequence(q, k, v, normalize):
    A = (q @ k.transpose(-1, -2)).tril()      # (H, T, T)
    o = A @ v
    return o / A.sum(-1, keepdim=True) if normalize else o


def parallel_linear_attention(q, k, v, normalize=True):
    return torch.stack([_one_sequence(q[b], k[b], v[b], normalize) for b in range(q.shape[0])])
"""

APPENDS = """\
SHAPES_SEEN = []      # what shapes my function was called with, for debugging


def parallel_linear_attention(q, k, v, normalize=True):
    SHAPES_SEEN.append(tuple(q.shape))
    A = (q @ k.transpose(-1, -2)).tril()
    o = A @ v
    if normalize:
        o = o / A.sum(-1, keepdim=True)
    return o
"""

SCRATCH_WITH_LIBRARY = """\
# my check against the library's version
from mlexp.ops import linear_attention as reference
qs, ks, vs = (torch.rand(1, 2, 6, 4) for _ in range(3))
mine = parallel_linear_attention(qs, ks, vs)
theirs, _ = reference(qs, ks, vs)
print("max difference:", (mine - theirs).abs().max().item())
print(torch.allclose(recurrent_linear_attention(qs, ks, vs), theirs, atol=1e-5))
"""

TIMERS = """\
from timeit import timeit
qs, ks, vs = (torch.rand(1, 2, 16, 4) for _ in range(3))
print("parallel:", timeit("parallel_linear_attention(qs, ks, vs)", globals=globals(), number=3))
%timeit -n 2 -r 1 recurrent_linear_attention(qs, ks, vs)
"""

PLOTS = """\
import numpy as np
Ts = [2, 4, 8, 16]
seconds = []
for T in Ts:
    x = torch.rand(1, 1, T, 4)
    start = time.perf_counter()
    parallel_linear_attention(x, x, x)
    seconds.append(time.perf_counter() - start)
fig, ax = plt.subplots(figsize=(4, 3))
ax.plot(Ts, seconds, marker="o")
ax.set_xlabel("T"); ax.set_ylabel("seconds")
plt.show()
print(np.round(np.array(seconds) * 1e3, 3))
"""

CUDNN = """\
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.deterministic = False
torch.backends.cuda.matmul.allow_tf32 = True
device = "cuda" if torch.cuda.is_available() else "cpu"
print("running on", device)
"""

STDLIB = """\
import inspect
import pickle
import sys
import types

sys.setrecursionlimit(5000)
print(inspect.signature(memory_per_sequence))
settings = types.SimpleNamespace(context=64, dim=64, n_heads=4)
result = memory_per_sequence(["attention", "gated_delta"], settings.context, settings.dim, settings.n_heads)
with open("my_result.pkl", "wb") as f:
    pickle.dump({"bytes": result, "settings": vars(settings)}, f)
print(result)
"""

OWN_ATTRIBUTES = """\
class BudgetPicker:
    \"\"\"Keeps the budget; picks the best design that fits it.\"\"\"

    def __init__(self, budget):
        self.budget = budget

    def __repr__(self):
        return f"BudgetPicker({self.__dict__})"

    def pick(self, table):
        fits = [(acc, -n, name) for name, (n, acc) in table.items() if n <= self.budget]
        return max(fits)[2] if fits else None


def best_under_budget(table, budget_bytes):
    picker = BudgetPicker(budget_bytes)
    return picker.pick(table)


print(BudgetPicker(1024))
"""

GATE_HEADS_LOOP = """\
def parallel_scalar_gate(q, k, v, g):
    T = g.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=g.device).tril()
    outs = []
    for h in range(q.shape[1]):               # head by head
        b = g[:, h].cumsum(dim=-1)
        L = torch.where(causal, b[..., :, None] - b[..., None, :], float("-inf")).exp()
        outs.append((L * (q[:, h] @ k[:, h].transpose(-1, -2))) @ v[:, h])
    return torch.stack(outs, dim=1)
"""


# Three dishonest neighbours graded in the same run: the library called under an alias, the
# library's function pasted and renamed, a loop over the tokens in the parallel form.
CALLS_LIBRARY = """\
from mlexp.ops import linear_attention as la


def recurrent_linear_attention(q, k, v, normalize=True):
    return la(q, k, v, normalize=normalize)[0]
"""
LOOPS_TOKENS = """\
def parallel_linear_attention(q, k, v, normalize=True):
    B, H, T, D = q.shape
    out = []
    for t in range(T):
        A = q[:, :, t:t + 1] @ k[:, :, :t + 1].transpose(-1, -2)
        o = A @ v[:, :, :t + 1]
        out.append(o / A.sum(-1, keepdim=True) if normalize else o)
    return torch.cat(out, dim=2)
"""
# student -> (status prefix, points lost, what the status says)
DISHONEST = {"d01_calls_library": ("graded", 3, ""),
             # held naming the paste, and its rule's points lost: the room's guard refuses to compile the
             # library's code there (autograder/engine/room_guard.py)
             "d01_pastes_library": ("needs manual review", 3, "_scan is the code of mlexp.ops.linear._recurrent"),
             "d01_loops_tokens": ("graded", 3, "")}


def _add_cell(nb, after_grade_id, code, markdown=None):
    """A copy of ``nb`` with a code cell ``code`` (and a markdown note before it) after the cell
    of ``after_grade_id``."""
    nb = copy.deepcopy(nb)
    i = corpus._index(nb, after_grade_id) + 1
    nb.cells.insert(i, new_code_cell(code))
    if markdown:
        nb.cells.insert(i, new_markdown_cell(markdown))
    return nb


def _first_code_cells(nb, n=2):
    return [c for c in nb.cells if c.cell_type == "code"][:n]


def students(lessons: dict) -> dict:
    """student -> {relative path: notebook}; ``lessons``: lesson -> (released, solution)."""
    good = {name: corpus._answer(lesson, corpus.solved_answers(solution))
            for name, (lesson, solution) in lessons.items()}
    out = {}

    def put(student, lesson, nb):
        out[student] = {f"{lesson}/{lesson}.ipynb": nb}

    g01 = good[L01]
    put("h01_heads_loop", L01, corpus._answer(g01, {"parallel_form": HEADS_LOOP}))
    put("h01_batch_loop", L01, corpus._answer(g01, {"parallel_form": BATCH_LOOP}))
    nb = copy.deepcopy(g01)
    nb.cells.insert(1, new_code_cell(COLAB_GUARD))
    put("h01_colab", L01, nb)
    nb = copy.deepcopy(g01)
    setup, imports = _first_code_cells(nb)
    setup.source += "\nimport os"                       # one line added to the Setup cell
    imports.source = "import numpy as np\n" + imports.source   # and one to the imports cell
    put("h01_setup_line", L01, nb)
    put("h01_appends_to_a_list", L01, corpus._answer(g01, {"parallel_form": APPENDS}))
    put("h01_scratch_library", L01, _add_cell(g01, "parallel_form", SCRATCH_WITH_LIBRARY,
                                              "My own check before the test:"))
    put("h01_timeit", L01, _add_cell(g01, "test_parallel_form", TIMERS))
    put("h01_plots", L01, _add_cell(g01, "test_parallel_form", PLOTS, "How long does it take?"))
    nb = copy.deepcopy(g01)
    _first_code_cells(nb)[1].source += "\n" + CUDNN
    put("h01_cudnn_flags", L01, nb)
    put("d01_calls_library", L01, corpus._answer(g01, {"recurrent_form": CALLS_LIBRARY}))
    nb = copy.deepcopy(g01)
    nb.cells[corpus._index(nb, "recurrent_form")].source += "\n\n" + corpus.pastes_library(HERE.parent.parent)
    put("d01_pastes_library", L01, nb)
    put("d01_loops_tokens", L01, corpus._answer(g01, {"parallel_form": LOOPS_TOKENS}))
    if L06 in good:
        g06 = good[L06]
        put("h06_heads_loop", L06, corpus._answer(g06, {"parallel_gate": GATE_HEADS_LOOP}))
        put("h06_stdlib", L06, _add_cell(g06, "memory", STDLIB))
        put("h06_own_attributes", L06, corpus._answer(g06, {"budget": OWN_ATTRIBUTES}))
    if L03 in good:
        nb = copy.deepcopy(good[L03])
        _first_code_cells(nb)[1].source += "\nimport numpy as np"   # "imports inspect" was said of it
        put("h03_imports_line", L03, nb)
    return out


def write_class(dest: Path, lessons: dict) -> Path:
    for student, files in students(lessons).items():
        for rel, nb in files.items():
            path = Path(dest) / student / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, path)
    return Path(dest)


def read_lessons(course: Path, names=LESSONS) -> dict:
    return {name: tuple(nbformat.read(Path(course) / d / name / f"{name}.ipynb", as_version=4)
                        for d in ("lessons", "solutions"))
            for name in names if (Path(course) / "lessons" / name).is_dir()}


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dest")
    p.add_argument("--course", required=True)
    a = p.parse_args()
    write_class(Path(a.dest), read_lessons(Path(a.course)))
