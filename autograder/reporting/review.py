"""``python -m autograder review DIR``: everything in a graded folder that needs a person, as a
page in the browser, and each decision written where ``report``, ``export`` and ``canvas push``
read it (issue 53).

The queue holds what export and push hold back or cannot settle alone: submissions held for
manual review, timed-out ones, rejected work, and decisions written for an earlier attempt
(stale), submissions whose time is unknown where a due date applies (no penalty was applied:
keep the score, or set the total the penalty leaves); and the pairs of similar answers of the last report (``similar.json``) until a person
has looked at them (a pair's decision is a line of ``decisions.jsonl``, never a grade). Each item shows the reason, the tests' points per exercise, and the student's code cells
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

import hmac
import html
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

from autograder.ids import folder_name
from autograder.journal import load_result, read_manifest
from autograder.results import NEEDS_REVIEW, REJECTED, TIMED_OUT
from autograder.reporting.decisions import (DECISIONS_LOG, PAIR_VERDICTS, decide, decide_pair, exercise_maxima,
                                            pair_decisions)
from autograder.reporting.similarity import load_pairs
from autograder.reporting.similarity import marked_html as _marked
from autograder.reporting.rubric import add_item, apply_item, groups, rubric_items, set_item_points, tag_of
from autograder.term.policy import load_final_grades

__all__ = ["Item", "review_queue", "decide", "make_app", "serve", "DECISIONS_LOG"]
KINDS = {NEEDS_REVIEW: "held for review", TIMED_OUT: "timed out", REJECTED: "rejected",
         "stale": "decided for an earlier attempt", "similar": "similar answers",
         "time": "no submission time"}
_CELL_REF = re.compile(r"In \[(\d+)\]")
_STYLE = ("body{font:15px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:70em;padding:0 1em}"
          "table{border-collapse:collapse}td,th{border-bottom:1px solid #ddd;padding:.3em .6em;text-align:left}"
          "pre{background:#f6f6f6;padding:.6em;overflow-x:auto;margin:0}.cell{margin:.6em 0}"
          ".named pre{outline:3px solid #e0a800;background:#fff8e1}.label{color:#555;font:13px monospace}"
          ".reason{background:#fdecea;padding:.5em}.kind{font-weight:600}a:focus,input:focus,select:focus,"
          "button:focus{outline:3px solid #1a73e8}form{margin:.8em 0}label{margin-right:1em}"
          ".pair{display:grid;grid-template-columns:1fr 1fr;gap:1em}mark{background:#ffe08a}")


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
    other: str = ""           # a similar pair's second student

    @property
    def key(self) -> dict:
        return {"student": self.student, "lesson": self.lesson, **({"other": self.other} if self.other else {})}

    @property
    def who(self) -> str:
        return f"{self.student} & {self.other}" if self.other else self.student

    @property
    def url(self) -> str:
        return f"/{'pair' if self.other else 'item'}?{urlencode(self.key)}"


def review_queue(out: Path, lesson: str = "", kind: str = "") -> list:
    """The items of the class graded into ``out`` that need a person, in student order,
    optionally only ``lesson``'s or only one ``kind`` (a key of KINDS). Reads the journal and
    overrides.csv as ``report`` does, and the similar pairs of the last report (similar.json) that
    no decision in decisions.jsonl covers for these answers; starts no kernel."""
    items, grades = [], load_final_grades(Path(out))
    for g in grades:
        what = g.status.kind
        if what in (NEEDS_REVIEW, TIMED_OUT) and g.review == "undecided":
            found = what
        elif what == REJECTED and not g.overrides:
            found = REJECTED
        elif g.stale and not g.overrides:     # decided again for this attempt: done
            found = "stale"
        elif g.late_note.startswith("submission time unknown") and not g.overrides:
            found = "time"        # a due date, but no time to hold it against: no penalty applied
        else:
            continue
        reason = {"stale": lambda: "; ".join(f"{o.what} (attempt {o.attempt[:12]})" for o in g.stale),
                  "time": lambda: g.late_note}.get(found, lambda: g.status.reason or str(g.status))()
        items.append(Item(g.student, g.assignment, found, reason, g.attempt, g.score, g.max_score,
                          dict(g.exercises), list(g.notes)))
    decided, rows = pair_decisions(out), {(g.student, g.assignment): g for g in grades}
    for p in load_pairs(out):
        if (p.assignment, *sorted([p.a, p.b]), p.digest) in decided:
            continue
        g = rows.get((p.a, p.assignment))
        items.append(Item(p.a, p.assignment, "similar", f"{p.a} and {p.b} share {p.score:.0%} of the answer code "
                          "each wrote (the skeleton's and the solution's code left out): worth a look, not a verdict",
                          g.attempt if g else "", g.score if g else 0.0, g.max_score if g else 0.0, other=p.b))
    return [i for i in sorted(items, key=lambda i: (i.lesson, i.student))
            if (not lesson or i.lesson == lesson) and (not kind or i.kind == kind)]


def student_cells(out: Path, student: str, lesson: str) -> list:
    """[(label, source, is_test, error)] of the graded notebook's code cells and written answers:
    ``In [n]`` as the student saw it (the harness's execution count, else the place among code
    cells), ``test <grade id>`` for a test cell, ``written answer <grade id>`` for a manually
    graded text cell, and the error the cell ended with ("" when none)."""
    import nbformat
    folder = next((internal for s, a, internal in read_manifest(out)[0] if (s, a) == (student, lesson)),
                  folder_name(student))       # the folder grade wrote it under (class.json)
    cells = []
    for path in sorted((Path(out) / "work" / "autograded" / folder / lesson).glob("*.ipynb"))[:1]:
        nb = nbformat.read(path, as_version=4)
        n = 0
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if cell.cell_type != "code":
                if meta.get("grade") and meta.get("solution"):
                    cells.append((f"written answer {meta.get('grade_id', '')}", cell.source, False, ""))
                continue
            n += 1
            is_test = bool(meta.get("grade")) and not meta.get("solution")
            label = f"test {meta.get('grade_id', '')}" if is_test else f"In [{cell.get('execution_count') or n}]"
            error = next((f"{o.get('ename', '')}: {o.get('evalue', '')}" for o in cell.get("outputs", [])
                          if o.get("output_type") == "error"), "")
            cells.append((label, cell.source, is_test, error))
    return cells


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

        def written(self, write, then: str):
            """Run ``write`` (a decision); on to ``then``, or the reason it was refused."""
            try:
                write()
            except ValueError as exc:
                self.set_status(400)
                self.finish(_page("Not written", f"<h1>Not written</h1><p>{_e(exc)}</p>"
                                  "<p><a href='javascript:history.back()'>back</a></p>"))
                return
            self.redirect(then, status=303)

        def arg(self, name):
            return self.get_body_argument(name, "")

    class Queue(Base):
        def get(self):
            lesson, kind = self.get_query_argument("lesson", ""), self.get_query_argument("kind", "")
            every = review_queue(out)              # the journal read once a page
            items = [i for i in every if (not lesson or i.lesson == lesson) and (not kind or i.kind == kind)]
            lessons = sorted({i.lesson for i in every})
            graded = sorted(read_manifest(out)[1])
            questions = "".join(f"<li><a href='/question?{_e(urlencode({'lesson': le, 'exercise': ex}))}'>"
                                f"{_e(le)} · {_e(ex)}</a></li>" for le in graded for ex in exercise_maxima(out, le))
            options = lambda values, chosen, names=None: "".join(   # noqa: E731
                f"<option value='{_e(v)}'{' selected' * (v == chosen)}>{_e((names or {}).get(v, v) or 'all')}</option>"
                for v in [""] + values)
            rows = "".join(
                f"<tr><td><a href='{_e(i.url)}'>{_e(i.who)}</a></td><td>{_e(i.lesson)}</td>"
                f"<td class='kind'>{_e(KINDS[i.kind])}</td><td>{_e(i.reason[:160])}</td>"
                f"<td>{i.score:g} / {i.max_score:g}</td></tr>" for i in items)
            self.finish(_page("Review", (
                f"<h1>To decide: {len(items)} of {len(every)}</h1>"
                "<form method='get' action='/'><label>Lesson <select name='lesson'>"
                f"{options(lessons, lesson)}</select></label><label>Reason <select name='kind'>"
                f"{options(list(KINDS), kind, KINDS)}</select></label><button>Filter</button></form>"
                "<table><tr><th>Student</th><th>Lesson</th><th>Why</th><th>Reason</th><th>Score</th></tr>"
                f"{rows}</table>" + ("" if items else "<p>Nothing to decide.</p>") +
                f"<h2>Grade by question</h2><ul>{questions}</ul>")))

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
            maxima = exercise_maxima(out, lesson)
            scored = res.get("exercises", {})
            table = "".join(f"<tr><td>{_e(g)}</td><td>{scored.get(g, 0):g} / {m:g}</td></tr>"
                            for g, m in maxima.items())
            nav = ""
            if here is not None:
                for key, step, word in (("j", 1, "next"), ("k", -1, "previous")):
                    other = items[(here + step) % len(items)]
                    nav += f"<a accesskey='{key}' href='{_e(other.url)}'>{word} ({key})</a> "
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
            a = self.arg
            self.written(lambda: decide(out, a("student"), a("lesson"), a("action"), a("by"), a("comment"),
                                        a("exercise"), a("points"), root=root), "/item")

        def redirect(self, url, *args, **kwargs):      # on to the next item still to decide
            rest = review_queue(out)
            super().redirect(rest[0].url if rest else "/", *args, **kwargs)

    class PairPage(Base):
        def get(self):
            lesson, a, b = (self.get_query_argument(n) for n in ("lesson", "student", "other"))
            pair = next((p for p in load_pairs(out) if p.assignment == lesson and {p.a, p.b} == {a, b}), None)
            if pair is None:
                raise tornado.web.HTTPError(404, "no such pair in the last report")
            items = review_queue(out)
            here = next((n for n, i in enumerate(items) if (i.lesson, i.student, i.other) == (lesson, a, b)), None)
            nav = "".join(f"<a accesskey='{k}' href='{_e(items[(here + step) % len(items)].url)}'>{w} ({k})</a> "
                          for k, step, w in (("j", 1, "next"), ("k", -1, "previous"))) if here is not None else ""
            last = pair_decisions(out).get((lesson, *sorted([a, b]), pair.digest))
            state = (f"<p>Decided by {_e(last['by'])}: {_e(PAIR_VERDICTS.get(last['verdict'], last['verdict']))}"
                     f"{(' (' + _e(last['comment']) + ')') if last.get('comment') else ''}</p>" if last else
                     f"<p class='reason'><span class='kind'>{_e(KINDS['similar'])}</span>: "
                     f"{_e(items[here].reason if here is not None else '')}</p>")
            side = "".join(f"<div><h2>{_e(who)} ({share:.0%} shared)</h2><pre>{_marked(code, spans)}</pre></div>"
                           for who, share, code, spans in ((pair.a, pair.score_a, pair.code_a, pair.shared_a),
                                                           (pair.b, pair.score_b, pair.code_b, pair.shared_b)))
            verdicts = "".join(f"<label><input type='radio' name='verdict' value='{_e(v)}' required> {_e(t)}</label>"
                               for v, t in PAIR_VERDICTS.items())
            form = (f"<form method='post' action='/pair'>{self.xsrf_form_html()}" + "".join(
                f"<input type='hidden' name='{n}' value='{_e(v)}'>" for n, v in
                (("lesson", lesson), ("student", a), ("other", b), ("answers", pair.digest))) +
                f"{verdicts}<label>Note <input name='comment' size='40'></label>"
                f"<label>By <input name='by' value='{_e(by)}' required></label><button>Record</button></form>")
            self.finish(_page(f"{a} & {b} · {lesson}", (
                f"<p><a href='/' accesskey='q'>queue (q)</a> {nav}</p><h1>{_e(a)} &amp; {_e(b)} · {_e(lesson)}</h1>"
                f"{state}{form}<p>Marked: the code the two answers share. A pair is never a grade; a decision "
                f"here changes no score.</p><div class='pair'>{side}</div>")))

        def post(self):
            a = self.arg
            self.written(lambda: decide_pair(out, a("lesson"), a("student"), a("other"), a("verdict"), a("by"),
                                             a("comment"), a("answers")), "/")

        def redirect(self, url, *args, **kwargs):
            rest = review_queue(out)
            super().redirect(rest[0].url if rest else "/", *args, **kwargs)

    class Question(Base):
        def get(self):
            lesson, exercise = self.get_query_argument("lesson"), self.get_query_argument("exercise")
            most = exercise_maxima(out, lesson).get(exercise)
            if most is None:
                raise tornado.web.HTTPError(404, "no such exercise")
            items = rubric_items(out, lesson, exercise)
            decided = {(o.student, o.exercise): o for g in load_final_grades(out) if g.assignment == lesson
                       for o in g.overrides}
            xsrf, key = self.xsrf_form_html(), (f"<input type='hidden' name='lesson' value='{_e(lesson)}'>"
                                                f"<input type='hidden' name='exercise' value='{_e(exercise)}'>")
            choose = "".join(f"<option value='{_e(i['id'])}'>{_e(i['id'])}: {i['points']:g} · {_e(i['comment'][:60])}"
                             "</option>" for i in items)
            rubric = "".join(
                f"<li><form method='post' action='/rubric/points'>{xsrf}{key}<input type='hidden' name='item' "
                f"value='{_e(i['id'])}'><b>{_e(i['id'])}</b> {_e(i['comment'])} <label>Points <input name='points' "
                f"size='5' value='{i['points']:g}'></label><button>Change for everyone who has it</button></form></li>"
                for i in items)
            shown = ""
            for name, students in groups(out, lesson, exercise).items():
                def now(s):
                    o = decided.get((s, exercise))
                    return "" if o is None else f" → {o.points:g}" + (f" ({tag_of(o.comment)})" if tag_of(o.comment) else "")
                members = ", ".join(f"<a href='/item?{_e(urlencode({'student': s, 'lesson': lesson}))}'>{_e(s)}</a>"
                                    f"{_e(now(s))}" for s in students)
                apply = (f"<form method='post' action='/rubric/apply'>{xsrf}{key}" +
                         "".join(f"<input type='hidden' name='student' value='{_e(s)}'>" for s in students) +
                         f"<label>Rubric item <select name='item'>{choose}</select></label>"
                         f"<label>By <input name='by' value='{_e(by)}' required></label>"
                         f"<button>Apply to these {len(students)}</button></form>") if items else ""
                shown += f"<h3>{_e(name)} ({len(students)})</h3><p>{members}</p>{apply}"
            self.finish(_page(f"{lesson} · {exercise}", (
                f"<p><a href='/' accesskey='q'>queue (q)</a></p><h1>{_e(lesson)} · {_e(exercise)} "
                f"(out of {most:g})</h1><h2>Rubric</h2><ul>{rubric}</ul>"
                f"<form method='post' action='/rubric/add'>{xsrf}{key}<label>Points <input name='points' size='5' "
                "required></label><label>Comment <input name='comment' size='60' required></label>"
                f"<button>Add an item</button></form><h2>Answers, grouped</h2>{shown}")))

    class RubricEdit(Base):
        def post(self, what):
            a, lesson, exercise = self.arg, self.arg("lesson"), self.arg("exercise")
            back = f"/question?{urlencode({'lesson': lesson, 'exercise': exercise})}"
            write = {"add": lambda: add_item(out, lesson, exercise, a("points"), a("comment")),
                     "points": lambda: set_item_points(out, lesson, exercise, a("item"), a("points"), root=root),
                     "apply": lambda: apply_item(out, lesson, exercise, a("item"),
                                                 self.get_body_arguments("student"), a("by"), root=root)}[what]
            self.written(write, back)

    return tornado.web.Application([(r"/", Queue), (r"/item", ItemPage), (r"/decide", Decide), (r"/pair", PairPage),
                                    (r"/question", Question), (r"/rubric/(add|points|apply)", RubricEdit)],
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
