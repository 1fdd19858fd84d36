"""What an LMS export or a student can put into a batch (issue 12): each kind, several variants.

Ids a spreadsheet would run or nbgrader would read as a glob, script in feedback pages,
symbolic links, corrupt zip entries, zip bombs, JSON that is not a notebook, data files past
nbgrader's limit, and the exports of Canvas, Moodle and Blackboard. Most cases stop before a
kernel (collect, repair, the feedback exporter); the slow ones grade the toy course
(tests/toy_course.py) and check that nothing else in the batch is affected.
"""
import base64
import csv
import datetime
import glob
import html
import io
import re
import zipfile
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from autograder.intake import collect as collect_mod
from autograder.intake import unpack as unpack_mod
from autograder.publishing.build import build
from autograder.intake.collect import DATA_FILE_BYTES, LINK, choose_notebook, collect
from autograder.config import FEEDBACK_PREPROCESSORS
from autograder.publishing.demo import student_notebook
from autograder.grading.grade import Result, _prepare, format_table, grade_class, write_csv
from autograder.options import GradingOptions
from autograder.ids import (FORMULA_PREFIXES, folder_name, internal_id, internal_ids, printable,
                            spreadsheet_safe)
from autograder.intake.repair import SubmissionRejected, read_notebook_text
from toy_course import (ADD_SOLUTION, ASSIGNMENT, MEAN_SOLUTION, MUL_SOLUTION, NOTEBOOK,
                        make_toy_course)

ANSWERS = {"add": ADD_SOLUTION, "mul": MUL_SOLUTION, "mean": MEAN_SOLUTION}
NAMES = {ASSIGNMENT: [NOTEBOOK]}
# Ids an LMS can produce; each must grade and stay recognisable.
ODD_IDS = ["li[1]", "Smith, J [12345]", "a*b?c", "O'Brien \"Bob\"", "new\nline", "José Núñez",
           "x" * 120, '=HYPERLINK("http://x","y")', "@SUM(1+1)", "+cmd", "-2+3"]
NBGRADER_SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,63}")


def evaluated(cell: str) -> bool:
    """Would a spreadsheet evaluate this CSV cell as a formula?"""
    return cell.startswith(FORMULA_PREFIXES)


# ---------------------------------------------------------------- 1 and 6: ids and grades.csv

def test_grades_csv_cells_are_never_formulas(tmp_path):
    odd = ODD_IDS + ["\tTab", "\rReturn", "=1+1", "＝1+1", "-", "@", "plain", "=", "+"]
    results = [Result(s, ASSIGNMENT, score=3.0, max_score=6.0,
                      status="=cmd|' /C calc'!A0" if i % 2 else "graded",
                      notes=["-note", "@x"] if i % 3 == 0 else [], exercises={"test_add": 2.0})
               for i, s in enumerate(odd)]
    write_csv(tmp_path / "grades.csv", results, ["test_add", "=weird_column"])
    with open(tmp_path / "grades.csv", newline="") as f:
        rows = list(csv.reader(f))
    bad = [cell for row in rows for cell in row if evaluated(cell)]
    assert not bad, bad
    got = [row[0] for row in rows[1:]]
    # recognisable: the id itself, or the id behind one apostrophe
    assert [c[1:] if c.startswith("'") and evaluated(c[1:]) else c for c in got] == odd
    assert rows[0][-1] == "'=weird_column" and rows[1][2] == "3.0"   # numbers untouched
    assert spreadsheet_safe(-2.5) == -2.5 and spreadsheet_safe("ann") == "ann"
    table = format_table(results)
    assert "new\\nline" in table and "\r" not in table and "\t" not in table


def test_internal_ids_are_safe_stable_distinct_and_plain_ids_unchanged(tmp_path):
    for plain in ("ann", "ok_correct", "a.b@uni.edu", "smithann_12345", "S123-4+x"):
        assert internal_id(plain) == plain
    many = ODD_IDS + ["li[2]", "li(1)", "José Nuñez", "con", "..", " ", "x" * 300, "a/b", "a\\b"]
    mapped = internal_ids(many)
    assert len(set(v.lower() for v in mapped.values())) == len(many)
    for original, iid in mapped.items():
        assert NBGRADER_SAFE.fullmatch(iid), (original, iid)
        assert iid == internal_id(original) == internal_ids([original])[original]   # stable
        # nbgrader globs the folder name and matches it with '.*': both find exactly it
        (tmp_path / "submitted" / iid).mkdir(parents=True)
        assert glob.glob(str(tmp_path / "submitted" / iid)) == [str(tmp_path / "submitted" / iid)]
        assert re.fullmatch("(?P<student_id>.*)", iid)
    assert internal_id("José Núñez").startswith("Jose-Nunez-")
    # a plain id that happens to look like another's internal id never takes it
    clash = internal_id("li[1]")
    both = internal_ids([clash, "li[1]"])
    assert both[clash] == clash and both["li[1]"] != clash


def test_folder_names_keep_what_file_systems_accept(tmp_path):
    for kept in ("Smith, J [12345]", "li[1]", "José Núñez", "O'Brien", "ann"):
        assert folder_name(kept) == kept
    names = [folder_name(s) for s in ODD_IDS + ["a/b", "a\\b", "con", "..", "x" * 300]]
    assert len(set(names)) == len(names)
    for name in names:
        (tmp_path / name).mkdir()
        assert len(name.encode()) <= 255 and "/" not in name and "\n" not in name
    assert folder_name("new\nline").startswith("new_line_")
    assert printable("a\nb\tc é") == "a\\nb\\tc é"


# ---------------------------------------------------------------------- 2: feedback pages

def _exporter():
    """nbgrader's feedback exporter as GenerateFeedback configures it, with our preprocessors
    (all but GetGrades, which needs a gradebook)."""
    import nbgrader
    from nbconvert import HTMLExporter
    from traitlets.config import Config
    fg = Path(nbgrader.__file__).parent / "server_extensions" / "formgrader"
    from autograder.config import use_feedback_template
    c = use_feedback_template(Config())     # the grader's own feedback template
    c.HTMLExporter.extra_template_paths = [str(fg / "static/node_modules/bootstrap/dist/css")]
    ex = HTMLExporter(config=c)
    for dotted in FEEDBACK_PREPROCESSORS:   # registered as nbgrader's converters do
        if not dotted.endswith("GetGrades"):
            ex.register_preprocessor(dotted)
    return ex


def render(nb) -> str:
    page, _ = _exporter().from_notebook_node(nb, resources={"nbgrader": {
        "notebook": "toy", "score": 1, "max_score": 2, "late_penalty": 0}})
    return page


class _Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.elements, self.scripts, self.text, self._in = [], [], [], None

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, attrs))
        if tag == "script":
            self._in = [dict(attrs).get("src"), ""]
            self.scripts.append(self._in)

    def handle_endtag(self, tag):
        if tag == "script":
            self._in = None

    def handle_data(self, data):
        if self._in is not None:
            self._in[1] += data
        else:
            self.text.append(data)


def parse(page: str) -> _Page:
    p = _Page()
    p.feed(page)
    return p


URL_ATTRS = {"href", "src", "action", "formaction", "xlink:href", "background", "poster",
             "data", "codebase", "cite", "srcset"}
SAFE_DATA = re.compile(r"data:image/(png|jpeg|gif|webp|svg\+xml);base64,", re.I)


def unsafe(page: str, baseline: _Page) -> list:
    """Everything in ``page`` that a browser could run, beyond the template's own scripts."""
    got, problems = parse(page), []
    problems += [f"script {s}" for s in got.scripts if s not in baseline.scripts]
    counts = lambda p, t: sum(tag == t for tag, _ in p.elements)  # noqa: E731
    # <math> is allowed: the page's own MathML (autograder.engine.feedback.tex_to_mathml), whose
    # attributes are checked below like any other element's.
    for tag in ("iframe", "object", "embed", "frame", "base", "form", "meta", "link", "svg",
                "style", "input", "button"):
        if counts(got, tag) > counts(baseline, tag):
            problems.append(f"<{tag}>")
    for tag, attrs in got.elements:
        for name, value in attrs:
            value = re.sub(r"[\x00-\x20]", "", html.unescape(value or "")).lower()
            if name.startswith("on") or name == "srcdoc":
                problems.append(f"<{tag} {name}>")
            elif name in URL_ATTRS and re.match(r"(javascript|vbscript|data|livescript):", value) \
                    and not (tag == "img" and name == "src" and SAFE_DATA.match(value)):
                problems.append(f"<{tag} {name}={value[:40]}>")
            elif name == "style" and ("expression" in value or "javascript" in value):
                problems.append(f"<{tag} style>")
    text = "".join(got.text)
    problems += [f"TeX {m}" for m in re.findall(r"\\(?:href|url|class|cssId|style)\b", text)]
    return problems


def _png() -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1, 2], [0, 1, 4])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


MARKDOWN_VECTORS = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(2)>",
    "[click](javascript:alert(3))",
    '<a href="JaVaScRiPt:alert(4)">x</a>',
    '<a href="java&#x09;script:alert(5)">x</a>',
    "<svg onload=alert(6)><circle r=1 /></svg>",
    '<iframe src="data:text/html,<script>alert(7)</script>"></iframe>',
    "![x](data:text/html;base64,PHNjcmlwdD5hbGVydCg4KTwvc2NyaXB0Pg==)",
    "$\\href{javascript:alert(9)}{x}$",
    "<details open ontoggle=alert(10)>d</details>",
    '<object data="javascript:alert(11)"></object><embed src="javascript:alert(12)">',
    '<form action="javascript:alert(13)"><button>go</button></form>',
    '<meta http-equiv="refresh" content="0;url=javascript:alert(14)">',
    '<base href="javascript:alert(15)//">',
    '<div style="background:url(javascript:alert(16))">s</div>',
    '<math><mtext><a xlink:href="javascript:alert(17)">m</a></mtext></math>',
    "<style>@import 'javascript:alert(18)';</style>",
    '<<script>script>alert(19)<</script>/script>',
]
OUTPUT_VECTORS = [   # (mime bundle, metadata) as display(HTML(...)) and friends produce them
    ({"text/html": "<img src=x onerror=alert(21)><b>bold</b>", "text/plain": "<HTML>"}, {}),
    ({"text/html": "<script>alert(22)</script><table><tr><th>h</th></tr></table>"}, {}),
    ({"application/javascript": "alert(23)", "text/plain": "js"}, {}),
    ({"text/markdown": "[x](javascript:alert(24))"}, {}),
    ({"image/svg+xml": "<svg xmlns='http://www.w3.org/2000/svg' onload='alert(25)'/>"}, {}),
    ({"image/png": "iVBORw0KGgo=", "text/plain": "img"},
     {"image/png": {"width": "1 onerror=alert(26)", "height": 5}}),
    ({"text/html": "<a href='x'>frame</a>"}, {"text/html": {"isolated": True}}),
    ({"text/latex": "$\\href{javascript:alert(27)}{x}$"}, {}),
    ({"application/vnd.jupyter.widget-view+json": {"model_id": "x"}, "text/plain": "w"}, {}),
]
GOOD_MARKDOWN = ("# Running sums\n\nThe state $S_t = \\sum_{i \\le t} k_i v_i^\\top$ and "
                 "$$\\frac{a}{b} < 1$$\n\n| T | ms |\n|---|---|\n| 512 | 3.5 |\n\n"
                 "```python\nx = 1\n\ny = 2\n```\n\n> a quote\n\n"
                 "<img src=\"data:image/png;base64,{png}\" alt=\"plot\">\n\n**bold** and "
                 "[a link](https://example.org)")


def hostile_notebook(png: str):
    cells = [new_markdown_cell(GOOD_MARKDOWN.replace("{png}", png))]
    cells += [new_markdown_cell(v) for v in MARKDOWN_VECTORS]
    code = new_code_cell("display(...)")
    code.outputs = [new_output("display_data", data=d, metadata=m) for d, m in OUTPUT_VECTORS]
    code.outputs += [new_output("display_data", data={"image/png": png, "text/plain": "fig"}),
                     new_output("stream", name="stdout", text="<script>alert(28)</script>\n"),
                     new_output("execute_result", data={"text/html": (
                         "<table class='dataframe'><thead><tr><th>a</th></tr></thead>"
                         "<tbody><tr><td>1</td></tr></tbody></table>")}, execution_count=1)]
    return new_notebook(cells=cells + [code])


def check_feedback_page(page: str, png: str) -> None:
    """The static checks a hostile notebook's feedback page must pass (used twice)."""
    baseline = parse(render(new_notebook(cells=[new_markdown_cell("plain")])))
    assert not baseline.scripts, "the template runs no script of its own (no MathJax)"
    problems = unsafe(page, baseline)
    assert not problems, problems
    got = parse(page)
    for n in range(1, 30):   # no vector's payload is left where a browser runs it
        assert not any(f"alert({n})" in (s[1] or "") for s in got.scripts if s not in baseline.scripts)
    text = html.unescape("".join(got.text))
    tags = [t for t, _ in got.elements]
    assert tags.count("math") >= 2 and "mfrac" in tags and "msubsup" in tags   # math as MathML
    assert "\\sum" not in text and "\\frac" not in text and "$" not in text    # no TeX left
    assert "<script>alert(28)</script>" in text            # printed text is shown, as text
    tags = [t for t, _ in got.elements]
    assert tags.count("table") >= 3 and "th" in tags and "h1" in tags and "blockquote" in tags
    imgs = [dict(a).get("src", "") for t, a in got.elements if t == "img"]
    assert sum(src == f"data:image/png;base64,{png}" for src in imgs) >= 2   # markdown + plot
    assert any(dict(a).get("href") == "https://example.org" for t, a in got.elements if t == "a")


def test_feedback_page_keeps_content_and_runs_no_student_script():
    png = _png()
    check_feedback_page(render(hostile_notebook(png)), png)


@pytest.mark.parametrize("vector", MARKDOWN_VECTORS)
def test_each_markdown_vector_alone_is_neutralised(vector):
    page = render(new_notebook(cells=[new_markdown_cell(vector)]))
    baseline = parse(render(new_notebook(cells=[new_markdown_cell("plain")])))
    assert not unsafe(page, baseline), vector


# ------------------------------------------------------------ 7: JSON that is not a notebook

NOT_NOTEBOOKS = {
    b"[1, 2]": "holds a list", b"3": "the number 3", b'"toy"': 'the string "toy"',
    b"null": "holds null", b"true": "holds true", b'{"hello": "world"}': "without 'cells'",
    b'{"cells": 5}': "'cells' is the number 5", b'{"cells": [1]}': "cell 1 is the number 1",
    b'{"cells": [{"source": "x"}]}': "cell 1 has no 'cell_type'",
    b'{"cells": [{"cell_type": "code", "source": 7}]}': "'source' is the number 7",
    b'{"nbformat": "four", "cells": []}': "'nbformat' is the string \"four\"",
    b'{"worksheets": 3}': "'worksheets' is the number 3",
    b'{"cells": [], "metadata": []}': "'metadata' is a list",
}


@pytest.mark.parametrize("data", list(NOT_NOTEBOOKS))
def test_json_that_is_not_a_notebook_is_rejected_with_the_reason(data, tmp_path):
    with pytest.raises(SubmissionRejected, match="not a Jupyter notebook") as exc:
        read_notebook_text(data, 2**20)
    assert NOT_NOTEBOOKS[data] in str(exc.value)
    path = tmp_path / NOTEBOOK
    path.write_bytes(data)
    sub = collect_mod.Submission("ann", ASSIGNMENT, [path])
    lesson = SimpleNamespace(names=[NOTEBOOK], release={}, sources={}, digest="d")
    status = _prepare(sub, lesson, "s", 2**20).result.status
    assert status.startswith("rejected: 'toy.ipynb': valid JSON but not a Jupyter notebook: ")
    assert NOT_NOTEBOOKS[data] in status


# ------------------------------------------------------------------------- helpers for zips

@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = make_toy_course(tmp_path_factory.mktemp("course"))
    build(root)
    return root


@pytest.fixture(scope="module")
def good(course) -> bytes:
    lesson = nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    return nbformat.writes(student_notebook(lesson, ANSWERS)).encode()


def write_zip(path: Path, entries: dict, compression=zipfile.ZIP_DEFLATED) -> Path:
    """entries: name -> bytes, ('link', target) for a symbolic link entry, or (date_time, bytes)
    for a file with that upload time."""
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in entries.items():
            if isinstance(data, tuple) and data[0] != "link":
                zf.writestr(zipfile.ZipInfo(name, data[0]), data[1], compression)
            elif isinstance(data, tuple):
                info = zipfile.ZipInfo(name)
                info.external_attr = (0o120777 << 16)
                info.create_system = 3
                zf.writestr(info, data[1])
            else:
                zf.writestr(name, data)
    return path


def corrupt_entry(path: Path, name: str) -> None:
    """Flip bytes in the middle of one entry's stored data (its CRC no longer matches)."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(name)
    raw = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    mid = start + info.compress_size // 2
    raw[mid:mid + 8] = bytes(b ^ 0x5A for b in raw[mid:mid + 8])
    path.write_bytes(bytes(raw))


def by_student(subs) -> dict:
    return {s.student: s for s in subs}


# --------------------------------------------------------------------------- 3: symbolic links

def test_links_in_folders_are_refused_at_any_depth_and_never_followed(tmp_path, good):
    secret = tmp_path / "instructor" / "solution.ipynb"
    secret.parent.mkdir()
    secret.write_bytes(good)
    cls = tmp_path / "cls"
    layout = {
        "ann": f"{ASSIGNMENT}/{NOTEBOOK}",
        "bob": f"{ASSIGNMENT}/{NOTEBOOK}@",                # the notebook is a link to a file
        "cat": f"{ASSIGNMENT}@",                           # the assignment folder is a link
        "dan": f"{ASSIGNMENT}/deep/er/{NOTEBOOK}@",        # a link three folders down
        "fay": f"{ASSIGNMENT}/data.csv@",                  # a data file beside a real notebook
        "gus": "notes@",                                   # a link in the student folder
        "hal": f"{ASSIGNMENT}/{NOTEBOOK}@dangling",        # a link to nothing
    }
    for student, rel in layout.items():
        path = cls / student / rel.split("@")[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith("@"):
            target = secret.parent if rel.endswith(f"{ASSIGNMENT}@") else secret
            path.symlink_to(target)
        elif rel.endswith("@dangling"):
            path.symlink_to(tmp_path / "nothing.ipynb")
        else:
            path.write_bytes(good)
        if student in ("dan", "fay", "gus"):
            (cls / student / ASSIGNMENT).mkdir(exist_ok=True)
            (cls / student / ASSIGNMENT / NOTEBOOK).write_bytes(good)
    (tmp_path / "eve_elsewhere" / ASSIGNMENT).mkdir(parents=True)
    (cls / "eve").symlink_to(tmp_path / "eve_elsewhere")   # the student folder is a link
    subs = by_student(collect(cls, [ASSIGNMENT], tmp_path / "u", NAMES))
    assert sorted(subs) == ["ann", "bob", "cat", "dan", "eve", "fay", "gus", "hal"]
    assert not subs["ann"].problem and subs["ann"].notebooks
    expected = {"bob": f"bob/{ASSIGNMENT}/{NOTEBOOK}", "cat": f"cat/{ASSIGNMENT}",
                "dan": f"dan/{ASSIGNMENT}/deep/er/{NOTEBOOK}", "eve": "eve",
                "fay": f"fay/{ASSIGNMENT}/data.csv", "gus": "gus/notes",
                "hal": f"hal/{ASSIGNMENT}/{NOTEBOOK}"}
    for student, rel in expected.items():
        assert subs[student].problem == f"'{rel}' {LINK}", (student, subs[student].problem)
    for sub in subs.values():   # no path handed on to grading goes through a link
        for p in sub.notebooks + [p for _, p in sub.data_files]:
            assert not any(q.is_symlink() for q in [p, *p.parents] if cls in q.parents), p


def test_links_inside_a_zip_are_refused_and_never_created(tmp_path, good):
    zpath = write_zip(tmp_path / "class.zip", {
        f"export/ann/{ASSIGNMENT}/{NOTEBOOK}": good,
        f"export/bob/{ASSIGNMENT}/{NOTEBOOK}": ("link", "/etc/passwd"),
        f"export/cat/{ASSIGNMENT}/{NOTEBOOK}": good,
        f"export/cat/{ASSIGNMENT}/more/data.csv": ("link", "../../../../../../etc/hostname"),
        "export/dan": ("link", "/"),
    })
    unpack = tmp_path / "u"
    subs = by_student(collect(zpath, [ASSIGNMENT], unpack, NAMES))
    assert not subs["ann"].problem
    assert subs["bob"].problem == f"'export/bob/{ASSIGNMENT}/{NOTEBOOK}' {LINK}"
    assert subs["cat"].problem == f"'export/cat/{ASSIGNMENT}/more/data.csv' {LINK}"
    assert subs["dan"].problem == f"'export/dan' {LINK}"
    assert not [p for p in unpack.rglob("*") if p.is_symlink()]
    assert not (unpack / "export/bob" / ASSIGNMENT / NOTEBOOK).exists()


# ----------------------------------------------------------------------- 4: corrupt zip entries

@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_a_corrupt_entry_costs_only_that_entry(tmp_path, good, compression):
    name = f"lms/bob/{ASSIGNMENT}/{NOTEBOOK}"
    zpath = write_zip(tmp_path / "class.zip", {
        f"lms/ann/{ASSIGNMENT}/{NOTEBOOK}": good, name: good,
        f"lms/cat/{ASSIGNMENT}/{NOTEBOOK}": good, f"lms/cat/{ASSIGNMENT}/data.csv": b"1,2\n" * 500,
        f"lms/dan/{ASSIGNMENT}/{NOTEBOOK}": good, f"lms/dan/{ASSIGNMENT}/toy (1).ipynb": good,
    }, compression)
    corrupt_entry(zpath, name)
    corrupt_entry(zpath, f"lms/cat/{ASSIGNMENT}/data.csv")
    corrupt_entry(zpath, f"lms/dan/{ASSIGNMENT}/toy (1).ipynb")
    subs = by_student(collect(zpath, [ASSIGNMENT], tmp_path / "u", NAMES))
    assert not subs["ann"].problem and not subs["ann"].notes
    assert subs["bob"].problem.startswith(f"zip entry '{name}' is corrupt in the zip (")
    assert not (tmp_path / "u" / name).exists()
    assert not subs["cat"].problem and subs["cat"].notebooks and subs["cat"].data_files == []
    assert subs["cat"].notes[0].startswith(f"dropped 'lms/cat/{ASSIGNMENT}/data.csv': is corrupt")
    # dan's second copy is corrupt: the first is graded, the status says why
    assert not subs["dan"].problem and len(subs["dan"].notebooks) == 1
    assert subs["dan"].notes[0].startswith(f"zip entry 'lms/dan/{ASSIGNMENT}/toy (1).ipynb' is corrupt")


def test_an_unreadable_zip_is_one_clear_error(tmp_path, good):
    zpath = write_zip(tmp_path / "class.zip", {f"ann/{ASSIGNMENT}/{NOTEBOOK}": good})
    raw = zpath.read_bytes()
    zpath.write_bytes(raw[:-10])     # the central directory is cut
    with pytest.raises(ValueError, match="class.zip is (not a readable zip|neither)"):
        collect(zpath, [ASSIGNMENT], tmp_path / "u", NAMES)


# ------------------------------------------------------------------------------ 5: zip bombs

def _zeros_entry(zf, name: str, mib: int) -> None:
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    with zf.open(info, "w", force_zip64=True) as f:
        block = bytes(2**20)
        for _ in range(mib):
            f.write(block)


def test_zip_bombs_are_capped_per_entry_and_in_total(tmp_path, good, monkeypatch):
    monkeypatch.setattr(unpack_mod, "DATA_FILE_BYTES", 8 * 2**20)   # the cap of one zip entry
    zpath = tmp_path / "bomb.zip"
    max_bytes = 2**20
    with zipfile.ZipFile(zpath, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"ann/{ASSIGNMENT}/{NOTEBOOK}", good)
        _zeros_entry(zf, f"bob/{ASSIGNMENT}/{NOTEBOOK}", 64)       # a notebook of 64 MiB zeros
        zf.writestr(f"cat/{ASSIGNMENT}/{NOTEBOOK}", good)
        _zeros_entry(zf, f"cat/{ASSIGNMENT}/zeros.bin", 32)        # a data file past its cap
        for i in range(12):                                        # many entries under each cap
            _zeros_entry(zf, f"dan/{ASSIGNMENT}/part{i:02d}.bin", 1)
        zf.writestr(f"dan/{ASSIGNMENT}/{NOTEBOOK}", good)
        zf.writestr(f"eve/{ASSIGNMENT}/{NOTEBOOK}", good)
        zf.writestr(f"fay/{ASSIGNMENT}/{NOTEBOOK}", bytes(900 * 2**10))   # under its own cap
    assert zpath.stat().st_size < 2**20
    unpack = tmp_path / "u"
    subs = by_student(collect(zpath, [ASSIGNMENT], unpack, NAMES, max_bytes=max_bytes))
    on_disk = sum(p.stat().st_size for p in unpack.rglob("*") if p.is_file())
    limit = max(collect_mod.ZIP_RATIO * zpath.stat().st_size, collect_mod.ZIP_FLOOR * max_bytes)
    assert on_disk <= limit, "nothing large is left behind"
    assert not subs["ann"].problem
    assert subs["bob"].problem == (f"zip entry 'bob/{ASSIGNMENT}/{NOTEBOOK}' expands to 64 MiB, "
                                   "over the 1 MiB limit for a notebook (--max-size)")
    assert not subs["cat"].problem and "zeros.bin': expands to 32 MiB, over the 8 MiB" \
        in subs["cat"].notes[0]
    dropped = [n for n in subs["dan"].notes if "is it a zip bomb?" in n]
    assert dropped and len(subs["dan"].data_files) + len(dropped) == 12
    assert not subs["eve"].problem, "a small entry still fits: refused entries cost nothing"
    # a notebook under its own cap, once the total is spent, is refused with its status
    assert subs["fay"].problem.startswith(f"zip entry 'fay/{ASSIGNMENT}/{NOTEBOOK}' not unpacked: "
                                          "the zip would expand past")


def test_a_header_that_lies_about_the_size_is_caught_while_unpacking(tmp_path, good):
    zpath = tmp_path / "liar.zip"
    with zipfile.ZipFile(zpath, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"ann/{ASSIGNMENT}/{NOTEBOOK}", good)
        _zeros_entry(zf, f"bob/{ASSIGNMENT}/{NOTEBOOK}", 16)
    raw = bytearray(zpath.read_bytes())
    with zipfile.ZipFile(zpath) as zf:
        info = zf.getinfo(f"bob/{ASSIGNMENT}/{NOTEBOOK}")
    # rewrite the declared size in the central directory's zip64 field to 1000 bytes
    at = raw.rfind((16 * 2**20).to_bytes(8, "little"))
    raw[at:at + 8] = (1000).to_bytes(8, "little")
    zpath.write_bytes(bytes(raw))
    subs = by_student(collect(zpath, [ASSIGNMENT], tmp_path / "u", NAMES, max_bytes=2**20))
    assert info.file_size == 16 * 2**20
    assert not subs["ann"].problem
    assert subs["bob"].problem.startswith(f"zip entry 'bob/{ASSIGNMENT}/{NOTEBOOK}' ")
    assert not (tmp_path / "u" / "bob" / ASSIGNMENT / NOTEBOOK).exists()


# ---------------------------------------------------------- 8: data files past nbgrader's limit

def test_a_data_file_over_nbgraders_limit_is_dropped_with_a_note(tmp_path, good, monkeypatch):
    cls = tmp_path / "cls"
    for student in ("ann", "bob"):
        (cls / student / ASSIGNMENT).mkdir(parents=True)
        (cls / student / ASSIGNMENT / NOTEBOOK).write_bytes(good)
    (cls / "ann" / ASSIGNMENT / "numbers.txt").write_text("1 2 3")
    with open(cls / "ann" / ASSIGNMENT / "big.bin", "wb") as f:   # sparse: no disk used
        f.truncate(DATA_FILE_BYTES + 1)
    (cls / "bob" / ASSIGNMENT / "sub").mkdir()
    (cls / "bob" / ASSIGNMENT / "sub" / "a.csv").write_text("x")
    subs = by_student(collect(cls, [ASSIGNMENT], tmp_path / "u", NAMES))
    assert not subs["ann"].problem
    assert subs["ann"].notes == [f"dropped 'big.bin' ({(DATA_FILE_BYTES + 1) / 1e6:.0f} MB): over "
                                 f"nbgrader's {DATA_FILE_BYTES / 1e6:.0f} MB limit for a file beside "
                                 "the notebook"]
    assert [n for n, _ in subs["ann"].data_files] == ["numbers.txt"]
    assert [n for n, _ in subs["bob"].data_files] == ["sub/a.csv"] and not subs["bob"].notes
    monkeypatch.setattr(collect_mod, "DATA_DIR_BYTES", 3)   # the folder's total limit
    subs = by_student(collect(cls, [ASSIGNMENT], tmp_path / "u", NAMES))
    assert "pass nbgrader's 0 MB limit" in subs["ann"].notes[-1]


# ------------------------------------------------------------------------ 9: LMS exports

def test_canvas_export(tmp_path, good):
    zpath = write_zip(tmp_path / "submissions.zip", {
        f"smithann_12345_67890_{NOTEBOOK}": good,
        f"doejohn_LATE_222_333_{NOTEBOOK}": good,
        "leeamy_late_9_10_Copy of toy.ipynb": ((2026, 3, 1, 9, 0, 0), good),
        "leeamy_late_9_11_toy-1.ipynb": ((2026, 3, 1, 10, 0, 0), good),
        "smithann_12345_67891_numbers.txt": b"1 2 3",
        "smithann_777_1_toy.ipynb": good,                 # another Ann Smith
        "moe_4_5_report.pdf": b"%PDF",
    })
    subs = by_student(collect(zpath, [ASSIGNMENT, "other"], tmp_path / "u", NAMES))
    assert sorted(subs) == ["doejohn_222", "leeamy_9", "moe_4", "smithann_12345", "smithann_777"]
    assert all(s.assignment == ASSIGNMENT for s in subs.values())
    assert not subs["smithann_12345"].problem
    assert subs["smithann_12345"].data_files[0][0] == "numbers.txt"
    assert subs["doejohn_222"].notes == ["marked late by Canvas"]
    notes = []
    chosen = choose_notebook(subs["leeamy_9"], NOTEBOOK, True, notes)
    assert chosen.name == "leeamy_late_9_11_toy-1.ipynb"   # the later upload
    assert "2 submissions" in notes[0] and "'Copy of toy.ipynb'" in notes[0]
    assert subs["moe_4"].problem == "no .ipynb file in the submission folder (found: report.pdf)"


def test_moodle_exports_in_folders_and_flat(tmp_path, good):
    zpath = write_zip(tmp_path / "moodle.zip", {
        f"Ann Smith_1001_assignsubmission_file_/{NOTEBOOK}": good,
        "Ann Smith_1001_assignsubmission_file_/data/n.txt": b"1",
        "Ann Smith_1001_assignsubmission_onlinetext_/onlinetext.html": b"<p>hi</p>",
        f"José Núñez_1002_assignsubmission_file_/Copy of {NOTEBOOK}": good,
    })
    subs = by_student(collect(zpath, [ASSIGNMENT, "other"], tmp_path / "u", NAMES))
    assert sorted(subs) == ["Ann Smith_1001", "José Núñez_1002"]
    assert [n for n, _ in subs["Ann Smith_1001"].data_files] == ["data/n.txt"]
    flat = write_zip(tmp_path / "flat.zip", {
        f"Bo Li_7_assignsubmission_file_{NOTEBOOK}": good,
        "Bo Li_7_assignsubmission_file_notes.md": b"#"})
    subs = by_student(collect(flat, [ASSIGNMENT], tmp_path / "u2", NAMES))
    assert list(subs) == ["Bo Li_7"] and subs["Bo Li_7"].notebooks


def test_blackboard_export_latest_attempt_wins(tmp_path, good, course):
    lesson = nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    old = nbformat.writes(lesson).encode()
    zpath = tmp_path / "gradebook.zip"
    with zipfile.ZipFile(zpath, "w") as zf:   # the later attempt is older inside the zip
        zf.writestr(zipfile.ZipInfo(f"HW 1_jsmith_attempt_2026-03-02-10-00-00_{NOTEBOOK}",
                                    (2020, 1, 1, 0, 0, 0)), good)
        zf.writestr(zipfile.ZipInfo(f"HW 1_jsmith_attempt_2026-03-01-10-00-00_{NOTEBOOK}",
                                    (2026, 1, 1, 0, 0, 0)), old)
        zf.writestr("HW 1_jsmith_attempt_2026-03-01-10-00-00.txt", "Name: J Smith")
        zf.writestr(f"HW 1_akim_attempt_2026-03-01-09-00-00_{NOTEBOOK}", good)
    subs = by_student(collect(zpath, [ASSIGNMENT], tmp_path / "u", NAMES))
    assert sorted(subs) == ["akim", "jsmith"]
    notes = []
    chosen = choose_notebook(subs["jsmith"], NOTEBOOK, True, notes)
    assert chosen.read_bytes() == good
    # the two attempts carry one file name: the note tells them apart by the attempt's time
    [note] = notes
    assert note.startswith(f"2 submissions: graded the latest, '{NOTEBOOK}' (uploaded 2026-03-02"), note
    assert f"ignored '{NOTEBOOK}' (uploaded 2026-03-01" in note, note


def tagged(good: bytes, who: str) -> bytes:
    """``good`` with ``who`` in its metadata, to tell whose upload was chosen."""
    nb = nbformat.reads(good.decode(), as_version=4)
    nb.metadata["uploaded_by"] = who
    return nbformat.writes(nb).encode()


def uploaded_by(sub) -> str:
    chosen = choose_notebook(sub, NOTEBOOK, True, [])
    return nbformat.read(chosen, as_version=4).metadata["uploaded_by"]


# Blackboard user names as schools issue them, and assignment names as instructors type them
BLACKBOARD_USERS = ["ann_smith", "bob_smith", "ana_m", "j.doe", "mary-jo", "s1234567", "x_1_y"]
BLACKBOARD_ASSIGNMENTS = ["HW 1", "Lesson_01 Running sum", "Übung 1 (Teil 2)"]


def receipt(assignment: str, user: str, stamp: str) -> str:
    """A Blackboard attempt receipt, as its download-all zip holds one per attempt."""
    return (f"Name: Student {user.title()} ({user})\nAssignment: {assignment}\n"
            f"Date Submitted: Sunday, March 1, 2026 10:00:00 AM EST\nCurrent Grade: Needs Grading\n"
            f"\nFiles:\n\tOriginal filename: {NOTEBOOK}\n"
            f"\tFilename: {assignment}_{user}_attempt_{stamp}_{NOTEBOOK}\n")


@pytest.mark.parametrize("assignment", BLACKBOARD_ASSIGNMENTS)
def test_blackboard_user_names_with_underscores_dots_and_digits(tmp_path, good, assignment):
    stamp = "2026-03-01-10-00-00"
    entries = {}
    for user in BLACKBOARD_USERS:
        entries[f"{assignment}_{user}_attempt_{stamp}_{NOTEBOOK}"] = tagged(good, user)
        entries[f"{assignment}_{user}_attempt_{stamp}.txt"] = receipt(assignment, user, stamp).encode()
    subs = by_student(collect(write_zip(tmp_path / "bb.zip", entries), [ASSIGNMENT],
                              tmp_path / "u", NAMES))
    assert sorted(subs) == sorted(BLACKBOARD_USERS)
    assert all(not s.problem and uploaded_by(s) == u for u, s in subs.items())


def test_a_blackboard_file_name_cannot_claim_another_students_attempt(tmp_path, good):
    """The part after the date is what the student typed: '_bob_smith_attempt_<later>_' in it
    names no one."""
    honest, later = "2026-03-01-10-00-00", "2026-03-09-23-00-00"
    crafted = f"x_bob_smith_attempt_{later}_{NOTEBOOK}"
    entries = {f"HW 1_bob_smith_attempt_{honest}_{NOTEBOOK}": tagged(good, "bob_smith"),
               f"HW 1_bob_smith_attempt_{honest}.txt": receipt("HW 1", "bob_smith", honest).encode(),
               f"HW 1_mallory_attempt_2026-03-02-08-00-00_{crafted}": tagged(good, "mallory")}
    for with_receipts in (True, False):
        chosen = {k: v for k, v in entries.items() if with_receipts or not k.endswith(".txt")}
        subs = by_student(collect(write_zip(tmp_path / f"bb{with_receipts}.zip", chosen),
                                  [ASSIGNMENT], tmp_path / f"u{with_receipts}", NAMES))
        assert sorted(subs) == ["bob_smith", "mallory"]
        assert uploaded_by(subs["bob_smith"]) == "bob_smith"
        assert uploaded_by(subs["mallory"]) == "mallory"
        assert set(subs["bob_smith"].times.values()) == {
            datetime.datetime(2026, 3, 1, 10).timestamp()}


def test_a_blackboard_name_no_receipt_settles_needs_the_instructor(tmp_path, good):
    stamp = "2026-03-01-10-00-00"
    # 'HW_1_ana_m' alone: HW_1 + ana_m, HW + 1_ana_m or HW_1_ana + m; no receipt says which
    subs = collect(write_zip(tmp_path / "one.zip", {f"HW_1_ana_m_attempt_{stamp}_{NOTEBOOK}": good}),
                   [ASSIGNMENT], tmp_path / "u1", NAMES)
    assert len(subs) == 1 and "cannot be told apart" in subs[0].problem
    assert "receipt" in subs[0].problem and subs[0].student == "HW_1_ana_m"
    # one receipt settles the assignment name for every name of the export
    entries = {f"HW_1_ana_m_attempt_{stamp}_{NOTEBOOK}": tagged(good, "ana_m"),
               f"HW_1_bo_x_attempt_{stamp}_{NOTEBOOK}": tagged(good, "bo_x"),
               f"HW_1_bo_x_attempt_{stamp}.txt": receipt("HW_1", "bo_x", stamp).encode()}
    subs = by_student(collect(write_zip(tmp_path / "two.zip", entries), [ASSIGNMENT],
                              tmp_path / "u2", NAMES))
    assert sorted(subs) == ["ana_m", "bo_x"] and uploaded_by(subs["ana_m"]) == "ana_m"
    # without receipts, the one split all names share: 'HW 1' (a space, no '_')
    entries = {f"HW 1_{u}_attempt_{stamp}_{NOTEBOOK}": tagged(good, u) for u in ("ann_smith", "bob")}
    subs = by_student(collect(write_zip(tmp_path / "three.zip", entries), [ASSIGNMENT],
                              tmp_path / "u3", NAMES))
    assert sorted(subs) == ["ann_smith", "bob"] and uploaded_by(subs["ann_smith"]) == "ann_smith"


def test_canvas_and_moodle_names_come_from_their_fixed_parts(tmp_path, good):
    """What a student types (the uploaded file's name) never decides whose work it is."""
    canvas = write_zip(tmp_path / "canvas.zip", {
        f"smithann_12345_67890_x_doejohn_222_333_{NOTEBOOK}": tagged(good, "smithann_12345"),
        f"doejohn_222_334_{NOTEBOOK}": tagged(good, "doejohn_222"),
        f"oneilmaryjo_LATE_9_10_doejohn_LATE_222_335_{NOTEBOOK}": tagged(good, "oneilmaryjo_9")})
    subs = by_student(collect(canvas, [ASSIGNMENT], tmp_path / "uc", NAMES))
    assert sorted(subs) == ["doejohn_222", "oneilmaryjo_9", "smithann_12345"]
    assert all(uploaded_by(s) == u for u, s in subs.items())
    moodle = write_zip(tmp_path / "moodle.zip", {
        f"Ann Smith_1001_assignsubmission_file_Bob Li_1002_assignsubmission_file_{NOTEBOOK}":
            tagged(good, "Ann Smith_1001"),
        f"Bob Li_1002_assignsubmission_file_{NOTEBOOK}": tagged(good, "Bob Li_1002"),
        f"Anne-Marie O'Neil 2_1003_assignsubmission_file_{NOTEBOOK}":
            tagged(good, "Anne-Marie O'Neil 2_1003")})
    subs = by_student(collect(moodle, [ASSIGNMENT], tmp_path / "um", NAMES))
    assert sorted(subs) == ["Ann Smith_1001", "Anne-Marie O'Neil 2_1003", "Bob Li_1002"]
    assert all(uploaded_by(s) == u for u, s in subs.items())


def test_plain_folder_per_student_inside_wrappers(tmp_path, good):
    zpath = write_zip(tmp_path / "class.zip", {f"a/b/ann/{NOTEBOOK}": good,
                                              f"a/b/bob/{ASSIGNMENT}/{NOTEBOOK}": good})
    subs = by_student(collect(zpath, [ASSIGNMENT], tmp_path / "u", NAMES))
    assert sorted(subs) == ["ann", "bob"] and all(s.notebooks for s in subs.values())


def test_an_unknown_layout_names_the_zip_what_was_found_and_the_layouts(tmp_path, good):
    zpath = write_zip(tmp_path / "export.zip", {"wrapper/readme.txt": b"hi",
                                               "wrapper/notebook-ann.ipynb": good,
                                               "wrapper/stuff/x.pdf": b"%PDF"})
    with pytest.raises(ValueError) as exc:
        collect(zpath, [ASSIGNMENT], tmp_path / "work" / "incoming", NAMES)
    message = str(exc.value)
    assert message.startswith(f"No submissions found in {zpath}: found 2 file(s): ")
    assert "notebook-ann.ipynb" in message and "stuff/" in message and "inside 'wrapper/'" in message
    for layout in ("a folder per student", "Canvas", "Moodle", "Blackboard"):
        assert layout in message
    assert "incoming" not in message and str(tmp_path / "work") not in message


def test_long_and_odd_names_inside_a_zip_keep_the_original_id(tmp_path, good):
    long_id = "Ñ" * 200          # 400 bytes: longer than a file name may be
    ids = [s for s in ODD_IDS + [long_id] if "/" not in s]   # '/' separates folders in a zip
    zpath = write_zip(tmp_path / "class.zip", {f"{s}/{ASSIGNMENT}/{NOTEBOOK}": good for s in ids})
    subs = by_student(collect(zpath, [ASSIGNMENT], tmp_path / "u", NAMES))
    assert sorted(subs) == sorted(s.strip() for s in ids) and long_id in subs
    assert all(s.notebooks and not s.problem for s in subs.values())


# ------------------------------------------------------------- graded end to end (slow)

WRONG_ADD = "def add(a, b):\n    return a - b"
READS_DATA = ("DATA = open('numbers.txt').read().split()\n"
              "def add(a, b):\n    return a + b if DATA == ['1', '2', '3'] else None")
XSS_CELL = ("from IPython.display import HTML, Markdown, Javascript, display\n"
            "display(HTML('<img src=x onerror=alert(41)><b>bold</b><script>alert(42)</script>'))\n"
            "display(Markdown('[x](javascript:alert(43))'))\n"
            "display(Javascript('alert(44)'))\n"
            "import io\nimport matplotlib.pyplot as plt\nfrom IPython.display import Image\n"
            "plt.plot([0, 1], [1, 0])\nbuf = io.BytesIO()\nplt.savefig(buf, format='png')\n"
            "display(Image(buf.getvalue()))   # the grader runs matplotlib with Agg\n"
            "print('<script>alert(45)</script>')")
# ids as folder names in a zip ('/' would make a folder), and what each must score
ZIP_IDS = [s for s in ODD_IDS if "/" not in s] + ['=HYPERLINK("evil.example","y")']


def lesson_of(course):
    return nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)


def nb_bytes(nb) -> bytes:
    return nbformat.writes(nb).encode()


def xss_notebook(course):
    nb = student_notebook(lesson_of(course), ANSWERS)
    nb.cells[1:1] = [new_markdown_cell(v) for v in MARKDOWN_VECTORS] + [new_code_cell(XSS_CELL)]
    return nb


def read_grades(out: Path) -> list:
    with open(out / "grades.csv", newline="") as f:
        return list(csv.reader(f))


@pytest.fixture(scope="module")
def hostile_zip_batch(course, good, tmp_path_factory):
    """One LMS-style zip holding every kind that needs a kernel or a whole batch, graded once."""
    tmp = tmp_path_factory.mktemp("hostile")
    data_nb = nb_bytes(student_notebook(lesson_of(course), {**ANSWERS, "add": READS_DATA}))
    w = "course_2026"
    entries = {f"{w}/ok_correct/{ASSIGNMENT}/{NOTEBOOK}": good}
    entries.update({f"{w}/{s}/{ASSIGNMENT}/{NOTEBOOK}": good for s in ZIP_IDS})
    entries.update({
        f"{w}/xss/{ASSIGNMENT}/{NOTEBOOK}": nb_bytes(xss_notebook(course)),
        f"{w}/corrupt_nb/{ASSIGNMENT}/{NOTEBOOK}": good,
        f"{w}/corrupt_data/{ASSIGNMENT}/{NOTEBOOK}": good,
        f"{w}/corrupt_data/{ASSIGNMENT}/table.csv": b"a,b\n" * 1000,
        f"{w}/zip_link/{ASSIGNMENT}/{NOTEBOOK}": ("link", "../../../solutions/toy/toy.ipynb"),
        f"{w}/json_list/{ASSIGNMENT}/{NOTEBOOK}": b"[1, 2, 3]",
        f"{w}/data_reader/{ASSIGNMENT}/{NOTEBOOK}": data_nb,
        f"{w}/data_reader/{ASSIGNMENT}/numbers.txt": b"1 2 3",
        f"{w}/bomb_data/{ASSIGNMENT}/{NOTEBOOK}": good,
    })
    zpath = write_zip(tmp / "class.zip", entries)
    with zipfile.ZipFile(zpath, "a", zipfile.ZIP_DEFLATED) as zf:
        _zeros_entry(zf, f"{w}/bomb_nb/{ASSIGNMENT}/{NOTEBOOK}", 30)   # over --max-size 20 MiB
        _zeros_entry(zf, f"{w}/bomb_data/{ASSIGNMENT}/zeros.bin", DATA_FILE_BYTES // 2**20 + 5)
    corrupt_entry(zpath, f"{w}/corrupt_nb/{ASSIGNMENT}/{NOTEBOOK}")
    corrupt_entry(zpath, f"{w}/corrupt_data/{ASSIGNMENT}/table.csv")
    out = tmp / "out"
    results = grade_class(course, zpath, out, options=GradingOptions(cell_timeout=30), progress=False, jobs=2)
    return {r.student: r for r in results}, out, zpath


@pytest.mark.slow
def test_every_odd_id_grades_and_nothing_else_is_affected(hostile_zip_batch):
    results, out, _ = hostile_zip_batch
    graded = ["ok_correct", "xss", "corrupt_data", "data_reader", "bomb_data"] + ZIP_IDS
    expected = {s.strip() for s in graded} | {"corrupt_nb", "zip_link", "json_list", "bomb_nb"}
    assert set(results) == expected
    wrong = [(s, r.score, r.status) for s, r in results.items()
             if s in {g.strip() for g in graded} and (r.score != 6 or r.status != "graded")]
    assert not wrong, wrong
    w = "course_2026"
    assert results["corrupt_nb"].status.startswith(
        f"rejected: zip entry '{w}/corrupt_nb/{ASSIGNMENT}/{NOTEBOOK}' is corrupt in the zip")
    assert results["corrupt_data"].notes[0].startswith(
        f"dropped '{w}/corrupt_data/{ASSIGNMENT}/table.csv': is corrupt")
    assert results["zip_link"].status == f"rejected: '{w}/zip_link/{ASSIGNMENT}/{NOTEBOOK}' {LINK}"
    assert results["json_list"].status.startswith(
        "rejected: 'toy.ipynb': valid JSON but not a Jupyter notebook: the file holds a list")
    assert results["bomb_nb"].status.startswith(f"rejected: zip entry '{w}/bomb_nb/{ASSIGNMENT}/"
                                                f"{NOTEBOOK}' expands to 30 MiB, over the 20 MiB")
    assert "zeros.bin': expands to" in results["bomb_data"].notes[0]
    assert all(r.max_score == 6 for r in results.values())


@pytest.mark.slow
def test_grades_csv_of_the_batch_has_no_formula_and_every_id(hostile_zip_batch):
    results, out, _ = hostile_zip_batch
    rows = read_grades(out)
    assert not [c for row in rows for c in row if evaluated(c)]
    shown = [c[1:] if c.startswith("'") and evaluated(c[1:]) else c for c in (r[0] for r in rows[1:])]
    assert sorted(shown) == sorted(results)


@pytest.mark.slow
def test_feedback_folders_use_the_students_own_ids(hostile_zip_batch):
    results, out, _ = hostile_zip_batch
    folders = {p.name for p in (out / "feedback").iterdir()}
    with_feedback = {s for s, r in results.items() if r.status == "graded"}
    assert folders == {folder_name(s) for s in with_feedback}, "no internal id is left behind"
    for s in with_feedback:
        page = out / "feedback" / folder_name(s) / ASSIGNMENT / "toy.html"
        assert page.is_file() and results[s].feedback == [str(page)], s
    assert (out / "feedback" / "Smith, J [12345]" / ASSIGNMENT / "toy.html").is_file()
    assert (out / "feedback" / "li[1]" / ASSIGNMENT / "toy.html").is_file()


@pytest.mark.slow
def test_feedback_of_a_hostile_notebook_runs_no_script(hostile_zip_batch):
    _, out, _ = hostile_zip_batch
    page = (out / "feedback" / "xss" / ASSIGNMENT / "toy.html").read_text()
    baseline = parse(render(new_notebook(cells=[new_markdown_cell("plain")])))
    assert not unsafe(page, baseline)
    got = parse(page)
    pngs = [dict(a)["src"] for t, a in got.elements if t == "img"
            and dict(a).get("src", "").startswith("data:image/png;base64,")]
    assert pngs, "the matplotlib plot is still shown"
    assert "<b>bold</b>" in page and "<script>alert(45)</script>" in html.unescape(page)
    autograded = out / "work" / "autograded" / "xss" / ASSIGNMENT / NOTEBOOK
    assert "onerror=alert(41)" in autograded.read_text(), "the vectors did reach the grader"


@pytest.mark.slow
def test_rerun_of_the_batch_reuses_every_result(hostile_zip_batch, course):
    results, out, zpath = hostile_zip_batch
    before = (out / "grades.csv").read_text()
    again = grade_class(course, zpath, out, options=GradingOptions(cell_timeout=30), progress=False, jobs=2)
    assert all(r.reused for r in again) and len(again) == len(results)
    assert (out / "grades.csv").read_text() == before


@pytest.mark.slow
def test_links_in_a_class_folder_are_refused_while_the_rest_grades(course, good, tmp_path):
    cls = tmp_path / "cls"
    for s in ("ann", "big_data"):
        (cls / s / ASSIGNMENT).mkdir(parents=True)
        (cls / s / ASSIGNMENT / NOTEBOOK).write_bytes(good)
    with open(cls / "big_data" / ASSIGNMENT / "big.bin", "wb") as f:
        f.truncate(DATA_FILE_BYTES + 10**6)
    (cls / "bob" / ASSIGNMENT).mkdir(parents=True)       # bob's notebook is the solution itself
    (cls / "bob" / ASSIGNMENT / NOTEBOOK).symlink_to(course / "solutions" / ASSIGNMENT / NOTEBOOK)
    (cls / "cat").mkdir()
    (cls / "cat" / ASSIGNMENT).symlink_to(course / "solutions" / ASSIGNMENT)
    results = {r.student: r for r in grade_class(course, cls, tmp_path / "out", options=GradingOptions(cell_timeout=30),
                                                 progress=False, jobs=2)}
    assert (results["ann"].score, results["ann"].status) == (6, "graded")
    assert (results["big_data"].score, results["big_data"].status) == (6, "graded")
    assert "dropped 'big.bin'" in results["big_data"].notes[0]
    for s, rel in (("bob", f"bob/{ASSIGNMENT}/{NOTEBOOK}"), ("cat", f"cat/{ASSIGNMENT}")):
        assert results[s].status == f"rejected: '{rel}' {LINK}" and results[s].score == 0


@pytest.mark.slow
def test_a_canvas_export_grades(course, good, tmp_path):
    blank = nb_bytes(lesson_of(course))
    zpath = write_zip(tmp_path / "submissions.zip", {
        f"smithann_12345_67890_{NOTEBOOK}": good,
        f"doejohn_LATE_222_333_{NOTEBOOK}": blank,
        "leeamy_late_9_10_Copy of toy.ipynb": ((2026, 3, 1, 9, 0, 0), blank),
        "leeamy_late_9_11_toy-1.ipynb": ((2026, 3, 1, 10, 0, 0), good),
    })
    out = tmp_path / "out"
    results = {r.student: r for r in grade_class(course, zpath, out, options=GradingOptions(cell_timeout=30), progress=False,
                                                 jobs=2)}
    assert {s: (r.score, r.status) for s, r in results.items()} == {
        "smithann_12345": (6, "graded"), "doejohn_222": (0, "graded"), "leeamy_9": (6, "graded")}
    assert results["doejohn_222"].notes == ["marked late by Canvas"]
    assert "graded the latest, 'toy-1.ipynb'" in " ".join(results["leeamy_9"].notes)
    assert (out / "feedback" / "smithann_12345" / ASSIGNMENT / "toy.html").is_file()
