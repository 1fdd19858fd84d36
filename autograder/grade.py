"""`grade`: grade a class with nbgrader in a private work folder; write grades.csv and feedback."""
import csv
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.apps import NbGraderAPI
from sqlalchemy.exc import SAWarning
from tqdm.auto import tqdm

from .build import generate_release
from .collect import collect
from .config import CELL_TIMEOUT_S, list_assignments, work_config

__all__ = ["Result", "grade_class", "grade_submission", "write_csv", "format_table",
           "DEMO_SUBMISSIONS", "BASE_COLUMNS"]

DEMO_SUBMISSIONS = Path(__file__).resolve().parent / "demo" / "submissions"
BASE_COLUMNS = ["student_id", "assignment", "score", "max_score", "status"]


@dataclass
class Result:
    """The outcome for one student and one assignment."""
    student: str
    assignment: str
    score: float = 0.0
    max_score: float = 0.0
    status: str = "graded"       # "graded", "graded (...)", "error: ...", "rejected: ..."
    exercises: dict = field(default_factory=dict)   # grade_id -> points scored
    feedback: list = field(default_factory=list)    # paths of the HTML feedback files


def _reason(text: str) -> str:
    """The final exception of a traceback, one line: 'NbGraderException: ...' (200 chars)."""
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    starts = [i for i, ln in enumerate(lines) if re.match(r"^[\w.]+(Error|Exception): ", ln)]
    picked = lines[starts[-1]:] if starts else lines[-1:]
    reason = re.sub(r"^(\w+\.)+", "", " ".join(picked))   # a.b.NbGraderException -> NbGraderException
    return (reason or "(no message)")[:200]


def _grade_cells(notebook: Path) -> list:
    """grade_ids of the graded cells of a notebook, in cell order."""
    nb = nbformat.read(notebook, as_version=4)
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade")]


def _place(sub, expected: list, dest: Path, notes: list) -> str:
    """Copy the student's notebooks into nbgrader's submitted/ folder under the expected names.

    Returns a rejection reason, or "" when at least one notebook can be graded.
    """
    dest.mkdir(parents=True, exist_ok=True)
    by_name = {p.name: p for p in sub.notebooks}
    unmatched = [p for p in sub.notebooks if p.name not in expected]
    placed = 0
    for name in expected:
        src = by_name.get(name)
        if src is None and len(expected) == 1 and len(unmatched) == 1:
            src = unmatched.pop()
            notes.append(f"renamed '{src.name}' to '{name}'")
        if src is None:
            notes.append(f"missing notebook '{name}'")
            continue
        try:
            nbformat.read(src, as_version=4)
        except Exception as exc:   # invalid JSON or not a notebook at all
            return f"'{src.name}' is not a readable notebook ({type(exc).__name__}: {exc})"[:300]
        shutil.copyfile(src, dest / name)
        placed += 1
    notes.extend(f"ignored extra notebook '{p.name}'" for p in unmatched)
    return "" if placed else "none of the expected notebooks was submitted"


def grade_submission(api, work: Path, sub, expected: list, out: Path) -> Result:
    """Autograde one submission in ``work`` and render its feedback into ``out/feedback``.

    Never raises for a bad submission: problems end up in ``Result.status``.
    """
    res = Result(sub.student, sub.assignment)
    notes = []
    problem = sub.problem or _place(sub, expected, work / "submitted" / sub.student / sub.assignment,
                                    notes)
    if problem:
        res.status = "rejected: " + problem
        return res
    auto = api.autograde(sub.assignment, sub.student, force=True, create=True)
    if not auto["success"]:
        res.status = "error: autograde failed, grade by hand: " + _reason(auto.get("error")
                                                                        or auto.get("log"))
        return res
    with Gradebook(api.coursedir.db_url) as gb:
        try:
            submitted = gb.find_submission(sub.assignment, sub.student)
        except MissingEntry:
            res.status = "error: nbgrader recorded no grades"
            return res
        res.score, res.max_score = float(submitted.score), float(submitted.max_score)
        res.exercises = {g.name: float(g.score) for nb in submitted.notebooks for g in nb.grades}
        if submitted.needs_manual_grade:
            notes.append("needs manual grading")
    fb = api.generate_feedback(sub.assignment, sub.student, force=True)
    if not fb["success"]:
        notes.append("feedback failed: " + _reason(fb.get("error")))
    src = work / "feedback" / sub.student / sub.assignment
    dst = out / "feedback" / sub.student / sub.assignment
    for html in sorted(src.glob("*.html")):
        dst.mkdir(parents=True, exist_ok=True)
        res.feedback.append(Path(shutil.copyfile(html, dst / html.name)))
    res.status = "graded" + (f" ({'; '.join(notes)})" if notes else "")
    return res


def grade_class(root: Path, submissions=None, out: Path = Path("grades"),
                timeout: int = CELL_TIMEOUT_S, progress: bool = True) -> list:
    """Grade every submission in ``submissions`` (folder or zip; default: the demo class).

    Writes ``out/grades.csv`` and ``out/feedback/<student>/<assignment>/<notebook>.html``;
    nbgrader's course folder and gradebook live in ``out/work`` (rebuilt on every run, so
    re-running is safe). ``timeout`` is the per-cell limit in seconds. Returns the Results
    sorted by assignment, then student. Raises FileNotFoundError / ValueError when
    ``submissions`` holds no class.
    """
    root, out = Path(root), Path(out)
    submissions = DEMO_SUBMISSIONS if submissions is None else Path(submissions)
    work = out / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    if (out / "feedback").exists():
        shutil.rmtree(out / "feedback")
    subs = sorted(collect(submissions, list_assignments(root), work / "incoming"),
                  key=lambda s: (s.assignment, s.student))
    needed = sorted({s.assignment for s in subs if not s.problem})
    release = generate_release(root, needed, work)
    expected = {a: sorted(p.name for p in (release / a).glob("*.ipynb")) for a in needed}
    columns = {a: [g for nb in expected[a] for g in _grade_cells(release.parent / "source" / a / nb)]
               for a in needed}
    api = NbGraderAPI(config=work_config(work, timeout))
    results = []
    bar = tqdm(subs, desc="grading", unit="notebook", disable=not progress)
    with warnings.catch_warnings():
        # nbgrader's gradebook code trips SQLAlchemy autoflush warnings; they say nothing of the class.
        warnings.filterwarnings("ignore", category=SAWarning)
        for sub in bar:
            bar.set_postfix_str(f"{sub.student}/{sub.assignment}")
            results.append(grade_submission(api, work, sub, expected.get(sub.assignment, []), out))
    for r in results:   # a rejected submission still shows what it could have scored
        if r.assignment in columns and not r.max_score:
            r.max_score = _max_score(api, r.assignment)
    write_csv(out / "grades.csv", results, [g for a in needed for g in columns[a]])
    return results


def _max_score(api, assignment: str) -> float:
    with Gradebook(api.coursedir.db_url) as gb:
        return float(gb.find_assignment(assignment).max_score)


def write_csv(path: Path, results: list, exercise_columns: list) -> None:
    """One row per student and assignment: BASE_COLUMNS, then points per graded cell."""
    columns = BASE_COLUMNS + list(dict.fromkeys(exercise_columns))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for r in results:
            row = {"student_id": r.student, "assignment": r.assignment, "score": r.score,
                   "max_score": r.max_score, "status": r.status}
            row.update({k: v for k, v in r.exercises.items() if k in columns})
            w.writerow(row)


def _num(x: float) -> str:
    return f"{x:g}"


def format_table(results: list) -> str:
    """A plain-text table: student, assignment, score/max, status."""
    rows = [("student", "assignment", "score", "status")]
    rows += [(r.student, r.assignment, f"{_num(r.score)}/{_num(r.max_score)}", r.status)
             for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths)) + "  " + row[3]
             for row in rows]
    lines.insert(1, "-" * min(max(len(ln) for ln in lines), 100))
    return "\n".join(lines)
