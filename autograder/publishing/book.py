"""`book`: the course as a static web site (Sphinx, myst-nb, sphinx-book-theme), built offline.

``python -m autograder book OUT [--size full|grading] [--lessons ID ...] [--with-solutions] [--rerun]``

1. Each lesson's solution notebook is copied into a scratch folder and executed there with the
   reference answers, through jupyter-cache: a lesson whose code cells did not change since the
   last build is not run again (one cache per size). ``--size grading`` runs the experiments at
   the token size the grader uses (``NBGRADER_EXECUTION=validate``), in seconds; ``full`` (the
   default, ``make book``) as a reader running the notebook gets them.
2. Each page is the student's notebook (the student edition's bytes, :mod:`autograder.publishing.publish`)
   with the outputs of that run: a graded exercise shows the cell the student starts from and
   its visible test, without outputs; a cell that uses a name an exercise defines loses its
   outputs too (they are computed from the answer), with a note. ``--with-solutions`` adds the
   worked solution under each exercise, folded.
3. Sphinx renders the pages, a landing page, the course's guides (``docs/*.md`` of the course:
   students, instructors, authors, contributors, troubleshooting; a link that leaves docs/ keeps
   its text and loses its target, which is not in the book) and an API page from mlexp's
   docstrings. Maths is
   MathML written at build time (latex2mathml), so the site needs no network and opens from
   ``file://``. The student notebooks are shipped beside the pages ("Download notebook").
4. The site, and the text of every page, is scanned (:func:`autograder.publishing.publish.scan`): any line
   of a solution cell (default edition) or of a hidden test is an error naming the file.
"""
from __future__ import annotations

import html
import html.parser
import json
import os
import re
import shutil
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlexp.runtime import temporary_environ

from autograder.cells import defined_names, grade_id_of, is_graded, is_solution, nbgrader_meta, read_names
from autograder.course import BRANCH, COURSE_REPO, LESSONS, validate_repo
from autograder.publishing.publish import _files, scan

__all__ = ["BookError", "BOOK_MARKER", "SIZES", "book", "page_notebook", "html_text_scan", "setup"]

BOOK_MARKER = ".course-book.json"
TEMPLATES = Path(__file__).resolve().parents[1] / "templates" / "book"
SIZES = {"full": None, "grading": "validate"}     # NBGRADER_EXECUTION for each size
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
PROJECT = "Linear attention: a course in notebooks"
HIDDEN_NOTE = ("*The output of the cell above is not shown in the book: it is computed from "
               "the answer to an exercise. Run the notebook to see it.*")
_BADGE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\(([^)]*)\)")
_WIDGET = "application/vnd.jupyter.widget-view+json"
# The guides of the course's docs/ shown as pages, in this order (a missing one is left out).
GUIDES = ("students", "instructors", "authors", "contributors", "troubleshooting")
# A link's text is anything but a bracket, newlines included, matched one way only: an alternation of two
# ways to match a newline backtracks exponentially on an unclosed "[" (a half-open interval "[0.5, 1)").
_LEAVING_LINK = re.compile(r"(?<!!)\[([^\[\]]*)\]\(\.\./(?!index\.md#)[^)\s]*\)")


class BookError(RuntimeError):
    """The book cannot be built: a lesson raised, OUT is not a book folder, or a page leaks."""


# ---------------------------------------------------------------------------------------------
# Executing the lessons (jupyter-cache)


def _execute(root: Path, ids: list, cache_dir: Path, size: str, log, rerun: bool = False) -> dict:
    """{lesson id: executed solution notebook}, run in scratch copies through jupyter-cache
    (which keys a run by the notebook's code: ``rerun`` runs them again, e.g. after mlexp changed)."""
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.executors import load_executor

    scratch = cache_dir / size / "lessons"
    scratch.mkdir(parents=True, exist_ok=True)
    cache = get_cache(str(cache_dir / size / "jupyter-cache"))
    paths = {}
    for lesson in ids:
        src = root / "solutions" / lesson / f"{lesson}.ipynb"
        dest = scratch / lesson / src.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.is_file() or dest.read_bytes() != src.read_bytes():
            shutil.copyfile(src, dest)
        paths[lesson] = dest
        cache.add_nb_to_project(str(dest))
    # The kernels' environment, whatever this process has: the size, and matplotlib's inline
    # backend so that plt.show() gives the figures (a caller's MPLBACKEND=Agg would drop them).
    with temporary_environ(NBGRADER_EXECUTION=SIZES[size], MPLBACKEND=INLINE_BACKEND):
        executor = load_executor("local-serial", cache=cache)
        pks = [cache.get_project_record(str(p)).pk for p in paths.values()]
        result = executor.run_and_cache(filter_pks=pks, timeout=3600, allow_errors=False,
                                        force=rerun)
    ran = set(result.succeeded) if result else set()
    out = {}
    for lesson, path in paths.items():
        record = cache.get_project_record(str(path))
        try:
            source = nbformat.read(path, as_version=4)
            _, nb = cache.merge_match_into_notebook(source)
            seconds = cache.match_cache_notebook(source).data.get("execution_seconds")
        except KeyError:
            raise BookError(f"lesson {lesson} failed at {size} size (nothing is built):\n"
                            f"{_failed_cell(record.traceback or 'no traceback recorded', source)}") from None
        how = "ran" if str(path) in ran else "unchanged, from the cache (ran"
        log(f"book: {lesson}: {how} in {seconds or 0:.0f} s at {size} size"
            + (")" if how.startswith("unchanged") else ""))
        out[lesson] = nb
    return out


def _failed_cell(traceback: str, nb) -> str:
    """Which cell of ``nb`` failed (its number, from 1, and code) and the error, from nbclient's
    message, without colour codes."""
    lines = re.sub(r"\x1b\[[0-9;]*m", "", traceback).strip().splitlines()
    start = next((i for i, line in enumerate(lines) if "An error occurred while executing" in line), 0)
    rules = [i for i, line in enumerate(lines) if i > start and set(line.strip()) == {"-"}][:2]
    where = ""
    if len(rules) == 2:
        code = "\n".join(lines[rules[0] + 1:rules[1]]).strip()
        number = next((n for n, cell in enumerate(nb.cells, 1)
                       if cell.cell_type == "code" and cell.source.strip() == code), None)
        where = f"cell {number} of the notebook raised:\n" if number else ""
    return where + "\n".join(lines[start:start + 60])


# ---------------------------------------------------------------------------------------------
# The pages


def _strip_markers(source: str) -> str:
    return "\n".join(line for line in source.splitlines()
                     if not re.match(r"^\s*### (BEGIN|END) SOLUTION\s*$", line))


def _outputs(cell) -> list:
    """A cell's outputs as the page shows them: widget views keep only their text fallback."""
    import nbformat
    out = []
    for o in cell.get("outputs", []):
        data = o.get("data")
        if data and _WIDGET in data:
            data = {k: v for k, v in data.items() if k != _WIDGET}
            if not data:
                continue
            o = nbformat.from_dict(dict(o, data=data))
        out.append(o)
    return out


def page_notebook(executed, student, lesson: str, repo: str, with_solutions: bool = False):
    """The page of ``lesson``: the student's notebook ``student`` with the outputs of the
    reference run ``executed`` (the solution notebook, same cells). Returns (notebook, counts)."""
    import nbformat
    if len(executed.cells) != len(student.cells):
        raise BookError(f"lesson {lesson}: the solution has {len(executed.cells)} cells and the "
                        f"released lesson {len(student.cells)}; rebuild the lessons (`make lessons`).")
    answers = set()
    for cell in executed.cells:
        if is_solution(cell) and cell.cell_type == "code":
            answers |= defined_names(cell.source)
    cells, counts = [], {"exercises": 0, "hidden_outputs": 0}
    colab = f"https://colab.research.google.com/github/{repo}/blob/{BRANCH}/lessons/{lesson}/{lesson}.ipynb"
    links = (f'<p class="book-links"><a href="{lesson}/{lesson}.ipynb" download>Download notebook</a> '
             f'<a href="{colab}">Open in Colab</a></p>')
    for i, (ran, cell) in enumerate(zip(executed.cells, student.cells)):
        meta = nbgrader_meta(cell)
        if grade_id_of(ran) != meta.get("grade_id"):
            raise BookError(f"lesson {lesson}: cell {i} of the solution and of the released lesson "
                            "differ; rebuild the lessons (`make lessons`).")
        new = nbformat.from_dict(json.loads(json.dumps(cell)))
        new.metadata = {"tags": list(cell.get("metadata", {}).get("tags", []))}
        if i == 0 and cell.cell_type == "markdown":
            new.source, n = _BADGE.subn(links, cell.source, count=1)
            if not n:
                new.source = cell.source + "\n\n" + links
        if cell.cell_type != "code":
            cells.append(new)
            continue
        new.execution_count = ran.get("execution_count")
        if meta.get("solution"):
            counts["exercises"] += 1
            points = next((nbgrader_meta(c).get("points") for c in executed.cells[i + 1:i + 2]
                           if is_graded(c)), None)
            cells.append(nbformat.v4.new_markdown_cell(
                f"```{{admonition}} Exercise: {meta.get('grade_id')}"
                + (f" ({points} points)" if points else "") +
                "\n:class: tip\nWrite your answer in the cell below, in the notebook (Download "
                "notebook or Open in Colab, at the top), then run the test after it.\n```"))
            new.outputs, new.execution_count = [], None
            new.metadata["tags"].append("exercise")
            cells.append(new)
            if with_solutions:
                worked = nbformat.v4.new_code_cell(_strip_markers(ran.source))
                worked.outputs, worked.execution_count = _outputs(ran), ran.get("execution_count")
                worked.metadata = {"tags": ["hide-input", "worked-solution"]}
                cells.append(worked)
            continue
        if meta.get("grade"):
            new.outputs, new.execution_count = [], None
            new.metadata["tags"].append("visible-test")
            cells.append(new)
            continue
        used = read_names(cell.source)
        new.outputs = _outputs(ran)
        if not with_solutions and new.outputs and (used is None or used & answers):
            new.outputs, new.execution_count = [], None
            counts["hidden_outputs"] += 1
            cells.append(new)
            cells.append(nbformat.v4.new_markdown_cell(HIDDEN_NOTE))
            continue
        cells.append(new)
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {"kernelspec": student.metadata.get("kernelspec", {}),
                   "language_info": {"name": "python"}}
    return nb, counts


def _lesson_table(root: Path) -> str:
    """The lessons with their reading time (autograder/course.py) and the wall-clock time of a
    full-size run measured by scripts/lesson_cells.py (scripts/lesson_times.json), where known."""
    times_file = root / "scripts" / "lesson_times.json"
    times = json.loads(times_file.read_text(encoding="utf-8")) if times_file.is_file() else {}
    rows = ["| Lesson | Reading | Running at full size | What takes the time |", "|---|---|---|---|"]
    for lesson in LESSONS.values():
        seconds = times.get(lesson.id, {}).get("seconds")
        run = "not measured" if seconds is None else (
            f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min")
        rows.append(f"| [{lesson.id[:2]} {lesson.title}](lessons/{lesson.id}.ipynb) "
                    f"| {lesson.minutes} min | {run} | {lesson.heavy} |")
    return "\n".join(rows)


def guide_page(text: str) -> str:
    """A guide of docs/ as a page of the book: a link to the README's lesson table goes to the
    landing page's; any other link that leaves docs/ (``../README.md``, ``../autograder/...``)
    keeps its text and loses its target, which the book does not hold; links between the guides
    stay (myst resolves them, anchors included)."""
    text = text.replace("](../README.md#the-lessons)", "](../index.md#the-lessons)")   # the landing page's table
    return _LEAVING_LINK.sub(r"\1", text)


def _guides(root: Path) -> list:
    """The guides of the course at ``root`` that the book shows, as names of docs/*.md."""
    return [name for name in GUIDES if (root / "docs" / f"{name}.md").is_file()]


def _sources(root: Path, src: Path, pages: dict, size: str, edition: dict,
             with_solutions: bool = False) -> None:
    """Write the Sphinx project: conf.py, the landing and API pages, the lesson pages, the
    student notebooks to download (``edition``: {relative path: bytes}) and the stylesheet."""
    import nbformat
    if src.exists():
        shutil.rmtree(src)
    (src / "lessons").mkdir(parents=True)
    (src / "_static").mkdir()
    fill = {"project": PROJECT, "math_extension": __name__,
            "size_note": "the experiments at full size" if size == "full" else
            "the experiments at the grader's token size, so figures are small-scale previews",
            "lesson_table": _lesson_table(root),
            "exercises_note": "This self-study edition also holds a worked solution under each "
            "exercise, folded: try the exercise first, then open it." if with_solutions else
            "The answers are not in this book: an output that would give one away is left out "
            "of the page, with a note saying so.",
            "toctree": "\n".join(f"lessons/{lesson}" for lesson in pages),
            "guides_toctree": "\n".join(f"guides/{name}" for name in _guides(root)),
            "guides_list": "\n".join(f"- [{name.capitalize()}](guides/{name}.md)" for name in _guides(root))
            or "(This course has no guides in docs/.)"}
    for name in ("conf.py", "index.md", "api.md"):
        text = string.Template((TEMPLATES / name).read_text(encoding="utf-8")).safe_substitute(fill)
        (src / name).write_text(text, encoding="utf-8")
    if len(pages) < len(LESSONS):      # a partial book lists only the lessons it holds
        index = (src / "index.md").read_text(encoding="utf-8")
        keep = [line for line in index.splitlines()
                if not line.startswith("| [") or any(f"lessons/{p}.ipynb" in line for p in pages)]
        (src / "index.md").write_text("\n".join(keep) + "\n", encoding="utf-8")
    shutil.copyfile(TEMPLATES / "book.css", src / "_static" / "book.css")
    for name in _guides(root):
        (src / "guides").mkdir(exist_ok=True)
        text = (root / "docs" / f"{name}.md").read_text(encoding="utf-8")
        (src / "guides" / f"{name}.md").write_text(guide_page(text), encoding="utf-8")
    for lesson, nb in pages.items():
        nbformat.write(nb, src / "lessons" / f"{lesson}.ipynb")
    for rel, data in edition.items():
        dest = src / "edition" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)


# ---------------------------------------------------------------------------------------------
# Maths as MathML (a Sphinx math renderer; this module is the extension conf.py loads)


def _mathml(latex: str, block: bool) -> str:
    from latex2mathml.converter import convert
    try:
        return convert(latex.strip(), display="block" if block else "inline")
    except Exception:       # noqa: BLE001  (a macro latex2mathml lacks: show the TeX)
        return f'<code class="math-tex">{html.escape(latex)}</code>'


def _visit_math(self, node):
    self.body.append(_mathml(node.astext(), block=False))
    from docutils import nodes
    raise nodes.SkipNode


def _visit_displaymath(self, node):
    from docutils import nodes
    latex = node.astext()
    if node.get("nowrap") or re.search(r"\\begin\{(align|gather|multline|equation)\*?\}", latex):
        latex = re.sub(r"\\(begin|end)\{(equation|gather|multline)\*?\}", "", latex)
    self.body.append(f'<div class="math notranslate nohighlight">{_mathml(latex, block=True)}</div>')
    raise nodes.SkipNode


def setup(app):
    """Sphinx extension: ``html_math_renderer = "mathml"``."""
    app.add_html_math_renderer("mathml", (_visit_math, None), (_visit_displaymath, None))
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# ---------------------------------------------------------------------------------------------
# Checking and writing the site


class _Text(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self._skip = [], 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style") and self._skip > 0

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def html_text_scan(site: Path, root: Path, solutions_allowed: bool = False) -> list:
    """:func:`autograder.publishing.publish.scan` of the site's files and of the text of each HTML page as
    a reader sees it (code highlighted into spans is found whole again)."""
    findings = scan(site, root, solutions_allowed=solutions_allowed)
    with tempfile.TemporaryDirectory() as tmp:
        for page in sorted(Path(site).rglob("*.html")):
            parser = _Text()
            parser.feed(page.read_text(encoding="utf-8", errors="replace"))
            dest = Path(tmp) / (page.relative_to(site).as_posix() + ".txt")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text("".join(parser.parts), encoding="utf-8")
        findings += [f"(text of) {f}" for f in scan(Path(tmp), root, solutions_allowed=solutions_allowed)]
    return findings


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise BookError(f"{out} is a file; give a folder for the book.")
    if out.is_dir() and any(out.iterdir()) and not (out / BOOK_MARKER).is_file():
        raise BookError(f"{out} holds files and is not a book written by `book` (no {BOOK_MARKER}): "
                        "give an empty or new folder.")


def book(root: Path, out: Path, size: str = "full", lessons=None, with_solutions: bool = False,
         repo: str | None = None, cache_dir: Path | None = None, rerun: bool = False,
         log=print) -> dict:
    """Build the course book of ``root`` into ``out``; returns a summary (lessons, seconds,
    exercises, hidden outputs, pages). Raises BookError when a lesson raises (naming the cell),
    when ``out`` is not a book folder, or when the site would show an answer."""
    root, out = Path(root).resolve(), Path(out).resolve()
    if size not in SIZES:
        raise BookError(f"size {size!r}: give one of {', '.join(SIZES)}.")
    repo = repo or COURSE_REPO
    validate_repo(repo)
    _check_out(out)
    ids = [lid for lid in LESSONS if not lessons or any(lid.startswith(p) for p in lessons)]
    if not ids:
        raise BookError(f"no lesson matches {lessons}; the course has {', '.join(LESSONS)}.")
    cache_dir = Path(cache_dir or root / "build" / "book-cache").resolve()
    started = time.monotonic()
    executed = _execute(root, ids, cache_dir, size, log, rerun=rerun)
    import nbformat
    edition = {rel: data for rel, data in _files(root, repo, with_solutions=False).items()
               if rel.endswith(".ipynb") and rel.split("/")[1] in ids}
    pages, counts = {}, {}
    for lesson in ids:
        student = nbformat.reads(edition[f"lessons/{lesson}/{lesson}.ipynb"].decode(), as_version=4)
        pages[lesson], counts[lesson] = page_notebook(executed[lesson], student, lesson, repo,
                                                      with_solutions)
    src = cache_dir / "site" / "src"
    # The student notebooks sit beside the pages: site/lessons/<id>/<id>.ipynb.
    _sources(root, src, pages, size, edition, with_solutions)
    html_dir = cache_dir / "site" / "html"
    if html_dir.exists():
        shutil.rmtree(html_dir)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).resolve().parents[2])] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-d", str(cache_dir / "site" / "doctrees"),
           str(src), str(html_dir)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise BookError(f"Sphinx failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    findings = html_text_scan(html_dir, root, solutions_allowed=with_solutions)
    if findings:
        raise BookError("the book would show what students must not see; nothing is written to "
                        f"{out}:\n  " + "\n  ".join(findings))
    out.mkdir(parents=True, exist_ok=True)
    for entry in sorted(out.iterdir()):
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    shutil.copytree(html_dir, out, dirs_exist_ok=True)
    (out / BOOK_MARKER).write_text(json.dumps({"edition": "book", "size": size, "repo": repo,
                                               "with_solutions": with_solutions,
                                               "lessons": ids}, indent=1) + "\n", encoding="utf-8")
    return {"lessons": ids, "seconds": time.monotonic() - started, "counts": counts,
            "warnings": [line for line in done.stderr.splitlines() if "WARNING" in line],
            "index": out / "index.html"}
