"""autograder/course.py is the one place that knows the course; `build --repo` and `build --colab`."""
import importlib.util
import os
import subprocess
import sys
import shutil
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder import course
from autograder.cli import main
from autograder.publishing.colab import build_wheel, wheel_name
from autograder.config import find_course_root, list_assignments

REPO = Path(__file__).resolve().parent.parent


def _lesson_cells(root: Path):
    spec = importlib.util.spec_from_file_location("lesson_cells_under_test", root / "scripts" / "lesson_cells.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_lessons_are_the_solution_folders_and_nobody_keeps_a_copy():
    assert list(course.LESSONS) == list_assignments(REPO)
    for lesson in course.LESSONS.values():
        assert lesson.title and lesson.minutes > 0 and lesson.heavy
    assert _lesson_cells(REPO).LESSONS is course.LESSONS
    assert find_course_root(REPO) == REPO
    from autograder.publishing import seeds as runner
    assert runner.find_course_root is course.find_course_root


def test_lesson_notebook_by_id_or_prefix(tmp_path):
    assert course.lesson_notebook(REPO, "01") == REPO / "solutions" / "01_running_sum" / "01_running_sum.ipynb"
    with pytest.raises(ValueError, match="matches nothing"):
        course.lesson_notebook(REPO, "99")
    with pytest.raises(ValueError, match=r"matches \['00_token_mixing', '01_running_sum'"):
        course.lesson_notebook(REPO, "0")


def test_set_course_repo_rewrites_one_line_and_refuses_bad_names(tmp_path):
    (tmp_path / "autograder").mkdir()
    text = (REPO / "autograder" / "course.py").read_text()
    target = tmp_path / "autograder" / "course.py"
    target.write_text(text)
    assert course.set_course_repo(tmp_path, "my-uni/la-course")
    new = target.read_text()
    assert 'COURSE_REPO = "my-uni/la-course"' in new
    assert [a for a, b in zip(text.splitlines(), new.splitlines()) if a != b] == [f'COURSE_REPO = "{course.COURSE_REPO}"']
    assert not course.set_course_repo(tmp_path, "my-uni/la-course")          # unchanged
    for bad in ("no-slash", "a/b/c", "space in/name", "-lead/x", 'q"uote/x'):
        with pytest.raises(ValueError, match="not a GitHub repository name"):
            course.set_course_repo(tmp_path, bad)
    with pytest.raises(FileNotFoundError, match="run it in the course checkout"):
        course.set_course_repo(tmp_path / "elsewhere", "my-uni/la-course")


def test_the_course_file_is_a_wheel_pip_understands(tmp_path):
    wheel = build_wheel(REPO, tmp_path)
    assert wheel.name == wheel_name(REPO) == f"mlexp-{course_version()}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        dist_info = f"mlexp-{course_version()}.dist-info"
        assert {f"{dist_info}/METADATA", f"{dist_info}/WHEEL", f"{dist_info}/RECORD"} <= set(names)
        assert "mlexp/__init__.py" in names and "mlexp/ops/__init__.py" in names
        assert not [n for n in names if "__pycache__" in n or n.startswith("autograder/")]
        record = zf.read(f"{dist_info}/RECORD").decode().splitlines()
        assert len(record) == len(names)
        assert "Requires-Dist: torch>=2.1" in zf.read(f"{dist_info}/METADATA").decode()
    assert build_wheel(REPO, tmp_path / "again").read_bytes() == wheel.read_bytes()   # reproducible


def test_the_course_file_carries_every_seed_table_and_find_table_reads_it(tmp_path, monkeypatch):
    """On Colab a lesson has no lessons/<id>/seeds.md beside it: the course file carries them."""
    import mlexp.seeds
    from autograder.publishing.colab import TABLES_IN_PACKAGE
    assert TABLES_IN_PACKAGE == mlexp.seeds.TABLES_IN_PACKAGE
    tables = sorted((REPO / "lessons").glob("*/seeds.md"))
    assert {p.parent.name for p in tables} >= {"00_token_mixing", "02_fixed_state_recall",
                                               "03_gates_and_delta_rule", "06_recall_per_byte"}
    with zipfile.ZipFile(build_wheel(REPO, tmp_path)) as zf:
        zf.extractall(tmp_path / "site")              # what pip installs: mlexp/ and its dist-info
    for table in tables:
        assert (tmp_path / "site" / "mlexp" / TABLES_IN_PACKAGE / f"{table.parent.name}.md").read_bytes() \
            == table.read_bytes()
    # The installed course file, run from an empty folder (Colab's /content): found inside mlexp.
    monkeypatch.chdir(tmp_path)
    code = ("import mlexp.seeds as s; p = s.find_table('06_recall_per_byte'); print(p); "
            "print(s.find_table('no_such_lesson')); print(s.find_table('06_recall_per_byte', 'lr_sweep.json'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}).stdout.split()
    # the course file carries seeds.md only: another file is not answered with it (lesson 06 would parse it as JSON)
    assert out == [str(tmp_path / "site" / "mlexp" / TABLES_IN_PACKAGE / "06_recall_per_byte.md"), "None", "None"]
    # A seeds.md next to the notebook comes first; in a course checkout, lessons/<id>/ is next.
    (tmp_path / "seeds.md").write_text("uploaded")
    assert mlexp.seeds.find_table("06_recall_per_byte") == tmp_path / "seeds.md"
    (tmp_path / "seeds.md").unlink()
    assert mlexp.seeds.find_table("06_recall_per_byte") == REPO / "lessons" / "06_recall_per_byte" / "seeds.md"


def course_version() -> str:
    import mlexp
    return mlexp.__version__


def test_build_refuses_mixed_options(capsys):
    assert main(["--course", str(REPO), "build", "--colab", "--check"]) == 2
    assert "--colab writes only the course file" in capsys.readouterr().err
    assert main(["--course", str(REPO), "build", "--repo", "x/y", "--check"]) == 2
    assert main(["--course", str(REPO), "build", "--repo", "not a repo"]) == 2
    assert "not a GitHub repository name" in capsys.readouterr().err


@pytest.mark.slow
def test_build_repo_rewrites_badges_setup_cells_and_readme(tmp_path):
    root = tmp_path / "course"
    for name in ("solutions", "scripts", "autograder", "mlexp"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "submissions"))
    shutil.copy(REPO / "README.md", root / "README.md")
    assert main(["--course", str(root), "build", "--repo", "my-uni/la-course"]) == 0
    assert 'COURSE_REPO = "my-uni/la-course"' in (root / "autograder" / "course.py").read_text()
    url = "https://colab.research.google.com/github/my-uni/la-course/blob/main/lessons/01_running_sum/01_running_sum.ipynb"
    assert url in (root / "README.md").read_text()
    for kind in ("solutions", "lessons"):
        nb = nbformat.read(root / kind / "01_running_sum" / "01_running_sum.ipynb", as_version=4)
        assert url in nb.cells[0].source
        assert 'COURSE_REPO = "my-uni/la-course"' in nb.cells[1].source
    assert "OWNER/REPO" not in (root / "README.md").read_text().split("<!-- lessons -->")[1].split("<!-- /lessons -->")[0]
    demo = sorted((root / "autograder" / "demo" / "submissions").glob("*/01_running_sum/01_running_sum.ipynb"))
    assert demo and all(url in nbformat.read(p, as_version=4).cells[0].source for p in demo)
