"""One check (issue 52, item 2): the student's check, the grader's check and grading restore test
cells and find a lesson from a file name by one rule (mlexp.restore), and give the same visible
verdicts on the same notebook.

tests/one_check_corpus.py breaks lesson 01 (right answers, or a wrong parallel form) the ways
students, JupyterLab and browsers do: a test cell turned markdown, turned raw, deleted,
duplicated with its id (the first copy edited to ``pass``; a right answer's 3-point test twice,
13/13 of a 10-point lesson), and damaged copies named ``01_running_sum-Copy1.ipynb`` and
``Copy of 01_running_sum (2).ipynb``. Before, ``python -m mlexp.check`` passed the markdown,
raw, duplicated and renamed ones (and showed 13/13), ``autograder check`` passed the renamed
JupyterLab copy, and grading gave those tests 0.
"""
import copy
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from mlexp.check import find_release, is_test_cell, restore_tests
from mlexp.restore import normalise_name, restore_cells

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
import one_check_corpus as occ  # noqa: E402

LINE = re.compile(r"^(PASS|FAIL)\s+(\S+)\s+([\d.]+)/([\d.]+)", re.M)


def _lesson():
    return occ.read_lesson(REPO)


def _tests(nb) -> list:
    return [(c.metadata["nbgrader"]["grade_id"], c.source) for c in nb.cells if is_test_cell(c)]


# ------------------------------------------------------------ the rule, in-process (fast)

@pytest.mark.parametrize("name", ["01_running_sum.ipynb", "01_running_sum-Copy1.ipynb",
                                  "01_running_sum-Copy2.ipynb", "Copy of 01_running_sum (2).ipynb",
                                  "01_running_sum (1).ipynb", "01_running_sum - Copy.ipynb",
                                  "01_running_sum-checkpoint.ipynb", "Copy of 01_running_sum-Copy1.ipynb"])
def test_a_renamed_copy_is_the_lesson(name, tmp_path):
    assert normalise_name(name) == "01_running_sum.ipynb"
    lessons = tmp_path / "course" / "lessons" / "01_running_sum"
    lessons.mkdir(parents=True)
    (lessons / "01_running_sum.ipynb").write_text("{}")
    mine = tmp_path / "course" / "handin" / name
    mine.parent.mkdir()
    assert find_release(mine) == lessons / "01_running_sum.ipynb"


@pytest.mark.parametrize("case", [c for c in occ.CASES if c != "intact_wrong"])
def test_each_damaged_notebook_gets_the_released_tests_back(case):
    lesson, solution = _lesson()
    _, nb = occ.cases(lesson, solution)[case]
    notes = restore_tests(nb, lesson)
    assert notes, case
    assert _tests(nb) == _tests(lesson), case
    assert len({c.get("id") for c in nb.cells}) == len(nb.cells)


def test_the_corpus_is_the_cases_named():
    assert tuple(occ.cases(*_lesson())) == occ.CASES


def test_the_grader_repairs_by_the_same_rule():
    from autograder.intake import repair
    assert repair.normalise_name is normalise_name and repair.restore_cells is restore_cells
    lesson, solution = _lesson()
    for case, (_, nb) in occ.cases(lesson, solution).items():
        mine, theirs = copy.deepcopy(nb), copy.deepcopy(nb)
        restore_tests(mine, lesson)
        repair.repair_notebook(theirs, lesson, {})
        assert _tests(mine) == _tests(theirs), case


# ------------------------------------------------- the three routes on the corpus (slow)

def parse_report(text: str) -> dict:
    """grade_id -> (PASS/FAIL, score, points) of every line of a check's report; a grade_id
    shown twice keys as ``id#2``."""
    out = {}
    for verdict, gid, got, of in LINE.findall(text):
        key, n = gid, 1
        while key in out:
            n += 1
            key = f"{gid}#{n}"
        out[key] = (verdict, float(got), float(of))
    return out


def run_student_check(path: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "mlexp.check", str(path)], capture_output=True,
                          text=True, timeout=900, cwd=REPO)
    return parse_report(proc.stdout)


def run_grader_check(path: Path, course: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "autograder", "--course", str(course), "check",
                           str(path)], capture_output=True, text=True, timeout=900, cwd=REPO)
    return parse_report(proc.stdout)


def run_grade(class_dir: Path, course: Path, out: Path, visible: list) -> dict:
    """case -> {grade_id: (PASS/FAIL, score, points)} of the visible tests, from the gradebook."""
    proc = subprocess.run([sys.executable, "-m", "autograder", "--course", str(course), "grade",
                           str(class_dir), "--out", str(out), "-j", "2", "--no-progress"],
                          capture_output=True, text=True, timeout=1800, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from nbgrader.api import Gradebook
    db = next(out.rglob("gradebook.db"))
    verdicts = {}
    with Gradebook(f"sqlite:///{db}") as gb:
        for student in sorted(p.name for p in class_dir.iterdir()):
            rows = {}
            for gid in visible:
                try:
                    g = gb.find_grade(gid, occ.LESSON, occ.LESSON, student)
                except Exception:   # noqa: BLE001  (not graded at all)
                    continue
                score, of = float(g.score or 0), float(g.max_score)
                rows[gid] = ("PASS" if score >= of else "FAIL", score, of)
            verdicts[student] = rows
    return verdicts


def routes(course: Path, paths: dict, out: Path) -> dict:
    """case -> {route: verdicts}."""
    lesson = nbformat.read(course / "lessons" / occ.LESSON / occ.NAME, as_version=4)
    visible = [gid for gid, _ in _tests(lesson)]
    with ThreadPoolExecutor(2) as pool:
        student = dict(zip(paths, pool.map(run_student_check, paths.values())))
        grader = dict(zip(paths, pool.map(lambda p: run_grader_check(p, course), paths.values())))
    graded = run_grade(course / "class", course, out, visible)
    return {case: {"mlexp.check": student[case], "autograder check": grader[case],
                   "grade": graded.get(case, {})} for case in paths}


def totals(verdicts: dict) -> tuple:
    return (sum(v[1] for v in verdicts.values()), sum(v[2] for v in verdicts.values()))


@pytest.fixture(scope="module")
def corpus_routes(tmp_path_factory):
    from autograder.publishing.build import build
    tmp = tmp_path_factory.mktemp("one_check")
    course = tmp / "course"
    (course / "lessons").mkdir(parents=True)
    shutil.copytree(REPO / "solutions" / occ.LESSON, course / "solutions" / occ.LESSON)
    build(course)
    paths = occ.write(course / "class", course)
    return routes(course, paths, tmp / "out")


@pytest.mark.slow
@pytest.mark.parametrize("case", occ.CASES)
def test_the_three_routes_give_the_same_visible_verdicts(corpus_routes, case):
    seen = corpus_routes[case]
    assert seen["grade"], (case, seen)
    assert seen["mlexp.check"] == seen["autograder check"] == seen["grade"], (case, seen)
    assert totals(seen["mlexp.check"]) == totals(seen["grade"]) and totals(seen["grade"])[1] == 10


if __name__ == "__main__":   # python tests/test_one_check.py COURSE OUT: print the table
    course, out = Path(sys.argv[1]), Path(sys.argv[2])
    paths = {p.parent.parent.name: p for p in sorted((course / "class").glob("*/*/*.ipynb"))}
    for case, seen in routes(course, paths, out).items():
        for route, verdicts in seen.items():
            got, of = totals(verdicts)
            cells = " ".join(f"{gid}={v[0]}" for gid, v in verdicts.items())
            print(f"{case:22} {route:17} {got:g}/{of:g}  {cells}")
