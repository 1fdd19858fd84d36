"""`export`: grades back into the gradebook file each LMS downloads (issue 24, item 4).

Each test writes a gradebook in the LMS's documented layout (header rows, totals and other
columns, a student with no submission, a test student), a grades.csv as a graded zip of that LMS
gives it (ids ``smithann_12345``, ``Ann Smith_1001``, ``jsmith``) and a term file; the expected
file is computed cell by cell from the rule (score / max_score x the column's points, every other
cell as it was) and compared with what export wrote, then the bytes outside the filled cells.
The slow test grades a real Canvas, Moodle and Blackboard zip of the toy course and exports each.
"""
import csv
import io
import zipfile
from pathlib import Path

import pytest

from autograder.lms import layouts as lms
from autograder.cli import main
from autograder.term.export import ExportError, export_gradebook, format_export, read_table, term_for
from autograder.engine.feedback import _GRADE_BOX
from autograder.grading.grade import Result, write_csv
from autograder.ids import FORMULA_PREFIXES, folder_name

TERM = """
[lessons.01_running_sum]
lms_column = "{c1}"
[lessons.02_fixed_state_recall]
lms_column = "{c2}"
"""


def graded_class(tmp_path: Path, scores: dict, pages=True) -> Path:
    """DIR with grades.csv ((student, lesson) -> (score, max)) and a feedback page per row."""
    out = tmp_path / "graded"
    out.mkdir()
    results = [Result(s, a, score=sc, max_score=mx) for (s, a), (sc, mx) in scores.items()]
    write_csv(out / "grades.csv", results, [])
    for (s, a) in scores:
        if pages:
            page = out / "feedback" / folder_name(s) / a / f"{a}.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(f"<html><body>feedback for {s} on {a}</body></html>")
    return out


def term_file(tmp_path: Path, c1: str, c2: str, out: Path):
    path = tmp_path / "term.toml"
    path.write_text(TERM.format(c1=c1, c2=c2))
    return term_for(path, out)


def lms_class(tmp_path: Path, scores: dict, name: str, data: bytes, c1: str, c2: str) -> tuple:
    """(DIR, gradebook path, term, scores): a graded class and the LMS's file ``name``."""
    out = graded_class(tmp_path, scores)
    book = tmp_path / name
    book.write_bytes(data)
    return out, book, term_file(tmp_path, c1, c2, out), scores


def parse(data: bytes, codec: str, delimiter=",") -> list:
    return list(csv.reader(io.StringIO(data.decode(codec), newline=""), delimiter=delimiter))


def expected_cells(original: list, fills: dict) -> list:
    """The original rows with fills ((row index, column index) -> points) applied."""
    rows = [list(r) for r in original]
    for (r, c), value in fills.items():
        rows[r][c] = value
    return rows


def assert_cells(got: list, want: list):
    """Every cell equal; a number written by export equal to the rule's to 2 decimals."""
    assert len(got) == len(want), (len(got), len(want))
    for r, (g, w) in enumerate(zip(got, want)):
        assert len(g) == len(w), (r, g, w)
        for c, (gc, wc) in enumerate(zip(g, w)):
            if isinstance(wc, float):
                assert float(gc.replace(",", ".")) == pytest.approx(wc, abs=0.005), (r, c, gc, wc)
                assert not gc.startswith(FORMULA_PREFIXES)
            else:
                assert gc == wc, (r, c, gc, wc)


def unchanged_lines(before: bytes, after: bytes, codec: str, changed_rows: set):
    """The physical lines of every row not filled are byte for byte the same."""
    a = before.decode(codec).splitlines(keepends=True)
    b = after.decode(codec).splitlines(keepends=True)
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        if i not in changed_rows:
            assert x == y, (i, x, y)


# ------------------------------------------------------------------------------------ Canvas

CANVAS = (
    "Student,ID,SIS User ID,SIS Login ID,Section,01 Running sum (1234),"
    "02 What a fixed state cannot hold (1235),Notebooks Current Points,Notebooks Final Points,"
    "Current Score,Unposted Current Score,Final Score,Unposted Final Score\r\n"
    "    Points Possible,,,,,10.00,20.00,(read only),(read only),(read only),(read only),"
    "(read only),(read only)\r\n"
    "    Muted,,,,,,Muted,,,,,,\r\n"
    '"Smith, Ann",12345,S001,asmith,"ML 101, Section A",3.00,,3.00,3.00,10.00,10.00,10.00,10.00\r\n'
    '"Doe, John",222,S002,jdoe,"ML 101, Section A",,,,,,,,\r\n'
    '"Lee, Amy",9,S003,alee,"ML 101, Section B",7.00,15.00,22.00,22.00,73.33,73.33,73.33,73.33\r\n'
    '"Smith, Ann",777,S004,asmith2,"ML 101, Section B",,,,,,,,\r\n'
    '"Student, Test",999,,,"ML 101, Section A",,,,,,,,\r\n'
)


@pytest.fixture
def canvas(tmp_path):
    scores = {("smithann_12345", "01_running_sum"): (4.5, 6), ("smithann_12345", "02_fixed_state_recall"): (6, 6),
              ("doejohn_222", "01_running_sum"): (0, 6), ("smithann_777", "02_fixed_state_recall"): (1, 3),
              ("bob", "01_running_sum"): (6, 6), ("smithann_12345", "03_gates_and_delta_rule"): (2, 4)}
    # 02 is named by its Canvas id only: the assignment was renamed since the term file was written
    return lms_class(tmp_path, scores, "2026-12-01T1200_Grades-ML_101.csv",
                     b"\xef\xbb\xbf" + CANVAS.encode(), "01 Running sum (1234)", "Fixed state (1235)")


def test_canvas_every_cell_is_the_rule_and_the_rest_is_byte_for_byte(canvas, tmp_path):
    out, book, term, scores = canvas
    dest = tmp_path / "upload.csv"
    result = export_gradebook(out, "canvas", book, dest, term=term)
    before, after = book.read_bytes(), dest.read_bytes()
    assert after.startswith(b"\xef\xbb\xbf") and b"\r\n" in after and after.count(b"\n") == before.count(b"\n")
    original = parse(before, "utf-8-sig")
    row = {r[1]: i for i, r in enumerate(original)}   # Canvas user id -> row
    col = {"01_running_sum": 5, "02_fixed_state_recall": 6}
    points = {5: 10.0, 6: 20.0}
    fills = {}
    for (student, lesson), (score, mx) in scores.items():
        user_id = student.rsplit("_", 1)[-1]
        if user_id in row and lesson in col:
            fills[(row[user_id], col[lesson])] = score / mx * points[col[lesson]]
    assert len(fills) == 4      # Ann (two lessons), John, the other Ann Smith
    assert_cells(parse(after, "utf-8-sig"), expected_cells(original, fills))
    unchanged_lines(before, after, "utf-8-sig", {r for r, _ in fills})
    assert result.unmatched_students == ["bob"]
    assert "03_gates_and_delta_rule" in result.unmatched_lessons
    assert result.kept == ["Lee, Amy", "Student, Test"]     # no submission: as the LMS had them
    assert result.changed == 4
    text = format_export(result)
    assert "'01 Running sum (1234)' (10 points)" in text and "bob" in text and "Lee, Amy" in text
    assert "03_gates_and_delta_rule" in text
    assert "smithann_12345 -> 'Smith, Ann' (row 4): 01_running_sum 7.5, 02_fixed_state_recall 20" in text
    assert "smithann_777 -> 'Smith, Ann' (row 7): 02_fixed_state_recall 6.67" in text


def semicolon_resave(text: str) -> str:
    """``text`` as a spreadsheet in a decimal-comma locale saves it: ';' between cells, every
    number with a decimal comma ('10,00'), quotes only where a cell holds ';' or a quote."""
    buf = io.StringIO()
    w = csv.writer(buf, delimiter=";", lineterminator="\r\n")
    for row in csv.reader(io.StringIO(text, newline="")):
        w.writerow([c.replace(".", ",") if c.replace(".", "", 1).isdigit() else c for c in row])
    return buf.getvalue()


@pytest.mark.parametrize("codec", ["utf-8-sig", "cp1252"])
def test_a_semicolon_gradebook_with_decimal_commas_is_filled_in_kind(canvas, tmp_path, codec):
    out, _, term, scores = canvas
    text = semicolon_resave(CANVAS.replace("Lee, Amy", "Lée, Amy"))
    book = tmp_path / "Grades-ML_101;semicolons.csv"
    book.write_bytes(text.encode(codec))
    dest = tmp_path / "upload.csv"
    result = export_gradebook(out, "canvas", book, dest, term=term)
    before, after = book.read_bytes(), dest.read_bytes()
    original = parse(before, codec, ";")
    assert original[1][5:7] == ["10,00", "20,00"] and original[5][0] == "Lée, Amy"
    row = {r[1]: i for i, r in enumerate(original)}
    col, points = {"01_running_sum": 5, "02_fixed_state_recall": 6}, {5: 10.0, 6: 20.0}
    fills = {(row[st.rsplit("_", 1)[-1]], col[le]): sc / mx * points[col[le]]
             for (st, le), (sc, mx) in scores.items()
             if st.rsplit("_", 1)[-1] in row and le in col}
    assert len(fills) == 4 and len(result.filled) == 4
    got = parse(after, codec, ";")
    assert_cells(got, expected_cells(original, fills))
    assert all("," in got[r][c] or got[r][c].isdigit() for r, c in fills)   # '7,5', '6,67', '20'
    assert got[3][5] == "7,5"
    unchanged_lines(before, after, codec, {r for r, _ in fills})


def test_lesson_limits_canvas_to_one_column(canvas, tmp_path):
    out, book, term, _ = canvas
    result = export_gradebook(out, "canvas", book, tmp_path / "o.csv", term=term, lesson="02_fixed_state_recall")
    assert sorted(result.filled) == [("smithann_12345", "02_fixed_state_recall"),
                                     ("smithann_777", "02_fixed_state_recall")]
    assert parse((tmp_path / "o.csv").read_bytes(), "utf-8-sig")[3][5] == "3.00"   # 01 as it was
    with pytest.raises(ExportError, match="--lesson 05_inattention: grades.csv has no grades"):
        export_gradebook(out, "canvas", book, tmp_path / "o.csv", term=term, lesson="05_inattention")


def test_two_ids_for_one_gradebook_row_fill_neither_and_need_you(tmp_path):
    """Never first-wins (issue 52): both are held, the cell stays as Canvas gave it."""
    out, book, term, _ = lms_class(tmp_path, {("smithann_12345", "01_running_sum"): (6, 6),
                                              ("annsmith_12345", "01_running_sum"): (0, 6)},
                                   "g.csv", CANVAS.encode(), "(1234)", "(1235)")
    for undecided in (False, True):
        result = export_gradebook(out, "canvas", book, tmp_path / "o.csv", term=term,
                                  send_undecided=undecided)
        assert result.filled == {} and result.needs_you
        assert parse((tmp_path / "o.csv").read_bytes(), "utf-8")[3][5] == "3.00"
        assert sorted(s for s, _, _ in result.held) == ["annsmith_12345", "smithann_12345"]
        assert "NEEDS YOU (2)" in format_export(result)


def test_canvas_a_filled_cell_keeps_its_quoting_and_a_row_the_scanner_cannot_follow(tmp_path):
    out = graded_class(tmp_path, {("smithann_12345", "01_running_sum"): (3, 6),
                                  ("leeamy_9", "01_running_sum"): (6, 6),
                                  ("oddly_31", "01_running_sum"): (6, 6)})
    text = ('Student,ID,SIS User ID,SIS Login ID,Section,01 Running sum (1234)\n'
            '    Points Possible,,,,,5\n'
            '"Smith, Ann","12345",,,A,"1"\n'
            'Amy 5" Lee,9,,,B,\n'
            '"=HYPERLINK(""x"")",4,,,B,2\n'
            '"Odd"ly,31,,,B,\n')
    book = tmp_path / "g.csv"
    book.write_text(text, newline="")
    term = term_file(tmp_path, "01 Running sum", "x", out)
    export_gradebook(out, "canvas", book, tmp_path / "o.csv", term=term)
    lines = (tmp_path / "o.csv").read_bytes().decode().split("\n")
    assert lines[2] == '"Smith, Ann","12345",,,A,"2.5"'          # quoted as the cell was
    assert lines[3] == 'Amy 5" Lee,9,,,B,5'                      # a quote inside a cell kept
    assert lines[4] == '"=HYPERLINK(""x"")",4,,,B,2'             # the LMS's own cell untouched
    assert lines[5] == 'Oddly,31,,,B,5'     # a cell csv reads otherwise than it is written: the row rewritten
    assert "\r" not in (tmp_path / "o.csv").read_bytes().decode()


def test_canvas_feedback_zip_one_page_per_student_per_lesson(canvas, tmp_path):
    out, book, term, scores = canvas
    z = tmp_path / "feedback.zip"
    result = export_gradebook(out, "canvas", book, tmp_path / "o.csv", term=term, feedback=z)
    with zipfile.ZipFile(z) as zf:
        names = sorted(zf.namelist())
        assert names == sorted(result.feedback) == [
            "01_running_sum/Doe, John (doejohn_222).html",
            "01_running_sum/Smith, Ann (smithann_12345).html",
            "02_fixed_state_recall/Smith, Ann (smithann_12345).html",
            "02_fixed_state_recall/Smith, Ann (smithann_777).html"]
        for name in names:
            lesson, rest = name.split("/")
            student = rest.rsplit("(", 1)[1][:-len(").html")]
            page = (out / "feedback" / student / lesson / f"{lesson}.html").read_text()
            sent = zf.read(name).decode()
            # headed by the grade as the gradebook shows it: the cell's text, of the column's points
            score, mx = scores[(student, lesson)]
            points = {"01_running_sum": 10, "02_fixed_state_recall": 20}[lesson]
            cell = result.filled[(student, lesson)]
            assert float(cell) == pytest.approx(score / mx * points, abs=0.005)
            assert f"in Canvas: <span class='lms-score'>{cell}</span> of {points}</strong>" in sent
            assert _GRADE_BOX.sub("", sent) == page, "the rest of the page as graded"


def test_not_a_canvas_gradebook_or_grades_is_a_clear_error(canvas, tmp_path, capsys):
    out, book, term, _ = canvas
    other = tmp_path / "moodle.csv"
    other.write_text("Identifier,Full name,Grade,Maximum Grade\nParticipant 1,A,,10\n")
    with pytest.raises(ExportError, match=r"moodle\.csv is not a Canvas gradebook export.*'ID'"):
        export_gradebook(out, "canvas", other, tmp_path / "o.csv", term=term)
    no_points = tmp_path / "np.csv"
    no_points.write_text("Student,ID,SIS User ID,SIS Login ID,Section,A (1)\nx,1,,,,\n")
    with pytest.raises(ExportError, match="Points Possible"):
        export_gradebook(out, "canvas", no_points, tmp_path / "o.csv", term=term)
    (out / "grades.csv").write_text("student_id,assignment,score,max_score\nann,01_running_sum,x,6\n")
    with pytest.raises(ExportError, match=r"grades\.csv, row 2, column score: 'x'"):
        export_gradebook(out, "canvas", book, tmp_path / "o.csv", term=term)
    assert main(["export", str(tmp_path / "nowhere"), "--lms", "canvas", "--gradebook", str(book),
                 "--out", str(tmp_path / "o.csv")]) == 2
    assert "No grades.csv" in capsys.readouterr().err


def test_the_command_prints_matches_and_misses(canvas, tmp_path, capsys):
    out, book, _, _ = canvas
    (tmp_path / "t.toml").write_text(TERM.format(c1="01 Running sum (1234)", c2="(1235)"))
    dest = tmp_path / "o.csv"
    # bob, graded, has no row in the gradebook: exit 3 until the instructor says it is meant
    assert main(["export", str(out), "--lms", "canvas", "--gradebook", str(book), "--out", str(dest),
                 "--term", str(tmp_path / "t.toml")]) == 3
    assert "1 graded student(s) not in the gradebook" in capsys.readouterr().err
    assert main(["export", str(out), "--lms", "canvas", "--gradebook", str(book), "--out", str(dest),
                 "--term", str(tmp_path / "t.toml"), "--send-undecided"]) == 0
    printed = capsys.readouterr().out
    assert "lesson 01_running_sum -> column '01 Running sum (1234)'" in printed
    assert "lesson 02_fixed_state_recall -> column '02 What a fixed state cannot hold (1235)'" in printed
    assert "NOT FOUND in the gradebook (1 student(s)" in printed and "bob" in printed
    assert "kept as the LMS had (2 student(s)" in printed
    assert dest.is_file()


def test_export_holds_back_what_no_one_decided(tmp_path, capsys):
    """An undecided manual review and rejected work keep the cell the LMS gave (blank), are
    listed with why, and make export exit 3; overrides.csv deciding them, or --send-undecided,
    lets them through. Every other cell is the rule's: score / max x the column's points."""
    from autograder.term.policy import Override
    out = tmp_path / "graded"
    out.mkdir()
    results = [Result("smithann_12345", "01_running_sum", score=6, max_score=6,
                      status="needs manual review: the kernel printed a score"),
               Result("doejohn_222", "01_running_sum", score=0, max_score=6,
                      status="rejected: no .ipynb file in the submission folder (found: hw.docx)"),
               Result("leeamy_9", "01_running_sum", score=3, max_score=6),
               Result("smithann_777", "01_running_sum", score=0, max_score=6,
                      status="needs manual review: timed out in the harness")]
    decided = [Override("smithann_777", "01_running_sum", "", 2.0, "read by hand")]
    write_csv(out / "grades.csv", results, [], overrides=decided)
    book = tmp_path / "canvas.csv"
    book.write_bytes(CANVAS.encode())
    term = term_file(tmp_path, "01 Running sum (1234)", "(1235)", out)
    before = parse(CANVAS.encode(), "utf-8")
    rows = {r[1]: i for i, r in enumerate(before)}      # Canvas user id -> row index
    col = before[0].index("01 Running sum (1234)")

    held = export_gradebook(out, "canvas", book, tmp_path / "held.csv", term=term)
    assert sorted((s, why.split(" (")[0]) for s, _, why in held.held) == [
        ("doejohn_222", "rejected, not graded"), ("smithann_12345", "manual review undecided")]
    assert_cells(parse((tmp_path / "held.csv").read_bytes(), "utf-8"), expected_cells(before, {
        (rows["9"], col): 3 / 6 * 10, (rows["777"], col): 2 / 6 * 10}))
    printed = format_export(held)
    assert "HELD BACK (1 manual review undecided, 1 rejected, not graded)" in printed
    assert "the kernel printed a score" in printed and "hw.docx" in printed
    assert "kept as the LMS had" in printed and "Doe, John" not in printed.split("kept as")[1]

    args = ["export", str(out), "--lms", "canvas", "--gradebook", str(book), "--term", str(term.path)]
    assert main(args + ["--out", str(tmp_path / "a.csv")]) == 3
    assert "2 grade(s) held back" in capsys.readouterr().err
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "held.csv").read_bytes()
    assert main(args + ["--out", str(tmp_path / "b.csv"), "--send-undecided"]) == 0
    assert "SENT UNDECIDED" in capsys.readouterr().out
    assert_cells(parse((tmp_path / "b.csv").read_bytes(), "utf-8"), expected_cells(before, {
        (rows["9"], col): 3 / 6 * 10, (rows["777"], col): 2 / 6 * 10,
        (rows["12345"], col): 10.0, (rows["222"], col): 0.0}))

    decided += [Override("smithann_12345", "01_running_sum", "", 5.0, "fine"),
                Override("doejohn_222", "01_running_sum", "", 0.0, "sent a .docx")]
    write_csv(out / "grades.csv", results, [], overrides=decided)
    assert main(args + ["--out", str(tmp_path / "c.csv")]) == 0
    assert_cells(parse((tmp_path / "c.csv").read_bytes(), "utf-8"), expected_cells(before, {
        (rows["9"], col): 3 / 6 * 10, (rows["777"], col): 2 / 6 * 10,
        (rows["12345"], col): 5 / 6 * 10, (rows["222"], col): 0.0}))


def test_without_term_the_recorded_term_file_is_used_whole(canvas, tmp_path, capsys):
    """DIR/term-file.txt (written by grade/report --term) gives the late rules and the
    lms_column alike: export without --term fills what export with that --term fills."""
    from autograder.term.termfile import TERM_RECORD
    out, book, _, _ = canvas
    term = tmp_path / "recorded.toml"
    term.write_text(TERM.format(c1="01 Running sum (1234)", c2="(1235)"))
    (out / TERM_RECORD).write_text(f"{term.resolve()}\n")
    with_term = export_gradebook(out, "canvas", book, tmp_path / "a.csv", term=term_for(term, out))
    recorded = export_gradebook(out, "canvas", book, tmp_path / "b.csv")
    assert recorded.filled == with_term.filled and len(recorded.filled) == 4
    assert not recorded.unmatched_lessons.get("01_running_sum")
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert recorded.term_recorded and recorded.term_file == term.resolve()
    dest = tmp_path / "o.csv"
    assert main(["export", str(out), "--lms", "canvas", "--gradebook", str(book),
                 "--out", str(dest)]) == 3     # bob is not in the gradebook
    printed = capsys.readouterr().out
    assert f"with the term file {term.resolve()} (recorded in DIR/term-file.txt" in printed
    assert "NOT FILLED: lesson 01_running_sum" not in printed and "4 cell(s) filled" in printed
    assert "NOT FILLED: lesson 03_gates_and_delta_rule: no lms_column" in printed  # none in it
    term.unlink()       # a recorded file that is gone stops export, as it stops report
    assert main(["export", str(out), "--lms", "canvas", "--gradebook", str(book),
                 "--out", str(dest)]) == 2
    assert "which is gone" in capsys.readouterr().err


def test_an_export_that_fills_nothing_says_so_and_exits_2(canvas, tmp_path, capsys):
    out, book, _, _ = canvas     # no --term, none recorded: no column is named after a lesson
    dest = tmp_path / "o.csv"
    assert main(["export", str(out), "--lms", "canvas", "--gradebook", str(book),
                 "--out", str(dest)]) == 2
    said = capsys.readouterr()
    assert "NOTHING FILLED: no grade was written" in said.out
    assert "no term file (no --term, none recorded in DIR/term-file.txt)" in said.out
    assert "upload it to" not in said.out and "nothing in it to upload" in said.out
    assert "error: no grade filled" in said.err
    assert dest.read_bytes() == book.read_bytes()


def test_students_the_gradebook_lacks_are_named_with_how_a_row_is_found(tmp_path, capsys):
    """Lessons matched to their columns, but no student of grades.csv has a row (ids that carry
    no Canvas user id): the lines say how a row is found, no --term advice is given when the term
    did its part, and no feedback zip is left behind for an export with nothing to upload."""
    out = graded_class(tmp_path, {("theo_pad_right", "01_running_sum"): (5, 6)})
    book = tmp_path / "canvas.csv"
    book.write_text(CANVAS)
    (tmp_path / "t.toml").write_text(TERM.format(c1="01 Running sum (1234)", c2="(1235)"))
    dest, zpath = tmp_path / "o.csv", tmp_path / "feedback.zip"
    assert main(["export", str(out), "--lms", "canvas", "--gradebook", str(book), "--out", str(dest),
                 "--term", str(tmp_path / "t.toml"), "--feedback", str(zpath)]) == 2
    said = capsys.readouterr().out
    assert "a student's row is found by the number that ends the student id" in said
    assert "no student of grades.csv has a row there" in said and "give --term" not in said
    assert not zpath.exists() and f"no feedback zip written to {zpath}" in said


# ------------------------------------------------------------------------------------ Moodle

MOODLE = (
    "Identifier,\"Full name\",\"Email address\",Status,Grade,\"Maximum Grade\","
    "\"Grade can be changed\",\"Last modified (submission)\",\"Last modified (grade)\","
    "\"Feedback comments\"\n"
    "\"Participant 1001\",\"Ann Smith\",ann@example.edu,\"Submitted for grading\",,100.00,Yes,"
    "\"Monday, 5 October 2026, 10:00 AM\",-,\n"
    "\"Participant 1002\",\"José Núñez\",jose@example.edu,\"Submitted for grading - Graded\","
    "55.00,100.00,Yes,\"Monday, 5 October 2026, 11:00 AM\",\"Tuesday, 6 October 2026, 9:00 AM\","
    "\"<p>Good start</p>\"\n"
    "\"Participant 1003\",\"Bo Li\",bo@example.edu,\"No submission\",,100.00,Yes,-,-,\n"
    "\"Participant 1004\",\"Kim Park\",kim@example.edu,\"Submitted for grading\",,\"7,50\",Yes,"
    "\"Monday, 5 October 2026, 12:00 AM\",-,\n"
)


@pytest.fixture
def moodle(tmp_path):
    scores = {("Ann Smith_1001", "01_running_sum"): (5, 6), ("José Núñez_1002", "01_running_sum"): (6, 6),
              ("Kim Park_1004", "01_running_sum"): (3, 6), ("Zed Ray_2000", "01_running_sum"): (1, 6),
              ("Ann Smith_1001", "02_fixed_state_recall"): (1, 6)}
    return lms_class(tmp_path, scores, "Grades-ML 101-01 Running sum-77.csv",   # Moodle's own name
                     MOODLE.encode(), "01 Running sum", "02 Fixed state")


def test_moodle_worksheet_filled_for_the_lesson_its_file_is_named_after(moodle, tmp_path):
    out, book, term, scores = moodle
    dest = tmp_path / "upload.csv"
    result = export_gradebook(out, "moodle", book, dest, term=term)
    before, after = book.read_bytes(), dest.read_bytes()
    original = parse(before, "utf-8")
    head = original[0]
    grade, maximum = head.index("Grade"), head.index("Maximum Grade")
    row = {r[0].split()[-1]: i for i, r in enumerate(original[1:], start=1)}   # participant id
    fills = {}
    for (student, lesson), (score, mx) in scores.items():
        pid = student.rsplit("_", 1)[1]
        if lesson == "01_running_sum" and pid in row:
            fills[(row[pid], grade)] = score / mx * float(original[row[pid]][maximum].replace(",", "."))
    assert len(fills) == 3
    got = parse(after, "utf-8")
    assert_cells(got, expected_cells(original, fills))
    assert got[row["1004"]][grade] == "3,75"      # the worksheet's decimal comma kept
    unchanged_lines(before, after, "utf-8", {r for r, _ in fills})
    assert not after.startswith(b"\xef\xbb\xbf")
    assert list(result.columns) == ["01_running_sum"]
    assert result.unmatched_students == ["Zed Ray_2000"] and result.kept == ["Bo Li"]


def test_moodle_needs_one_lesson(moodle, tmp_path):
    out, book, term, _ = moodle
    plain = tmp_path / "worksheet.csv"
    plain.write_bytes(book.read_bytes())
    with pytest.raises(ExportError, match="--lesson"):
        export_gradebook(out, "moodle", plain, tmp_path / "o.csv", term=term)
    result = export_gradebook(out, "moodle", plain, tmp_path / "o.csv", term=term,
                              lesson="02_fixed_state_recall")
    assert list(result.filled) == [("Ann Smith_1001", "02_fixed_state_recall")]
    assert float(parse((tmp_path / "o.csv").read_bytes(), "utf-8")[1][4]) == pytest.approx(100 / 6, abs=0.005)


def test_moodle_headers_match_ignoring_case_and_spaces(moodle, tmp_path):
    """Moodle's English worksheet writes "Maximum Grade"; other versions and language packs
    differ in case, and a re-saved file may pad a header with spaces."""
    out, book, term, _ = moodle
    odd = tmp_path / "Grades-ML 101-01 Running sum-78.csv"
    odd.write_text(MOODLE.replace('Identifier,', 'identifier,', 1)
                   .replace(',Grade,', ', GRADE ,', 1)
                   .replace('"Maximum Grade"', '" maximum grade "', 1)
                   .replace('"Full name"', '"Full Name"', 1), encoding="utf-8")
    want = export_gradebook(out, "moodle", book, tmp_path / "a.csv", term=term)
    got = export_gradebook(out, "moodle", odd, tmp_path / "b.csv", term=term)
    assert got.filled == want.filled and len(got.filled) == 3
    assert got.kept == ["Bo Li"]          # "Full Name" still gives the display name
    assert parse((tmp_path / "b.csv").read_bytes(), "utf-8")[1:] == \
        parse((tmp_path / "a.csv").read_bytes(), "utf-8")[1:]
    no_max = tmp_path / "no-max.csv"
    no_max.write_text(MOODLE.replace('"Maximum Grade"', '"Maximum"', 1))
    with pytest.raises(ExportError, match="no 'Maximum Grade' column"):
        export_gradebook(out, "moodle", no_max, tmp_path / "c.csv", term=term,
                         lesson="01_running_sum")


def test_moodle_feedback_zip_has_its_download_folders(moodle, tmp_path):
    out, book, term, _ = moodle
    z = tmp_path / "feedback.zip"
    export_gradebook(out, "moodle", book, tmp_path / "o.csv", term=term, feedback=z)
    with zipfile.ZipFile(z) as zf:
        names = sorted(zf.namelist())
        assert names == ["Ann Smith_1001_assignsubmission_file_/01_running_sum_feedback.html",
                         "José Núñez_1002_assignsubmission_file_/01_running_sum_feedback.html",
                         "Kim Park_1004_assignsubmission_file_/01_running_sum_feedback.html"]
        for name in names:
            # Moodle's importer: fullname_participantid_plugintype_pluginname_ per path part
            full, pid, ptype, pname, _ = name.split("/")[0].split("_", 4)
            assert pid.isdigit() and (ptype, pname) == ("assignsubmission", "file")
            page = (out / "feedback" / f"{full}_{pid}" / "01_running_sum" / "01_running_sum.html").read_text()
            sent = zf.read(name).decode()
            assert "Your grade for 01_running_sum in Moodle: <span class='lms-score'>" in sent
            assert _GRADE_BOX.sub("", sent) == page
    # and the names read back as the same students, the way collect reads a Moodle zip
    layout, files, _ = lms.match_layout([n.replace(".html", ".ipynb") for n in names])
    assert layout == "Moodle" and sorted(f.student for f in files) == [
        "Ann Smith_1001", "José Núñez_1002", "Kim Park_1004"]


# -------------------------------------------------------------------------------- Blackboard

BB_HEAD = ["Last Name", "First Name", "Username", "Student ID", "Last Access", "Availability",
           "Weighted Total [Total Pts: up to 0 Percentage] |101",
           "Total [Total Pts: up to 30 Score] |102", "01 Running sum [Total Pts: 10 Score] |103",
           "02 Fixed state [Total Pts: 20 Percentage] |104", "Notes |105"]
BB_ROWS = [["Smith", "John", "jsmith", "S001", "2026-10-05 10:00:00", "Available", "", "", "", "", ""],
           ["Kim", "Alex", "akim", "S002", "2026-10-05 11:00:00", "Available", "40.00%", "12", "8.00",
            "", "late"],
           ["Park", "Jo", "jpark", "S003", "", "Available", "25.00%", "5.00", "5.00", "", ""]]


@pytest.fixture
def blackboard(tmp_path):
    scores = {("jsmith", "01_running_sum"): (6, 6), ("AKim", "01_running_sum"): (3, 6),
              ("jsmith", "02_fixed_state_recall"): (3, 6), ("nobody", "01_running_sum"): (2, 6)}
    text = "".join("\t".join(f'"{c}"' for c in r) + "\r\n" for r in [BB_HEAD] + BB_ROWS)
    return lms_class(tmp_path, scores, "gc_ML101_fullgc_2026-12-01-12-00-00.xls",
                     b"\xff\xfe" + text.encode("utf-16-le"), "01 Running sum", "|104")  # as Blackboard writes it


def test_blackboard_utf16_tab_file_filled_by_user_name(blackboard, tmp_path):
    out, book, term, scores = blackboard
    dest = tmp_path / "upload.xls"
    result = export_gradebook(out, "blackboard", book, dest, term=term)
    before, after = book.read_bytes(), dest.read_bytes()
    assert after.startswith(b"\xff\xfe")
    original = parse(before[2:], "utf-16-le", "\t")
    users = {r[2]: i for i, r in enumerate(original)}
    fills = {}
    for (student, lesson), (score, mx) in scores.items():
        if student.lower() in users and lesson == "01_running_sum":
            fills[(users[student.lower()], 8)] = score / mx * 10
    assert len(fills) == 2
    assert_cells(parse(after[2:], "utf-16-le", "\t"), expected_cells(original, fills))
    unchanged_lines(before[2:], after[2:], "utf-16-le", {r for r, _ in fills})
    assert '"10"\t"0"' not in after[2:].decode("utf-16-le")
    assert '\t"10"\t' in after[2:].decode("utf-16-le")          # quoted like every cell
    assert "Percentage" in result.unmatched_lessons["02_fixed_state_recall"]
    assert result.unmatched_students == ["nobody"] and result.kept == ["Park, Jo"]


def test_blackboard_comma_file_and_feedback_zip(blackboard, tmp_path):
    out, _, term, _ = blackboard
    book = tmp_path / "gc.csv"
    book.write_text("".join(",".join(f'"{c}"' for c in r) + "\n" for r in [BB_HEAD] + BB_ROWS))
    z = tmp_path / "fb.zip"
    export_gradebook(out, "blackboard", book, tmp_path / "o.csv", term=term, feedback=z)
    got = list(csv.reader(open(tmp_path / "o.csv", newline="")))
    assert got[1][8] == "10" and got[2][8] == "5" and got[3][8] == "5.00"
    with zipfile.ZipFile(z) as zf:
        assert sorted(zf.namelist()) == ["01_running_sum/Kim, Alex (AKim).html",
                                         "01_running_sum/Smith, John (jsmith).html"]


def test_a_calculated_column_is_never_filled(blackboard, tmp_path):
    out, book, _, _ = blackboard
    (tmp_path / "t.toml").write_text(TERM.format(c1="Total", c2="Weighted Total"))
    term = term_for(tmp_path / "t.toml", out)
    result = export_gradebook(out, "blackboard", book, tmp_path / "o.xls", term=term)
    assert not result.filled and (tmp_path / "o.xls").read_bytes() == book.read_bytes()
    assert "calculated" in result.unmatched_lessons["01_running_sum"]


def test_read_table_keeps_what_it_read(tmp_path):
    p = tmp_path / "x.csv"
    p.write_bytes(b'a,b\r\n"multi\nline",2\r\n')
    t = read_table(p)
    assert [r.values for r in t.records] == [["a", "b"], ["multi\nline", "2"]]
    assert t.records[1].line == 2 and t.delimiter == ","
    p.write_bytes(b"")
    with pytest.raises(ExportError, match="empty"):
        read_table(p)


# ------------------------------------------------------------------ slow: a real graded zip

# per LMS: the zip's names (full marks, half marks), the gradebook, the cell of each of the two
# students (row, column) and the third student's untouched cell, the term's column
GRADED_ZIPS = {
    "canvas": (["smithann_12345_67890_toy.ipynb", "doejohn_LATE_222_333_toy.ipynb"],
               "Student,ID,SIS User ID,SIS Login ID,Section,Toy lesson (55),Final Score\n"
               "    Points Possible,,,,,12.00,(read only)\n"
               '"Smith, Ann",12345,,,A,,\n"Doe, John",222,,,A,,\n"Lee, Amy",9,,,A,4.00,\n',
               [(2, 5), (3, 5)], (4, 5, "4.00"), "Toy lesson (55)", ["smithann_12345", "doejohn_222"]),
    "moodle": (["Ann Smith_1001_assignsubmission_file_/toy.ipynb",
                "John Doe_1002_assignsubmission_file_/toy.ipynb"],
               "Identifier,Full name,Email address,Status,Grade,Maximum Grade,Grade can be changed,"
               "Last modified (submission),Last modified (grade),Feedback comments\n"
               "Participant 1001,Ann Smith,a@x.edu,Submitted for grading,,12.00,Yes,-,-,\n"
               "Participant 1002,John Doe,j@x.edu,Submitted for grading,,12.00,Yes,-,-,\n"
               "Participant 1003,Amy Lee,l@x.edu,No submission,4.00,12.00,Yes,-,-,\n",
               [(1, 4), (2, 4)], (3, 4, "4.00"), "Toy", ["Ann Smith_1001", "John Doe_1002"]),
    "blackboard": (["HW 1_asmith_attempt_2026-03-01-10-00-00_toy.ipynb",
                    "HW 1_jdoe_attempt_2026-03-01-11-00-00_toy.ipynb"],
                   '"Last Name","First Name","Username","Student ID","Toy lesson [Total Pts: 12 Score] |55"\n'
                   '"Smith","Ann","asmith","1",""\n"Doe","John","jdoe","2",""\n"Lee","Amy","alee","3","4.00"\n',
                   [(1, 4), (2, 4)], (3, 4, "4.00"), "Toy lesson", ["asmith", "jdoe"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("lms_name", sorted(GRADED_ZIPS))
def test_a_graded_lms_zip_goes_back_into_its_gradebook(tmp_path, lms_name):
    import nbformat

    from autograder.publishing.build import build
    from autograder.publishing.demo import student_notebook
    from autograder.grading.grade import grade_class
    from autograder.options import GradingOptions
    from toy_course import ADD_SOLUTION, ASSIGNMENT, MEAN_SOLUTION, MUL_SOLUTION, NOTEBOOK, make_toy_course

    names, gradebook, cells, untouched, column, students = GRADED_ZIPS[lms_name]
    course = make_toy_course(tmp_path / "course")
    build(course)
    lesson = nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    good = nbformat.writes(student_notebook(lesson, {"add": ADD_SOLUTION, "mul": MUL_SOLUTION,
                                                     "mean": MEAN_SOLUTION})).encode()
    half = nbformat.writes(student_notebook(lesson, {"mul": MUL_SOLUTION})).encode()
    zpath = tmp_path / "submissions.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        for name, nb in zip(names, (good, half)):
            zf.writestr(name, nb)
    out = tmp_path / "out"
    results = {r.student: r for r in grade_class(course, zpath, out, options=GradingOptions(cell_timeout=30),
                                                 progress=False, jobs=1)}
    assert sorted(results) == sorted(students)
    book = tmp_path / ("Grades-ML-Toy-5.csv" if lms_name == "moodle" else "gradebook.csv")
    book.write_text(gradebook)
    (tmp_path / "t.toml").write_text(f'[lessons.toy]\nlms_column = "{column}"\n')
    term = term_for(tmp_path / "t.toml", out)
    z = tmp_path / "fb.zip"
    export_gradebook(out, lms_name, book, tmp_path / "o.csv", term=term, feedback=z)
    got = list(csv.reader(open(tmp_path / "o.csv", newline="")))
    for (r, c), sid in zip(cells, students):
        assert float(got[r][c]) == pytest.approx(results[sid].score / results[sid].max_score * 12, abs=0.005)
    assert got[cells[0][0]][cells[0][1]] == "12" and float(got[cells[1][0]][cells[1][1]]) < 12
    assert got[untouched[0]][untouched[1]] == untouched[2]
    with zipfile.ZipFile(z) as zf:
        assert len(zf.namelist()) == 2


# The worksheet as Moodle writes it in each language (strings of the 3.11-4.5 language packs:
# recordid, fullname, email, status, gradenoun, maxgrade, gradecanbechanged,
# lastmodifiedsubmission, lastmodifiedgrade, assignfeedback_comments; dates by
# strftimedaydatetime; a German, French or Spanish sheet re-saved with ';' and decimal commas).
MOODLE_LANGS = {
    "de": ('ID;Vollständiger Name;E-Mail-Adresse;Status;Bewertung;Bestwertung;Bewertung kann geändert werden;'
           'Zuletzt geändert (Abgabe);Zuletzt geändert (Bewertung);Feedback als Kommentar\n',
           "Teilnehmer/in", "Ja", "Nein", "Montag, 5. Oktober 2026, 10:00", "5/10/26 11:00"),
    "fr": ('Identifiant;Nom complet;Adresse de courriel;Statut;Note;Note maximale;La note peut être modifiée;'
           'Dernière modification (travail remis);Dernière modification (note);Feedback par commentaires\n',
           "Participant", "Oui", "Non", "lundi 5 octobre 2026, 10:00", "5/10/2026 11:00"),
    "es": ('Identificador;Nombre completo;Dirección de correo;Estado;Calificación;Calificación máxima;'
           'La calificación puede ser cambiada;Última modificación (entrega);Última modificación (calificación);'
           'Comentarios de retroalimentación\n',
           "Participante", "Sí", "No", "lunes, 5 de octubre de 2026, 10:00", "5/10/26 11:00"),
}


@pytest.mark.parametrize("lang", sorted(MOODLE_LANGS))
def test_moodle_worksheets_in_german_french_and_spanish(tmp_path, lang):
    """Export fills the translated Grade column scaled to the translated Maximum Grade and names
    a locked row ('Grade can be changed' in the language's No: Moodle skips it); the submission times
    read in the worksheet's language, an all-number date day first (5/10 is 5 October)."""
    import datetime as dt

    from autograder.lms.moodle import moodle_submission_times
    head, who, yes, no, words, numbers = MOODLE_LANGS[lang]
    sheet = head + (f'{who} 1001;Ann Smith;a@x.edu;-;;10,00;{yes};"{words}";-;\n'
                    f'{who} 1002;Bo Li;b@x.edu;-;;10,00;{no};{numbers};-;\n'
                    f'{who} 1003;Cy Ng;c@x.edu;-;;10,00;{yes};-;-;\n')
    scores = {("Ann Smith_1001", "01_running_sum"): (3, 6), ("Bo Li_1002", "01_running_sum"): (6, 6)}
    out, book, term, _ = lms_class(tmp_path, scores, "Grades-ML 101-01 Running sum-77.csv",
                                   sheet.encode("utf-8"), "01 Running sum", "02 Fixed state")
    dest = tmp_path / "upload.csv"
    result = export_gradebook(out, "moodle", book, dest, term=term)
    got = parse(dest.read_bytes(), "utf-8", ";")
    assert got[1][4] == "5" and got[2][4] == "10" and got[3][4] == "", got   # 3/6 and 6/6 of 10
    assert sorted(result.filled) == [("Ann Smith_1001", "01_running_sum"), ("Bo Li_1002", "01_running_sum")]
    locked = [n for n in result.notes if "Grade can be changed" in n]
    assert len(locked) == 1 and locked[0].startswith("Bo Li_1002"), result.notes
    zone = dt.timezone(dt.timedelta(hours=2))
    times = moodle_submission_times(book, zone)
    assert times == {"1001": dt.datetime(2026, 10, 5, 10, 0, tzinfo=zone),
                     "1002": dt.datetime(2026, 10, 5, 11, 0, tzinfo=zone)}


def test_moodle_english_worksheet_dates_read_as_before(tmp_path):
    import datetime as dt

    from autograder.lms.moodle import moodle_submission_times
    sheet = tmp_path / "w.csv"
    sheet.write_text(MOODLE)
    times = moodle_submission_times(sheet, dt.timezone.utc)
    assert times["1001"] == dt.datetime(2026, 10, 5, 10, 0, tzinfo=dt.timezone.utc)
    assert times["1004"] == dt.datetime(2026, 10, 5, 0, 0, tzinfo=dt.timezone.utc)   # 12:00 AM
    assert "1003" not in times
    for vague in ("yesterday", "2 days ago", "October 2026", "soon"):
        sheet.write_text(f'Identifier,Last modified (submission)\nParticipant 1001,"{vague}"\n')
        with pytest.raises(ValueError, match="is not a date"):
            moodle_submission_times(sheet, dt.timezone.utc)
