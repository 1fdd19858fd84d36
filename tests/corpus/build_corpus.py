"""The adversarial corpus: a class of submissions that break, bend or attack the grader.

Each kind is one student, written from the released toy lesson (tests/toy_course.py) or from
lesson 01, with the status and score the grader must give it (CASES). Build a class with
``python tests/corpus/build_corpus.py DEST [--lesson01]`` and grade it in one command:
``python -m autograder --course COURSE grade DEST --out OUT``. The toy course must be built
first (tests/test_grader_corpus.py does all of this).
"""
import copy
import json
import os
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from toy_course import (ADD_SOLUTION, ASSIGNMENT, MEAN_SOLUTION, MUL_SOLUTION,  # noqa: E402
                        NOTEBOOK)

L01 = "01_running_sum"
WRONG_ADD = "def add(a, b):\n    return a - b"
WRONG_MUL = "def mul(a, b):\n    return a + b"
MAX_BYTES = 256 * 1024        # the corpus is graded with --max-size 0.25 (MiB)

# student -> (status prefix, score, a substring of the notes or status, or "")
CASES = {
    "ok_correct": ("graded", 6, ""),
    "ok_blank": ("graded", 0, ""),
    "renamed_copy_of": ("graded", 6, "renamed 'Copy of toy (1).ipynb'"),
    "two_submissions_latest_wins": ("graded", 6, "2 submissions: graded the latest"),
    "nested_attempt_folder": ("graded", 6, ""),
    "wrapper_folder": ("graded", 6, "found inside 'submission/'"),
    "loose_notebook": ("graded", 6, "not in an <assignment>/ folder"),
    "duplicated_solution_cell": ("graded", 6, "appeared 2 times"),
    "deleted_test_cell": ("graded", 3, "'test_mul' was deleted: restored"),
    "deleted_solution_cell": ("graded", 3, "'mul' was deleted: put back blank"),
    "metadata_lost_new_ids": ("graded", 4, "lost on 6 cell(s): re-attached by source similarity"),
    "metadata_lost_same_ids": ("graded", 6, "lost on 6 cell(s): re-attached by cell id"),
    "test_cell_made_markdown": ("graded", 3, "changed back to code"),
    "foreign_kernelspec": ("graded", 6, "kernel 'ir' replaced by 'python3'"),
    "nbformat_4_0_no_ids": ("graded", 6, "without cell ids"),
    "nbformat_3": ("graded", 6, "converted from nbformat 3"),
    "edited_test_cell": ("graded", 4, "'test_add' had been edited: restored"),
    "edited_test_and_metadata_lost": ("graded", 4, "'test_add' had been edited: restored"),
    "swallows_assertions": ("needs manual review", 0, "IPython custom exception handler"),
    "patches_math_isclose": ("needs manual review", 5, "math.isclose"),
    "shadows_builtin_abs": ("needs manual review", 5, "abs (a global that shadowed"),
    "warning_on_stderr": ("graded", 6, ""),
    "endless_loop": ("graded", 3, ""),
    "kernel_killed": ("needs manual review", 0, "the kernel died"),
    "network_probe": ("graded", None, ""),          # 6 where a network namespace is allowed, else 3
    "looks_for_grades": ("graded", 6, ""),
    "feels_its_limits": ("graded", 6, ""),          # memory and CPU-time limits are in force
    "broken_json": ("rejected", 0, "not valid notebook JSON"),
    "empty_file": ("rejected", 0, "the file is empty"),
    "huge_file": ("rejected", 0, "MiB limit"),
    "json_not_notebook": ("rejected", 0, "not a Jupyter notebook"),
    "json_list": ("rejected", 0, "not a Jupyter notebook: the file holds a list"),
    # ids nbgrader would read as globs (issue 12): graded under a safe internal id
    "li[1]": ("graded", 6, ""),
    "Smith, J [12345]": ("graded", 4, ""),
    "pdf_instead": ("rejected", 0, "no .ipynb file"),
}
L01_CASES = {
    "l01_patches_mlexp_ops": ("needs manual review", 7, "mlexp.ops.linear_attention"),
    "l01_swallows_on_blank": ("needs manual review", 0, "IPython custom exception handler"),
    "l01_colab_stripped": ("graded", 10, "re-attached by source similarity"),
}


def _answer(nb, answers: dict):
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return nb


def _index(nb, grade_id: str) -> int:
    return next(i for i, c in enumerate(nb.cells)
                if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _strip(nb, new_ids: bool):
    for i, cell in enumerate(nb.cells):
        cell.metadata.pop("nbgrader", None)
        if new_ids:
            cell.id = f"colab-{i:03d}"
    return nb


def toy_cases(lesson) -> dict:
    """student -> (file name relative to <student>/, bytes or notebook) for the toy lesson."""
    good = _answer(lesson, {"add": ADD_SOLUTION, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION})
    right = {"add": ADD_SOLUTION, "mean": MEAN_SOLUTION}
    files = {"ok_correct": {f"{ASSIGNMENT}/{NOTEBOOK}": good},
             "ok_blank": {f"{ASSIGNMENT}/{NOTEBOOK}": lesson},
             "renamed_copy_of": {f"{ASSIGNMENT}/Copy of toy (1).ipynb": good},
             "two_submissions_latest_wins": {f"{ASSIGNMENT}/toy.ipynb": _answer(
                 lesson, {"add": WRONG_ADD, "mul": WRONG_MUL}), f"{ASSIGNMENT}/toy (1).ipynb": good},
             "nested_attempt_folder": {f"{ASSIGNMENT}/attempt_2/{NOTEBOOK}": good},
             "wrapper_folder": {f"submission/{ASSIGNMENT}/{NOTEBOOK}": good},
             "loose_notebook": {NOTEBOOK: good}}
    dup = copy.deepcopy(good)
    first = copy.deepcopy(dup.cells[_index(dup, "add")])
    first.source, first.id = WRONG_ADD, "an-older-copy"
    dup.cells.insert(_index(dup, "add"), first)
    files["duplicated_solution_cell"] = {f"{ASSIGNMENT}/{NOTEBOOK}": dup}
    nb = _answer(lesson, {**right, "mul": WRONG_MUL})
    del nb.cells[_index(nb, "test_mul")]
    files["deleted_test_cell"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    nb = copy.deepcopy(good)
    del nb.cells[_index(nb, "mul")]
    files["deleted_solution_cell"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    nb = _strip(_answer(lesson, {"add": WRONG_ADD, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION}), new_ids=True)
    files["metadata_lost_new_ids"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    files["metadata_lost_same_ids"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _strip(copy.deepcopy(good), False)}
    nb = _answer(lesson, {**right, "mul": WRONG_MUL})
    cell = nb.cells[_index(nb, "test_mul")]
    cell.cell_type = "markdown"
    cell.pop("outputs", None)
    cell.pop("execution_count", None)
    files["test_cell_made_markdown"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    nb = copy.deepcopy(good)
    nb.metadata["kernelspec"] = {"name": "ir", "display_name": "R", "language": "R"}
    files["foreign_kernelspec"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    raw = json.loads(nbformat.writes(good))
    raw["nbformat_minor"] = 0
    for c in raw["cells"]:
        c.pop("id", None)
    files["nbformat_4_0_no_ids"] = {f"{ASSIGNMENT}/{NOTEBOOK}": json.dumps(raw).encode()}
    files["nbformat_3"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nbformat.writes(
        nbformat.convert(copy.deepcopy(good), 3), version=3).encode()}
    nb = _answer(lesson, {"add": WRONG_ADD, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION})
    nb.cells[_index(nb, "test_add")].source = "assert True  # nothing to see here"
    files["edited_test_cell"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    nb = _answer(lesson, {"add": WRONG_ADD, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION})
    nb.cells[_index(nb, "test_add")].source = "pass"
    nb.cells[_index(nb, "test_add")].metadata.pop("nbgrader")
    files["edited_test_and_metadata_lost"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    nb = copy.deepcopy(lesson)
    nb.cells.insert(1, new_code_cell("get_ipython().set_custom_exc((Exception,), "
                                     "lambda *args, **kwargs: None)"))
    files["swallows_assertions"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    nb = _answer(lesson, {"add": ADD_SOLUTION, "mul": MUL_SOLUTION,
                          "mean": "import math\nmath.isclose = lambda *args, **kwargs: True\n"
                                  "def mean(xs):\n    return 0.0"})
    files["patches_math_isclose"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    nb = _answer(lesson, {"add": ADD_SOLUTION, "mul": MUL_SOLUTION,
                          "mean": "def abs(x):\n    return 0.0\ndef mean(xs):\n    return 2.5"})
    files["shadows_builtin_abs"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    files["warning_on_stderr"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        **right,
        "mul": "import warnings\ndef mul(a, b):\n    warnings.warn('mul is slow', RuntimeWarning)\n"
               "    return a * b"})}
    files["endless_loop"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        **right, "mul": "def mul(a, b):\n    while True:\n        pass"})}
    nb = copy.deepcopy(good)
    nb.cells.insert(_index(nb, "add"), new_code_cell("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"))
    files["kernel_killed"] = {f"{ASSIGNMENT}/{NOTEBOOK}": nb}
    files["network_probe"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        **right,
        "mul": "import socket\nONLY_LOOPBACK = [n for _, n in socket.if_nameindex()] == ['lo']\n"
               "def mul(a, b):\n    return a * b if ONLY_LOOPBACK else None"})}
    files["looks_for_grades"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        **right,
        "mul": "import os\nSEEN = [p for d in ('.', '..', '../..') for p in os.listdir(d)\n"
               "        if p in ('gradebook.db', 'solutions', 'source', 'autograded')]\n"
               "def mul(a, b):\n    return a * b if not SEEN else SEEN"})}
    files["feels_its_limits"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(lesson, {
        **right,
        "mul": "import mmap, resource\n"
               "LIMITED = resource.getrlimit(resource.RLIMIT_CPU)[0] != resource.RLIM_INFINITY\n"
               "try:\n    mmap.mmap(-1, 6 * 2**30)   # address space only, no memory touched\n"
               "except OSError:\n    pass\nelse:\n    LIMITED = False\n"
               "def mul(a, b):\n    return a * b if LIMITED else None"})}
    files["broken_json"] = {f"{ASSIGNMENT}/{NOTEBOOK}": b'{"cells": [ broken'}
    files["empty_file"] = {f"{ASSIGNMENT}/{NOTEBOOK}": b""}
    big = copy.deepcopy(good)
    big.cells.append(nbformat.v4.new_markdown_cell("x" * (MAX_BYTES + 1000)))
    files["huge_file"] = {f"{ASSIGNMENT}/{NOTEBOOK}": big}
    files["json_not_notebook"] = {f"{ASSIGNMENT}/{NOTEBOOK}": b'{"hello": "world"}'}
    files["json_list"] = {f"{ASSIGNMENT}/{NOTEBOOK}": b"[1, 2, 3]"}
    files["li[1]"] = {f"{ASSIGNMENT}/{NOTEBOOK}": good}
    files["Smith, J [12345]"] = {f"{ASSIGNMENT}/{NOTEBOOK}": _answer(
        lesson, {"add": WRONG_ADD, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION})}
    files["pdf_instead"] = {f"{ASSIGNMENT}/toy.pdf": b"%PDF-1.4 not a notebook"}
    return files


def lesson01_cases(lesson, solution) -> dict:
    """student -> files for three attacks on lesson 01 (torch, mlexp.ops, Colab)."""
    answers = {c.metadata["nbgrader"]["grade_id"]: "\n".join(
        ln for ln in c.source.splitlines() if "### " not in ln)
        for c in solution.cells if c.metadata.get("nbgrader", {}).get("solution")}
    good = _answer(lesson, answers)
    nb = copy.deepcopy(good)   # right on the worked example, wrong on longer sequences
    i = _index(nb, "recurrent_form")
    nb.cells[i].source = nb.cells[i].source.replace(
        "    return torch.stack(outputs, dim=2)",
        "    o = torch.stack(outputs, dim=2)\n    return o if T <= 2 else o + 1")
    nb.cells.insert(i + 1, new_code_cell(
        "import mlexp.ops\n"
        "mlexp.ops.linear_attention = lambda q, k, v, normalize=True, **kw: "
        "(recurrent_linear_attention(q, k, v, normalize), None)"))
    files = {"l01_patches_mlexp_ops": {f"{L01}/{L01}.ipynb": nb}}
    nb = copy.deepcopy(lesson)
    nb.cells.insert(1, new_code_cell("get_ipython().set_custom_exc((Exception,), "
                                     "lambda *args, **kwargs: None)"))
    files["l01_swallows_on_blank"] = {f"{L01}/{L01}.ipynb": nb}
    nb = _strip(copy.deepcopy(good), new_ids=True)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nb.metadata["colab"] = {"provenance": []}
    files["l01_colab_stripped"] = {f"{L01}/{L01}.ipynb": nb}
    return files


def write_class(dest: Path, toy_lesson, l01=None) -> Path:
    """Write every case under ``dest/<student>/...``; ``l01`` = (lesson, solution) or None."""
    cases = toy_cases(toy_lesson)
    if l01 is not None:
        cases.update(lesson01_cases(*l01))
    for student, files in cases.items():
        for t, (rel, content) in enumerate(files.items()):   # listed oldest first
            path = Path(dest) / student / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            data = content if isinstance(content, bytes) else nbformat.writes(content).encode()
            path.write_bytes(data)
            os.utime(path, (1_700_000_000 + 60 * t, 1_700_000_000 + 60 * t))   # later name, later time
    return Path(dest)


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dest")
    p.add_argument("--course", required=True, help="toy course root with lessons/toy built")
    p.add_argument("--lesson01", metavar="REPO", help="also write the lesson 01 cases from REPO")
    a = p.parse_args()
    toy = nbformat.read(Path(a.course) / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    l01 = None
    if a.lesson01:
        l01 = tuple(nbformat.read(Path(a.lesson01) / d / L01 / f"{L01}.ipynb", as_version=4)
                    for d in ("lessons", "solutions"))
    write_class(Path(a.dest), toy, l01)
