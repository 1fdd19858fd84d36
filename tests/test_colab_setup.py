"""Each lesson's setup cell: static rules, and a run in a simulated Colab and in a local checkout.

Colab paths covered: the course file (`python -m autograder build --colab`) uploaded to /content
or to a Drive folder, the course folder uploaded to /content/course, the published repository,
and the message that names the steps when none of them is there.

The simulated Colab is a python started with -S (no site-packages, so no editable install of
this checkout) in a folder outside the repository standing for /content, whose sys.path is:
a stub folder (a fake ``google.colab`` and a fake ``pip`` that records its arguments and
"installs" from this checkout instead of the network), an empty site folder the stub installs
into, and the course venv's site-packages seen through symlinks, without mlexp (and without
tqdm in the "tqdm missing" case).
"""
import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.publishing import colab as build_colab
from autograder.cli import main

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("lesson_cells", REPO / "scripts" / "lesson_cells.py")
lesson_cells = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lesson_cells)

LESSON_IDS = list(lesson_cells.LESSONS)
KEEP_RE = re.compile(r"\b(" + "|".join(lesson_cells.COLAB_KEEPS) + r")\b")
TEST_REPO = "test-owner/test-course"


def _setup_cell(kind: str, lesson_id: str):
    nb = nbformat.read(REPO / kind / lesson_id / f"{lesson_id}.ipynb", as_version=4)
    cells = [c for c in nb.cells if c.get("id") == lesson_cells.SETUP_ID]
    assert cells, f"{kind}/{lesson_id}: no cell with id '{lesson_cells.SETUP_ID}'; run scripts/lesson_cells.py"
    return nb, cells[0]


def _string_literals(source: str) -> list:
    return [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


@pytest.mark.parametrize("kind", ["solutions", "lessons"])
@pytest.mark.parametrize("lesson_id", LESSON_IDS)
def test_setup_cell_follows_the_rules(kind, lesson_id):
    nb, cell = _setup_cell(kind, lesson_id)
    assert nb.cells.index(cell) == 1, "the setup cell must come right after the introduction"
    assert cell.source == lesson_cells.SETUP_SOURCE, "stale setup cell: run scripts/lesson_cells.py, then build"
    literals = _string_literals(cell.source)
    # Nothing that Colab already has is ever named in a string the cell could pass to pip.
    assert not [s for s in literals if KEEP_RE.search(s)], "the setup cell names a package Colab keeps"
    assert not [s for s in literals if s in ("-U", "--upgrade", "--force-reinstall", "--ignore-installed")]
    # The course is installed with --no-deps, in the same call as the repository URL.
    calls = [ln for ln in cell.source.splitlines() if "subprocess.run(_pip" in ln]
    assert len(calls) == 2 and "_missing" in calls[0] and "--no-deps" in calls[1], calls
    # The only other pip call takes out an installed mlexp that a corrected course file replaces.
    others = [ln for ln in cell.source.splitlines() if '"pip"' in ln and "_pip = " not in ln]
    assert others == [ln for ln in others if '"uninstall", "--quiet", "--yes", "mlexp"]' in ln] and len(others) == 1
    assert 'f"mlexp @ git+https://github.com/{COURSE_REPO}@' in cell.source
    small = ast.literal_eval(re.search(r"^SMALL_DEPS = (\{.*?\})", cell.source, re.M).group(1))
    assert small and not [r for r in small.values() if KEEP_RE.search(r)], small
    # It checks with importlib before installing a small dependency.
    assert "importlib.util.find_spec(name) is None" in cell.source
    # Colab detection and the checkout search.
    assert '"google.colab" in sys.modules' in cell.source and '(p / "mlexp" / "__init__.py")' in cell.source


def test_readme_and_intros_link_to_colab():
    readme = (REPO / "README.md").read_text()
    for lesson_id in LESSON_IDS:
        url = lesson_cells.colab_url(lesson_id)
        assert url.startswith("https://colab.research.google.com/github/")
        assert url.endswith(f"/lessons/{lesson_id}/{lesson_id}.ipynb")
        assert readme.count(url) == 1, f"README lacks the Colab link of {lesson_id}"
        for kind in ("solutions", "lessons"):
            nb = nbformat.read(REPO / kind / lesson_id / f"{lesson_id}.ipynb", as_version=4)
            intro = nb.cells[0].source
            assert lesson_cells.badge(lesson_id) in intro, f"{kind}/{lesson_id}: no Colab badge at the top"
            for part in (*lesson_cells.REQUIRED_IN_INTRO, "**Time.**", "shared 2-core machine"):
                assert part in intro, f"{kind}/{lesson_id}: the first cell lacks {part!r}"
    assert lesson_cells.run(check=True) == 0, "run scripts/lesson_cells.py: notebooks or README are stale"


# ---------------------------------------------------------------------------- simulated Colab
STUB_PIP = '''
"""Fake pip: record the arguments; install the course (or a small dependency) by copying."""
import json, os, shutil, sys, zipfile
from pathlib import Path

args = sys.argv[1:]
with open(os.environ["SIM_PIP_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
site, repo, venv_site = (Path(os.environ[k]) for k in ("SIM_SITE", "SIM_REPO", "SIM_VENV_SITE"))
if args[0] == "uninstall":
    assert [a for a in args[1:] if not a.startswith("-")] == ["mlexp"], args
    for entry in [site / "mlexp", *site.glob("mlexp-*.dist-info")]:
        shutil.rmtree(entry)
    sys.exit(0)
for req in [a for a in args[1:] if not a.startswith("-")]:
    if req.startswith("mlexp @ git+https://github.com/"):   # the published student edition
        assert not (repo / "autograder").exists(), "the public repository holds the grader"
        shutil.copytree(repo / "mlexp", site / "mlexp", ignore=shutil.ignore_patterns("__pycache__"))
    elif req.endswith(".whl"):
        name = Path(req).name            # pip refuses a wheel whose name is not name-version-tags.whl
        if name.count("-") != 4 or " " in name:
            sys.exit(f"stub pip: {name} is not a valid wheel filename")
        if (site / f"mlexp-{name.split('-')[1]}.dist-info").is_dir():   # what pip does, without --force-reinstall
            print("mlexp is already installed with the same version as the provided wheel.")
            continue
        zipfile.ZipFile(req).extractall(site)
    elif req.split(">")[0].split("=")[0] == "tqdm":
        shutil.copytree(venv_site / "tqdm", site / "tqdm")
    else:
        sys.exit(f"stub pip: no network here, cannot install {req!r}")
'''

RUNNER = '''
import importlib.util, json, os, sys
if os.environ["SIM_COLAB"] == "1":
    import google.colab  # Colab imports it at kernel start
report = {"mlexp_before": importlib.util.find_spec("mlexp") is not None}
if os.environ.get("SIM_PREIMPORT") == "1":
    import mlexp.kvcache  # an earlier cell (or run of the setup cell) imported it
ns = {"__name__": "__main__"}
try:
    exec(compile(open(sys.argv[1]).read(), "setup-cell", "exec"), ns)
    import mlexp, mlexp.kvcache
    report["mlexp_file"] = mlexp.__file__
    report["old_code"] = hasattr(mlexp.kvcache, "SIM_OLD")
    if os.environ.get("SIM_IMPORT_TORCH") == "1":
        import torch, numpy, matplotlib, tqdm
        report["kept"] = {m.__name__: m.__file__ for m in (torch, numpy, matplotlib, tqdm)}
except Exception as exc:
    report["error"] = f"{type(exc).__name__}: {exc}"
print("REPORT " + json.dumps(report))
'''
COLAB_LINE = 'COLAB = Path("/content")'


def _venv_site() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _simulate(tmp_path: Path, source: str, colab=True, hide=(), cwd=None, import_torch=False,
              repo: Path = REPO, preimport=False) -> tuple:
    """Run ``source`` as the setup cell in a simulated kernel; returns (report, pip calls).

    Colab's folder /content is ``tmp_path/content`` (the cell's COLAB line is rewritten) and the
    kernel starts there, as on Colab, unless ``cwd`` says otherwise. ``repo``: what an install
    from GitHub gets (the student edition that `publish` wrote). ``preimport``: the kernel has
    imported mlexp before the cell runs. The report's "stdout" is what the cell printed.
    """
    colab_stub, pip_stub, site, visible, content = (
        tmp_path / n for n in ("colab-stub", "pip-stub", "site", "venv-site", "content"))
    for d in (colab_stub / "google" / "colab", pip_stub / "pip", site, visible, content):
        d.mkdir(parents=True, exist_ok=True)
    (colab_stub / "google" / "__init__.py").write_text("")
    (colab_stub / "google" / "colab" / "__init__.py").write_text('"""Fake google.colab for tests."""\n')
    (pip_stub / "pip" / "__init__.py").write_text("")
    (pip_stub / "pip" / "__main__.py").write_text(textwrap.dedent(STUB_PIP))
    venv_site = _venv_site()
    hidden = ("mlexp", "autograder", "__editable__", "_distutils_hack", *hide)
    for entry in venv_site.iterdir():
        if not entry.name.startswith(hidden) and entry.suffix != ".pth" and not (visible / entry.name).is_symlink():
            (visible / entry.name).symlink_to(entry)                 # (a second run in tmp_path has them)
    assert source.count(COLAB_LINE) == 1, "the setup cell no longer names Colab's folder in one line"
    (tmp_path / "cell.py").write_text(source.replace(COLAB_LINE, f"COLAB = Path({str(content)!r})"))
    (tmp_path / "runner.py").write_text(RUNNER)
    log = tmp_path / "pip.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    path = [colab_stub] * colab + [pip_stub, site, visible]
    env.update(PYTHONPATH=os.pathsep.join(map(str, path)),
               SIM_PIP_LOG=str(log), SIM_SITE=str(site), SIM_REPO=str(repo), SIM_VENV_SITE=str(venv_site),
               SIM_COLAB="1" if colab else "0", SIM_IMPORT_TORCH="1" if import_torch else "0",
               SIM_PREIMPORT="1" if preimport else "0",
               PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-S", str(tmp_path / "runner.py"), str(tmp_path / "cell.py")],
                          cwd=cwd or content, env=env,
                          capture_output=True, text=True, timeout=120)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert lines, f"the simulated kernel crashed:\n{proc.stdout}\n{proc.stderr}"
    calls = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
    report = json.loads(lines[-1][len("REPORT "):])
    report["stdout"] = "\n".join(ln for ln in proc.stdout.splitlines() if not ln.startswith("REPORT "))
    return report, calls


def _lesson_cell(lesson_id: str) -> str:
    """The setup cell of the student notebook lessons/<id>/<id>.ipynb, as a student opens it."""
    return _setup_cell("lessons", lesson_id)[1].source


@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    """The student edition, as `python -m autograder publish OUT --repo TEST_REPO` writes it."""
    out = tmp_path_factory.mktemp("edition") / "public"
    assert main(["--course", str(REPO), "publish", str(out), "--repo", TEST_REPO]) == 0
    return out


def _cell_for_a_published_repo(edition: Path, lesson_id: str) -> str:
    """The lesson's setup cell in the student edition published for TEST_REPO."""
    nb = nbformat.read(edition / "lessons" / lesson_id / f"{lesson_id}.ipynb", as_version=4)
    [cell] = [c for c in nb.cells if c.get("id") == lesson_cells.SETUP_ID]
    assert cell.source == lesson_cells.setup_source(TEST_REPO)
    return cell.source


def _unpublished_cell(lesson_id: str) -> str:
    """The lesson's setup cell before the course is on GitHub (the placeholder repository)."""
    return _lesson_cell(lesson_id).replace(f'COURSE_REPO = "{lesson_cells.COURSE_REPO}"',
                                           f'COURSE_REPO = "{lesson_cells.PLACEHOLDER_REPO}"')


@pytest.fixture(scope="module")
def course_file(tmp_path_factory):
    """The file `python -m autograder build --colab` writes for students to upload."""
    out = tmp_path_factory.mktemp("dist")
    assert main(["--course", str(REPO), "build", "--colab", str(out)]) == 0
    [wheel] = out.glob("*.whl")
    assert wheel.name == build_colab.wheel_name(REPO)
    return wheel


UNINSTALL_MLEXP = ["uninstall", "--quiet", "--yes", "mlexp"]   # the one uninstall the cell may ask for


def _assert_nothing_kept_was_installed(calls):
    for args in calls:
        assert args[0] == "install" or args == UNINSTALL_MLEXP, args
        assert not [a for a in args if KEEP_RE.search(Path(a).name)], f"pip was asked to install a package Colab keeps: {args}"
        assert not {"-U", "--upgrade", "--force-reinstall"} & set(args), args


def _assert_imported_from(report, folder: Path):
    assert report["mlexp_before"] is False, "the simulation leaked the checkout's mlexp"
    assert "error" not in report, report
    assert Path(report["mlexp_file"]).is_relative_to(folder), report


@pytest.mark.parametrize("lesson_id", [LESSON_IDS[0], LESSON_IDS[-1]])
def test_published_repo_on_simulated_colab(tmp_path, lesson_id, edition):
    report, calls = _simulate(tmp_path, _cell_for_a_published_repo(edition, lesson_id),
                              import_torch=lesson_id == LESSON_IDS[0], repo=edition)
    _assert_imported_from(report, tmp_path / "site")
    _assert_nothing_kept_was_installed(calls)
    assert calls == [["install", "--quiet", "--no-deps", f"mlexp @ git+https://github.com/{TEST_REPO}@main"]]
    for name, path in report.get("kept", {}).items():   # torch & co come from where they were
        assert Path(path).resolve().is_relative_to(_venv_site().resolve()), (name, path)


# Every lesson has the same setup cell (test_setup_cell_follows_the_rules), so each path is run
# from two lessons: the first (which also imports torch & co.) and the last.
@pytest.mark.parametrize("lesson_id", [LESSON_IDS[0], LESSON_IDS[-1]])
def test_uploaded_course_file_on_simulated_colab(tmp_path, lesson_id, course_file):
    """Before the course is on GitHub: the student uploads the course file to /content."""
    (tmp_path / "content").mkdir()
    shutil.copy(course_file, tmp_path / "content" / course_file.name)
    report, calls = _simulate(tmp_path, _unpublished_cell(lesson_id), import_torch=lesson_id == LESSON_IDS[0])
    _assert_imported_from(report, tmp_path / "site")
    _assert_nothing_kept_was_installed(calls)
    [call] = calls
    assert call[:3] == ["install", "--quiet", "--no-deps"] and Path(call[3]).name == course_file.name, call
    for name, path in report.get("kept", {}).items():
        assert Path(path).resolve().is_relative_to(_venv_site().resolve()), (name, path)


@pytest.mark.parametrize("where", ["drive/MyDrive/ML course", "drive/MyDrive/Colab Notebooks", "drive/MyDrive"])
def test_course_file_in_drive_uploaded_twice(tmp_path, where, course_file):
    """In a mounted Drive folder, uploaded a second time (Colab and Drive add " (1)" to the name)."""
    folder = tmp_path / "content" / where
    folder.mkdir(parents=True)
    shutil.copy(course_file, folder / course_file.name.replace(".whl", " (1).whl"))
    report, calls = _simulate(tmp_path, _unpublished_cell("01_running_sum"))
    _assert_imported_from(report, tmp_path / "site")
    [call] = calls
    assert Path(call[-1]).name == course_file.name, call     # pip gets the name it accepts


def _install_older(site: Path, course_file: Path, version=None) -> None:
    """An earlier install of the course file in ``site``, as pip lays it out, whose kvcache module
    differs (marked SIM_OLD); ``version`` overrides the version its metadata gives."""
    zipfile.ZipFile(course_file).extractall(site)
    module = site / "mlexp" / "kvcache.py"
    module.write_text(module.read_text() + "\nSIM_OLD = True\n")
    if version is not None:
        [info] = site.glob("mlexp-*.dist-info")
        meta = info / "METADATA"
        meta.write_text(re.sub(r"^Version: .*$", f"Version: {version}", meta.read_text(), flags=re.M))
        info.rename(site / f"mlexp-{version}.dist-info")


@pytest.mark.parametrize("preimport", [False, True], ids=["fresh-kernel", "imported-before"])
@pytest.mark.parametrize("lesson_id", [LESSON_IDS[0], LESSON_IDS[-1]])
def test_corrected_course_file_replaces_an_older_install(tmp_path, lesson_id, course_file, preimport):
    """Issue 26 item 11: an older mlexp is installed (same version, other code) and the corrected
    course file is uploaded beside the notebook: the cell installs it, and the lesson imports it."""
    _install_older(tmp_path / "site", course_file)
    (tmp_path / "content").mkdir()
    shutil.copy(course_file, tmp_path / "content" / course_file.name)
    report, calls = _simulate(tmp_path, _unpublished_cell(lesson_id), preimport=preimport)
    assert report["mlexp_before"] is True and "error" not in report, report
    assert report["old_code"] is False, "the lesson still imports the older mlexp"
    _assert_nothing_kept_was_installed(calls)
    assert calls[0] == UNINSTALL_MLEXP and len(calls) == 2, calls
    assert calls[1][:3] == ["install", "--quiet", "--no-deps"] and Path(calls[1][3]).name == course_file.name
    assert "Installed the course file" in report["stdout"] and course_file.name in report["stdout"]
    # Run again in a new kernel: the installed copy is the file's now, so nothing is installed.
    (tmp_path / "pip.jsonl").unlink()
    report, calls = _simulate(tmp_path, _unpublished_cell(lesson_id))
    assert calls == [] and report["old_code"] is False and report["stdout"] == "", (calls, report)


def test_course_file_older_than_the_install_is_named_not_installed(tmp_path, course_file):
    """A course file of a lower version than the installed mlexp (an old download) is not
    installed over it; the cell says so and what to do."""
    _install_older(tmp_path / "site", course_file, version="99.0.0")
    (tmp_path / "content").mkdir()
    shutil.copy(course_file, tmp_path / "content" / course_file.name)
    report, calls = _simulate(tmp_path, _unpublished_cell("01_running_sum"))
    assert calls == [] and "error" not in report and report["old_code"] is True, (calls, report)
    assert "older than the installed 99.0.0" in report["stdout"] and "run this cell again" in report["stdout"]


def test_installed_mlexp_is_left_alone_outside_colab(tmp_path, course_file):
    _install_older(tmp_path / "site", course_file)
    (tmp_path / "content").mkdir()
    shutil.copy(course_file, tmp_path / "content" / course_file.name)
    report, calls = _simulate(tmp_path, _lesson_cell("01_running_sum"), colab=False)
    assert calls == [] and report["old_code"] is True and report["stdout"] == "", (calls, report)


@pytest.mark.parametrize("lesson_id", [LESSON_IDS[0], LESSON_IDS[-1]])
def test_course_folder_uploaded_to_a_subfolder(tmp_path, lesson_id):
    """The whole course folder uploaded to /content/course; the notebook opened from anywhere."""
    course = tmp_path / "content" / "course"
    shutil.copytree(REPO / "mlexp", course / "mlexp", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "lessons" / lesson_id, course / "lessons" / lesson_id)
    report, calls = _simulate(tmp_path, _unpublished_cell(lesson_id))
    _assert_imported_from(report, course / "mlexp")
    assert calls == []


def test_setup_cell_adds_only_missing_small_deps(tmp_path, course_file, edition):
    report, calls = _simulate(tmp_path, _cell_for_a_published_repo(edition, LESSON_IDS[1]), hide=("tqdm",),
                              import_torch=True, repo=edition)
    assert "error" not in report, report
    _assert_nothing_kept_was_installed(calls)
    assert [a for a in calls[0] if not a.startswith("-")] == ["install", "tqdm>=4.65"]
    assert "--no-deps" in calls[1] and len(calls) == 2
    assert Path(report["kept"]["tqdm"]).is_relative_to(tmp_path / "site")
    (tmp_path / "file" / "content").mkdir(parents=True)                    # the same with the course file
    shutil.copy(course_file, tmp_path / "file" / "content" / course_file.name)
    report, calls = _simulate(tmp_path / "file", _unpublished_cell(LESSON_IDS[1]), hide=("tqdm",))
    assert [a for a in calls[0] if not a.startswith("-")] == ["install", "tqdm>=4.65"] and len(calls) == 2


def test_setup_cell_uses_a_checkout_above_the_notebook(tmp_path):
    report, calls = _simulate(tmp_path, _lesson_cell("01_running_sum"), colab=False,
                              cwd=REPO / "lessons" / "01_running_sum")
    assert "error" not in report, report
    assert calls == [] and Path(report["mlexp_file"]).is_relative_to(REPO / "mlexp")


def test_setup_cell_explains_what_to_do(tmp_path, course_file):
    # Outside Colab, with nothing: how to set up a checkout.
    report, calls = _simulate(tmp_path / "local", _lesson_cell("01_running_sum"), colab=False)
    assert calls == [] and report["error"].startswith("ImportError: This lesson needs the course library")
    # On Colab before the course is published, with nothing uploaded: the exact steps.
    report, calls = _simulate(tmp_path / "colab", _unpublished_cell("01_running_sum"))
    assert calls == [], calls
    for step in ("python -m autograder build --colab", "Files panel", "Upload", "/content",
                 "Mount Drive", "run this cell again", "/content/course", course_file.name):
        assert step in report["error"], (step, report["error"])
    # Outside Colab, with the course file next to the notebook: it is named, not installed.
    (tmp_path / "file" / "content").mkdir(parents=True)
    shutil.copy(course_file, tmp_path / "file" / "content" / course_file.name)
    report, calls = _simulate(tmp_path / "file", _lesson_cell("01_running_sum"), colab=False)
    assert calls == [] and f"pip install {tmp_path / 'file' / 'content' / course_file.name}" in report["error"]


# ---------------------------------------------------------------------------- widgets
# ipywidgets names present, with the same meaning, in both 7.7 (Colab) and 8.1 (JupyterLab 4).
COMMON_WIDGETS = {"IntSlider", "FloatSlider", "IntRangeSlider", "FloatRangeSlider", "FloatLogSlider",
                  "SelectionSlider", "Dropdown", "RadioButtons", "ToggleButtons", "Checkbox", "Button",
                  "Text", "IntText", "FloatText", "Label", "HTML", "Output", "VBox", "HBox", "GridBox",
                  "Layout", "Tab", "Accordion", "Play", "jslink", "link", "interactive", "interact", "fixed"}
ONLY_ONE_VERSION_KWARGS = {"tooltip", "description_tooltip", "description_allow_html", "titles"}


def test_widgets_use_api_common_to_ipywidgets_7_and_8():
    tree = ast.parse((REPO / "mlexp" / "widgets.py").read_text())
    used = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "w"}
    assert used, "mlexp/widgets.py no longer imports ipywidgets as w: update this test"
    assert used <= COMMON_WIDGETS, f"not in both ipywidgets 7.7 and 8.1: {sorted(used - COMMON_WIDGETS)}"
    kwargs = {k.arg for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords}
    assert not kwargs & ONLY_ONE_VERSION_KWARGS, sorted(kwargs & ONLY_ONE_VERSION_KWARGS)
    w = pytest.importorskip("ipywidgets")
    assert all(hasattr(w, name) for name in used)
