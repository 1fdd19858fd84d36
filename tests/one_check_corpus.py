"""The damaged-notebook corpus of issue 52, item 2 ("One check"): lesson 01 with right answers,
broken the ways students, JupyterLab and browsers break it.

Each case is (file name, notebook). ``python tests/one_check_corpus.py DEST --course COURSE``
writes ``DEST/<case>/01_running_sum/<file name>`` from a built course.
"""
import copy
import json
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "corpus"))
import build_corpus as corpus  # noqa: E402

LESSON = "01_running_sum"
NAME = f"{LESSON}.ipynb"
CASES = ("test_markdown", "test_raw", "test_deleted", "test_twin_passes", "test_twin_13_of_10",
         "jupyterlab_duplicate", "browser_copy", "intact_wrong")
WRONG_PARALLEL = ("def parallel_linear_attention(q, k, v, normalize=True):\n"
                  "    return torch.zeros_like(v)\n")


def _retyped(nb, grade_id, cell_type):
    nb = copy.deepcopy(nb)
    cell = nb.cells[corpus._index(nb, grade_id)]
    cell.cell_type = cell_type
    cell.pop("outputs", None)
    cell.pop("execution_count", None)
    return nb


def _deleted(nb, grade_id):
    nb = copy.deepcopy(nb)
    del nb.cells[corpus._index(nb, grade_id)]
    return nb


def _duplicated(nb, grade_id, source=None, before=False):
    """The test cell copied with its id and metadata; the copy's source ``source`` (or as is),
    put before the original (``before``) or after it."""
    nb = copy.deepcopy(nb)
    i = corpus._index(nb, grade_id)
    twin = copy.deepcopy(nb.cells[i])
    if source is not None:
        twin.source = source
    nb.cells.insert(i if before else i + 1, twin)
    return nb


def cases(lesson, solution) -> dict:
    """case -> (file name, notebook)."""
    good = corpus._answer(lesson, corpus.solved_answers(solution))
    wrong = corpus._answer(good, {"parallel_form": WRONG_PARALLEL})
    return {
        # the parallel form is wrong and its test cannot say so
        "test_markdown": (NAME, _retyped(wrong, "test_parallel_form", "markdown")),
        "test_raw": (NAME, _retyped(wrong, "test_parallel_form", "raw")),
        "test_deleted": (NAME, _deleted(wrong, "test_parallel_form")),
        "test_twin_passes": (NAME, _duplicated(wrong, "test_parallel_form", "pass", before=True)),
        # a right answer whose 3-point test is there twice: 13/13 of a 10-point lesson
        "test_twin_13_of_10": (NAME, _duplicated(good, "test_recurrent_form")),
        # renamed copies of a damaged notebook
        "jupyterlab_duplicate": (f"{LESSON}-Copy1.ipynb",
                                 _retyped(wrong, "test_parallel_form", "markdown")),
        "browser_copy": (f"Copy of {LESSON} (2).ipynb",
                         _duplicated(wrong, "test_parallel_form", "pass", before=True)),
        # and one that is not damaged, for the baseline
        "intact_wrong": (NAME, wrong),
    }


def read_lesson(course: Path):
    return tuple(nbformat.read(Path(course) / d / LESSON / NAME, as_version=4)
                 for d in ("lessons", "solutions"))


def write(dest: Path, course: Path) -> dict:
    """Write every case; returns case -> path."""
    out = {}
    for case, (name, nb) in cases(*read_lesson(course)).items():
        path = Path(dest) / case / LESSON / name
        path.parent.mkdir(parents=True, exist_ok=True)
        # as JSON: nbformat.write would give a copied cell id a new one, which a copy keeps
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        out[case] = path
    return out


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dest")
    p.add_argument("--course", required=True)
    a = p.parse_args()
    for case, path in write(Path(a.dest), Path(a.course)).items():
        print(case, path)
