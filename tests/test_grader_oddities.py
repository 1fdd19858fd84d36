"""Honest oddities and attacks of issue 25, each at the function where it arose (fast).

Repair of a stripped notebook near the size limit (item 7), a checkout or venv under /tmp
(item 9), CRLF line endings (item 11), lone surrogates and long ints on the wire (item 12), the
words of nbgrader's hidden-test markers in a student's cell (item 13), and control characters in
what ``check`` prints (item 6). The corpus (tests/corpus/build_corpus.py) grades a variant of
each; these tests hold each fix to its function so a regression fails in seconds.
"""
import copy
import html
import json
import random
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest

from autograder.intake.repair import read_notebook_text, repair_notebook

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent / "corpus"))
import build_corpus as corpus  # noqa: E402

L01 = corpus.L01


def _l01():
    """Lesson 01 as released and as solved (with hidden tests), and its solved answers."""
    lesson = nbformat.read(REPO / "lessons" / L01 / f"{L01}.ipynb", as_version=4)
    solution = nbformat.read(REPO / "solutions" / L01 / f"{L01}.ipynb", as_version=4)
    return lesson, solution


def _grade_ids(nb) -> list:
    return [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade_id")]


def _sources(solution) -> dict:
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in solution.cells
            if c.metadata.get("nbgrader", {}).get("grade_id")}


# ---------------------------------------------------------------- 7: repair is linear
def _fillers(lesson, kind: str, seed=0):
    """Sources of filler cells: 2 KB of random text from the lesson's own characters, or
    near-copies of its graded cells (a few words swapped)."""
    rng = random.Random(seed)
    graded = [c.source for c in lesson.cells if c.metadata.get("nbgrader", {}).get(
        "grade" if kind == "near_tests" else "grade_id")]
    alphabet = sorted(set("".join(c.source for c in lesson.cells)))
    while True:
        if kind == "random":
            yield "".join(rng.choice(alphabet) for _ in range(2000))
        else:
            words = rng.choice(graded).split(" ")
            for _ in range(max(1, len(words) // 15)):
                a, b = rng.randrange(len(words)), rng.randrange(len(words))
                words[a], words[b] = words[b], words[a]
            yield " ".join(words)


@pytest.mark.parametrize("kind", ["random", "near_tests", "near_everything"])
def test_a_stripped_one_mib_notebook_repairs_in_seconds(kind):
    """A Colab-stripped lesson 01 (no nbgrader metadata, new ids) with 1 MiB of filler cells:
    repaired in a few CPU seconds (it took minutes when repair was quadratic), every graded
    cell found again; in its own place unless the fillers imitate the answers' frames too."""
    lesson, solution = _l01()
    answers = corpus.solved_answers(solution)
    nb = corpus._strip(corpus._answer(lesson, answers), new_ids=True)
    expected = [c.source for c in nb.cells]
    rng = random.Random(1)
    fill = _fillers(lesson, kind)
    after_tests = [i + 1 for i, c in enumerate(lesson.cells)
                   if c.metadata.get("nbgrader", {}).get("grade")]
    size = len(nbformat.writes(nb))
    while size < 2**20:   # after a test cell: an answer stays by its test
        at = rng.choice(after_tests)
        after_tests = [i + (i > at) for i in after_tests]
        nb.cells.insert(at, nbformat.v4.new_code_cell(next(fill)))
        size += len(nb.cells[at].source) + 100
    data = nbformat.writes(nb).encode()
    assert len(data) >= 2**20
    start = time.process_time()
    repaired, notes = read_notebook_text(data, 20 * 2**20)
    notes += repair_notebook(repaired, lesson, _sources(solution))
    took = time.process_time() - start
    assert took < 10, f"repair of a 1 MiB notebook took {took:.1f} s of CPU"
    assert _grade_ids(repaired) == _grade_ids(lesson)
    if kind == "near_everything":   # with each answer's frame copied, it may lose to a copy
        return
    graded = {c.metadata["nbgrader"]["grade_id"]: c.source for c in repaired.cells
              if c.metadata.get("nbgrader")}
    for cell in lesson.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid:
            want = answers.get(gid, cell.source)
            assert graded[gid] == want, gid
            assert want in expected
    assert any("re-attached by source similarity" in n for n in notes), notes
    assert not any("edited" in n or "deleted" in n for n in notes), notes


def test_an_honest_colab_notebook_still_repairs_by_similarity():
    """The Colab-stripped lesson with the student's own answers (no filler): each cell matched,
    answers kept, no note of an edit or a deletion."""
    lesson, solution = _l01()
    answers = {gid: answer + "\n# checked it twice"   # the student typed a little more
               for gid, answer in corpus.solved_answers(solution).items()}
    nb = corpus._strip(corpus._answer(lesson, answers), new_ids=True)
    notes = repair_notebook(nb, lesson, _sources(solution))
    assert _grade_ids(nb) == _grade_ids(lesson)
    assert not any("deleted" in n or "edited" in n for n in notes), notes


# ---------------------------------------------------------------- 11: line endings
def _crlf(nb):
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        cell.source = "\r\n".join(line + "  " for line in cell.source.split("\n"))
    return nb


@pytest.mark.parametrize("variant", ["crlf_sources", "crlf_file", "trailing_spaces", "cr_only"])
def test_line_endings_and_trailing_whitespace_are_not_edits(variant):
    lesson, solution = _l01()
    nb = corpus._answer(lesson, corpus.solved_answers(solution))
    if variant == "crlf_sources":
        nb = _crlf(nb)
    elif variant == "trailing_spaces":
        for cell in nb.cells:
            cell.source = "\n".join(ln + " \t" for ln in cell.source.split("\n")) + "\n\n"
    elif variant == "cr_only":
        for cell in nb.cells:
            cell.source = cell.source.replace("\n", "\r")
    data = nbformat.writes(nb).encode()
    if variant == "crlf_file":
        data = data.replace(b"\n", b"\r\n")
    repaired, notes = read_notebook_text(data, 20 * 2**20)
    notes += repair_notebook(repaired, lesson, _sources(solution))
    assert not any("edited" in n for n in notes), notes
    tests = [c for c in repaired.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert tests and all(c.source == k.source for c, k in zip(tests, (
        k for k in lesson.cells if k.metadata.get("nbgrader", {}).get("grade"))))


def test_a_real_edit_with_crlf_is_still_an_edit():
    lesson, solution = _l01()
    nb = _crlf(corpus._answer(lesson, corpus.solved_answers(solution)))
    i = corpus._index(nb, "test_recurrent_form")
    nb.cells[i].source = nb.cells[i].source.replace("assert", "pass  #", 1)
    notes = repair_notebook(nb, lesson, _sources(solution))
    assert any("'test_recurrent_form' had been edited: restored" in n for n in notes), notes


# ---------------------------------------------------------------- 13: marker words in a student cell
def _autograded_toy(answer_add: str):
    """The toy lesson as nbgrader autograde leaves it: test cells restored (hidden tests
    included), the student's answer in the ``add`` cell."""
    from toy_course import toy_notebook
    nb = toy_notebook()
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade"):
            meta["score"] = meta["points"]   # what GetGrades puts there
        if meta.get("grade_id") == "add":
            cell.source = answer_add
        elif meta.get("solution"):
            cell.source = cell.source.replace("### BEGIN SOLUTION\n", "").replace(
                "    ### END SOLUTION", "")
    return nb


@pytest.mark.parametrize("comment", [
    "# ### BEGIN HIDDEN TESTS  (a note to myself)",
    "# BEGIN HIDDEN TESTS\n# BEGIN HIDDEN TESTS",
    "# END HIDDEN TESTS\n# BEGIN HIDDEN TESTS"])
def test_marker_words_in_a_student_cell_neither_break_nor_hide(comment):
    """A student's cell that quotes nbgrader's markers (no END, two BEGINs, END first) renders
    as written; the hidden test of the grader's own test cell is still removed."""
    from test_lms_inputs import render
    from toy_course import HIDDEN_MARK
    answer = f"def add(a, b):\n    {comment.replace(chr(10), chr(10) + '    ')}\n    return a + b"
    nb = _autograded_toy(answer)
    nb.cells.append(nbformat.v4.new_markdown_cell(f"My notes: {comment}"))
    page = html.unescape(re.sub(r"<[^>]*>", "", render(nb)))
    assert HIDDEN_MARK not in page
    assert "return a + b" in page and "My notes:" in page
    assert page.count("BEGIN HIDDEN TESTS") == 2 * comment.count("BEGIN")   # shown as written


def test_a_test_cell_region_without_end_is_removed_to_the_end():
    from autograder.engine.feedback import HideHiddenTests
    cell = nbformat.v4.new_code_cell("assert f(1) == 1\n### BEGIN HIDDEN TESTS\nassert f(2) == 9",
                                     metadata={"nbgrader": {"grade": True, "solution": False,
                                                            "grade_id": "t", "points": 1}})
    cell, _ = HideHiddenTests().preprocess_cell(cell, {}, 0)
    assert cell.source == "assert f(1) == 1"


# ---------------------------------------------------------------- 9: a checkout or venv under /tmp
def _mounts(args) -> list:
    """(kind, destination) of each mount in a bubblewrap argument list, in order."""
    out = []
    for i, word in enumerate(args):
        if word in ("--ro-bind", "--bind", "--ro-bind-try"):
            out.append(("bind", args[i + 2]))
        elif word in ("--tmpfs", "--dev", "--proc"):
            out.append((word[2:], args[i + 1]))
    return out


def test_a_venv_under_tmp_is_mounted_over_the_sandboxes_tmp(tmp_path, monkeypatch):
    """The Python's environment under /tmp (a checkout in /tmp/x): bound read-only after the
    sandbox's own /tmp tmpfs, so it is visible; the job folder and the working folder, though
    on sys.path, are never mounted."""
    from autograder.engine.jail import jail
    from autograder.options import GradingOptions
    import tempfile
    venv = Path(tempfile.mkdtemp(prefix="x-main-venv-", dir="/tmp"))
    job = Path(tempfile.mkdtemp(prefix="autograder-job-", dir="/tmp"))
    try:
        monkeypatch.setattr(sys, "prefix", str(venv))
        monkeypatch.setattr(sys, "path", [*sys.path, str(job), str(job / "ipc"), ""])
        monkeypatch.chdir(job)
        (job / "ipc").mkdir()
        args = jail.sandbox_command(ipc_dir=job / "ipc", job_dir=job, data_files=[],
                                    options=GradingOptions())
        mounts = _mounts(args)
        binds = [d for kind, d in mounts if kind == "bind"]
        assert str(venv) in binds
        assert str(job) not in binds and "/tmp" not in binds
        tmpfs = {d: i for i, (kind, d) in enumerate(mounts) if kind in ("tmpfs", "dev", "proc")}
        for i, (kind, dest) in enumerate(mounts):   # nothing mounted later covers a bind
            covering = [t for t in tmpfs if t == dest or dest.startswith(t.rstrip("/") + "/")]
            assert all(tmpfs[t] <= i for t in covering), (dest, covering)
    finally:
        import shutil
        shutil.rmtree(venv, ignore_errors=True)
        shutil.rmtree(job, ignore_errors=True)


def test_the_sandbox_error_names_the_real_cause():
    from autograder.engine.jail.jail import _failure
    cause, why = _failure("bwrap: execvp /tmp/x/main/.venv/bin/python: No such file or directory")
    assert cause == "layout" and "does not show this grader's Python" in why
    assert "bubblewrap cannot run" not in why
    cause, why = _failure("bwrap: setting up uid map: Permission denied")
    assert cause == "bubblewrap" and why.startswith("bubblewrap cannot run here")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux") or not __import__("shutil").which("bwrap"),
                    reason="needs Linux with bubblewrap")
def test_a_python_under_tmp_runs_in_the_sandbox(tmp_path):
    """A real sandbox from a venv under /tmp (its packages reached through a .pth file): the
    probe succeeds; it failed with 'execvp ... No such file' when /tmp hid the venv."""
    import subprocess
    import sysconfig
    import tempfile
    import shutil
    base = Path(tempfile.mkdtemp(prefix="x-main-", dir="/tmp"))
    try:
        os_venv = base / ".venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(os_venv)], check=True)
        site = next(os_venv.glob("lib/python*/site-packages"))
        here = sysconfig.get_paths()["purelib"]
        (site / "grader.pth").write_text(f"import site; site.addsitedir({here!r})\n")
        proc = subprocess.run([str(os_venv / "bin" / "python"), "-c",
                               "from autograder.engine.jail import jail; p = jail.probe(); "
                               "print(p['ok'], p['cause'], p['why'])"],
                              capture_output=True, text=True, timeout=120, cwd=base)
        assert proc.stdout.startswith("True"), proc.stdout + proc.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------- 12: unusual strings and ints
from autograder.engine.kernel.wire import WireError, decode, encode, visible  # noqa: E402

ODD_VALUES = ["x\ud800", "\udc80tail", "ok \U0001f600 \ud83d", 10**5000, -(10**5000) - 1,
              2**64, -2**63 - 1, float("inf"), float("-inf"), complex(float("inf"), 1),
              {"k\udfff": [10**4400, "v\ud800"]}, ("\ud800",) * 3]


class _Text(str):
    pass


@pytest.mark.parametrize("value", ODD_VALUES, ids=[
    "lone_high", "lone_low", "emoji_and_lone", "int_5000_digits", "int_negative_5000",
    "2_to_64", "below_int64", "inf", "minus_inf", "complex_inf", "dict_of_odd", "tuple_of_lone"])
def test_odd_values_cross_a_kernel_message_exactly(value):
    """Each value, encoded on the kernel side, goes through the kernel's own message packer
    (jupyter_client's, which refuses lone surrogates, NaN and long ints) and back unchanged."""
    from jupyter_client.session import json_packer, json_unpacker
    node = encode(value, kernel=True, refs=[])
    got = decode(json_unpacker(json_packer({"data": node}))["data"])
    assert got == value and type(got) is type(value)


def test_nan_and_subclasses_of_odd_values_cross():
    from jupyter_client.session import json_packer, json_unpacker
    import math
    got = decode(json_unpacker(json_packer(encode([float("nan"), _Text("a\ud800")],
                                                  kernel=True, refs=[]))))
    assert math.isnan(got[0]) and got[1] == "a\ud800" and type(got[1]) is str


@pytest.mark.parametrize("node, needle", [
    ({"t": "int", "v": "12g"}, "bad int"), ({"t": "int", "v": 12}, "bad int"),
    ({"t": "float", "v": "1e400"}, "bad float"), ({"t": "str", "v": "!!"}, "malformed"),
    ({"t": "str", "v": "/w=="}, "malformed")])
def test_malformed_odd_nodes_are_refused(node, needle):
    with pytest.raises(WireError, match=needle):
        decode(node)


def test_visible_writes_lone_surrogates_out():
    assert visible({"a\ud800": ["b\udfff", 3]}) == {"a\\ud800": ["b\\udfff", 3]}
    assert visible("plain π") == "plain π"
    json.dumps(visible(["x\ud800"]), ensure_ascii=False).encode("utf-8")


SURROGATE_CELL = ("S = 'x\\ud800'\nprint(S)\nBIG = 10**5000\n"
                  "def lone():\n    return S\ndef big():\n    return -BIG\n"
                  "def nan():\n    return float('nan')\n")


@pytest.mark.slow
def test_a_kernel_with_odd_values_is_graded_not_flagged(tmp_path):
    """In a real sandbox: a printed lone surrogate is shown as text (no ipykernel traceback,
    no grader path), functions returning one, a 5,000-digit int or NaN pass their tests, an
    assertion quoting the surrogate is written, and nothing is reported as tampering."""
    from autograder.options import GradingOptions
    from autograder.engine.sandbox import run_submission
    from toy_course import ADD_SOLUTION, MUL_SOLUTION, toy_notebook
    nb = toy_notebook()
    tests = {"test_add": "assert lone() == 'x\\ud800' and big() == -10**5000\n"
                         "import math\nassert math.isnan(nan())",
             "test_mul": "assert mul(2, 3) == 6\nassert lone() == 'y', lone()"}
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid == "add":
            cell.source = ADD_SOLUTION + "\n" + SURROGATE_CELL
        elif gid == "mul":
            cell.source = MUL_SOLUTION
        elif gid in tests:
            cell.source = tests[gid]
    executed, report = run_submission(nb, tmp_path, GradingOptions(cell_timeout=30))
    assert report["tampered"] == [] and not report["review"] and not report["kernel"], report
    out = {c.metadata.get("nbgrader", {}).get("grade_id"): c.get("outputs") for c in executed.cells}
    assert [o.get("text") for o in out["add"]] == ["x\\ud800\n"]
    assert out["test_add"] == []
    assert [(o.ename, o.evalue) for o in out["test_mul"]] == [("AssertionError", "x\\ud800")]
    text = json.dumps(executed)
    assert "site-packages" not in text and "Traceback (most recent call last):\\n  File \\\"/" \
        not in text


# ---------------------------------------------------------------- 6: what check prints
FAKE = "\x1b[2K\r\x1b[1APASS  test_add   2/2\nvisible tests: 4/4 passed, 10/10 points\x1b[8m"
HOSTILE = [FAKE, "\rPASS  test_mul  3/3", "tab\there\x07\x9b31m\u202eSSAP", "lone \ud800 \x00"]


def _only_real_lines(text: str, expected_lines: int):
    lines = text.split("\n")
    assert len(lines) == expected_lines, lines
    for line in lines:
        assert all(c.isprintable() for c in line), repr(line)
    return lines


@pytest.mark.parametrize("message", HOSTILE, ids=["ansi_and_newline", "carriage_return",
                                                   "bell_csi_bidi", "surrogate_nul"])
def test_check_report_prints_no_control_character(message):
    """A student's exception message, grade id, note or file name with escape codes, carriage
    returns or newlines: each report line is one printable line; only real results say PASS."""
    from mlexp.check import ExerciseResult, format_report
    results = [ExerciseResult("test_add", 2, False, f"ValueError: {message}"),
               ExerciseResult(f"test_mul{message}", 3, False, message),
               ExerciseResult("test_mean", 1, True)]
    text = format_report(f"toy{message}.ipynb", results, notes=[f"repaired {message}"])
    lines = _only_real_lines(text, 1 + 1 + 3 + 1)
    assert [ln.split()[0] for ln in lines[2:5]] == ["FAIL", "FAIL", "PASS"]
    assert lines[-1].startswith("visible tests: 1/3 passed, 1/6 points")
    assert sum(ln.startswith("PASS") for ln in lines) == 1


@pytest.mark.slow
def test_autograder_check_escapes_a_hostile_exception_message(tmp_path):
    """The real `autograder check` of a toy notebook whose answers raise with escape codes: the
    terminal gets escapes as text, the FAIL rows and the real summary line."""
    import subprocess
    from autograder.publishing.build import build
    from toy_course import ASSIGNMENT, NOTEBOOK, make_toy_course
    course = make_toy_course(tmp_path / "course")
    build(course)
    lesson = nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    raising = f"def {{}}(*args):\n    raise ValueError({FAKE!r})"
    nb = corpus._answer(lesson, {g: raising.format(g) for g in ("add", "mul", "mean")})
    path = tmp_path / NOTEBOOK
    nbformat.write(nb, path)
    proc = subprocess.run([sys.executable, "-m", "autograder", "--course", str(course), "check",
                           str(path), "--timeout", "20"], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "\x1b" not in proc.stdout and "\r" not in proc.stdout
    lines = proc.stdout.strip().split("\n")
    assert not any(ln.startswith("PASS") for ln in lines), lines
    assert sum(ln.startswith("FAIL") for ln in lines) == 3
    assert "visible tests: 0/3 passed, 0/6 points" in lines[-1]
    assert "\\x1b[2K\\r\\x1b[1APASS" in proc.stdout


# ---------------------------------------------------------------- 6: feedback dressed up
IMITATION = ('<div class="mlexp-ok">Passed.</div>'
             '<table class="mlexp-summary dataframe" id="toc"><tr class="exercise passed">'
             '<td class="mark">✓</td><td class="score">10 / 10</td></tr></table>'
             '<details class="mlexp-code" id="notebook"><summary>x</summary></details>')


@pytest.mark.parametrize("where", ["markdown", "html_output", "markdown_output"])
def test_student_html_cannot_wear_the_graders_status_classes(where):
    """A 0-point notebook whose markdown or outputs copy the grader's 'Passed.' box, score table
    and ids: the page has no element with the grader's status classes but its own (one hint
    box per failed test, no 'Passed.' box), the student's text itself still shown."""
    from test_lms_inputs import render
    nb = _autograded_toy("def add(a, b):\n    return a - b")
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.metadata["nbgrader"]["score"] = 0
    if where == "markdown":
        nb.cells.append(nbformat.v4.new_markdown_cell(IMITATION))
    else:
        mime = "text/html" if where == "html_output" else "text/markdown"
        nb.cells.append(nbformat.v4.new_code_cell("show()", outputs=[nbformat.v4.new_output(
            "display_data", data={mime: IMITATION})]))
    found = corpus.element_classes(render(nb))
    assert ("class", "mlexp-ok") not in found
    assert found.count(("class", "mlexp-hint")) == 2 * 3    # the summary's and each test's own
    assert found.count(("class", "mlexp-summary")) == 1 and found.count(("id", "toc")) == 1
    assert found.count(("class", "passed")) == 0 and ("class", "dataframe") in found


def test_the_students_own_check_takes_line_endings_for_no_edit():
    """mlexp.check (the student edition's self-check) restores test cells the same way."""
    from mlexp.check import restore_tests
    lesson, solution = _l01()
    nb = _crlf(corpus._answer(lesson, corpus.solved_answers(solution)))
    assert restore_tests(nb, lesson) == []
    assert [c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")] == [
        c.source for c in lesson.cells if c.metadata.get("nbgrader", {}).get("grade")]
    i = corpus._index(nb, "test_recurrent_form")
    nb.cells[i].source = "pass"
    assert [n for n in restore_tests(nb, lesson) if "test_recurrent_form" in n]


def _widget_notebook(state):
    """The toy lesson, a progress-bar widget output in its first code cell, ``state`` saved."""
    lesson, _ = _l01()
    nb = copy.deepcopy(lesson)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "text/plain": "  5/5 [00:01<00:00]",
        "application/vnd.jupyter.widget-view+json": {"model_id": "m1", "version_major": 2,
                                                     "version_minor": 0}})]
    if state is not None:
        nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": state}
    return lesson, nb


@pytest.mark.parametrize("state, note", [
    ({"m1": {"model_name": "FloatProgressModel", "state": {"value": 5}}}, "without its 'state'"),
    ("garbled", "could not be read"),
    ({"state": {"m1": {"model_name": "FloatProgressModel", "state": {"value": 5}}},
      "version_major": 2, "version_minor": 0}, None),       # as JupyterLab saves it: untouched
])
def test_widget_state_as_colab_saves_it_still_gives_a_feedback_page(state, note):
    from nbconvert import HTMLExporter
    lesson, nb = _widget_notebook(state)
    before = copy.deepcopy(nb.metadata)
    notes = repair_notebook(nb, lesson, {})
    widget_notes = [n for n in notes if "widget" in n]
    if note is None:
        assert widget_notes == [] and nb.metadata == before
    else:
        assert len(widget_notes) == 1 and note in widget_notes[0]
    page, _ = HTMLExporter().from_notebook_node(nb)
    assert "5/5" in page or "FloatProgressModel" in page
