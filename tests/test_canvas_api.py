"""`canvas pull` / `canvas push` against a stand-in Canvas on 127.0.0.1 (issue 41).

A class of 30 on the toy course: each student's notebook and submission time are served by the
stand-in (tests/canvas_standin.py, which names the Canvas API shapes it follows), pulled into a
folder, graded with a late rule (10% a started day; Grader.grade replaced by one that scores the
answers without a kernel, so the test stays fast: everything else, the folder read, timestamp.txt,
the term, the journal, report and feedback pages, is grade's own), then pushed. One student sends
a notebook that is not JSON (rejected) and one is left for manual review: those two are held back.
"""
import datetime as dt
import json
import sys

import nbformat
import pytest

import autograder.lms.canvas_api as canvas_mod
from autograder.publishing.build import build
from autograder.cli import main
from autograder.publishing.demo import student_notebook
from autograder.grading.grade import Grader, grade_class
from canvas_standin import StandIn
from toy_course import ADD_SOLUTION, ASSIGNMENT, MEAN_SOLUTION, MUL_SOLUTION, NOTEBOOK, make_toy_course

pytest.importorskip("canvasapi")
REAL_GRADE = Grader.grade

TOKEN = "7~SeCrEtToKeN4xQ9zL2mWvB8nR5tY1uI6oP3aS0dF"
AID, COURSE, POINTS = 77, 3, 10.0
DUE = dt.datetime(2026, 10, 1, 21, 59, tzinfo=dt.timezone.utc)
N = 30
REJECTED, REVIEW = 1007, 1013   # user ids: a notebook that is not JSON; a manual review


def answers(i: int) -> dict:
    return {"add": ADD_SOLUTION, **({"mul": MUL_SOLUTION} if i % 2 else {}),
            **({"mean": MEAN_SOLUTION} if i % 3 else {})}


def raw_score(i: int) -> float:
    return 2 + 3 * (i % 2 == 1) + 1 * (i % 3 != 0)


def hours_late(i: int) -> float:
    return [0, 0, 0, 5, 30, 200][i % 6] - (2 if i % 6 < 3 else 0)


def rule(i: int) -> float:
    """The grade the term's rule gives student i, on the assignment's 10 points."""
    h = hours_late(i)
    days = 0 if h <= 0 else -(-h // 24)
    raw = raw_score(i)
    score = 0 if days > 7 else raw - min(raw, raw * 0.1 * days)
    return round(round(score, 2) / 6 * POINTS, 2)


def fake_grade(self, job):
    """Score the answers as the toy tests would (add 2, mul 3, mean 1) without a kernel."""
    res = job.result
    src = "\n".join(c.source for nb in job.notebooks.values() for c in nb.cells)
    res.exercises = {"test_add": 2.0 * (ADD_SOLUTION in src), "test_mul": 3.0 * (MUL_SOLUTION in src),
                     "test_mean": 1.0 * (MEAN_SOLUTION in src)}
    res.score, res.max_score = sum(res.exercises.values()), 6.0
    if job.sub.student and "review" in "".join(job.notebooks[NOTEBOOK].cells[0].source):
        res.status = "needs manual review: a test cell was changed"
    page = self.out / "feedback" / job.sub.student / res.assignment / f"{ASSIGNMENT}.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(f"<html><body><h1>{res.score:g} / 6</h1>feedback</body></html>")
    res.feedback = [str(page)]
    return res


def serve(lesson_nb) -> StandIn:
    s = StandIn(TOKEN, COURSE, page_size=10).start()
    s.student_tokens.add("student-token")
    s.add_assignment(AID, "01 Toy", POINTS)
    for i in range(N):
        uid = 1000 + i
        s.add_user(uid, f"Student{i} Name{i}", f"s{i}@uni.example")
        nb = student_notebook(lesson_nb, answers(i))
        if uid == REVIEW:
            nb.cells[0].source += "\n(review)"
        data = b'{"cells": [ broken' if uid == REJECTED else nbformat.writes(nb).encode()
        when = DUE + dt.timedelta(hours=hours_late(i))
        s.submit(AID, uid, {f"{ASSIGNMENT}.ipynb": data}, when.strftime("%Y-%m-%dT%H:%M:%SZ"),
                 late=hours_late(i) > 0, attempt=1 + i % 2)
    s.add_user(1100, "Never Submitted", "nobody@uni.example")
    s.submit(AID, 1100)
    return s


@pytest.fixture(scope="module")
def term_class(tmp_path_factory):
    """The toy course built, the stand-in serving the class, the class pulled and graded."""
    tmp = tmp_path_factory.mktemp("canvas")
    course = make_toy_course(tmp / "course")
    build(course)
    lesson_nb = nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    standin = serve(lesson_nb)
    term = tmp / "term.toml"
    term.write_text(f'[lessons.{ASSIGNMENT}]\ndue = {DUE.isoformat()}\n'
                    f'lms_column = "01 Toy ({AID})"\n[late]\nper_day = 0.10\nzero_after_days = 7\n')
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CANVAS_TOKEN", TOKEN)
        mp.setattr(canvas_mod, "BACKOFF_S", 0.01)
        mp.setattr("autograder.grading.grade.Grader.grade", fake_grade)
        mp.chdir(course)
        outputs = []
        code = run_cli(outputs, ["canvas", "pull", str(COURSE), str(AID), "--out",
                                 str(tmp / "pulled"), "--url", standin.url, "--term", str(term)])
        assert code == 0, outputs
        from autograder.term.termfile import load_term
        results = grade_class(course, tmp / "pulled", tmp / "graded", progress=False,
                              term=load_term(term, {ASSIGNMENT}))
        yield {"course": course, "standin": standin, "tmp": tmp, "term": term, "mp": mp,
               "results": results, "outputs": outputs, "graded": tmp / "graded"}
    standin.stop()


def run_cli(outputs: list, argv: list) -> int:
    """main(argv), its stdout and stderr appended to ``outputs``."""
    import contextlib
    import io
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    outputs.append(out.getvalue() + err.getvalue())
    return code


def push(tc, *extra, url=None) -> tuple:
    code = run_cli(tc["outputs"], ["canvas", "push", str(tc["graded"]), str(COURSE), str(AID),
                                   "--url", url or tc["standin"].url, *extra])
    return code, tc["outputs"][-1]


def writes(standin: StandIn) -> list:
    return [(m, p) for m, p in standin.log if m in ("PUT", "POST")]


def test_pull_writes_a_folder_grade_reads_with_canvas_times(term_class):
    pulled, s = term_class["tmp"] / "pulled", term_class["standin"]
    out = term_class["outputs"][0]
    assert "30 submission(s) of lesson toy" in out and "NOTHING TO GRADE: nobody@uni.example_1100" in out
    assert "s4@uni.example_1004  submitted 2026-10-03T03:59:00Z  [Canvas: LATE]" in out
    assert "[Canvas: on time]" in out
    pages = [p for m, p in s.log if m == "GET" and p.endswith("/submissions")]
    assert len(pages) >= 4       # 31 submissions, 10 a page: the Link headers were followed
    stamp = (pulled / "s4@uni.example_1004" / ASSIGNMENT / "timestamp.txt").read_text()
    assert stamp == "2026-10-03 03:59:00.000000 UTC\n"
    manifest = json.loads((pulled / ".canvas-pull.json").read_text())
    assert manifest["students"]["s4@uni.example_1004"]["late"] is True
    by = {r.student: r for r in term_class["results"]}
    assert len(by) == N
    assert by["s4@uni.example_1004"].submitted_at == "2026-10-03T03:59:00+00:00"
    assert by[f"s7@uni.example_{REJECTED}"].status.startswith("rejected")


def test_pull_again_downloads_nothing_unchanged(term_class):
    s = term_class["standin"]
    before = len([p for m, p in s.log if "/download" in p])
    code = run_cli(term_class["outputs"], ["canvas", "pull", str(COURSE), str(AID), "--out",
                                           str(term_class["tmp"] / "pulled"), "--url", s.url,
                                           "--lesson", ASSIGNMENT])
    assert code == 0
    assert "0 file(s) downloaded now" in term_class["outputs"][-1]
    assert len([p for m, p in s.log if "/download" in p]) == before


def test_pull_again_takes_a_new_attempt_in_place_of_the_old(term_class, tmp_path):
    lesson_nb = nbformat.read(term_class["course"] / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    s = StandIn(TOKEN, COURSE).start()
    try:
        s.add_assignment(AID, "01 Toy", POINTS)
        s.add_user(3001, "Ann Smith", "asmith")
        first = nbformat.writes(student_notebook(lesson_nb, {})).encode()
        s.submit(AID, 3001, {NOTEBOOK: first}, "2026-09-30T10:00:00Z")
        argv = ["canvas", "pull", str(COURSE), str(AID), "--out", str(tmp_path / "in"),
                "--url", s.url, "--lesson", ASSIGNMENT]
        outputs = []
        assert run_cli(outputs, argv) == 0
        folder = tmp_path / "in" / "asmith_3001" / ASSIGNMENT
        assert (folder / NOTEBOOK).read_bytes() == first
        second = nbformat.writes(student_notebook(lesson_nb, answers(1))).encode()
        s.submit(AID, 3001, {"toy (1).ipynb": second}, "2026-10-02T08:00:00Z", late=True, attempt=2)
        assert run_cli(outputs, argv) == 0
        assert sorted(p.name for p in folder.iterdir()) == ["timestamp.txt", "toy (1).ipynb"]
        assert (folder / "toy (1).ipynb").read_bytes() == second
        assert (folder / "timestamp.txt").read_text() == "2026-10-02 08:00:00.000000 UTC\n"
        assert "1 file(s) downloaded now" in outputs[-1] and "[Canvas: LATE]" in outputs[-1]
    finally:
        s.stop()


def test_a_pull_cut_short_resumes_where_it_stopped(term_class, tmp_path):
    lesson_nb = nbformat.read(term_class["course"] / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    s = serve(lesson_nb)
    try:
        s.down_after_downloads = 9
        argv = ["canvas", "pull", str(COURSE), str(AID), "--out", str(tmp_path / "in"),
                "--url", s.url, "--lesson", ASSIGNMENT]
        outputs = []
        assert run_cli(outputs, argv) == 1
        assert "run the same command again" in outputs[-1]
        assert len(list((tmp_path / "in").rglob("*.ipynb"))) == 9
        s.down, s.down_after_downloads, s.downloads = False, None, 0
        assert run_cli(outputs, argv) == 0
        assert s.downloads == N - 9 and f"{N - 9} file(s) downloaded now" in outputs[-1]
        assert len(list((tmp_path / "in").rglob("timestamp.txt"))) == N
    finally:
        s.stop()


def expected_grades() -> dict:
    return {1000 + i: rule(i) for i in range(N) if 1000 + i not in (REJECTED, REVIEW)}


def check_canvas_holds_exactly(s: StandIn):
    want = expected_grades()
    for (aid, uid), sub in s.submissions.items():
        comments = sub["submission_comments"]
        if uid in want:
            assert sub["score"] == pytest.approx(want[uid], abs=0.005), uid
            assert len(comments) == 1 and len(comments[0]["attachments"]) == 1, (uid, comments)
            page = s.file_data(comments[0]["attachments"][0]["id"]).decode()
            assert f"{want[uid]:.2f}".rstrip("0").rstrip(".") in page and "of 10" in page
        else:
            assert sub["score"] is None and comments == [], uid


def test_dry_run_then_push_then_push_again(term_class):
    s = term_class["standin"]
    s.rate_limit = 1      # the first request is throttled: retried
    n = len(writes(s))
    code, out = push(term_class, "--dry-run")
    assert code == 3, out    # two held back, as export exits
    assert len(writes(s)) == n and "dry run: nothing was sent" in out
    assert "28 student(s) would post" in out and "HELD BACK (2)" in out
    assert "403 Rate Limit Exceeded; try 2" in out
    code, out = push(term_class)
    assert code == 3, out
    assert "28 student(s) posted" in out
    check_canvas_holds_exactly(s)
    n = len(writes(s))
    code, out = push(term_class)
    assert len(writes(s)) == n, "a second push changed something"
    assert "0 student(s) posted, 28 already as Canvas has them" in out
    check_canvas_holds_exactly(s)


def test_push_cut_at_student_12_resumes_without_duplicates(term_class):
    fresh = serve(nbformat.read(term_class["course"] / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4))
    try:
        fresh.down_after_puts = 11      # the 12th PUT is applied, then the network is gone
        code, out = push(term_class, url=fresh.url)
        assert code == 1 and "run the same command again" in out, out
        graded = [u for (a, u), sub in fresh.submissions.items() if sub["score"] is not None]
        assert len(graded) == 12
        fresh.down, fresh.down_after_puts = False, None
        code, out = push(term_class, url=fresh.url)
        assert code == 3 and "16 student(s) posted, 12 already" in out, out
        check_canvas_holds_exactly(fresh)
    finally:
        fresh.stop()


def test_a_grade_and_comment_whose_answer_was_lost_are_not_posted_twice(term_class):
    """Canvas took the 5th student's PUT but its answer never came: the retry reads first."""
    fresh = serve(nbformat.read(term_class["course"] / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4))
    try:
        fresh.lose_answers_of_puts = {5}
        code, out = push(term_class, url=fresh.url)
        assert code == 3 and "28 student(s) posted" in out and "network failure" in out, out
        assert fresh.puts == 28
        check_canvas_holds_exactly(fresh)
    finally:
        fresh.stop()


def test_errors_name_what_to_fix(term_class, tmp_path):
    tc, s = term_class, term_class["standin"]
    mp = tc["mp"]
    mp.setenv("CANVAS_TOKEN", "expired-token")
    code, out = push(tc)
    assert code == 2 and "expired" in out and "New Access Token" in out
    mp.setenv("CANVAS_TOKEN", "student-token")
    code, out = push(tc)
    assert code == 2 and "teacher or TA role" in out
    mp.setenv("CANVAS_TOKEN", TOKEN)
    code = run_cli(tc["outputs"], ["canvas", "push", str(tc["graded"]), str(COURSE), "999",
                                   "--url", s.url, "--lesson", ASSIGNMENT])
    assert code == 2 and "found nothing to read assignment 999" in tc["outputs"][-1]
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o644)
    mp.delenv("CANVAS_TOKEN")
    code, out = push(tc, "--dry-run", "--token-file", str(token_file))
    assert code == 2 and "chmod 600" in out
    token_file.chmod(0o600)
    code, out = push(tc, "--dry-run", "--token-file", str(token_file))
    assert code == 3 and "0 student(s) would post" in out
    code, out = push(tc, "--dry-run")
    assert code == 2 and "set CANVAS_TOKEN" in out
    mp.setenv("CANVAS_TOKEN", TOKEN)


def test_the_token_never_appears_in_any_output(term_class, caplog):
    tc = term_class
    import logging
    with caplog.at_level(logging.DEBUG):
        push(tc, "--dry-run")
        push(tc, "--dry-run")   # outputs of its own, whether it runs alone or after the others
    assert TOKEN not in caplog.text and TOKEN[-4:] not in caplog.text
    assert all(TOKEN not in o for o in tc["outputs"]) and len(tc["outputs"]) >= 3
    for folder in (tc["tmp"] / "pulled", tc["graded"]):
        for f in folder.rglob("*"):
            if f.is_file() and f.stat().st_size < 2**20:
                assert TOKEN.encode() not in f.read_bytes(), f


def test_without_the_extra_the_commands_say_how_to_install(term_class, monkeypatch):
    monkeypatch.setitem(sys.modules, "canvasapi", None)     # import canvasapi raises ImportError
    for argv in (["canvas", "pull", "3", "77", "--out", "x"],
                 ["canvas", "push", str(term_class["graded"]), "3", "77"]):
        outputs = []
        assert run_cli(outputs, argv) == 2
        assert "pip install" in outputs[0] and "[canvas]" in outputs[0]


def test_canvas_address_must_be_https_except_to_this_machine():
    from autograder.lms.canvas_api import CanvasError, Session
    with pytest.raises(CanvasError, match="https://"):
        Session("http://canvas.example.edu", TOKEN)
    with pytest.raises(CanvasError, match="CANVAS_URL"):
        Session("", TOKEN)
    assert Session("http://127.0.0.1:9", TOKEN).url == "http://127.0.0.1:9"


@pytest.mark.slow
def test_three_pulled_students_graded_by_their_kernels_and_pushed(term_class, tmp_path, monkeypatch):
    """The same loop with grade's own kernels: what pull writes grades as any folder does."""
    monkeypatch.setattr("autograder.grading.grade.Grader.grade", REAL_GRADE)
    course = term_class["course"]
    s = StandIn(TOKEN, COURSE).start()
    try:
        s.add_assignment(AID, "01 Toy", POINTS)
        lesson_nb = nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
        for i in (3, 4, 6):      # 1 day late, 2 days late, on time
            s.add_user(2000 + i, f"Real{i} Student", f"real{i}")
            when = DUE + dt.timedelta(hours=hours_late(i))
            s.submit(AID, 2000 + i, {NOTEBOOK: nbformat.writes(student_notebook(lesson_nb, answers(i))).encode()},
                     when.strftime("%Y-%m-%dT%H:%M:%SZ"), late=hours_late(i) > 0)
        outputs = []
        assert run_cli(outputs, ["canvas", "pull", str(COURSE), str(AID), "--out", str(tmp_path / "in"),
                                 "--url", s.url, "--term", str(term_class["term"])]) == 0, outputs
        assert run_cli(outputs, ["grade", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
                                 "--term", str(term_class["term"]), "--no-progress"]) == 0, outputs
        assert run_cli(outputs, ["canvas", "push", str(tmp_path / "out"), str(COURSE), str(AID),
                                 "--url", s.url]) == 0, outputs
        for i in (3, 4, 6):
            sub = s.submissions[(AID, 2000 + i)]
            assert sub["score"] == pytest.approx(rule(i), abs=0.005), (i, outputs)
            assert len(sub["submission_comments"]) == 1
        assert all(TOKEN not in o for o in outputs)
    finally:
        s.stop()
