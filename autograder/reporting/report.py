"""`report`: the class report, one self-contained HTML page of what the class got wrong.

``DIR/report.html`` shows, per lesson: the score distribution and each exercise's pass rate
(matplotlib figures embedded as base64 PNG), for each exercise the catalogued mistakes ranked by
how many students made them with the hint they were shown and who they are, a "no hint matched"
row for unforeseen wrong answers, the submissions whose status needs the instructor (manual
review undecided, what overrides.csv decided, late penalties and unknown submission times,
timed out, repaired, rejected), and pairs of similar answers (autograder.reporting.similarity). Scores
shown per student are the final ones (autograder.results: the term's late rule and
overrides.csv applied); the distribution and pass rates are the tests' own.
The page opens offline from the file system: no script, no server, no external resource (its
Content-Security-Policy forbids them), and every string a student could have written (ids,
hints quoting their values, code) is HTML-escaped.

``grade`` rebuilds it at the end of every run; ``python -m autograder report DIR [--term FILE]``
rebuilds it (with insights.csv, grades.csv and the per-lesson CSVs, and each feedback page's
grade box) without regrading or starting a kernel, for example after a lesson's mistakes.json
was edited, an extension given or an override written.
"""
import base64
import datetime
import html
import io
import statistics
from collections import Counter
from pathlib import Path
from urllib.parse import quote

from autograder import ids
from autograder.reporting.insights import ClassData, load_class, write_insights_csv, write_lesson_csvs
from autograder.journal import atomic_write
from autograder.mistakes import NO_MATCH, NOT_GRADED
from autograder.results import GRADED, NEEDS_REVIEW, REJECTED, TIMED_OUT, Status
from autograder.term.policy import class_grades, final_grades
from autograder.reporting.similarity import MIN_SHARED, THRESHOLD, available, save_pairs, similar_pairs
from autograder.reporting.similarity import marked_html as _marked
from autograder.config import list_assignments
from autograder.engine.feedback import write_grade_boxes
from autograder.term.termfile import remember_term, remembered_term

__all__ = ["write_class_outputs", "render_report", "unknown_extensions", "REPORT_FILE",
           "MAX_PAIRS_SHOWN"]

REPORT_FILE = "report.html"
MAX_PAIRS_SHOWN = 30          # per lesson; the rest are counted
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
_STATUS_ADVICE = {
    NEEDS_REVIEW: "open the student's notebook (work/submitted/) and feedback page; the reason "
                  "says what the grader could not decide. Until a row of DIR/overrides.csv "
                  "decides it, the machine score stands.",
    "decided": "decided in DIR/overrides.csv: a manual review settled, or points changed by "
               "hand (the grade and the comment are in grades.csv and on the student's "
               "feedback page).",
    "late": "the late penalty of the term file; an extension in its [extensions] table and "
            "`report DIR --term FILE` change it without regrading.",
    "time unknown": "the lesson has a due date but the submission carries no time: no penalty "
                    "was applied; set one with overrides.csv if one is due.",
    TIMED_OUT: "the cells named reached a limit and scored as failed; like a manual review, "
               "export and push hold the grade back until a row of DIR/overrides.csv decides "
               "it (points, or keep to keep the tests' score). If the code was merely slow, "
               "regrade with a larger --timeout or --cpu-time.",
    "stale": "overrides.csv decided an earlier attempt; the student handed in again, so that "
             "decision is not applied to this one: write a row for the attempt now graded "
             "(its attempt column, or leave it empty) to decide it.",
    REJECTED: "the file could not be graded (not a notebook, broken JSON, wrong lesson); ask "
                "the student for the notebook itself, then grade again.",
    "no page": "graded, and the score stands, but the feedback page could not be written (the "
               "reason names the notebook and the error): the student has nothing to read yet. "
               "The next `grade` run writes it again (after the grader is fixed, if it failed again).",
    "repaired": "the grader fixed or chose something (renamed file, restored cells, several "
                "notebooks); the grade stands, the note says what was done.",
}


def _e(text) -> str:
    """``text`` escaped for HTML text and attribute values."""
    return html.escape(str(text), quote=True)


def write_class_outputs(root: Path, out: Path, threshold: float = THRESHOLD, term=None) -> dict:
    """Write report.html, insights.csv, grades.csv (with hints) and grades-<lesson>.csv into
    ``out`` from the class graded there, and the final-grade box of each feedback page, with
    ``term`` (autograder.term.termfile.Term; None: the one recorded in ``out``, else none) and
    ``out/overrides.csv`` applied (autograder.results). Starts no kernel. Returns {"report":
    path, "insights": path, "csv": [paths], "pairs": number of similar pairs, "feedback":
    pages updated, "grades": [FinalGrade]}. Raises FileNotFoundError when ``out`` holds no
    graded class, results.OverrideError, term.TermError."""
    out = Path(out)
    if term is None:
        term = remembered_term(out, list_assignments(Path(root)))
    else:
        remember_term(out, term)
    data = load_class(root, out)
    maxima = {a: {ex.grade_id: ex.points for ex in lesson.exercises}
              for a, lesson in data.lessons.items()}
    grades = class_grades(out, data.results, maxima, term)
    pairs, note = {}, ""
    if available():
        for a, lesson in data.lessons.items():
            answers = {s: text for (s, aa), text in data.answers.items() if aa == a}
            pairs[a] = similar_pairs(a, answers, [lesson.skeleton, lesson.reference], threshold)
    else:
        note = "copydetect is not installed (pip install copydetect, or the grade extra)."
    save_pairs(out, pairs)
    write_insights_csv(out / "insights.csv", data)
    csvs = write_lesson_csvs(out, data, grades)
    titles = {a: {ex.grade_id: ex.title for ex in lesson.exercises}
              for a, lesson in data.lessons.items()}
    pages = write_grade_boxes(out, grades, titles)
    atomic_write(out / REPORT_FILE, render_report(data, pairs, out, threshold, note, grades))
    return {"report": out / REPORT_FILE, "insights": out / "insights.csv", "csv": csvs,
            "pairs": sum(len(p) for p in pairs.values()), "feedback": len(pages),
            "grades": grades, "unknown_extensions": unknown_extensions(term, grades)}


def unknown_extensions(term, grades: list) -> list:
    """The term file's extensions that name no graded student, as "student (lesson)", sorted:
    an extension for a lesson graded in this folder whose student id has no row of that lesson
    (a typo there would silently leave a student's penalty in place). An extension for a lesson
    this folder does not hold is another folder's (one folder per lesson), so never listed."""
    here = {g.assignment for g in grades}
    rows = {(g.student, g.assignment) for g in grades}
    return sorted(f"{student} ({lesson})" for student, lessons in term.extensions.items()
                  for lesson in lessons if lesson in here and (student, lesson) not in rows)


# ---------------------------------------------------------------------------------- figures

def _png(fig) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figures(scores: list, max_score: float, rates: list) -> tuple:
    """(histogram of scores, pass rate per exercise) as base64 PNGs. ``rates``: [(title, rate)]."""
    import matplotlib as mpl
    from matplotlib.figure import Figure

    from mlexp.plot import COLORS, STYLE
    with mpl.rc_context({**STYLE, "figure.dpi": 100, "savefig.dpi": 100}):
        fig = Figure(figsize=(5.2, 3.0))
        ax = fig.add_subplot()
        top = max(max_score, max(scores, default=0))
        bins = [x - 0.5 for x in range(int(top) + 2)] if top <= 40 else 20
        ax.hist(scores, bins=bins, color=COLORS[0], edgecolor="white")
        ax.set_xlabel(f"score (of {max_score:g})")
        ax.set_ylabel("students")
        ax.set_title("Score distribution")
        ax.yaxis.get_major_locator().set_params(integer=True)
        hist = _png(fig)
        fig = Figure(figsize=(5.2, 0.6 + 0.45 * max(len(rates), 1)))
        ax = fig.add_subplot()
        labels = [t if len(t) <= 34 else t[:33] + "…" for t, _ in rates][::-1]
        values = [100 * r for _, r in rates][::-1]
        ax.barh(range(len(values)), values, color=COLORS[2])
        ax.set_yticks(range(len(values)), labels)
        ax.set_xlim(0, 100)
        ax.set_xlabel("students who passed (%)")
        ax.set_title("Pass rate per exercise")
        bars = _png(fig)
    return hist, bars


# ------------------------------------------------------------------------------------- page

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto;
       max-width: 1100px; padding: 0 1em; color: #1b1b1b; line-height: 1.4; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 2px solid #0072B2; padding-bottom: 0.2em;
       margin-top: 2em; } h3 { margin: 1.4em 0 0.4em; }
.meta, .note { color: #555; } .note { font-size: 0.92em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; width: 100%; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.5em; text-align: left; vertical-align: top; }
th { background: #f2f5f8; } td.num { text-align: right; white-space: nowrap; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.plots img { max-width: 100%; height: auto; }
.hint { white-space: pre-wrap; overflow-wrap: break-word; font-size: 0.92em; }
.who { font-size: 0.92em; overflow-wrap: break-word; min-width: 9em; }
table.mistakes td:first-child code { white-space: nowrap; }
tr.no-match td { background: #fff6e5; } tr.none td { color: #888; }
code { background: #f2f2f2; padding: 0 0.2em; overflow-wrap: anywhere; }
.side { display: grid; grid-template-columns: 1fr 1fr; gap: 0.6em; }
.side pre { white-space: pre-wrap; overflow-wrap: anywhere; font-size: 0.8em; background: #fafafa;
            border: 1px solid #ddd; padding: 0.5em; margin: 0; }
mark { background: #ffe08a; } nav a { margin-right: 1em; }
.verdict { border-left: 4px solid #E69F00; padding: 0.3em 0.8em; background: #fffaf0; }
details { margin: 0.3em 0; } summary { cursor: pointer; }
"""


def _lesson_numbers(data: ClassData, a: str) -> dict:
    results = [r for r in data.results if r["assignment"] == a]
    graded = [r for r in results if r.get("exercises") and Status.of(r["status"]).kind != REJECTED]
    return {"results": results, "graded": graded, "scores": [float(r["score"]) for r in graded]}


def _mistake_table(data: ClassData, lesson, ex, rows: list) -> str:
    """The ranked mistakes of one exercise, the no-match row, the catalogued ones nobody made."""
    failed = [i for i in rows if i.mistake and i.mistake != NOT_GRADED]
    by_id = {}
    for i in failed:
        by_id.setdefault(i.mistake, []).append(i)
    catalogued = [m for m in lesson.mistakes.values() if m.test == ex.grade_id]
    made = sorted((mid for mid in by_id if mid != NO_MATCH),
                  key=lambda mid: (-len(by_id[mid]), mid))
    out = ["<table class='mistakes'><tr><th>Mistake</th><th>Students</th><th>Hint shown</th>"
           "<th>Who</th></tr>"]
    for mid in made:
        hint = Counter(i.hint for i in by_id[mid]).most_common(1)[0][0]
        out.append(f"<tr class='mistake' data-mistake='{_e(mid)}'><td><code>{_e(mid)}</code></td>"
                   f"<td class='num count'>{len(by_id[mid])}</td><td class='hint'>{_e(hint)}</td>"
                   f"<td class='who'>{_e(', '.join(i.student for i in by_id[mid]))}</td></tr>")
    unmatched = by_id.get(NO_MATCH, [])
    hints = Counter(i.hint or "(no message)" for i in unmatched).most_common(5)
    shown = "".join(f"<div>{_e(h)}{f' (×{n})' if n > 1 else ''}</div>" for h, n in hints)
    out.append(f"<tr class='no-match' data-mistake='{NO_MATCH}'><td>no hint matched</td>"
               f"<td class='num count'>{len(unmatched)}</td><td class='hint'>{shown or '—'}</td>"
               f"<td class='who'>{_e(', '.join(i.student for i in unmatched))}</td></tr>")
    out.append("</table>")
    unmade = [m.id for m in catalogued if m.id not in by_id]
    if unmade:
        out.append(f"<p class='note'>Catalogued, made by no one: "
                   f"{', '.join(f'<code>{_e(m)}</code>' for m in unmade)}</p>")
    return "\n".join(out)


def _statuses(results: list, grades: dict = None) -> str:
    """The "needs you" table: per status kind (and, with ``grades`` {(student, lesson):
    FinalGrade}, manual reviews decided, late penalties and unknown times) who and why."""
    groups = {k: [] for k in _STATUS_ADVICE}
    for r in results:
        status = Status.of(r["status"])
        final = (grades or {}).get((r["student"], r["assignment"]))
        kind = status.kind
        if final is not None and final.overrides:
            was = f"{status.reason}; " if final.review == "decided" else ""
            groups["decided"].append((r["student"], f"{was}{final.override_text} -> score "
                                      f"{final.score:g} ({final.override_comment or 'no comment'})"))
        for o in (final.stale if final is not None else ()):
            groups["stale"].append((r["student"], f"line {o.line}: {o.what} for attempt "
                                    f"{o.attempt[:12]}; graded now: {final.attempt[:12]}"))
        if kind != GRADED and not (final is not None and final.review == "decided"):
            groups[kind].append((r["student"], status.reason))
        elif kind == GRADED and status.reason:
            groups["no page"].append((r["student"], status.reason))
        if final is not None and final.late_penalty:
            groups["late"].append((r["student"], final.late_note))
        elif final is not None and final.due and not final.submitted_at and kind != REJECTED:
            groups["time unknown"].append((r["student"], final.late_note))
        if r.get("notes"):
            groups["repaired"].append((r["student"], "; ".join(r["notes"])))
    if not any(groups.values()):
        return "<p class='note'>Every submission was graded as it came, without notes.</p>"
    out = ["<table class='statuses'><tr><th>Status</th><th>Students</th><th>Why</th>"
           "<th>What to do</th></tr>"]
    for kind, items in groups.items():
        if items:
            why = "".join(f"<div><b>{_e(s)}</b>: {_e(reason)}</div>" for s, reason in items)
            label = {NEEDS_REVIEW: "manual review: undecided" if grades else kind,
                     TIMED_OUT: "timed out: undecided" if grades else kind,
                     "decided": "decided (overrides)",
                     "stale": "decided for an earlier attempt"}.get(kind, kind)
            out.append(f"<tr class='status' data-status='{_e(kind)}'><td>{_e(label)}</td>"
                       f"<td class='num count'>{len(items)}</td><td class='who'>{why}</td>"
                       f"<td class='note'>{_e(_STATUS_ADVICE[kind])}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def _similar(a: str, pairs, threshold: float, note: str) -> str:
    out = [f"<p class='verdict'>Worth a look, never a verdict: these pairs of students share long "
           f"runs of answer code (at least {threshold:.0%} of each one's code and {MIN_SHARED} "
           "characters), found by winnowing fingerprints (copydetect, as in MOSS; names do not "
           "matter). Code from the released skeleton and from the reference solution is not "
           "counted, so two correct answers written the natural way are not a pair. Similar "
           "code has honest causes: a study group, a shared hint, a common source.</p>"]
    if note:
        return out[0] + f"<p class='note'>{_e(note)}</p>"
    if pairs is None or not pairs:
        out.append("<p class='note pairs-none'>No pair above the threshold.</p>")
        return "\n".join(out)
    out.append("<table class='pairs'><tr><th>Students</th><th>Shared</th><th>Side by side</th></tr>")
    for n, p in enumerate(pairs[:MAX_PAIRS_SHOWN]):
        anchor = f"pair-{_e(a)}-{n}"
        out.append(
            f"<tr class='pair' id='{anchor}'><td class='who'>{_e(p.a)} and {_e(p.b)}</td>"
            f"<td class='num'>{p.score_a:.0%} / {p.score_b:.0%}</td><td><details><summary>"
            f"show the two answers</summary><div class='side'><div><b>{_e(p.a)}</b>"
            f"<pre>{_marked(p.code_a, p.shared_a)}</pre></div><div><b>{_e(p.b)}</b>"
            f"<pre>{_marked(p.code_b, p.shared_b)}</pre></div></div></details></td></tr>")
    out.append("</table>")
    if len(pairs) > MAX_PAIRS_SHOWN:
        out.append(f"<p class='note'>{len(pairs) - MAX_PAIRS_SHOWN} more pairs above the "
                   "threshold are not shown.</p>")
    return "\n".join(out)


def _feedback_link(out: Path, res: dict) -> str:
    pages = [Path(p) for p in res.get("feedback", [])]
    if not pages:
        return ""
    rel = ["feedback", ids.folder_name(res["student"]), res["assignment"], pages[0].name]
    if not (out / Path(*rel)).is_file():
        return ""
    return f"<a href='{_e('/'.join(quote(part) for part in rel))}'>feedback</a>"


def _lesson_section(data: ClassData, a: str, pairs, out: Path, threshold: float, note: str,
                    grades: dict) -> str:
    lesson, nums = data.lessons[a], _lesson_numbers(data, a)
    rows = [i for i in data.insights if i.assignment == a]
    scores, graded = nums["scores"], nums["graded"]
    mean = f"{statistics.mean(scores):.2f}" if scores else "—"
    median = f"{statistics.median(scores):g}" if scores else "—"
    stats = []
    for ex in lesson.exercises:
        mine = [i for i in rows if i.exercise == ex.grade_id and i.mistake != NOT_GRADED]
        passed = sum(1 for i in mine if not i.mistake)
        stats.append((ex, passed, len(mine)))
    hist, bars = _figures(scores, lesson.max_score,
                          [(ex.title, p / n if n else 0.0) for ex, p, n in stats])
    h = [f"<section class='lesson' id='lesson-{_e(a)}' data-assignment='{_e(a)}'>",
         f"<h2>{_e(a)}</h2>",
         f"<p class='summary'><span class='n-students'>{len(nums['results'])}</span> students, "
         f"<span class='n-graded'>{len(graded)}</span> graded; mean score "
         f"<span class='mean'>{mean}</span> of {lesson.max_score:g}, median {median}.</p>",
         "<div class='plots'>"
         f"<img alt='Score distribution of {_e(a)}' src='data:image/png;base64,{hist}'>"
         f"<img alt='Pass rate per exercise of {_e(a)}' src='data:image/png;base64,{bars}'></div>",
         "<table class='exercises'><tr><th>Exercise</th><th>Points</th><th>Passed</th>"
         "<th>Pass rate</th><th>Top mistakes (students)</th></tr>"]
    for ex, passed, n in stats:
        counts = Counter(i.mistake for i in rows if i.exercise == ex.grade_id
                         and i.mistake not in ("", NOT_GRADED))
        top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        shown = ", ".join(f"<code>{_e(m)}</code> ({k})" for m, k in top[:3])
        more = f", {len(top) - 3} more" if len(top) > 3 else ""
        h.append(f"<tr class='exercise' data-exercise='{_e(ex.grade_id)}'>"
                 f"<td><a href='#ex-{_e(a)}-{_e(ex.grade_id)}'>{_e(ex.title)}</a> "
                 f"<code>{_e(ex.grade_id)}</code></td><td class='num'>{ex.points:g}</td>"
                 f"<td class='num passed'>{passed} / {n}</td>"
                 f"<td class='num'>{(passed / n if n else 0):.0%}</td>"
                 f"<td>{shown + more or '—'}</td></tr>")
    h.append("</table>")
    for ex, passed, n in stats:
        h.append(f"<h3 id='ex-{_e(a)}-{_e(ex.grade_id)}'>{_e(ex.title)} "
                 f"<small><code>{_e(ex.grade_id)}</code>, {passed} of {n} passed</small></h3>")
        h.append(_mistake_table(data, lesson, ex, [i for i in rows if i.exercise == ex.grade_id]))
    h.append("<h3>Submissions that need you</h3>")
    h.append(_statuses(nums["results"], grades))
    h.append("<h3>Similar submissions</h3>")
    h.append(_similar(a, pairs, threshold, note))
    h.append(f"<details><summary>All {len(nums['results'])} students</summary>"
             "<table class='students'><tr><th>Student</th><th>Score</th><th>Status</th>"
             "<th>Mistakes</th><th></th></tr>")
    for r in nums["results"]:
        final = grades[(r["student"], a)]
        changed = [f"raw {final.raw_score:g}"] if final.raw_score != final.machine_score else []
        changed += [f"late -{final.late_penalty:g}"] if final.late_penalty else []
        h.append(f"<tr class='student' data-student='{_e(r['student'])}'><td>{_e(r['student'])}</td>"
                 f"<td class='num score'>{final.score:g} / {final.max_score:g}"
                 f"{' (' + _e(', '.join(changed)) + ')' if changed else ''}</td>"
                 f"<td>{_e(r['status'])}</td><td>{_e(data.hints(r['student'], a))}</td>"
                 f"<td>{_feedback_link(out, r)}</td></tr>")
    h.append("</table></details></section>")
    return "\n".join(h)


def render_report(data: ClassData, pairs: dict, out: Path, threshold: float = THRESHOLD,
                  note: str = "", grades: list = None) -> str:
    """The report page (a str of HTML) for ``data``; ``pairs``: assignment -> [similarity.Pair];
    ``grades``: [results.FinalGrade] of data.results (default: as graded, no term)."""
    grades = {(g.student, g.assignment): g for g in (grades or final_grades(data.results))}
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lessons = [a for a in sorted(data.lessons)]
    head = (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta http-equiv='Content-Security-Policy' content=\"{_CSP}\">"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>Class report</title><style>{_STYLE}</style></head><body>")
    body = [f"<h1>What the class got wrong</h1><p class='meta'>{len(data.results)} submissions "
            f"in {len(lessons)} lesson(s), from {_e(out)}, {when}. Each failed exercise is "
            "matched to the mistake its hint names (solutions/&lt;lesson&gt;/mistakes.json); "
            "insights.csv holds every row.</p>",
            "<nav>" + "".join(f"<a href='#lesson-{_e(a)}'>{_e(a)}</a>" for a in lessons) + "</nav>"]
    body += [_lesson_section(data, a, pairs.get(a), out, threshold, note, grades) for a in lessons]
    other = [r for r in data.results if r["assignment"] not in data.lessons]
    if other:
        body.append("<h2>Submissions of no known lesson</h2>" + _statuses(other, grades))
    return head + "\n".join(body) + "\n</body></html>\n"
