"""``python -m autograder review DIR``: everything in a graded folder that needs a person, as a
page in the browser, and each decision written where ``report``, ``export`` and ``canvas push``
read it (issue 53).

The queue holds what export and push hold back or cannot settle alone: submissions held for
manual review, timed-out ones, rejected work, and decisions written for an earlier attempt
(stale). Each item shows the reason, the tests' points per exercise, and the student's code cells
numbered as the student saw them (``In [n]``, the harness's count), the cells a reason names
highlighted. A decision (keep the tests' score, set an exercise's points, set the lesson total)
is a row of ``DIR/overrides.csv`` in its usual format, stamped with the attempt it decides and
who made it, and a line of ``DIR/decisions.jsonl`` with when; then the class outputs (grades.csv,
the feedback pages' grade box, report.html) are written again, as ``report`` writes them.

The page is served by Tornado (Jupyter's own web server) on the loopback only, and every request
must carry the secret printed with its address (``?token=``, then a cookie), as Jupyter's own
pages do; a decision is a POST with Tornado's XSRF check. Keyboard only: every control is a link
or a form field; ``j``/``k`` (outside a form field) go to the next and previous item, ``q`` to the queue.
"""
from __future__ import annotations

import csv
import datetime
import hmac
import html
import json
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

from autograder.ids import folder_name
from autograder.journal import folder_in_use, load_result
from autograder.results import NEEDS_REVIEW, REJECTED, TIMED_OUT
from autograder.release import lesson_maxima
from autograder.reporting.report import write_class_outputs
from autograder.term.policy import ATTEMPT_COLUMN, KEEP, OVERRIDE_COLUMNS, OVERRIDES_FILE, load_final_grades

__all__ = ["Item", "review_queue", "decide", "make_app", "serve", "DECISIONS_LOG"]

DECISIONS_LOG = "decisions.jsonl"     # who decided what, when, for which attempt (one JSON a line)
KINDS = {NEEDS_REVIEW: "held for review", TIMED_OUT: "timed out", REJECTED: "rejected",
         "stale": "decided for an earlier attempt"}
_CELL_REF = re.compile(r"In \[(\d+)\]")
_STYLE = ("body{font:15px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:70em;padding:0 1em}"
          "table{border-collapse:collapse}td,th{border-bottom:1px solid #ddd;padding:.3em .6em;text-align:left}"
          "pre{background:#f6f6f6;padding:.6em;overflow-x:auto;margin:0}.cell{margin:.6em 0}"
          ".named pre{outline:3px solid #e0a800;background:#fff8e1}.label{color:#555;font:13px monospace}"
          ".reason{background:#fdecea;padding:.5em}.kind{font-weight:600}a:focus,input:focus,select:focus,"
          "button:focus{outline:3px solid #1a73e8}form{margin:.8em 0}label{margin-right:1em}")


@dataclass
class Item:
    """One thing for a person to decide: a submission (``student``, ``lesson``) and why."""
    student: str
    lesson: str
    kind: str                 # a key of KINDS
    reason: str               # the status text, or what went stale
    attempt: str
    score: float
    max_score: float
    exercises: dict = field(default_factory=dict)    # grade_id -> points (decisions applied)
    notes: list = field(default_factory=list)

    @property
    def key(self) -> dict:
        return {"student": self.student, "lesson": self.lesson}


def review_queue(out: Path, lesson: str = "", kind: str = "") -> list:
    """The items of the class graded into ``out`` that need a person, in student order,
    optionally only ``lesson``'s or only one ``kind`` (a key of KINDS). Reads the journal and
    overrides.csv as ``report`` does; starts no kernel."""
    items = []
    for g in load_final_grades(Path(out)):
        what = g.status.kind
        if what in (NEEDS_REVIEW, TIMED_OUT) and g.review == "undecided":
            found = what
        elif what == REJECTED and not g.overrides:
            found = REJECTED
        elif g.stale:
            found = "stale"
        else:
            continue
        reason = g.status.reason or str(g.status) if found != "stale" else "; ".join(
            f"{o.what} (attempt {o.attempt[:12]})" for o in g.stale)
        items.append(Item(g.student, g.assignment, found, reason, g.attempt, g.score, g.max_score,
                          dict(g.exercises), list(g.notes)))
    return [i for i in sorted(items, key=lambda i: (i.lesson, i.student))
            if (not lesson or i.lesson == lesson) and (not kind or i.kind == kind)]


def student_cells(out: Path, student: str, lesson: str) -> list:
    """[(label, source, is_test, error)] of the graded notebook's code cells: ``In [n]`` as the
    student saw it (the harness's execution count, else the place among code cells), the test's
    grade id for a test cell, and the error the cell ended with ("" when none)."""
    import nbformat
    folder = Path(out) / "work" / "autograded" / folder_name(student) / lesson
    cells = []
    for path in sorted(folder.glob("*.ipynb"))[:1]:
        nb = nbformat.read(path, as_version=4)
        n = 0
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            n += 1
            meta = cell.metadata.get("nbgrader", {})
            is_test = bool(meta.get("grade")) and not meta.get("solution")
            label = f"test {meta.get('grade_id', '')}" if is_test else f"In [{cell.get('execution_count') or n}]"
            error = next((f"{o.get('ename', '')}: {o.get('evalue', '')}" for o in cell.get("outputs", [])
                          if o.get("output_type") == "error"), "")
            cells.append((label, cell.source, is_test, error))
    return cells


def decide(out: Path, student: str, lesson: str, action: str, by: str, comment: str = "",
           exercise: str = "", points: str = "", root=None) -> dict:
    """Write one decision on ``student``'s ``lesson``: ``action`` "keep" (the tests' score
    stands), "exercise" (``exercise`` set to ``points``) or "total" (the lesson total set to
    ``points``). Appends a row to overrides.csv (its header written when the file is new; the
    attempt column added when the file has none) stamped with the attempt graded now, and a line
    to decisions.jsonl; then writes the class outputs again when ``root`` (the course) is given.
    Returns the decision as logged. Raises ValueError for an unknown submission, action,
    exercise or points that are not a number within the exercise's or lesson's maximum."""
    out = Path(out)
    res = load_result(out, lesson, student)
    if res is None:
        raise ValueError(f"no graded submission of {lesson} by {student} in {out}")
    attempt = res.get("attempt") or res.get("digest", "")
    if action == "keep":
        exercise, value = "", KEEP
    elif action in ("exercise", "total"):
        most = float(res.get("max_score") or 0)
        if action == "exercise":
            maxima = _exercise_maxima(out, lesson)
            if exercise not in maxima:
                raise ValueError(f"{lesson} has no exercise {exercise!r}")
            most = maxima[exercise]
        else:
            exercise = ""
        try:
            number = float(points)
        except ValueError:
            raise ValueError(f"points must be a number, got {points!r}") from None
        if not 0 <= number <= most:
            raise ValueError(f"points must be between 0 and {most:g}, got {points}")
        value = f"{number:g}"
    else:
        raise ValueError(f"unknown decision {action!r}: keep, exercise or total")
    by = by.strip() or "instructor"
    row = [student, lesson, exercise, value, comment.strip(), by]
    when = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    with folder_in_use(out, "review"):
        _append_override(out / OVERRIDES_FILE, row, attempt)
        with open(out / DECISIONS_LOG, "a", encoding="utf-8") as f:
            record = {"when": when, "by": by, "student": student, "lesson": lesson, "exercise": exercise,
                      "points": value, "comment": comment.strip(), "attempt": attempt}
            f.write(json.dumps(record) + "\n")
        if root is not None:
            write_class_outputs(Path(root), out)
    return record


def _exercise_maxima(out: Path, lesson: str) -> dict:
    return lesson_maxima(out, {lesson}).get(lesson, {})


def _append_override(path: Path, row: list, attempt: str) -> None:
    """Add ``row`` (the six columns) with ``attempt`` to overrides.csv, in place of an earlier
    row for the same student, lesson and exercise of this attempt (or of no attempt yet): a
    decision made again replaces the one before, as overrides.csv allows one."""
    header = list(OVERRIDE_COLUMNS) + [ATTEMPT_COLUMN]
    if not path.exists() or not path.read_text(encoding="utf-8-sig").strip():
        rows = [header]
    else:
        rows = list(csv.reader(path.open(encoding="utf-8-sig", newline="")))
        if rows and ATTEMPT_COLUMN not in [h.strip() for h in rows[0]]:   # an older file: add the column
            rows = [rows[0] + [ATTEMPT_COLUMN]] + [r + [""] * (len(rows[0]) + 1 - len(r)) for r in rows[1:]]

    def same(r):
        cells = [c.strip() for c in r] + [""] * 7
        return (cells[0].lstrip("'"), cells[1], cells[2]) == tuple(row[:3]) and attempt.startswith(cells[6])
    rows = rows[:1] + [r for r in rows[1:] if not same(r)] + [row + [attempt]]
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows(rows)
    tmp.replace(path)


# ------------------------------------------------------------------------------ the page

def _e(text) -> str:
    return html.escape(str(text), quote=True)


# j / k / q outside a form field follow the link with that access key (next, previous, queue)
_KEYS = ("<script>document.addEventListener('keydown',e=>{if(e.ctrlKey||e.metaKey||e.altKey||"
         "/^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(e.target.tagName))return;"
         "const a=document.querySelector(`a[accesskey='${e.key}']`);if(a){e.preventDefault();a.click();}});"
         "</script>")


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{_STYLE}</style></head><body>{body}{_KEYS}</body></html>")


def make_app(out: Path, token: str, root=None, by: str = ""):
    """The Tornado application of the review page over ``out``; every request needs ``token``."""
    import tornado.web

    class Base(tornado.web.RequestHandler):
        def prepare(self):
            given = self.get_query_argument("token", "") or (self.get_cookie("review_token") or "")
            if not hmac.compare_digest(given.encode(), token.encode()):
                raise tornado.web.HTTPError(403, "this page needs the secret printed with its address")
            if self.get_query_argument("token", ""):
                self.set_cookie("review_token", token, httponly=True, samesite="Strict")

        def write_error(self, status_code, **kwargs):
            self.finish(_page("Refused", f"<h1>{status_code}</h1><p>{_e(self._reason)}</p>"))

    class Queue(Base):
        def get(self):
            lesson, kind = self.get_query_argument("lesson", ""), self.get_query_argument("kind", "")
            items = review_queue(out, lesson, kind)
            every = review_queue(out)
            lessons = sorted({i.lesson for i in every})
            options = lambda values, chosen, names=None: "".join(   # noqa: E731
                f"<option value='{_e(v)}'{' selected' * (v == chosen)}>{_e((names or {}).get(v, v) or 'all')}</option>"
                for v in [""] + values)
            rows = "".join(
                f"<tr><td><a href='/item?{_e(urlencode(i.key))}'>{_e(i.student)}</a></td><td>{_e(i.lesson)}</td>"
                f"<td class='kind'>{_e(KINDS[i.kind])}</td><td>{_e(i.reason[:160])}</td>"
                f"<td>{i.score:g} / {i.max_score:g}</td></tr>" for i in items)
            self.finish(_page("Review", (
                f"<h1>To decide: {len(items)} of {len(every)}</h1>"
                "<form method='get' action='/'><label>Lesson <select name='lesson'>"
                f"{options(lessons, lesson)}</select></label><label>Reason <select name='kind'>"
                f"{options(list(KINDS), kind, KINDS)}</select></label><button>Filter</button></form>"
                "<table><tr><th>Student</th><th>Lesson</th><th>Why</th><th>Reason</th><th>Score</th></tr>"
                f"{rows}</table>" + ("" if items else "<p>Nothing to decide.</p>"))))

    class ItemPage(Base):
        def get(self):
            student, lesson = self.get_query_argument("student"), self.get_query_argument("lesson")
            items = review_queue(out)
            here = next((n for n, i in enumerate(items) if (i.student, i.lesson) == (student, lesson)), None)
            res = load_result(out, lesson, student)
            if res is None:
                raise tornado.web.HTTPError(404, "no such submission")
            item = items[here] if here is not None else None
            named = {int(n) for n in _CELL_REF.findall(item.reason if item else res.get("status", ""))}
            cells = "".join(
                f"<div class='cell{' named' * (not test and int(re.sub(r'[^0-9]', '', label) or 0) in named)}'>"
                f"<div class='label'>{_e(label)}{(' · ' + _e(error)) if error else ''}</div>"
                f"<pre>{_e(source)}</pre></div>"
                for label, source, test, error in student_cells(out, student, lesson))
            maxima = _exercise_maxima(out, lesson)
            scored = res.get("exercises", {})
            table = "".join(f"<tr><td>{_e(g)}</td><td>{scored.get(g, 0):g} / {m:g}</td></tr>"
                            for g, m in maxima.items())
            nav = ""
            if here is not None:
                for key, step, word in (("j", 1, "next"), ("k", -1, "previous")):
                    other = items[(here + step) % len(items)]
                    nav += f"<a accesskey='{key}' href='/item?{_e(urlencode(other.key))}'>{word} ({key})</a> "
            xsrf = self.xsrf_form_html()
            hidden = f"{xsrf}<input type='hidden' name='student' value='{_e(student)}'>" \
                     f"<input type='hidden' name='lesson' value='{_e(lesson)}'>"
            by_field = f"<label>By <input name='by' value='{_e(by)}' required></label>"
            forms = (
                f"<form method='post' action='/decide'>{hidden}<input type='hidden' name='action' value='keep'>"
                f"<label>Comment <input name='comment' size='50'></label>{by_field}"
                "<button>Keep the tests' score</button></form>"
                f"<form method='post' action='/decide'>{hidden}<input type='hidden' name='action' value='exercise'>"
                f"<label>Exercise <select name='exercise'>{''.join(f'<option>{_e(g)}</option>' for g in maxima)}"
                "</select></label><label>Points <input name='points' size='5' required></label>"
                f"<label>Comment <input name='comment' size='40'></label>{by_field}<button>Set points</button></form>"
                f"<form method='post' action='/decide'>{hidden}<input type='hidden' name='action' value='total'>"
                "<label>Lesson total <input name='points' size='5' required></label>"
                f"<label>Comment <input name='comment' size='40'></label>{by_field}<button>Set the total</button></form>")
            why = (f"<p class='reason'><span class='kind'>{_e(KINDS[item.kind])}</span>: {_e(item.reason)}</p>"
                   if item else "<p>Decided: nothing waits on this submission.</p>")
            self.finish(_page(f"{student} · {lesson}", (
                f"<p><a href='/' accesskey='q'>queue (q)</a> {nav}</p><h1>{_e(student)} · {_e(lesson)}</h1>"
                f"{why}<p>Attempt <code>{_e((res.get('attempt') or res.get('digest', ''))[:12])}</code>; "
                f"tests: {float(res.get('score', 0)):g} of {float(res.get('max_score', 0)):g}</p>"
                f"<table><tr><th>Exercise</th><th>Tests' points</th></tr>{table}</table>{forms}"
                f"<h2>The notebook as graded</h2>{cells}")))

    class Decide(Base):
        def post(self):
            args = {k: self.get_body_argument(k, "") for k in
                    ("student", "lesson", "action", "exercise", "points", "comment", "by")}
            try:
                decide(out, args["student"], args["lesson"], args["action"], args["by"], args["comment"],
                       args["exercise"], args["points"], root=root)
            except ValueError as exc:
                self.set_status(400)
                self.finish(_page("Not written", f"<h1>Not written</h1><p>{_e(exc)}</p>"
                                  "<p><a href='javascript:history.back()'>back</a></p>"))
                return
            rest = review_queue(out)
            target = f"/item?{urlencode(rest[0].key)}" if rest else "/"
            self.redirect(target, status=303)

    return tornado.web.Application([(r"/", Queue), (r"/item", ItemPage), (r"/decide", Decide)],
                                   xsrf_cookies=True, cookie_secret=secrets.token_hex(16))


def serve(out: Path, port: int = 0, root=None, by: str = "", open_browser: bool = True,
          started=None) -> None:
    """Serve the review page on 127.0.0.1 (``port`` 0: any free one) until interrupted; prints
    its address with the secret. ``started(url, server)`` is called once it listens (tests)."""
    import asyncio
    import tornado.httpserver
    import tornado.netutil

    token = secrets.token_urlsafe(24)
    review_queue(out)            # a folder that holds no graded class: say so before serving

    async def main():
        sockets = tornado.netutil.bind_sockets(port, address="127.0.0.1")
        server = tornado.httpserver.HTTPServer(make_app(Path(out), token, root, by))
        server.add_sockets(sockets)
        url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}/?token={token}"
        print(f"review page for {out}: {url}\n(loopback only; Ctrl-C stops it)", flush=True)
        if started is not None:
            started(url, server)
        if open_browser:
            import webbrowser
            webbrowser.open(url)
        await asyncio.Event().wait()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        print("review page stopped; every decision is in overrides.csv", flush=True)
