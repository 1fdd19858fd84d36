"""The student edition (`python -m autograder publish`) and the course file hold no answer.

The scan (autograder.publishing.publish.scan) looks for every whole line of a solution cell or a hidden test
of solutions/ that the released lessons and mlexp do not hold anyway, mistake catalogues, demo
notebooks and the grader's code, in every file, zips and wheels included. It is first shown to
find each kind when planted, then run on the edition and the course file.
"""
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.cli import main
from autograder.publishing.colab import build_wheel
from autograder.course import LESSONS
from autograder.publishing.publish import EDITION_MARKER, PublishError, publish, scan, secret_lines

REPO = Path(__file__).resolve().parent.parent
TEST_REPO = "test-owner/test-course"


@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    out = tmp_path_factory.mktemp("edition") / "public"
    assert main(["--course", str(REPO), "publish", str(out), "--repo", TEST_REPO]) == 0
    return out


def _tree(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(folder).parts}


def test_the_edition_holds_what_students_need_and_points_at_the_repo(edition):
    files = _tree(edition)
    for lesson in LESSONS:
        nb = files[f"lessons/{lesson}/{lesson}.ipynb"].decode()
        assert f"colab.research.google.com/github/{TEST_REPO}/blob/main/lessons/{lesson}/" in nb
        assert f'COURSE_REPO = \\"{TEST_REPO}\\"' in nb
    for table in (REPO / "lessons").glob("*/seeds.md"):
        assert files[f"mlexp/seed_tables/{table.parent.name}.md"] == table.read_bytes()
        assert files[f"lessons/{table.parent.name}/seeds.md"] == table.read_bytes()
    for name in ("README.md", "Makefile", "setup.sh", "environment.yml", "pyproject.toml",
                 "mlexp/__init__.py", "mlexp/check.py", ".gitignore", EDITION_MARKER):
        assert name in files, name
    assert not [f for f in files if f.startswith(("solutions/", "autograder/", "tests/", "worked/"))]
    readme = files["README.md"].decode()
    assert "python -m mlexp.check" in readme and TEST_REPO in readme and "${" not in readme
    assert b"autograder" not in files["pyproject.toml"] and b"[tool.pytest" not in files["pyproject.toml"]


def test_the_scan_passes_on_the_edition_and_the_course_file(edition, tmp_path):
    assert scan(edition, REPO) == []
    wheel = build_wheel(REPO, tmp_path)
    assert scan(wheel, REPO) == []
    names = zipfile.ZipFile(wheel).namelist()
    assert all(n.startswith(("mlexp/", "mlexp-")) for n in names), names
    assert not [n for n in names if "grading" in n or "autograder" in n]


def test_the_scan_finds_each_kind_of_leak(edition, tmp_path):
    """Each planted leak is named with its file, so the scan above can fail."""
    leaky = tmp_path / "leaky"
    shutil.copytree(edition, leaky)
    secrets = secret_lines(REPO)
    solution = next(line for line, where in secrets.items() if where.startswith("a solution cell"))
    hidden = next(line for line, where in secrets.items() if where.startswith("a hidden test"))
    (leaky / "notes.md").write_text(f"Some notes\n    {solution}\n")
    nb = nbformat.read(leaky / "lessons" / "01_running_sum" / "01_running_sum.ipynb", as_version=4)
    nb.cells[-1].source += "\n" + hidden
    nbformat.write(nb, leaky / "lessons" / "01_running_sum" / "01_running_sum.ipynb")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("inner/mistakes.json", "{}")
        zf.writestr("inner/wire.py", (REPO / "autograder" / "engine" / "kernel" / "wire.py").read_text())
    (leaky / "dist").mkdir()
    (leaky / "dist" / "extra.zip").write_bytes(buf.getvalue())
    demo = next((REPO / "autograder" / "demo" / "submissions").iterdir())
    shutil.copytree(demo, leaky / "more" / demo.name)
    found = "\n".join(scan(leaky, REPO))
    assert "notes.md: holds a line of a solution cell" in found
    assert "lessons/01_running_sum/01_running_sum.ipynb: holds a line of a hidden test" in found
    assert "dist/extra.zip!inner/mistakes.json: a mistake catalogue" in found
    assert "dist/extra.zip!inner/wire.py: holds a line of the grader's module autograder/engine/kernel/wire.py" in found
    assert f"more/{demo.name}/" in found and "a notebook of the demo class" in found
    assert len(scan(REPO / "solutions", REPO)) >= 2 * len(LESSONS)   # the answers themselves


def test_publishing_again_gives_the_same_files_and_other_folders_are_refused(edition, tmp_path):
    again = tmp_path / "again"
    (again / ".git").mkdir(parents=True)
    (again / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    publish(REPO, again, repo=TEST_REPO)
    (again / "stale.txt").write_text("left from before")
    publish(REPO, again, repo=TEST_REPO)      # republish: everything but .git is rewritten
    assert _tree(again) == _tree(edition)
    assert (again / ".git" / "HEAD").is_file()
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("mine")
    with pytest.raises(PublishError, match="not a student edition"):
        publish(REPO, other, repo=TEST_REPO)
    assert (other / "thesis.tex").read_text() == "mine"
    with pytest.raises(ValueError, match="not a GitHub repository name"):
        publish(REPO, tmp_path / "x", repo="no slash")


def test_with_solutions_adds_worked_solutions_without_hidden_tests(tmp_path):
    out = tmp_path / "selfstudy"
    publish(REPO, out, repo=TEST_REPO, with_solutions=True)
    worked = sorted(p.relative_to(out).as_posix() for p in (out / "worked").rglob("*.ipynb"))
    assert worked == [f"worked/{a}/{a}.ipynb" for a in sorted(LESSONS)]
    assert scan(out, REPO, solutions_allowed=True) == []       # no hidden test, no catalogue
    assert any("a solution cell" in f for f in scan(out, REPO))   # and the solutions are there
    for path in (out / "worked").rglob("*.ipynb"):
        assert "BEGIN HIDDEN TESTS" not in path.read_text()


def _fresh_python(tmp_path: Path) -> Path:
    """A new venv that sees this venv's packages (torch, nbclient, ...) but neither mlexp nor
    the grader: their editable installs are .pth files, which a path added this way skips."""
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "course-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py


@pytest.mark.slow
def test_the_edition_installs_alone_and_checks_a_notebook(edition, tmp_path):
    py = _fresh_python(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    wheels = tmp_path / "wheels"     # pip install OUT, in two steps (no build isolation: offline)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(edition)], check=True, env=env, timeout=300)
    [wheel] = wheels.glob("mlexp-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                    str(wheel)], check=True, env=env, timeout=300)
    probe = ("import importlib.util, mlexp, mlexp.seeds\n"
             "print(mlexp.__file__)\n"
             "print(importlib.util.find_spec('autograder'))\n"
             "print(mlexp.seeds.find_table('02_fixed_state_recall'))\n")
    out = subprocess.run([py, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=120).stdout.split("\n")
    assert Path(out[0]).is_relative_to(tmp_path / "fresh"), out
    assert out[1] == "None", "the grader is importable from the student edition"
    assert out[2].endswith("seed_tables/02_fixed_state_recall.md"), out
    for lesson in LESSONS:            # every lesson's setup cell finds the installed mlexp
        nb = nbformat.read(edition / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)
        [setup] = [c for c in nb.cells if c.get("id") == "course-setup"]
        ran = subprocess.run([py, "-c", setup.source + "\nprint('SETUP-OK', mlexp.__file__)"],
                             capture_output=True, text=True, env=env, cwd=edition / "lessons" / lesson,
                             timeout=120)
        assert "SETUP-OK" in ran.stdout and str(tmp_path / "fresh") in ran.stdout, (lesson, ran.stderr)
    lesson_dir = edition / "lessons" / "01_running_sum"
    blank = subprocess.run([py, "-m", "mlexp.check", str(lesson_dir / "01_running_sum.ipynb")],
                           capture_output=True, text=True, env=env, cwd=edition, timeout=600)
    assert blank.returncode == 1, blank.stdout + blank.stderr
    assert blank.stdout.count("FAIL  ") == 4 and "Hint:" in blank.stdout
    assert "hidden tests run only when the course grades it" in blank.stdout
    assert "WARNING" not in blank.stderr, blank.stderr   # the kernel's own log is not the student's
    solved = tmp_path / "handin" / "01_running_sum.ipynb"
    solved.parent.mkdir()
    shutil.copy(REPO / "autograder" / "demo" / "submissions" / "ada_all_correct" / "01_running_sum"
                / "01_running_sum.ipynb", solved)
    good = subprocess.run([py, "-m", "mlexp.check", str(solved)], capture_output=True, text=True,
                          env=env, cwd=edition, timeout=600)
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.count("PASS  ") == 4
