"""`publish`: the student edition of the course, a folder to push as its public repository.

This repository is the instructor's and stays private: it holds ``solutions/`` (every solution
cell and hidden test), the mistake catalogues, the grader and the demo class. ``python -m
autograder publish OUT [--repo OWNER/NAME]`` writes what students get, and only that:

- ``lessons/``: the released notebooks (``python -m autograder build``), their Colab badges and
  setup cells pointing at ``--repo``, and each lesson's seed tables;
- ``mlexp/`` with its packaging (``pyproject.toml``; each lesson's ``seeds.md`` also as
  ``mlexp/seed_tables/<id>.md``, so an installed ``mlexp`` finds them);
- a README written for students, a ``Makefile`` and ``setup.sh`` with their commands (open the
  lessons, check a notebook) and an ``environment.yml``;
- with ``--with-solutions`` (self-study, or after the last deadline): ``worked/<id>/<id>.ipynb``,
  the solution notebooks with every hidden test removed; never a mistake catalogue.

The same sources give the same bytes (no dates, sorted walks). OUT must be empty, missing, or a
student edition written before (it holds ``EDITION_MARKER``); everything in it but ``.git`` is
then replaced. Before it returns, the edition is scanned (:func:`scan`): a line of a solution
cell or a hidden test, a mistake catalogue, a demo notebook or a line of the grader anywhere in
it, zips and wheels included, is an error naming the file.
"""
from __future__ import annotations

import io
import json
import re
import shutil
import string
import zipfile
from pathlib import Path

from autograder.cells import is_solution
from autograder.course import BRANCH, COURSE_REPO, LESSONS, PLACEHOLDER_REPO, validate_repo
from autograder.mistakes import MISTAKES_FILE
from autograder.publishing.colab import TABLES_IN_PACKAGE, wheel_name

__all__ = ["PublishError", "EDITION_MARKER", "publish", "scan", "secret_lines", "grader_lines"]

EDITION_MARKER = ".course-edition.json"
TEMPLATES = Path(__file__).resolve().parents[1] / "templates" / "student"
MIN_LINE = 16          # shorter lines (``return out``, ``x = x + 1``) say nothing of an answer
MIN_GRADER_LINE = 30
_BEGIN_END = re.compile(r"^\s*### (BEGIN|END) (SOLUTION|HIDDEN TESTS)\s*$")


class PublishError(RuntimeError):
    """OUT is not a folder the edition may be written to, or the edition would leak answers."""


# ---------------------------------------------------------------------------------------------
# What must never reach students


def _cells(path: Path) -> list:
    return json.loads(path.read_text(encoding="utf-8")).get("cells", [])


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _between(lines: list, marker: str) -> list:
    """Lines between ``### BEGIN <marker>`` and ``### END <marker>``."""
    out, inside = [], False
    for line in lines:
        m = _BEGIN_END.match(line)
        if m and m.group(2) == marker:
            inside = m.group(1) == "BEGIN"
        elif inside:
            out.append(line)
    return out


def _public_lines(root: Path) -> set:
    """Stripped lines students get anyway: the released lessons and mlexp's sources."""
    seen = set()
    for nb in sorted((root / "lessons").glob("*/*.ipynb")):
        for cell in _cells(nb):
            seen.update(line.strip() for line in _source(cell).splitlines())
    for py in sorted((root / "mlexp").rglob("*.py")):
        seen.update(line.strip() for line in py.read_text(encoding="utf-8").splitlines())
    for f in sorted(TEMPLATES.iterdir()):
        seen.update(line.strip() for line in f.read_text(encoding="utf-8").splitlines())
    return seen


def secret_lines(root: Path, solutions: bool = True) -> dict:
    """{stripped line: where it comes from} for every line of a solution cell (when
    ``solutions``) and of a hidden test in ``root/solutions``, at least MIN_LINE characters
    long, that is not in a released lesson or in mlexp anyway."""
    public = _public_lines(root)
    found = {}
    for nb in sorted((root / "solutions").glob("*/*.ipynb")):
        lesson = nb.parent.name
        for cell in _cells(nb):
            lines = _source(cell).splitlines()
            kinds = [("hidden test", _between(lines, "HIDDEN TESTS"))]
            if solutions and is_solution(cell):
                inner = _between(lines, "SOLUTION")
                kinds.append(("solution cell", inner if inner or cell.get("cell_type") == "code"
                              else lines))
            for kind, chosen in kinds:
                for line in chosen:
                    s = line.strip()
                    if len(s) >= MIN_LINE and s not in public and not _BEGIN_END.match(s):
                        found.setdefault(s, f"a {kind} of solutions/{lesson}")
    return found


def grader_lines(root: Path) -> dict:
    """{stripped line: module} for the grader's own code lines (autograder/**/*.py, its folders
    included), at least MIN_GRADER_LINE characters long and not in mlexp or the lessons."""
    public = _public_lines(root)
    found = {}
    grader = root / "autograder"
    for py in sorted(grader.rglob("*.py")):
        if {"demo", "templates"} & set(py.relative_to(grader).parts[:-1]):
            continue
        for line in py.read_text(encoding="utf-8").splitlines():
            s = line.strip()
            if len(s) >= MIN_GRADER_LINE and s not in public and not s.startswith("#"):
                found.setdefault(s, f"the grader's module autograder/{py.relative_to(grader).as_posix()}")
    return found


def _texts(name: str, data: bytes):
    """(name, text) for a file and, for a zip or wheel, each of its members (recursively);
    a notebook's text is its cells' sources and outputs, as a reader sees them (so that a
    line is found whole, not as its JSON escape)."""
    if data[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                for info in zf.infolist():
                    if not info.is_dir():
                        yield from _texts(f"{name}!{info.filename}", zf.read(info))
        except zipfile.BadZipFile:
            pass
        return
    text = data.decode("utf-8", errors="replace")
    if name.endswith(".ipynb"):
        try:
            cells = json.loads(text).get("cells", [])
        except (ValueError, AttributeError):
            cells = []
        parts = []
        for cell in cells:
            parts.append(_source(cell))
            for out in cell.get("outputs", []):
                parts.append(json.dumps(out.get("data", {}), ensure_ascii=False))
                t = out.get("text", "")
                parts.append("".join(t) if isinstance(t, list) else str(t))
        text = "\n".join(parts)
    yield name, text


def scan(path, root: Path, solutions_allowed: bool = False) -> list:
    """Everything in ``path`` (a folder, or a zip/wheel file) that students must not see.

    Returns one line per finding, each naming the file (``a.zip!member`` inside archives): a
    whole line (stripped) of a solution cell (unless ``solutions_allowed``) or of a hidden test of ``root``'s
    ``solutions/``, a mistake catalogue, a demo notebook, or a line of the grader's code.
    """
    path, root = Path(path), Path(root)
    secrets = secret_lines(root, solutions=not solutions_allowed)
    grader = grader_lines(root)
    demo = {p.name for p in (root / "autograder" / "demo" / "submissions").glob("*")}
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*")
                                                   if p.is_file() and ".git" not in p.relative_to(path).parts)
    findings = []
    for f in files:
        rel = f.name if f == path else f.relative_to(path).as_posix()
        for name, text in _texts(rel, f.read_bytes()):
            lines = {line.strip() for line in text.splitlines()}
            parts = set(re.split(r"[/!]", name))
            if MISTAKES_FILE in parts:
                findings.append(f"{name}: a mistake catalogue")
            if parts & demo:
                findings.append(f"{name}: a notebook of the demo class")
            if "autograder" in parts:
                findings.append(f"{name}: a file of the grader")
            for table in (secrets, grader):
                hit = next((line for line in sorted(lines & table.keys())), None)
                if hit is not None:
                    findings.append(f"{name}: holds a line of {table[hit]}: {hit[:80]!r}")
    return findings


# ---------------------------------------------------------------------------------------------
# Writing the edition


def _lesson_table(repo: str) -> str:
    rows = ["| Lesson | Notebook | Open in Colab |", "|---|---|---|"]
    for lesson in LESSONS.values():
        nb = f"lessons/{lesson.id}/{lesson.id}.ipynb"
        colab = f"https://colab.research.google.com/github/{repo}/blob/{BRANCH}/{nb}"
        badge = f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab})"
        rows.append(f"| {lesson.id[:2]} {lesson.title} ({lesson.minutes} min) | [`{nb}`]({nb}) | {badge} |")
    return "\n".join(rows)


def _point_at(text: str, old: str, new: str, where: str) -> str:
    """Rewrite a released notebook's badge and setup cell from repository ``old`` to ``new``."""
    pairs = [(f"colab.research.google.com/github/{old}/", f"colab.research.google.com/github/{new}/"),
             (f'COURSE_REPO = \\"{old}\\"', f'COURSE_REPO = \\"{new}\\"')]
    for a, b in pairs:
        if a not in text:
            raise PublishError(f"{where} has no {a!r}: rebuild the lessons (`make lessons`) first.")
        text = text.replace(a, b)
    return text


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise PublishError(f"{out} is a file; give a folder for the student edition.")
    if out.is_dir():
        entries = [p.name for p in out.iterdir() if p.name != ".git"]
        if entries and not (out / EDITION_MARKER).is_file():
            raise PublishError(f"{out} holds files and is not a student edition written by "
                               f"`publish` (no {EDITION_MARKER}): give an empty or new folder.")


def _files(root: Path, repo: str, with_solutions: bool) -> dict:
    """{relative path: bytes} of the whole edition."""
    files = {}
    current = COURSE_REPO
    for f in sorted((root / "lessons").rglob("*")):
        rel = f.relative_to(root)
        if not f.is_file() or any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            continue
        data = f.read_bytes()
        if f.suffix == ".ipynb":
            data = _point_at(data.decode("utf-8"), current, repo, rel.as_posix()).encode("utf-8")
        files[rel.as_posix()] = data
    for f in sorted((root / "mlexp").rglob("*")):
        rel = f.relative_to(root)
        if f.is_file() and "__pycache__" not in rel.parts and f.suffix not in (".pyc", ".pyo") \
                and not any(p.startswith(".") for p in rel.parts):
            files[rel.as_posix()] = f.read_bytes()
    for table in sorted((root / "lessons").glob("*/seeds.md")):
        files[f"mlexp/{TABLES_IN_PACKAGE}/{table.parent.name}.md"] = table.read_bytes()
    pyproject = (root / "pyproject.toml").read_text(encoding="utf-8")
    body = pyproject[pyproject.index("[build-system]"):].split("\n[tool.pytest", 1)[0].rstrip()
    files["pyproject.toml"] = ("# The course library the lessons import, mlexp: pip install -e \".[lab,check]\"\n"
                               + body + "\n").encode()
    wheel = wheel_name(root)
    how = (f"Click a lesson's \"Open in Colab\" badge (above, or at the top of the notebook)."
           if repo != PLACEHOLDER_REPO else
           "Upload the lesson's notebook (File > Upload notebook).")
    readme = string.Template((TEMPLATES / "README.md").read_text(encoding="utf-8")).substitute(
        lesson_table=_lesson_table(repo), colab_how=how, wheel=wheel, repo=repo)
    files["README.md"] = readme.encode()
    for name in ("Makefile", "setup.sh", "environment.yml"):
        files[name] = (TEMPLATES / name).read_bytes()
    files[".gitignore"] = (TEMPLATES / "gitignore").read_bytes()
    if with_solutions:
        files.update(_worked_solutions(root, repo))
    files[EDITION_MARKER] = (json.dumps({"edition": "student", "repo": repo,
                                         "with_solutions": with_solutions,
                                         "written_by": "python -m autograder publish"},
                                        indent=1) + "\n").encode()
    return files


def _worked_solutions(root: Path, repo: str) -> dict:
    """worked/<id>/<id>.ipynb: each solution notebook with its hidden tests removed (nbgrader's
    ClearHiddenTests) and no outputs."""
    import nbformat
    from nbgrader.preprocessors import ClearHiddenTests
    out = {}
    for nb_path in sorted((root / "solutions").glob("*/*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        nb, _ = ClearHiddenTests().preprocess(nb, {})
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        text = nbformat.writes(nb) + "\n"
        if nb_path.parent.name in LESSONS:
            text = _point_at(text, COURSE_REPO, repo, str(nb_path.relative_to(root)))
        out[f"worked/{nb_path.parent.name}/{nb_path.name}"] = text.encode()
    return out


def publish(root: Path, out: Path, repo: str | None = None, with_solutions: bool = False) -> dict:
    """Write the student edition of the course at ``root`` into ``out``; returns a summary.

    ``repo``: the public repository "owner/name" the badges and setup cells point at (default:
    autograder.course.COURSE_REPO). Raises PublishError when ``out`` is not empty and not an
    earlier edition, or when the written edition holds anything :func:`scan` finds; ValueError
    for a malformed ``repo``. The summary has ``files`` (count), ``lessons`` and ``repo``.
    """
    root, out = Path(root), Path(out)
    repo = repo or COURSE_REPO
    validate_repo(repo)
    _check_out(out)
    files = _files(root, repo, with_solutions)
    out.mkdir(parents=True, exist_ok=True)
    for entry in sorted(out.iterdir()):
        if entry.name != ".git":
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    for rel, data in files.items():
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        if rel == "setup.sh":
            dest.chmod(0o755)
    findings = scan(out, root, solutions_allowed=with_solutions)
    if findings:
        raise PublishError(f"the student edition in {out} would show students what they must not "
                           "see; nothing is to be pushed until this is fixed:\n  " + "\n  ".join(findings))
    return {"files": len(files), "lessons": sorted({r.split("/")[1] for r in files
                                                    if r.startswith("lessons/")}), "repo": repo}
