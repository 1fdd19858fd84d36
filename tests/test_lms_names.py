"""Every upload has an owner or a rejected row (issue 52, item 3).

Each LMS names the files of its downloads its own way; what a name cannot tie to one student
is a rejected row naming the file, never a silent drop and never another student's work. Two
rows that land on one LMS user stop export and push for that user. The tables an LMS or a
spreadsheet writes (Moodle's worksheet, Blackboard's Grade Centre) are read by one decoder in
every command, times keep the zone written in them.

Files are shaped like each LMS's real downloads; the commands run as an instructor runs them,
``python -m autograder ...``. Nothing here grades a notebook: the zips hold only what is
rejected before a kernel starts, and what a name means is checked through ``collect``.
"""
import contextlib
import csv
import io
import json
import zipfile
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from autograder.intake.collect import collect
from autograder.publishing.build import build
from toy_course import ASSIGNMENT, NOTEBOOK, make_toy_course

NAMES = {ASSIGNMENT: [NOTEBOOK]}


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = make_toy_course(tmp_path_factory.mktemp("course"))
    build(root)
    return root


@pytest.fixture(scope="module")
def blank(course) -> bytes:
    return nbformat.writes(nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK,
                                         as_version=4)).encode()


def tagged(data: bytes, who: str) -> bytes:
    nb = nbformat.reads(data.decode(), as_version=4)
    nb.metadata["uploaded_by"] = who
    return nbformat.writes(nb).encode()


def write_zip(path: Path, entries: dict) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return path


def cli(*args) -> SimpleNamespace:
    """``python -m autograder ARGS`` as an instructor runs it (its ``main``, in this process:
    a new interpreter per command would cost seconds each): returncode, stdout, stderr."""
    from autograder.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def grades(out: Path) -> dict:
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        return {(r["student_id"], r["assignment"]): r for r in csv.DictReader(f)}


def owners(subs) -> dict:
    """student id -> who uploaded the notebook it holds (its metadata), or its problem."""
    out = {}
    for s in subs:
        if s.problem:
            out[s.student] = "rejected: " + s.problem
        else:
            [nb] = s.notebooks
            out[s.student] = nbformat.read(nb, as_version=4).metadata["uploaded_by"]
    return out


# --------------------------------------------------------------------- Canvas's file names

def test_a_canvas_name_with_underscores_and_digits_keeps_its_owner(tmp_path, blank):
    """The sortable name keeps '_' and digits; the student's own file name may hold both too.
    A name part ending in _<digits> is never read as another user's id."""
    entries = {
        f"o_brien_555_666_{NOTEBOOK}": "o_brien_555",                   # '_' in the name
        f"smithann_12345_67890_lab_3_2_{NOTEBOOK}": "smithann_12345",   # '_<n>_<n>' in the file
        f"leeamy_2_31_{NOTEBOOK}": "leeamy_2",                          # user 2
        f"annsmith_2_901_902_{NOTEBOOK}": "annsmith_2_901",             # name ends in _2
        f"kim_LATE_77_88_01_{NOTEBOOK}": "kim_77",
    }
    zpath = write_zip(tmp_path / "submissions.zip", {k: tagged(blank, v) for k, v in entries.items()})
    subs = collect(zpath, [ASSIGNMENT], tmp_path / "u", NAMES)
    assert owners(subs) == {v: v for v in entries.values()}
    # settled by the rule that a name holds no two numbers in a row: said, with the other reading
    [note] = next(s for s in subs if s.student == "smithann_12345").notes
    assert "smithann_12345_67890_lab_3 (Canvas user 3)" in note and "two numbers in a row" in note
    assert next(s for s in subs if s.student == "o_brien_555").notes == []


def own_upload_grade(self, job):
    """6/6 when the notebook graded as a student's is the one that student uploaded (its
    metadata says who), else 0; no kernel."""
    res = job.result
    [nb] = job.notebooks.values()
    res.score, res.max_score = (6.0 if nb.metadata.get("uploaded_by") == job.sub.student else 0.0), 6.0
    res.exercises = {"test_add": res.score}
    return res


def test_each_canvas_upload_is_graded_as_its_owners_through_grade(course, blank, tmp_path,
                                                                monkeypatch):
    """The same names through ``grade``: one row per owner, each scored from their own upload
    (the grader stands in for the kernel: 6 when the notebook is the row's own, else 0)."""
    monkeypatch.setattr("autograder.grading.grade.Grader.grade", own_upload_grade)
    owners_of = {f"o_brien_555_666_{NOTEBOOK}": "o_brien_555",
                 f"leeamy_2_31_{NOTEBOOK}": "leeamy_2",
                 f"annsmith_2_901_902_{NOTEBOOK}": "annsmith_2_901",
                 f"kim_LATE_77_88_01_{NOTEBOOK}": "kim_77"}
    zpath = write_zip(tmp_path / "submissions.zip",
                      {k: tagged(blank, v) for k, v in owners_of.items()})
    out = tmp_path / "out"
    run = cli("--course", course, "grade", zpath, "--out", out, "--no-progress")
    assert run.returncode == 0, run.stdout + run.stderr
    assert {s: r["score"] for (s, _), r in grades(out).items()} == {
        v: "6.0" for v in owners_of.values()}, run.stdout


def test_a_canvas_name_no_reading_settles_is_a_rejected_row_naming_the_file(tmp_path, blank):
    """'smith_2_12345_67890_toy.ipynb' is Smith (user 2, file 12345, 67890_toy.ipynb) or
    Smith_2 (user 12345): nothing in the zip says which; it is no one's, and says so."""
    name = f"smith_2_12345_67890_{NOTEBOOK}"
    zpath = write_zip(tmp_path / "submissions.zip", {name: tagged(blank, "smith_2_12345")})
    [sub] = collect(zpath, [ASSIGNMENT], tmp_path / "u", NAMES)
    assert sub.student == f"{name} (owner not certain)"
    assert "owner not certain" in sub.problem and name in sub.problem
    assert "smith_2 (Canvas user 2)" in sub.problem and "smith_2_12345 (Canvas user 12345)" in sub.problem
    # two files the name rule alone would settle, that contradict each other (one user id, two
    # names): neither is anyone's
    both = [f"ann_100_200_lab_3_2_{NOTEBOOK}", f"bob_100_300_lab_3_2_{NOTEBOOK}"]
    zpath = write_zip(tmp_path / "two.zip", {n: blank for n in both})
    subs = collect(zpath, [ASSIGNMENT], tmp_path / "u2", NAMES)
    assert sorted(s.student for s in subs) == [f"{n} (owner not certain)" for n in both]


def test_canvas_names_through_grade(course, tmp_path):
    """grade's table and grades.csv: the honest 'o_brien' (a PDF only) is a rejected row naming
    the PDF, the uncertain file a rejected row naming the file; no row for user 2."""
    zpath = write_zip(tmp_path / "submissions.zip", {
        "o_brien_555_666_report.pdf": b"%PDF-1.4",
        f"smith_2_12345_67890_{NOTEBOOK}": b"{}",
        f"leeamy_{NOTEBOOK}": b"{}"})                 # no ids at all: fits no Canvas name
    out = tmp_path / "out"
    run = cli("--course", course, "grade", zpath, "--out", out, "--no-progress")
    rows = grades(out)
    assert set(rows) == {("o_brien_555", ASSIGNMENT),
                         (f"smith_2_12345_67890_{NOTEBOOK} (owner not certain)", ASSIGNMENT),
                         (f"leeamy_{NOTEBOOK} (owner not certain)", ASSIGNMENT)}, (
        run.stdout, run.stderr)
    nameless = rows[(f"leeamy_{NOTEBOOK} (owner not certain)", ASSIGNMENT)]["status"]
    assert nameless.startswith("rejected: owner not certain") and "fits no Canvas" in nameless
    pdf = rows[("o_brien_555", ASSIGNMENT)]["status"]
    assert pdf.startswith("rejected: no .ipynb file") and "report.pdf" in pdf
    unsure = rows[(f"smith_2_12345_67890_{NOTEBOOK} (owner not certain)", ASSIGNMENT)]["status"]
    assert unsure.startswith("rejected: owner not certain")
    assert "smith_2_12345_67890_toy.ipynb" in run.stdout


# ------------------------------------------------------------- a Canvas submission, no notebook

@pytest.fixture
def standin():
    pytest.importorskip("canvasapi")
    from canvas_standin import StandIn
    s = StandIn("7~tok", 3).start()
    s.add_assignment(77, "01 Toy", 10.0)
    yield s
    s.stop()


def test_a_pdf_only_canvas_submission_is_a_rejected_row_everywhere(course, standin, tmp_path,
                                                                   monkeypatch):
    """pull -> manifest, grade -> grades.csv and the report, push -> its held-back list."""
    standin.add_user(1201, "Pat Doc", "pat@uni.example")
    standin.submit(77, 1201, {"report.pdf": b"%PDF-1.4"}, "2026-10-01T20:00:00Z")
    env_args = ["--url", standin.url, "--lesson", ASSIGNMENT]
    monkeypatch.setenv("CANVAS_TOKEN", "7~tok")
    pulled, out = tmp_path / "pulled", tmp_path / "out"
    run = cli("--course", course, "canvas", "pull", 3, 77, "--out", pulled, *env_args)
    assert run.returncode == 0, run.stderr
    assert "NO NOTEBOOK: pat@uni.example_1201" in run.stdout and "report.pdf" in run.stdout
    manifest = json.loads((pulled / ".canvas-pull.json").read_text())["students"]
    assert "report.pdf" in manifest["pat@uni.example_1201"]["problem"]
    run = cli("--course", course, "grade", pulled, "--out", out, "--no-progress")
    row = grades(out)[("pat@uni.example_1201", ASSIGNMENT)]
    assert row["status"].startswith("rejected: no .ipynb file") and "report.pdf" in row["status"]
    assert "pat@uni.example_1201" in (out / "report.html").read_text(encoding="utf-8")
    run = cli("--course", course, "canvas", "push", out, 3, 77, "--dry-run", *env_args)
    assert run.returncode == 3, run.stdout + run.stderr
    held = run.stdout.split("HELD BACK")[1]
    assert "pat@uni.example_1201" in held and "report.pdf" in held
    # a later attempt with a notebook takes the placeholder's place
    standin.submit(77, 1201, {NOTEBOOK: b"{}"}, "2026-10-02T20:00:00Z", attempt=2)
    run = cli("--course", course, "canvas", "pull", 3, 77, "--out", pulled, *env_args)
    assert run.returncode == 0 and "NO NOTEBOOK" not in run.stdout, run.stdout
    assert sorted(p.name for p in (pulled / "pat@uni.example_1201" / ASSIGNMENT).iterdir()) == [
        "timestamp.txt", NOTEBOOK]
    assert "problem" not in json.loads((pulled / ".canvas-pull.json").read_text())[
        "students"]["pat@uni.example_1201"]


# ------------------------------------------------------------- two rows, one LMS user

CANVAS_BOOK = (
    "Student,ID,SIS User ID,SIS Login ID,Section,01 Toy (77)\r\n"
    "    Points Possible,,,,,10.00\r\n"
    '"Smith, Ann",12345,S001,asmith,"ML 101",\r\n'
    '"Lee, Amy",9,S003,alee,"ML 101",\r\n')


def graded(tmp_path: Path, scores: dict) -> Path:
    """DIR holding grades.csv ({student: score of 6}) and a feedback page per student."""
    from autograder.grading.grade import Result, write_csv
    from autograder.ids import folder_name
    out = tmp_path / "graded"
    out.mkdir()
    write_csv(out / "grades.csv", [Result(s, ASSIGNMENT, score=v, max_score=6)
                                   for s, v in scores.items()], [])
    for s in scores:
        page = out / "feedback" / folder_name(s) / ASSIGNMENT / f"{ASSIGNMENT}.html"
        page.parent.mkdir(parents=True)
        page.write_text(f"<html><body>feedback for {s}</body></html>")
    return out


def test_two_rows_on_one_canvas_user_stop_export_for_that_user(tmp_path):
    """smith_2_12345 read as annsmith's id, or two spellings: neither grade reaches Ann's cell,
    with or without --send-undecided; Amy's is filled; export exits 3 and names both rows, and
    with --send-undecided says that flag sends no clash."""
    out = graded(tmp_path, {"smithann_12345": 6, "evil_12345": 0, "leeamy_9": 3})
    book = tmp_path / "Grades-ML_101.csv"
    book.write_bytes(CANVAS_BOOK.encode())
    term = tmp_path / "term.toml"
    term.write_text(f'[lessons.{ASSIGNMENT}]\nlms_column = "01 Toy (77)"\n')
    args = ["export", out, "--lms", "canvas", "--gradebook", book, "--term", term]
    for extra, code in (([], 3), (["--send-undecided"], 3)):
        dest = tmp_path / f"upload{len(extra)}.csv"
        run = cli(*args, "--out", dest, *extra)
        assert run.returncode == code, run.stdout + run.stderr
        rows = list(csv.reader(io.StringIO(dest.read_text(encoding="utf-8"))))
        assert rows[2][5] == "" and rows[3][5] == "5", rows        # Ann untouched; Amy 3/6 of 10
        needs = run.stdout.split("NEEDS YOU (2)")[1]
        assert "smithann_12345" in needs and "evil_12345" in needs and "Smith, Ann" in needs
        if extra:
            assert "whatever --send-undecided says" in run.stderr, run.stderr


def test_two_rows_on_one_canvas_user_stop_push_for_that_user(tmp_path, standin, monkeypatch):
    standin.add_user(12345, "Ann Smith", "asmith")
    standin.add_user(9, "Amy Lee", "alee")
    for uid in (12345, 9):
        standin.submit(77, uid, {NOTEBOOK: b"{}"}, "2026-10-01T20:00:00Z")
    out = graded(tmp_path, {"smithann_12345": 6, "evil_12345": 0, "leeamy_9": 3})
    monkeypatch.setenv("CANVAS_TOKEN", "7~tok")
    run = cli("canvas", "push", out, 3, 77, "--url", standin.url, "--lesson", ASSIGNMENT)
    assert run.returncode == 3, run.stdout + run.stderr
    held = run.stdout.split("HELD BACK (2)")[1]
    assert "smithann_12345" in held and "evil_12345" in held and "user id 12345" in held
    sub = standin.submissions[(77, 12345)]
    assert sub["score"] is None and sub["submission_comments"] == []     # nothing posted to Ann
    assert standin.submissions[(77, 9)]["score"] == 5.0


# ------------------------------------------------------------- Moodle's worksheet: zones, Excel

ANSWERS_SRC = "def add(a, b):\n    return a + b"


def fake_grade(self, job):
    """6/6 for a notebook whose add is right, without a kernel (everything else is grade's)."""
    res = job.result
    src = "\n".join(c.source for nb in job.notebooks.values() for c in nb.cells)
    res.exercises = {"test_add": 6.0 * (ANSWERS_SRC in src)}
    res.score, res.max_score = sum(res.exercises.values()), 6.0
    page = self.out / "feedback" / job.sub.student / res.assignment / f"{ASSIGNMENT}.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(f"<html><body>{res.score:g} / 6</body></html>")
    res.feedback = [str(page)]
    return res


def answered(blank: bytes) -> bytes:
    nb = nbformat.reads(blank.decode(), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(ANSWERS_SRC))
    return nbformat.writes(nb).encode()


WORKSHEET = ('"Identifier","Full name","Email address","Status","Grade","Maximum Grade",'
             '"Grade can be changed","Last modified (submission)"\n'
             '"Participant 1001","Ann Smith",a@x.edu,"Submitted",,"20,00",Yes,"{ann}"\n'
             '"Participant 1002","José Núñez",j@x.edu,"Submitted",,"20,00",Yes,"{jose}"\n')
TERM_MOODLE = ('timezone = "Europe/Berlin"\n[lessons.toy]\ndue = 2026-10-01T23:59:00+02:00\n'
               'moodle_worksheet = "Grades-ML 101-toy-77.csv"\n[late]\nper_day = 0.10\n')


@pytest.fixture
def moodle_class(course, blank, tmp_path, monkeypatch):
    """A Moodle zip of two students graded (6/6 each, no kernel) with a term whose worksheet
    gives their times; returns (tmp_path, DIR, worksheet path, term path)."""
    monkeypatch.setattr("autograder.grading.grade.Grader.grade", fake_grade)
    zpath = write_zip(tmp_path / "moodle.zip", {
        f"Ann Smith_1001_assignsubmission_file_/{NOTEBOOK}": answered(blank),
        f"José Núñez_1002_assignsubmission_file_/{NOTEBOOK}": answered(blank)})
    term = tmp_path / "term.toml"
    term.write_text(TERM_MOODLE)
    sheet = tmp_path / "Grades-ML 101-toy-77.csv"
    return tmp_path, zpath, sheet, term


def exported_grades(tmp_path, out, sheet, course) -> dict:
    dest = tmp_path / "upload.csv"
    run = cli("--course", course, "export", out, "--lms", "moodle", "--gradebook", sheet,
              "--out", dest)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = list(csv.reader(io.StringIO(dest.read_bytes().decode(read_codec(sheet)), newline="")))
    return {r[1]: r[4] for r in rows[1:]}


def read_codec(sheet: Path) -> str:
    from autograder.lms.table import read_table
    return read_table(sheet).codec


@pytest.mark.parametrize("written, ann", [
    ("Thursday, 1 October 2026, 10:30 PM UTC", "18"),   # 22:30 UTC: 31 minutes late
    ("Thursday, 1 October 2026, 5:30 PM -0500", "18"),  # 22:30 UTC too
    ("Friday, 2 October 2026, 6:00 AM +0900", "20")])   # 21:00 UTC: on time
def test_a_moodle_time_keeps_the_zone_written_in_it(moodle_class, course, written, ann):
    """Due 23:59 Berlin (21:59 UTC). Ann's time is read in the zone written in it: 31 minutes
    late is 10% off, 18 of 20 (read as Berlin's, 22:30 would be on time, and 06:00 late).
    José's time has no zone: the term's (Berlin), on time."""
    tmp_path, zpath, sheet, term = moodle_class
    sheet.write_text(WORKSHEET.format(ann=written, jose="Thursday, 1 October 2026, 11:00 PM"),
                     encoding="utf-8")
    out = tmp_path / "out"
    run = cli("--course", course, "grade", zpath, "--out", out, "--term", term, "--no-progress")
    assert run.returncode == 0, run.stdout + run.stderr
    assert exported_grades(tmp_path, out, sheet, course) == {"Ann Smith": ann, "José Núñez": "20"}


@pytest.mark.parametrize("codec, newline", [("cp1252", "\r\n"), ("mac_roman", "\r")])
def test_an_excel_saved_worksheet_reads_in_every_command(moodle_class, course, codec, newline):
    """Excel on Windows (Windows-1252) or a Mac (Mac Roman, CR line ends): grade, report and
    export read it as they read UTF-8 (José's name, his late time), never a codec error."""
    tmp_path, zpath, sheet, term = moodle_class
    text = WORKSHEET.format(ann="Thursday, 1 October 2026, 11:00 PM",
                            jose="Friday, 2 October 2026, 1:00 AM")     # 1 minute late
    sheet.write_bytes(text.replace("\n", newline).encode(codec))
    out = tmp_path / "out"
    run = cli("--course", course, "grade", zpath, "--out", out, "--term", term, "--no-progress")
    assert run.returncode == 0, run.stdout + run.stderr
    run = cli("--course", course, "report", out, "--term", term)
    assert run.returncode == 0, run.stdout + run.stderr
    assert exported_grades(tmp_path, out, sheet, course) == {"Ann Smith": "20", "José Núñez": "18"}
    assert sheet.read_bytes().decode(codec) == text.replace("\n", newline)   # left as it was


# ------------------------------------------------------------- Blackboard: Excel and leading zeros

def test_a_blackboard_user_name_excel_stripped_of_its_zeros_is_matched_and_noted(tmp_path):
    """Grade Centre downloaded, opened and saved in Excel (Windows-1252, 0012345 -> 12345): the
    student graded as 0012345 finds the row, the export says how and writes the user name
    back as Blackboard knows it; the rest of the file is as Excel left it."""
    head = ('Last Name,First Name,Username,Student ID,Availability,'
            '01 Toy [Total Pts: 10 Score] |103\r\n')
    rows = ('Núñez,José,12345,S1,Available,\r\n'
            'Kim,Alex,akim,S2,Available,\r\n')
    book = tmp_path / "gc_ML101_fullgc_2026-12-01-12-00-00.csv"
    book.write_bytes((head + rows).encode("cp1252"))
    out = graded(tmp_path, {"0012345": 6, "akim": 3})
    term = tmp_path / "term.toml"
    term.write_text(f'[lessons.{ASSIGNMENT}]\nlms_column = "01 Toy"\n')
    dest = tmp_path / "upload.csv"
    run = cli("export", out, "--lms", "blackboard", "--gradebook", book, "--term", term,
              "--out", dest)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "NOT FOUND" not in run.stdout
    assert "0012345: matched the Username '12345'" in run.stdout and "leading zeros" in run.stdout
    got = dest.read_bytes().decode("cp1252")
    assert got == head + 'Núñez,José,0012345,S1,Available,10\r\nKim,Alex,akim,S2,Available,5\r\n'


# ------------------------------------------------------------- look-alike ids (NFC, NFD)

def test_look_alike_ids_are_one_student_named_at_intake(course, blank, tmp_path):
    """'José' composed (NFC, from Windows or a browser) and decomposed (NFD, a Mac's zip): one
    row, whose notes name both forms; not two rows that print the same."""
    import unicodedata
    nfc, nfd = unicodedata.normalize("NFC", "José"), unicodedata.normalize("NFD", "José")
    assert nfc != nfd
    zpath = write_zip(tmp_path / "class.zip", {f"{nfc}/{ASSIGNMENT}/notes.pdf": b"%PDF",
                                               f"{nfd}/{ASSIGNMENT}/answers.docx": b"PK",
                                               f"bo/{ASSIGNMENT}/x.txt": b"x"})
    out = tmp_path / "out"
    cli("--course", course, "grade", zpath, "--out", out, "--no-progress")
    rows = grades(out)
    assert sorted(rows) == [("Jos\u00e9", ASSIGNMENT), ("bo", ASSIGNMENT)]
    row = rows[(nfc, ASSIGNMENT)]
    assert "answers.docx" in row["status"] and "notes.pdf" in row["status"]
    assert "NFC" in row["notes"] and "NFD" in row["notes"] and "print the same" in row["notes"]
    # an LMS zip: Moodle's names, one participant id in two forms
    zpath = write_zip(tmp_path / "moodle.zip", {
        f"{nfc}_1002_assignsubmission_file_/{NOTEBOOK}": tagged(blank, "nfc"),
        f"{nfd}_1002_assignsubmission_file_/data.txt": b"1"})
    [sub] = collect(zpath, [ASSIGNMENT], tmp_path / "u", NAMES)
    assert sub.student == f"{nfc}_1002" and len(sub.notebooks) == 1
    assert any("NFD" in n for n in sub.notes)


def test_the_canvas_gradebook_says_whose_an_uncertain_upload_may_be(tmp_path):
    """The rejected row of 'smith_2_12345_67890_toy.ipynb' fills no one's cell; the gradebook,
    as the roster, says which reading it fits (ID 12345 is 'Smith_2'; ID 2 is Amy Lee)."""
    from autograder.grading.grade import Result, write_csv
    out = tmp_path / "graded"
    out.mkdir()
    unsure = f"smith_2_12345_67890_{NOTEBOOK} (owner not certain)"
    write_csv(out / "grades.csv", [
        Result(unsure, ASSIGNMENT, score=0, max_score=6, status="rejected: owner not certain"),
        Result("leeamy_2", ASSIGNMENT, score=6, max_score=6)], [])
    book = tmp_path / "Grades-ML_101.csv"
    book.write_bytes(("Student,ID,SIS User ID,SIS Login ID,Section,01 Toy (77)\r\n"
                      "    Points Possible,,,,,10.00\r\n"
                      '"Lee, Amy",2,S1,alee,"ML 101",\r\n'
                      'Smith_2,12345,S2,asmith,"ML 101",\r\n').encode())
    term = tmp_path / "term.toml"
    term.write_text(f'[lessons.{ASSIGNMENT}]\nlms_column = "01 Toy (77)"\n')
    dest = tmp_path / "upload.csv"
    run = cli("export", out, "--lms", "canvas", "--gradebook", book, "--term", term, "--out", dest)
    assert run.returncode == 3, run.stdout + run.stderr
    rows = list(csv.reader(io.StringIO(dest.read_text(encoding="utf-8"))))
    assert rows[2][5] == "10" and rows[3][5] == "", rows
    assert f"{unsure}: the gradebook's row 'Smith_2' (ID 12345) fits its reading as smith_2_12345" \
        in run.stdout
