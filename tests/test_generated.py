"""Generated files and the demo class: `make check-generated` and the demo-hints check behind it.

`make check-generated` runs every --check (shared lesson cells, lessons/ from solutions/, the demo
class from its catalogue) and `demo --check-hints`, which grades every catalogued demo student in
this process and names each one that no longer draws the hint it was built for. The tests below
prove that check can fail: they change an exercise in a scratch copy of the course.
"""
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.publishing.demo import check_hints, format_hint_report, load_catalog, sample_students

REPO = Path(__file__).resolve().parent.parent
LESSON = "01_running_sum"          # the lesson whose exercises the scratch copies change


def scratch_course(tmp_path: Path, lessons=(LESSON,)) -> Path:
    """A copy of the course with every lesson but only ``lessons`` in the demo catalogue."""
    root = tmp_path / "course"
    for name in ("solutions", "lessons", "scripts", "autograder", "mlexp"):
        shutil.copytree(REPO / name, root / name,
                        ignore=shutil.ignore_patterns("__pycache__", "submissions", "catalog"))
    for name in ("README.md", "Makefile", "pyproject.toml", "nbgrader_config.py"):
        shutil.copy(REPO / name, root / name)
    demo = root / "autograder" / "demo"
    (demo / "catalog").mkdir(parents=True)
    for lesson in lessons:
        shutil.copy(REPO / "autograder" / "demo" / "catalog" / f"{lesson}.json", demo / "catalog")
        for student in load_catalog()[lesson]["students"]:
            shutil.copytree(REPO / "autograder" / "demo" / "submissions" / student / lesson,
                            demo / "submissions" / student / lesson)
    return root


def student_with_literal_hint(lesson: str):
    """(student, test id, hint) of a catalogued mistake whose hint is written literally in the
    solution's test cell (so that an edit of that text is an edit of the exercise)."""
    tests = {c.metadata["nbgrader"]["grade_id"]: c.source
             for c in nbformat.read(REPO / "solutions" / lesson / f"{lesson}.ipynb", as_version=4).cells
             if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"}
    for student, spec in load_catalog()[lesson]["students"].items():
        for test, hint in spec["expect"]["hints"].items():
            if spec["expect"]["score"] > 0 and tests.get(test, "").count(hint) == 1:
                return student, test, hint
    pytest.skip(f"no catalogued hint of {lesson} is written literally in its test cell")


def edit_test_cell(root: Path, lesson: str, test: str, old: str, new: str) -> None:
    path = root / "solutions" / lesson / f"{lesson}.ipynb"
    nb = nbformat.read(path, as_version=4)
    [cell] = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == test]
    assert old in cell.source
    cell.source = cell.source.replace(old, new)
    nbformat.write(nb, path)


@pytest.mark.slow   # one of the slowest fast tests: left out of make test-fast (under 3 min); make test runs it
def test_every_demo_student_of_a_lesson_draws_its_hint(tmp_path):
    root = scratch_course(tmp_path)
    problems, checked = check_hints(root, root / "autograder" / "demo")
    assert checked == len(load_catalog()[LESSON]["students"])
    assert problems == [], format_hint_report(problems, checked)


def test_a_reworded_hint_names_the_student_the_exercise_and_the_new_hint(tmp_path):
    student, test, hint = student_with_literal_hint(LESSON)
    root = scratch_course(tmp_path)
    edit_test_cell(root, LESSON, test, hint, "a reworded hint XYZZY")
    problems, checked = check_hints(root, root / "autograder" / "demo", students={student})
    mine = [p for p in problems if p["student"] == student and p["test"] == test]
    assert mine and mine[0]["expected"] == hint and "a reworded hint XYZZY" in mine[0]["got"], problems
    report = format_hint_report(problems, checked)
    assert f"{LESSON}, student {student}, exercise {test}: built to draw the hint {hint!r}; now it gets: " in report
    assert "a reworded hint XYZZY" in report


def test_an_exercise_that_no_longer_catches_the_mistake_is_named(tmp_path):
    """The test cell stops checking anything: the student now passes and the score is off."""
    student, test, _ = student_with_literal_hint(LESSON)
    root = scratch_course(tmp_path)
    path = root / "solutions" / LESSON / f"{LESSON}.ipynb"
    nb = nbformat.read(path, as_version=4)
    [cell] = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == test]
    cell.source = "# Test: checks nothing any more\nassert True"
    nbformat.write(nb, path)
    problems, checked = check_hints(root, root / "autograder" / "demo", students={student})
    report = format_hint_report(problems, checked)
    assert f"student {student}, exercise {test}: built to draw the hint" in report and "now it passes" in report
    assert f"{LESSON}, student {student}: catalogued score" in report


def test_the_sample_shows_a_mistake_then_a_correct_student_per_lesson():
    picked = sample_students(2)
    catalog = load_catalog()
    assert len(picked) == 2 * len(catalog)
    for lesson in catalog:
        first, second = [catalog[lesson]["students"][s] for a, s in picked if a == lesson]
        assert len(first["expect"]["hints"]) == 1 and 0 < first["expect"]["score"] < first["expect"]["max_score"]
        assert second["expect"]["score"] == second["expect"]["max_score"] and not second["expect"]["hints"]
    assert sample_students(1) == picked[::2]
    with pytest.raises(ValueError, match="at least 1"):
        sample_students(0)


def _make_check_generated(root: Path) -> subprocess.CompletedProcess:
    """`make check-generated` in ``root`` with this Python, without re-running the setup."""
    return subprocess.run(["make", "-s", "-o", "setup", "check-generated", f"PY={sys.executable}"],
                          cwd=root, capture_output=True, text=True, timeout=1800)


@pytest.mark.slow
def test_make_check_generated_passes_on_the_checkout():
    proc = _make_check_generated(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "still gets the score and hints it was built for" in proc.stdout


@pytest.mark.slow
def test_make_check_generated_fails_naming_the_student(tmp_path):
    student, test, hint = student_with_literal_hint(LESSON)
    root = scratch_course(tmp_path)
    edit_test_cell(root, LESSON, test, hint, "a reworded hint XYZZY")
    proc = _make_check_generated(root)
    assert proc.returncode != 0
    assert f"student {student}, exercise {test}: built to draw the hint {hint!r}; now it gets: " in proc.stdout
    assert "XYZZY" in proc.stdout


def test_grade_says_what_it_grades_and_how_long_before_it_starts(capsys):
    """On stderr with the progress bar, so that stdout starts with the table of grades."""
    from argparse import Namespace

    from autograder.grading.console import announce as _announce
    picked, total = sample_students(1), sum(len(c["students"]) for c in load_catalog().values())
    _announce(Namespace(sample=1, jobs=2, out="grades", submissions=None), (picked, total))
    out, err = capsys.readouterr()
    assert out == ""
    assert f"{len(picked)} of its {total} submissions" in err and "minutes" in err
    assert "make grade-all" in err and "autograder grade SUBMISSIONS --out DIR" in err
    _announce(Namespace(sample=None, jobs=2, out="grades", submissions="no-such-class.zip"), None)
    assert "a class of 100, which takes about" in capsys.readouterr().err
    _announce(Namespace(sample=None, jobs=None, out="grades", submissions="no-such-class.zip"), None)   # -j left out
    assert "1 at a time" in capsys.readouterr().err
    demo = Path(__file__).resolve().parent.parent / "autograder" / "demo" / "submissions"
    _announce(Namespace(sample=None, jobs=2, out="grades", submissions=str(demo)), None)
    n = len(list(demo.rglob("*.ipynb")))
    assert f"{n} notebooks found, which takes about" in capsys.readouterr().err
    _announce(Namespace(sample=None, jobs=None, out="grades", submissions="class.zip",
                        scheduler="tcp://127.0.0.1:8786"), None)
    assert "on the Dask cluster at tcp://127.0.0.1:8786" in capsys.readouterr().err


def test_check_hints_names_a_hint_the_report_files_under_another_mistake():
    """A drawn hint is not enough: the class report must file it under the student's mistake id
    (the longest catalogued piece wins, so a shorter, more general piece can lose)."""
    from autograder.publishing.demo import _compare
    from autograder.engine.dryrun import Outcome
    from autograder.mistakes import Mistake
    error = "AssertionError: Hint: the gradient holds NaN: exp was taken above the diagonal (inf there)."
    expect = {"score": 0, "max_score": 4, "hints": {"t": "gradient holds NaN"}, "mistakes": ["grad_nan"]}
    outcomes = {"t": Outcome(False, error, 4.0)}
    general = {"grad_nan": Mistake("grad_nan", "t", "gradient holds NaN"),
               "exp_then_mask": Mistake("exp_then_mask", "t", "exp was taken above the diagonal")}
    problems = _compare("L", "mira", expect, outcomes, general)
    assert len(problems) == 1 and "files it under the mistake 'exp_then_mask', not 'grad_nan'" in problems[0]["got"]
    assert "student mira, exercise t: built to draw the hint 'gradient holds NaN'; now it draws the hint" \
        in format_hint_report(problems, 1)
    distinct = {**general, "grad_nan": Mistake("grad_nan", "t", "the gradient holds NaN: exp was taken above")}
    assert _compare("L", "mira", expect, outcomes, distinct) == []
    unforeseen = {**expect, "mistakes": ["no_hint_matched"]}
    other = {"other": Mistake("other", "t", "a piece this hint does not hold")}
    assert _compare("L", "mira", unforeseen, outcomes, other) == []          # matches nothing: no_hint_matched
    assert _compare("L", "mira", unforeseen, outcomes, general)               # matches one: not unforeseen
