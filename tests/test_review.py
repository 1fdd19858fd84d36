"""The review page (autograder.reporting.review, issue 53): what needs a person, decided in the
browser, written where export reads it.

A graded folder is built as ``grade`` leaves it (tests/test_attempts.py's helpers: a release, the
journal, class.json, one graded notebook); the page is served on a free port of the loopback and
driven over HTTP as a browser would (its cookies, its form fields).
"""
import csv
import hashlib
import http.cookiejar
import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import nbformat
import pytest

from autograder.cli import main
from autograder.journal import write_manifest
from autograder.reporting.review import DECISIONS_LOG, decide, review_queue, serve
from autograder.reporting.insights import INSIGHT_COLUMNS
from autograder.results import Result
from autograder.term.policy import load_final_grades
from test_attempts import LESSON, NEW, TIMEOUT, graded, overrides

pytest.importorskip("tornado")
REPO = Path(__file__).resolve().parent.parent
REVIEW = "needs manual review: the grader's channel was touched (your In [2], exercise 'test_mul')"
RESULTS = [Result("ann_1", LESSON, 5, exercises={"test_add": 2.0, "test_mul": 3.0}, digest="a" * 64),
           Result("bo_2", LESSON, 4, status=REVIEW, exercises={"test_add": 2.0, "test_mul": 2.0},
                  digest=NEW, attempt=NEW),
           Result("cy_3", LESSON, 2, status=TIMEOUT, exercises={"test_add": 2.0, "test_mul": 0.0},
                  digest="c" * 64),
           Result("dee_4", LESSON, 0, status="rejected: no .ipynb file in the upload (essay.docx)",
                  digest="d" * 64)]


def graded_folder(tmp_path):
    out = graded(tmp_path, [Result(**r.__dict__) for r in RESULTS])
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import torch", execution_count=1),
                nbformat.v4.new_markdown_cell("## Your turn"),
                nbformat.v4.new_code_cell("import sys\nsys.modules['_autograder_wire'] = None", execution_count=2),
                nbformat.v4.new_code_cell("def mul(a, b):\n    return a * b", execution_count=3),
                nbformat.v4.new_markdown_cell("A decay gate forgets <i>old</i> tokens.",
                                              metadata={"nbgrader": {"grade": True, "solution": True,
                                                                     "grade_id": "say_why", "points": 1}})]
    write_manifest(out, [(r.student, LESSON, f"s{n:04d}") for n, r in enumerate(RESULTS)],   # grade's own
                   {LESSON: ["test_add", "test_mul"]})                                       # folder names
    folder = out / "work" / "autograded" / "s0001" / LESSON
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / f"{LESSON}.ipynb")
    return out


def serve_in_thread(out, by="prof") -> tuple:
    """(the address serve printed, its server) of the review page over ``out``, in a thread."""
    started, ready = {}, threading.Event()

    def on_start(url, server):
        started.update(url=url, server=server)
        ready.set()
    threading.Thread(target=serve, args=(out,), kwargs=dict(by=by, open_browser=False, started=on_start),
                     daemon=True).start()
    assert ready.wait(30)
    return started["url"], started["server"]


@pytest.fixture
def page(tmp_path):
    """(base url, token, the folder, an opener that keeps cookies) of a page serving a graded class."""
    out = graded_folder(tmp_path)
    url, server = serve_in_thread(out)
    parts = urllib.parse.urlsplit(url)
    token = urllib.parse.parse_qs(parts.query)["token"][0]
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    return f"{parts.scheme}://{parts.netloc}", token, out, opener, server


def fetch(opener, url, data=None):
    """(status, body) of a GET, or of a POST of ``data``; redirects are followed."""
    try:
        with opener.open(url, urllib.parse.urlencode(data).encode() if data else None, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_page_refuses_a_request_without_its_secret_and_listens_on_the_loopback_only(page):
    base, token, _, opener, server = page
    assert fetch(opener, base + "/")[0] == 403
    assert fetch(opener, base + "/?token=" + "x" * len(token))[0] == 403
    assert fetch(opener, base + "/item?student=bo_2&lesson=" + LESSON)[0] == 403
    assert {s.getsockname()[0] for s in server._sockets.values()} == {"127.0.0.1"}
    status, body = fetch(opener, f"{base}/?token={token}")
    assert status == 200 and "To decide: 3 of 3" in body


def test_the_queue_lists_what_export_holds_back_and_filters_it(page):
    base, token, _, opener, _ = page
    _, body = fetch(opener, f"{base}/?token={token}")
    assert "bo_2" in body and "cy_3" in body and "dee_4" in body and "ann_1" not in body
    _, body = fetch(opener, f"{base}/?kind=timed+out")             # the cookie carries the secret now
    assert "cy_3" in body and "bo_2" not in body and "To decide: 1 of 3" in body


def test_an_item_shows_the_cells_as_the_student_saw_them_with_the_one_named_marked(page):
    base, token, _, opener, _ = page
    fetch(opener, f"{base}/?token={token}")
    status, body = fetch(opener, f"{base}/item?student=bo_2&lesson={LESSON}")
    assert status == 200
    marked = re.findall(r"<div class='cell named'><div class='label'>(.*?)</div>", body)
    assert marked == ["In [2]"], marked
    assert "sys.modules[&#x27;_autograder_wire&#x27;]" in body and "test_mul" in body
    assert "written answer say_why" in body and "forgets &lt;i&gt;old&lt;/i&gt; tokens" in body


def test_a_decision_made_on_the_page_is_a_row_export_reads(page, tmp_path):
    base, token, out, opener, _ = page
    fetch(opener, f"{base}/?token={token}")
    _, body = fetch(opener, f"{base}/item?student=bo_2&lesson={LESSON}")
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', body).group(1)
    form = {"student": "bo_2", "lesson": LESSON, "action": "keep", "comment": "a stray import", "by": "prof"}
    assert fetch(opener, base + "/decide", form)[0] == 403, "a post without the form's XSRF field"
    status, body = fetch(opener, base + "/decide", {**form, "_xsrf": xsrf})
    assert status == 200 and "cy_3 · " in body, "on to the next item"
    rows = list(csv.reader((out / "overrides.csv").open()))
    assert rows[0][-1] == "attempt" and rows[1] == ["bo_2", LESSON, "", "keep", "a stray import", "prof", NEW]
    [logged] = [json.loads(line) for line in (out / DECISIONS_LOG).read_text().splitlines()]
    assert logged["by"] == "prof" and logged["attempt"] == NEW and logged["when"]
    bad = {**form, "_xsrf": xsrf, "action": "exercise", "exercise": "test_mul", "points": "9"}
    status, body = fetch(opener, base + "/decide", bad)
    assert status == 400 and "between 0 and 3" in body
    assert [i.student for i in review_queue(out)] == ["cy_3", "dee_4"]
    grades = {g.student: g for g in load_final_grades(out)}      # what report and export read
    assert (grades["bo_2"].review, grades["bo_2"].score, grades["cy_3"].review) == ("decided", 4.0, "undecided")
    book, term = tmp_path / "Grades-ML_101.csv", tmp_path / "term.toml"
    book.write_text("Student,ID,SIS User ID,SIS Login ID,Section,01 Running sum (1234)\n"
                    "    Points Possible,,,,,10.00\n" +
                    "".join(f"\"{r.student[:-2].title()}, A\",{r.student[-1]},,,A,\n" for r in RESULTS))
    term.write_text(f'[lessons.{LESSON}]\nlms_column = "01 Running sum (1234)"\n')
    code = main(["export", str(out), "--lms", "canvas", "--gradebook", str(book), "--term", str(term),
                 "--out", str(tmp_path / "up.csv")])
    cells = {r[1]: r[5] for r in csv.reader((tmp_path / "up.csv").open()) if r[1].isdigit()}
    assert (code, cells) == (3, {"1": "10", "2": "8", "3": "", "4": ""}), cells   # cy, dee held back


def test_decide_writes_an_exercise_and_a_total_beside_rows_typed_by_hand(tmp_path):
    out = graded_folder(tmp_path)
    overrides(out, [["ann_1", LESSON, "test_add", "1", "typed", "TA"]])       # no attempt column yet
    decide(out, "cy_3", LESSON, "exercise", "prof", "slow but right", "test_mul", "3", root=REPO)
    row = {r["student_id"]: r for r in csv.DictReader((out / "grades.csv").open())}["cy_3"]
    assert (row["score"], row["review"]) == ("5.0", "decided"), "grades.csv written again, as report does"
    assert row["status"].startswith("decided (was timed out: test_mul")
    decide(out, "dee_4", LESSON, "total", "prof", "sent the notebook by mail", points="4")
    decide(out, "dee_4", LESSON, "total", "prof", "the mailed notebook read again", points="4.5")   # replaces
    rows = list(csv.reader((out / "overrides.csv").open()))
    assert rows[0] == ["student_id", "assignment", "exercise", "points", "comment", "by", "attempt"]
    assert len(rows) == 4 and rows[3][3:5] == ["4.5", "the mailed notebook read again"]
    assert rows[1][:6] == ["ann_1", LESSON, "test_add", "1", "typed", "TA"]
    assert rows[2] == ["cy_3", LESSON, "test_mul", "3", "slow but right", "prof", "c" * 64]
    assert review_queue(out) == [review_queue(out)[0]] and review_queue(out)[0].student == "bo_2"
    for wrong in (dict(action="exercise", exercise="test_nope", points="1"), dict(action="total", points="six"),
                  dict(action="guess")):
        with pytest.raises(ValueError):
            decide(out, "bo_2", LESSON, by="prof", **wrong)
    with pytest.raises(ValueError, match="no graded submission"):
        decide(out, "zed_9", LESSON, "keep", "prof")
    assert main(["review", str(out / "missing"), "--no-browser"]) == 2


# --------------------------------------------------------------------- by question, with a rubric

def rubric_class(tmp_path):
    """Five answers to test_mul: two alike (1 of 3, the insights' mistake 'off_by_one'), one
    with another mistake, one at 0 with none recorded, one full."""
    scored = {"eli_1": 1.0, "fay_2": 1.0, "gus_3": 1.0, "hal_4": 0.0, "ivy_5": 3.0}
    out = graded(tmp_path, [Result(s, LESSON, 2 + p, exercises={"test_add": 2.0, "test_mul": p},
                                   digest=hashlib.sha256(s.encode()).hexdigest()) for s, p in scored.items()])
    mistake = {"eli_1": "off_by_one", "fay_2": "off_by_one", "gus_3": "swapped"}
    with open(out / "insights.csv", "w", newline="") as f:      # as report writes it
        w = csv.writer(f)
        w.writerow(INSIGHT_COLUMNS)
        w.writerows([s, LESSON, "test_mul", "mul", p, 3, mistake.get(s, ""), ""] for s, p in scored.items())
    return out


def test_a_rubric_item_decides_a_group_and_its_points_change_for_everyone_who_has_it(tmp_path):
    from autograder.reporting.rubric import FULL, add_item, apply_item, groups, set_item_points
    out = rubric_class(tmp_path)
    found = groups(out, LESSON, "test_mul")
    assert found == {"off_by_one": ["eli_1", "fay_2"], "swapped": ["gus_3"], "0 of 3 points": ["hal_4"],
                     FULL: ["ivy_5"]}
    item = add_item(out, LESSON, "test_mul", "2", "the product is right, one extra term")
    assert item["id"] == "r1"
    with pytest.raises(ValueError, match="between 0 and 3"):
        add_item(out, LESSON, "test_mul", "4", "too many")
    assert apply_item(out, LESSON, "test_mul", "r1", found["off_by_one"] + found["swapped"], "TA") == 3
    decide(out, "gus_3", LESSON, "exercise", "prof", "swapped, not off by one", "test_mul", "1.5")  # its own
    assert set_item_points(out, LESSON, "test_mul", "r1", "2.5") == 2
    final = {g.student: g.score for g in load_final_grades(out)}
    assert final == {"eli_1": 4.5, "fay_2": 4.5, "gus_3": 3.5, "hal_4": 2.0, "ivy_5": 5.0}
    rows = list(csv.reader((out / "overrides.csv").open()))[1:]
    assert {r[0]: r[4] for r in rows}["eli_1"] == "[rubric r1] the product is right, one extra term"
    from autograder.engine.feedback import grade_box
    box = grade_box(next(g for g in load_final_grades(out) if g.student == "eli_1"))
    assert "set to 2.5 points: the product is right, one extra term<" in box and "[rubric" not in box


def test_the_question_page_groups_answers_and_applies_rubric_items(tmp_path):
    out = rubric_class(tmp_path)
    url, _ = serve_in_thread(out, "TA")
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    base = url.split("/?")[0]
    _, body = fetch(opener, url)
    question = f"/question?lesson={LESSON}&exercise=test_mul"
    assert question.replace("&", "&amp;") in body, "the queue links each question"
    _, body = fetch(opener, base + question)
    assert re.findall(r"<h3>(.*?)</h3>", body) == ["off_by_one (2)", "0 of 3 points (1)", "swapped (1)",
                                                   "full points (1)"]
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', body).group(1)
    key = {"_xsrf": xsrf, "lesson": LESSON, "exercise": "test_mul"}
    status, body = fetch(opener, base + "/rubric/add", {**key, "points": "2", "comment": "one extra term"})
    assert status == 200 and "Apply to these 2" in body
    form = urllib.parse.urlencode({**key, "item": "r1", "by": "TA"}) + "&student=eli_1&student=fay_2"
    with opener.open(base + "/rubric/apply", form.encode(), timeout=30) as r:
        assert "eli_1</a> → 2 (r1)" in r.read().decode()
    status, body = fetch(opener, base + "/rubric/points", {**key, "item": "r1", "points": "2.5"})
    assert status == 200 and "fay_2</a> → 2.5 (r1)" in body
    assert fetch(opener, base + "/rubric/points", {**key, "item": "r1", "points": "x"})[0] == 400
    assert {g.student: g.score for g in load_final_grades(out)}["fay_2"] == 4.5


def test_a_decision_for_an_earlier_attempt_is_an_item_again(tmp_path):
    """ann handed in again after a decision: the old row is stale, the queue lists it, and a new
    decision for the attempt graded now takes it off."""
    out = graded_folder(tmp_path)
    header = ("student_id", "assignment", "exercise", "points", "comment", "by", "attempt")
    overrides(out, [["ann_1", LESSON, "", "4", "regrade request", "prof", "f" * 12]], header)
    [stale] = review_queue(out, kind="stale")
    assert (stale.student, stale.kind) == ("ann_1", "stale") and "lesson total set to 4 points" in stale.reason
    decide(out, "ann_1", LESSON, "keep", "prof", "the new attempt is right")
    assert review_queue(out, kind="stale") == []
    [ann] = [g for g in load_final_grades(out) if g.student == "ann_1"]
    assert "decide again" not in " ".join(ann.notes) and "line 3 decides this one" in " ".join(ann.notes)
    from autograder.engine.feedback import grade_box
    assert "earlier attempt" not in grade_box(ann) and "kept the tests' score" in grade_box(ann)


def test_a_similar_pair_is_an_item_until_a_person_looks_and_again_once_an_answer_changes(page):
    """The report's similar pairs (similar.json) wait in the queue; a decision on the page is a line of
    decisions.jsonl for those two answers, never a grade; a changed answer brings the pair back."""
    from autograder.reporting.similarity import Pair, load_pairs, save_pairs
    base, token, out, opener, _ = page
    code_a, code_b = "def mul(a, b):\n    return sum(a for _ in range(b))\n", "def mul(x, y):\n    return sum(x for _ in range(y))\n"
    pair = Pair(LESSON, "ann_1", "cy_3", 0.9, 0.85, code_a, code_b, [(15, 48)], [(15, 48)])   # the shared run
    save_pairs(out, {LESSON: [pair]})
    assert load_pairs(out) == [pair]
    fetch(opener, f"{base}/?token={token}")
    _, body = fetch(opener, f"{base}/?kind=similar")
    assert "To decide: 1 of 4" in body and "ann_1 &amp; cy_3" in body
    status, body = fetch(opener, f"{base}/pair?{urllib.parse.urlencode({'lesson': LESSON, 'student': 'ann_1', 'other': 'cy_3'})}")
    assert status == 200 and "<mark>    return sum(a for _ in range(b</mark>" in body
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', body).group(1)
    before = (out / "grades.csv").read_text() if (out / "grades.csv").exists() else None
    form = {"lesson": LESSON, "student": "ann_1", "other": "cy_3", "answers": pair.digest, "by": "prof",
            "comment": "same study group, told me", "_xsrf": xsrf}
    assert fetch(opener, base + "/pair", {**form, "verdict": "guilty"})[0] == 400
    status, body = fetch(opener, base + "/pair", {**form, "verdict": "no concern"})
    assert status == 200 and "ann_1 &amp; cy_3" not in body
    [logged] = [json.loads(line) for line in (out / DECISIONS_LOG).read_text().splitlines()]
    assert (logged["pair"], logged["verdict"], logged["by"]) == (["ann_1", "cy_3"], "no concern", "prof")
    assert [i.kind for i in review_queue(out)].count("similar") == 0
    assert ((out / "grades.csv").read_text() if (out / "grades.csv").exists() else None) == before
    save_pairs(out, {LESSON: [Pair(**{**pair.__dict__, "code_b": code_b + "# mine\n"})]})
    assert [i.other for i in review_queue(out) if i.kind == "similar"] == ["cy_3"]


def test_a_submission_with_no_time_against_a_due_date_waits_until_decided(tmp_path):
    """A due date applies but the submission's time is unknown (no penalty was applied, silently
    until now): the queue lists it with that note; a decision for the attempt settles it."""
    from autograder.term.termfile import load_term, remember_term
    out = graded_folder(tmp_path)
    path = tmp_path / "term.toml"
    path.write_text(f'[lessons.{LESSON}]\ndue = "2026-10-01T23:59:00+00:00"\n')
    remember_term(out, load_term(path))
    timed = [i for i in review_queue(out) if i.kind == "time"]
    assert [i.student for i in timed] == ["ann_1"], "the others wait for their own reason first"
    assert timed[0].reason.startswith("submission time unknown") and "no late penalty" in timed[0].reason
    decide(out, "ann_1", LESSON, "total", "prof", "handed in on paper two days late", points="4")
    assert [i.kind for i in review_queue(out)].count("time") == 0
    assert {g.student: g.score for g in load_final_grades(out)}["ann_1"] == 4.0
