"""``canvas pull`` and ``canvas push``: submissions in with their times, grades and pages out.

Both read Canvas's Submissions API (``GET /api/v1/courses/:course_id/assignments/:id/submissions``,
paginated, each item a Submission: ``user_id``, ``attempt``, ``submitted_at`` (ISO 8601 UTC, or
null), ``late`` (Canvas's own flag), ``workflow_state``, ``score``, ``attachments`` (the latest
attempt's files: ``id``, ``filename``, ``display_name``, ``size``, ``url``), with
``include[]=user`` a ``user`` (``id``, ``name``, ``login_id``) and with
``include[]=submission_comments`` its ``submission_comments`` (``comment``, ``attachments``)).

**pull** writes ``SUBMISSIONS/<login>_<user id>/<lesson>/<file>.ipynb`` (the latest attempt's
notebooks, under the names the student gave them) and beside them nbgrader's ``timestamp.txt``
(``2026-10-01 21:59:00.000000 UTC``, Canvas's ``submitted_at``), the folder layout ``grade``
reads, whose times the term's late rule uses (docs/instructors.md: A term). The student id ends in the Canvas
user id, which ``export --lms canvas`` and ``push`` match students by.
``SUBMISSIONS/.canvas-pull.json`` (ignored by ``grade``: a dot file) records per student the user id, login, name, attempt,
``submitted_at``, Canvas's ``late`` flag and the files written, so a second pull downloads only
what changed. A submission whose latest attempt holds no notebook (a PDF only) gets its folder
all the same, a ``<file name>.txt`` in place of each file, saying what Canvas holds: ``grade``
gives it a rejected row naming them, ``push`` holds it back, the manifest records its ``problem``.

**push** posts, per student of the lesson graded in DIR, the final score (as ``report`` and
``export`` compute it: autograder.term.export._final_rows) scaled to the assignment's
``points_possible`` as ``submission[posted_grade]``, and the feedback page, headed by that grade
(feedback.gradebook_page), as a submission comment carrying the file: Canvas's three-step upload
(``POST .../submissions/:user_id/comments/files`` for an upload address, the file posted there,
then the redirect followed to confirm) and ``PUT .../submissions/:user_id`` with
``comment[text_comment]`` and ``comment[file_ids][]``. A grade no one decided (export's
``held``) is never posted. Nothing is posted twice: the score Canvas holds is compared first,
and each comment carries a marker with the page's SHA-256, looked for in the comments Canvas
holds (read again before any retry). The course's posting policy is left as it is.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from autograder import ids
from autograder.lms.canvas_api import CanvasError, Session
from autograder.journal import atomic_write, folder_in_use
from autograder.lms.gradebooks import points_text, trailing_number
from autograder.term.export import _feedback_page, _final_rows, recorded_term, term_for
from autograder.engine.feedback import gradebook_page

__all__ = ["MANIFEST", "PullResult", "pull", "PushPlan", "plan_push", "push", "student_id",
           "lesson_for", "graded_lessons", "format_pull", "format_push", "push_command"]

MANIFEST = ".canvas-pull.json"
MARK = "autograder feedback"   # in each comment push writes: "[autograder feedback <lesson> <sha>]"


def student_id(login: str, user_id) -> str:
    """``<login>_<user id>``: a folder name on every file system, ending in the Canvas user id
    (``ann.smith@uni.edu``, 101 -> ``ann.smith@uni.edu_101``)."""
    safe = re.sub(r"[^A-Za-z0-9.@-]+", "-", login or "").strip("-.") or "user"
    return f"{safe[:60]}_{int(user_id)}"


def lesson_for(assignment_id, lesson, term, lessons) -> str:
    """The lesson a Canvas assignment is: ``lesson`` (--lesson), else the lesson whose term
    file ``lms_column`` ends in ``(<assignment id>)``, else the only one of ``lessons``.
    Raises CanvasError saying how to name it."""
    if lesson:
        if lessons and lesson not in lessons:
            raise CanvasError(f"--lesson {lesson}: not a lesson here (one of "
                              f"{', '.join(sorted(lessons))})")
        return lesson
    if term is not None:
        found = [lid for lid, lt in term.lessons.items()
                 if (lt.lms_column or "").strip().endswith(f"({assignment_id})")]
        if len(found) == 1:
            return found[0]
    if lessons and len(lessons) == 1:
        return next(iter(lessons))
    raise CanvasError(f"which lesson is Canvas assignment {assignment_id}? give --lesson ID, or "
                      f"--term FILE whose lms_column for it ends in \"({assignment_id})\"")


def graded_lessons(out_dir) -> set:
    """The lessons grades.csv of ``out_dir`` holds (empty when it cannot be read)."""
    import csv
    try:
        with open(Path(out_dir) / "grades.csv", newline="", encoding="utf-8") as f:
            return {r.get("assignment") or "" for r in csv.DictReader(f)} - {""}
    except (OSError, UnicodeDecodeError, csv.Error):
        return set()


def _stamp(submitted_at: str) -> str:
    """Canvas's ``2026-10-01T21:59:00Z`` as nbgrader's timestamp.txt line, in UTC."""
    when = dt.datetime.fromisoformat(submitted_at.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")


@dataclass
class PullResult:
    """What a pull found: ``rows`` (one dict per student: id, user_id, name, submitted_at,
    late, files, fetched (how many downloaded now), note), and students with nothing to grade."""
    lesson: str
    out: Path
    rows: list = field(default_factory=list)
    missing: list = field(default_factory=list)     # (student id, why)
    rejected: list = field(default_factory=list)    # (student id, why): no notebook; grade rejects
    downloaded: int = 0


def pull(session: Session, course_id, assignment_id, lesson: str, out,
         max_bytes: int = 50 * 2**20) -> PullResult:
    """Download the latest attempt of every student of the assignment into ``out`` (module
    docstring). Attachments over ``max_bytes`` and files that are no notebook are not fetched
    (noted). Raises CanvasError (see canvas.Session.call); a CanvasCut leaves what was written."""
    out = Path(out)
    _, assignment = session.assignment(course_id, assignment_id)
    subs = session.listing(f"list the submissions of assignment {assignment_id}",
                           assignment.get_submissions(include=["user"]))
    try:
        before = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        before = {}
    before = before.get("students", {}) if isinstance(before, dict) else {}
    result, record = PullResult(lesson, out), dict(before)
    for sub in sorted(subs, key=lambda s: int(s.user_id)):
        user = getattr(sub, "user", None) or {}
        sid = student_id(user.get("login_id") or user.get("sis_user_id") or "", sub.user_id)
        submitted = getattr(sub, "submitted_at", None)
        notebooks = [a for a in sub.attachments
                     if str(getattr(a, "filename", "")).lower().endswith(".ipynb")]
        if getattr(sub, "workflow_state", "") == "unsubmitted" or not submitted:
            result.missing.append((sid, "no submission"))
            continue
        folder = out / ids.folder_name(sid) / lesson
        old = before.get(sid, {})
        for gone in old.get("placeholders", {}).values():
            (folder / gone).unlink(missing_ok=True)     # an earlier attempt without a notebook
        if not notebooks:
            row = _no_notebook(sub, sid, user, submitted, folder, old)
            record[sid] = row
            result.rejected.append((sid, row["problem"]))
            _write_manifest(out, course_id, assignment_id, lesson, record)
            continue
        files, note, fetched = {}, "", 0
        for att in notebooks:
            name = ids.folder_name(str(att.filename))
            if int(getattr(att, "size", 0) or 0) > max_bytes:
                note = (f"{name} not fetched: {att.size / 2**20:.0f} MiB, over "
                        f"{max_bytes // 2**20} MiB")
                continue
            target = folder / name
            if old.get("files", {}).get(str(att.id)) == name and target.is_file():
                files[str(att.id)] = name
                continue
            data = session.call(f"download {name} of {sid}", session.download, att.url)
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{name}.part"
            tmp.write_bytes(data)
            tmp.replace(target)
            files[str(att.id)] = name
            fetched += 1
        for gone in set(old.get("files", {}).values()) - set(files.values()):
            (folder / gone).unlink(missing_ok=True)    # an earlier attempt's notebook
        if files:
            atomic_write(folder / "timestamp.txt", _stamp(submitted) + "\n")
        row = {"user_id": int(sub.user_id), "login": user.get("login_id") or "",
               "name": user.get("name") or "", "attempt": getattr(sub, "attempt", None),
               "submitted_at": submitted, "late": bool(getattr(sub, "late", False)),
               "files": files}
        record[sid] = row
        result.rows.append({**row, "id": sid, "fetched": fetched, "note": note})
        result.downloaded += fetched
        _write_manifest(out, course_id, assignment_id, lesson, record)
    return result


def _write_manifest(out: Path, course_id, assignment_id, lesson: str, record: dict) -> None:
    atomic_write(out / MANIFEST, json.dumps({"course": str(course_id), "assignment":
                                             str(assignment_id), "lesson": lesson,
                                             "students": record}, indent=1, sort_keys=True))


def _no_notebook(sub, sid: str, user: dict, submitted: str, folder: Path, old: dict) -> dict:
    """A submission whose latest attempt holds no notebook (a PDF only): its folder gets, in
    place of each file, ``<file name>.txt`` saying what Canvas holds (nothing is downloaded), so
    that ``grade`` gives it a rejected row naming the files, and ``push`` holds it back. Any
    notebook of an earlier attempt is removed. Returns its manifest row (``problem`` set)."""
    for gone in old.get("files", {}).values():
        (folder / gone).unlink(missing_ok=True)
    (folder / "timestamp.txt").unlink(missing_ok=True)
    shown = [str(getattr(a, "display_name", None) or getattr(a, "filename", "?"))
             for a in sub.attachments]
    problem = (f"attempt {getattr(sub, 'attempt', '?')} holds no .ipynb file"
               + (f" ({', '.join(shown)})" if shown else ""))
    placeholders = {}
    folder.mkdir(parents=True, exist_ok=True)
    for att, name in zip(sub.attachments, shown):
        text = ids.folder_name(f"{name}.txt")
        if text in placeholders.values() or text.lower() == "timestamp.txt":   # nbgrader's
            text = ids.folder_name(f"{att.id}-{name}.txt")
        atomic_write(folder / text, f"Canvas holds {name!r} ({getattr(att, 'size', '?')} bytes) "
                                    f"in {sid}'s submission, submitted {submitted}: not a "
                                    "notebook, not downloaded.\n")
        placeholders[str(att.id)] = text
    if not shown:
        text = "no-file.txt"
        atomic_write(folder / text, f"Canvas holds a submission of {sid} with no file.\n")
        placeholders["-"] = text
    return {"user_id": int(sub.user_id), "login": user.get("login_id") or "",
            "name": user.get("name") or "", "attempt": getattr(sub, "attempt", None),
            "submitted_at": submitted, "late": bool(getattr(sub, "late", False)),
            "files": {}, "placeholders": placeholders, "problem": problem}


def format_pull(result: PullResult) -> str:
    """One line per student: id, submission time, Canvas's late flag beside it, files."""
    lines = [f"{len(result.rows)} submission(s) of lesson {result.lesson} in {result.out}/ "
             f"({result.downloaded} file(s) downloaded now, the rest unchanged since the last "
             "pull):"]
    for r in result.rows:
        flag = "Canvas: LATE" if r["late"] else "Canvas: on time"
        lines.append(f"  {ids.printable(r['id'])}  submitted {r['submitted_at']}  [{flag}]  "
                     + ", ".join(ids.printable(f) for f in r["files"].values())
                     + (f"  note: {r['note']}" if r["note"] else ""))
    for sid, why in result.rejected:
        lines.append(f"  NO NOTEBOOK: {ids.printable(sid)}: {ids.printable(why)}; grade gives it "
                     "a rejected row, push holds it back")
    for sid, why in result.missing:
        lines.append(f"  NOTHING TO GRADE: {ids.printable(sid)}: {why}")
    lines.append(f"next: python -m autograder grade {result.out} --out DIR --term term.toml "
                 "(timestamp.txt beside each notebook holds Canvas's submitted_at for the late "
                 "rule)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ push

@dataclass
class PushPlan:
    """What push would do. ``steps``: one dict per student to post to: student, lesson, user_id,
    grade (the points text to post; None when Canvas has it already), old (Canvas's score, None
    when ungraded), score (the points text), html (the page to attach; None when a comment with
    its marker is there already), marker, no_page (DIR has no feedback page for it) and
    submission (the canvasapi Submission); plus what is held back or not in Canvas.
    ``points``: the assignment's points possible."""
    lesson: str
    points: float
    steps: list = field(default_factory=list)
    held: list = field(default_factory=list)         # (student, why)
    not_found: list = field(default_factory=list)    # student ids with no Canvas user
    unchanged: int = 0
    done: list = field(default_factory=list)         # students posted to by push()


def _marker(lesson: str, text: str) -> str:
    return f"[{MARK} {lesson} {hashlib.sha256(text.encode()).hexdigest()[:16]}]"


def _has_comment(sub, marker: str) -> bool:
    return any(marker in str(c.get("comment") or "")
               for c in getattr(sub, "submission_comments", None) or [])


def plan_push(session: Session, out_dir, course_id, assignment_id, lesson: str,
              term=None) -> PushPlan:
    """Read DIR's final grades of ``lesson`` and what Canvas holds, and decide what to post
    (module docstring). Raises CanvasError, export.ExportError for an unreadable DIR."""
    rows = [r for r in _final_rows(out_dir, term) if r["assignment"] == lesson]
    if not rows:
        raise CanvasError(f"{out_dir} holds no grades of lesson {lesson}: grade it there first, "
                          "or name the lesson with --lesson")
    _, assignment = session.assignment(course_id, assignment_id)
    points = float(getattr(assignment, "points_possible", None) or 0)
    if points <= 0:
        raise CanvasError(f"assignment {assignment_id} has no points possible in Canvas: set "
                          "its Points in the assignment's settings, then push again")
    subs = session.listing(f"list the submissions of assignment {assignment_id}",
                           assignment.get_submissions(include=["submission_comments", "user"]))
    by_user = {str(s.user_id): s for s in subs}
    plan = PushPlan(lesson, points)
    landing = {}      # Canvas user id -> the student ids of grades.csv that end in it
    for row in rows:
        landing.setdefault(trailing_number(row["student_id"]), set()).add(row["student_id"])
    for row in sorted(rows, key=lambda r: r["student_id"]):
        sid = row["student_id"]
        uid = trailing_number(sid)
        if uid is None or uid not in by_user:
            plan.not_found.append(sid)
            continue
        others = sorted(landing[uid] - {sid})
        if others:     # never first-wins: nothing is posted to that user
            plan.held.append((sid, f"two rows for one Canvas user ({sid} and {', '.join(others)} "
                                   f"all end in user id {uid}); nothing posted for any: which is "
                                   "theirs? Fix the submissions (the file that is not theirs) "
                                   "and grade again"))
            continue
        if row["held"]:
            plan.held.append((sid, row["held"]))
            continue
        if row["max_score"] <= 0:
            plan.held.append((sid, "max_score is 0 in grades.csv: nothing to scale"))
            continue
        text = points_text(max(0.0, row["score"]) / row["max_score"] * points, False)
        sub = by_user[uid]
        old = getattr(sub, "score", None)
        grade = None if old is not None and abs(float(old) - float(text)) < 0.005 else text
        page, marker = _feedback_page(Path(out_dir), sid, lesson), None
        html = None
        if page is not None:
            html = gradebook_page(page.read_text(encoding="utf-8"), lesson, text,
                                  points_text(points, False), "canvas")
            marker = _marker(lesson, html)
            if _has_comment(sub, marker):
                html = None
        if grade is None and html is None:
            plan.unchanged += 1
            continue
        plan.steps.append({"student": sid, "lesson": lesson, "user_id": int(uid),
                           "grade": grade, "old": old,
                           "score": text, "html": html, "marker": marker, "submission": sub,
                           "no_page": page is None})
    return plan


def _post(step: dict, attempt: list) -> None:
    """One student's grade and comment. Before a retry (``attempt`` non-empty) it reads the
    submission again, so a request Canvas took before the connection broke is not repeated."""
    from canvasapi.upload import Uploader
    sub = step["submission"]
    if attempt:
        sub = _fresh(sub)
        old = getattr(sub, "score", None)
        if (step["grade"] is not None and old is not None
                and abs(float(old) - float(step["grade"])) < 0.005):
            step["grade"] = None
        if step["html"] is not None and _has_comment(sub, step["marker"]):
            step["html"] = None
        step["submission"] = sub
    attempt.append(1)
    kwargs = {}
    if step["grade"] is not None:
        kwargs["submission"] = {"posted_grade": step["grade"]}
    if step["html"] is not None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / ids.folder_name(f"{step['lesson']}_feedback.html")
            path.write_text(step["html"], encoding="utf-8")
            ok, info = Uploader(sub._requester, f"courses/{sub.course_id}/assignments/"
                                f"{sub.assignment_id}/submissions/{sub.user_id}/comments/files",
                                str(path)).start()
        if not ok or "id" not in info:
            raise CanvasError(f"Canvas did not confirm the upload of {step['student']}'s feedback "
                              "page; push again")
        kwargs["comment"] = {"text_comment": f"Feedback page for this lesson, with your grade. "
                                             f"{step['marker']}", "file_ids": [info["id"]]}
    if kwargs:
        sub.edit(**kwargs)


def _fresh(sub):
    """The submission as Canvas holds it now, with its comments."""
    from canvasapi.submission import Submission
    response = sub._requester.request(
        "GET", f"courses/{sub.course_id}/assignments/{sub.assignment_id}/submissions/{sub.user_id}",
        _kwargs=[("include[]", "submission_comments")])
    return Submission(sub._requester, {**response.json(), "course_id": sub.course_id})


def push(session: Session, plan: PushPlan, progress=None) -> PushPlan:
    """Carry out ``plan``, one student at a time, each through Session.call (bounded retries;
    a CanvasCut stops the run with every student before it posted). ``progress``: a callable
    taking one line per student posted. Returns the plan with ``done`` filled."""
    for step in plan.steps:
        attempt = []
        session.call(f"post the grade and feedback of {step['student']}", _post, step, attempt)
        plan.done.append(step["student"])
        if progress:
            progress(_step_line(step, "posted"))
    return plan


def _step_line(step: dict, verb: str) -> str:
    what = []
    if step["grade"] is not None:
        was = "none" if step["old"] is None else f"{float(step['old']):g}"
        what.append(f"grade {step['grade']} (Canvas had {was})")
    if step["html"] is not None:
        what.append("feedback page as a comment")
    return f"  {verb}: {ids.printable(step['student'])}: " + " and ".join(what or ["nothing"])


def format_push(plan: PushPlan, dry_run: bool) -> str:
    """What push did (or, with --dry-run, would do), and what it held back."""
    verb = "would post" if dry_run else "posted"
    lines = [f"lesson {plan.lesson} -> Canvas assignment worth {plan.points:g} points:"]
    if dry_run:
        lines += [_step_line(s, verb) for s in plan.steps]
    lines.append(f"  {len(plan.steps) if dry_run else len(plan.done)} student(s) {verb}, "
                 f"{plan.unchanged} already as Canvas has them (nothing posted)")
    lines += [f"  note: {ids.printable(s['student'])}: no feedback page in DIR/feedback; grade "
              "only" for s in plan.steps if s["no_page"]]
    if plan.held:
        lines.append(f"  HELD BACK ({len(plan.held)}): no one decided these grades, or two rows "
                     "land on one Canvas user; nothing posted for them. Decide each (DIR/"
                     "overrides.csv, or the submissions), run report, push again:")
        lines += [f"    {ids.printable(s)}: {ids.printable(why)}" for s, why in plan.held]
    if plan.not_found:
        lines.append(f"  NOT IN CANVAS ({len(plan.not_found)}): no submission of this assignment "
                     "for the Canvas user id these ids end in: "
                     + ", ".join(ids.printable(s) for s in plan.not_found))
    if dry_run:
        lines.append("dry run: nothing was sent to Canvas")
    return "\n".join(lines)


def push_command(session, out: Path, course, assignment, lesson, term_file, dry_run: bool, progress=print):
    """``canvas push``: the plan for the class graded into ``out`` (the folder held while it is
    read and posted, as ``grade`` holds it: autograder.journal.folder_in_use), posted unless
    ``dry_run``. ``term_file``: --term's path, else the term recorded in ``out``."""
    with folder_in_use(out, "canvas push", create=False):
        term = term_for(term_file, out) if term_file else recorded_term(out)
        plan = plan_push(session, out, course, assignment, lesson_for(assignment, lesson, term,
                                                                      graded_lessons(out)), term)
        if not dry_run:
            push(session, plan, progress=progress)
    return plan
