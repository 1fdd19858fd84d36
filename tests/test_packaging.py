"""Both distributions' wheels hold every module of their package (issue 42, item 4).

The course library (``mlexp``, ./pyproject.toml) and the grader (``mlexp-autograder``,
autograder/pyproject.toml, whose package-dir maps ``autograder`` to that folder) are built offline
with pip (``--no-deps --no-build-isolation --no-index``) from a copy of the checkout in a temporary
folder, so that setuptools' build/ and egg-info folders are never written into the checkout. Each
wheel is opened with zipfile: every ``.py`` file of the package's folder (its data folders,
``__pycache__`` and egg-info left out) must be in it at the same path, the grader's templates too,
and nothing of the demo class (autograder/demo/, data read from the checkout). The kernel folder
(autograder/engine/kernel/) is what the harness sends into the student's kernel: its modules, less
``__init__.py``, are the files of ``autograder.engine.calls.KERNEL_SOURCES``, no more and no less.

Each check is a function returning what is wrong (empty when all is well); the tests run it on the
wheels built here and on a wheel or a list made wrong for the purpose, so that it is seen to fail.
"""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GRADER = REPO / "autograder"
KERNEL = GRADER / "engine" / "kernel"
# left out of a package's modules: data of the grader (the demo class is read from the checkout,
# the templates are package data, checked apart), bytecode, and what a build leaves behind
GRADER_DATA = {"demo", "templates"}
NEVER = {"__pycache__", "build", "dist"}
COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", ".ipynb_checkpoints")


def package_files(folder: Path, prefix: str, skip=frozenset(), suffix: str = ".py") -> set:
    """The wheel paths (``prefix/relative/path``) of the files of ``folder`` ending in ``suffix``,
    subfolders named in ``skip`` or ``NEVER`` and egg-info folders left out."""
    found = set()
    for path in folder.rglob(f"*{suffix}"):
        parts = path.relative_to(folder).parts
        if (set(skip) | NEVER) & set(parts[:-1]) or any(p.endswith(".egg-info") for p in parts):
            continue
        if path.is_file():
            found.add("/".join((prefix, *parts)))
    return found


def missing_from(wheel: Path, expected: set) -> list:
    """The paths of ``expected`` that the wheel does not hold."""
    with zipfile.ZipFile(wheel) as z:
        return sorted(expected - set(z.namelist()))


def held_under(wheel: Path, prefix: str) -> list:
    """The wheel's paths under ``prefix/`` (what must not be in it)."""
    with zipfile.ZipFile(wheel) as z:
        return sorted(n for n in z.namelist() if n.startswith(prefix.rstrip("/") + "/"))


def kernel_mismatch(kernel_folder: Path, sources) -> dict:
    """How the kernel folder's modules (``__init__.py`` left out) and the files of the modules the
    harness sends (``sources``) differ: {"not sent": [...], "not in the folder": [...]}, both empty
    when they are the same files."""
    folder = {p.resolve() for p in kernel_folder.glob("*.py") if p.name != "__init__.py"}
    sent = {Path(m.__file__).resolve() for m in sources}
    return {"not sent": sorted(str(p) for p in folder - sent),
            "not in the folder": sorted(str(p) for p in sent - folder)}


def build_wheel(source: Path, out: Path) -> Path:
    """The wheel of the project in ``source``, built offline by pip into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.whl"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-q", "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"pip wheel {source} failed:\n{done.stdout}\n{done.stderr}"
    (wheel,) = set(out.glob("*.whl")) - before
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """{"mlexp": wheel, "autograder": wheel}, each built from a copy of the checkout."""
    tree = tmp_path_factory.mktemp("checkout")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, tree / name)
    shutil.copytree(REPO / "mlexp", tree / "mlexp", ignore=COPY_IGNORE)
    # the whole grader folder, demo/ included: the wheel must leave it out by itself
    shutil.copytree(GRADER, tree / "autograder", ignore=COPY_IGNORE)
    out = tmp_path_factory.mktemp("wheels")
    return {"mlexp": build_wheel(tree, out / "mlexp"),
            "autograder": build_wheel(tree / "autograder", out / "autograder")}


def test_grader_wheel_holds_every_module(wheels):
    expected = package_files(GRADER, "autograder", skip=GRADER_DATA)
    assert "autograder/engine/kernel/wire.py" in expected and len(expected) > 40
    assert missing_from(wheels["autograder"], expected) == []


def test_grader_wheel_holds_the_templates(wheels):
    expected = package_files(GRADER / "templates", "autograder/templates", suffix="")
    assert "autograder/templates/book/conf.py" in expected
    assert missing_from(wheels["autograder"], expected) == []


def test_grader_wheel_leaves_out_the_demo_class_and_the_library(wheels):
    assert any((GRADER / "demo").iterdir())      # there was something to leave out
    assert held_under(wheels["autograder"], "autograder/demo") == []
    assert held_under(wheels["autograder"], "mlexp") == []


def test_library_wheel_holds_every_module_and_nothing_of_the_grader(wheels):
    expected = package_files(REPO / "mlexp", "mlexp")
    assert "mlexp/ops/__init__.py" in expected
    assert missing_from(wheels["mlexp"], expected) == []
    assert held_under(wheels["mlexp"], "autograder") == []


def test_kernel_folder_is_what_the_harness_sends():
    from autograder.engine.calls import KERNEL_SOURCES

    assert kernel_mismatch(KERNEL, KERNEL_SOURCES) == {"not sent": [], "not in the folder": []}


def test_the_checks_fail_on_a_wrong_wheel(wheels, tmp_path):
    """A wheel missing a kernel module and holding a demo file is caught by both checks."""
    good, bad = wheels["autograder"], tmp_path / "wrong-0.1.0-py3-none-any.whl"
    dropped = "autograder/engine/kernel/wire.py"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            if item.filename != dropped:
                dst.writestr(item, src.read(item))
        dst.writestr("autograder/demo/catalog/00_token_mixing.json", "{}")
    assert missing_from(bad, package_files(GRADER, "autograder", skip=GRADER_DATA)) == [dropped]
    assert held_under(bad, "autograder/demo") == ["autograder/demo/catalog/00_token_mixing.json"]


def test_the_module_walk_leaves_out_data_and_droppings(tmp_path):
    package = tmp_path / "pkg"
    for rel in ("__init__.py", "sub/mod.py", "demo/x.py", "sub/__pycache__/mod.py",
                "pkg.egg-info/y.py", "build/lib/z.py", "notes.md"):
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text("")
    assert package_files(package, "pkg", skip={"demo"}) == {"pkg/__init__.py", "pkg/sub/mod.py"}


def test_kernel_check_fails_on_a_wrong_list():
    """One kernel module not sent, and one module sent from outside the folder: both are named."""
    from autograder.engine import protocol
    from autograder.engine.calls import KERNEL_SOURCES

    dropped = KERNEL_SOURCES[0]
    wrong = kernel_mismatch(KERNEL, [*KERNEL_SOURCES[1:], protocol])
    assert wrong == {"not sent": [str(Path(dropped.__file__).resolve())],
                     "not in the folder": [str(Path(protocol.__file__).resolve())]}
