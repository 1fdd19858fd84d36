"""`grade`: grade a class with nbgrader, each student sandboxed; resumable; grades.csv, feedback.

One run: collect the submissions (a folder or an LMS zip), choose and repair each student's
notebook against the released lesson, then for each student not already graded with the same
bytes, let nbgrader autograde it with execution moved into the trusted harness (test cells run
there, the student's cells in a sandboxed kernel: autograder.engine.sandbox), render feedback without
hidden tests, and commit the result to the journal (autograder.journal). ``jobs`` students run
at once; a submission that reaches a time limit is graded again alone, once the others are done,
and that run's result is the one kept (issue 52: no verdict depends on the load); everything that touches the gradebook is serialised in this process (the only writer
of grades). With a Dask scheduler, each submission's sandboxed run goes to a worker of that
cluster instead (autograder.engine.distributed); everything else stays here. nbgrader's part, one
student at a time, is autograder.engine.autograde; the releases graded against, autograder.publishing.releases.
"""
import os
import shutil
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from sqlalchemy.exc import SAWarning
from tqdm.auto import tqdm

from autograder import ids
from autograder.engine import sandbox
from autograder.engine.jail import jail
from autograder.engine.autograde import SANDBOX_PREPROCESSORS, Grader, nbgrader_config
from autograder.intake.collect import DEFAULT_MAX_BYTES, choose_notebook, collect
from autograder.config import list_assignments
from autograder.grading.earlier import EarlierLessons
from autograder.journal import (atomic_write, digest, folder_in_use, load_result, save_result,
                               write_manifest)
from autograder.options import GradingOptions
from autograder.release import Release
from autograder.publishing.releases import git_releases, release_history, update_releases
from autograder.lms.base import by_layout
from autograder.intake.repair import SubmissionRejected, read_notebook_text, release_cells, repair_notebook
from autograder.results import GRADE_COLUMNS, TIMED_OUT, Result, Status, read_timestamp, write_grades_csv
from autograder.term.policy import (OVERRIDES_FILE, attempts_of, grade_rows, read_overrides,
                                    stamp_overrides)
from autograder.term.termfile import remember_term, remembered_term
from autograder.reporting.report import write_class_outputs

__all__ = ["Result", "grade_class", "write_csv", "format_table", "DEMO_SUBMISSIONS",
           "BASE_COLUMNS", "MAX_NOTEBOOK_BYTES", "GRADER_VERSION", "SANDBOX_PREPROCESSORS"]

DEMO_SUBMISSIONS = Path(__file__).resolve().parents[1] / "demo" / "submissions"
BASE_COLUMNS = GRADE_COLUMNS   # grades.csv's first columns (autograder.results)
MAX_NOTEBOOK_BYTES = DEFAULT_MAX_BYTES   # GradingOptions.max_size_mb (--max-size), in bytes
GRADER_VERSION = "3"                 # part of each job's digest: bump to regrade everything


@dataclass
class _Job:
    sub: object                # the collect.Submission
    notebooks: dict            # expected name -> repaired NotebookNode
    result: Result
    review: list = field(default_factory=list)   # reasons found before or after the run
    page_missing: str = ""     # why a graded notebook got no feedback page ("" when each got one)


TAMPERING = "grader settings of"      # the repair note of a graded cell whose metadata was changed


ALONE_NOTE = ("it reached a time limit, so it was graded a second time, alone (no other notebook of the "
              "run being graded); this is the second run's result")


def _with_earlier(lesson: Release, root: Path) -> Release:
    """``lesson`` with the releases before it, per notebook (autograder.intake.repair's
    ``earlier``): the course's committed lessons/ and the releases made in this DIR, so that an
    old notebook is not blamed for the changes since."""
    for n in lesson.names:
        now = release_cells(lesson.release[n])
        found = git_releases(root, lesson.assignment, n) + \
            [r[n] for r in release_history(lesson.work, lesson.assignment) if n in r]
        lesson.earlier[n] = [r for i, r in enumerate(found) if r != now and r not in found[:i]]
    return lesson


def _submitted_at(sub, chosen) -> tuple:
    """(ISO time, source) of a submission, read where the class was handed in (never from
    anything the student's code wrote): nbgrader's timestamp.txt beside a folder submission,
    the time the LMS's name of the ``chosen`` file gives (Blackboard's attempt date), or the
    LMS's late mark (Canvas's _LATE_): each LMS's sources (``Lms.stamp_source``,
    ``Lms.late_source``, lms/); else ("", why it is unknown). In an
    LMS export a file named timestamp.txt is one the student uploaded: it is never read."""
    for rel, path in sub.data_files if sub.layout == "folder" else ():
        if rel == "timestamp.txt":
            try:   # nbgrader's format, "2026-10-01 21:59:00.000000 UTC" (results.read_timestamp)
                return read_timestamp(path.read_text(errors="replace")[:200])
            except (ValueError, OverflowError, OSError):
                return "", "unknown (timestamp.txt is not a date)"
    lms = by_layout(sub.layout)    # the LMS of the export (lms/), None for a class folder
    stamp = sub.stamps.get(chosen) if chosen is not None else None
    if stamp and lms is not None:
        return stamp, lms.stamp_source
    if lms is not None and lms.late_note and lms.late_note in sub.notes:
        return "", lms.late_source
    return "", ""


def _prepare(sub, lesson, settings: str, max_bytes: int) -> _Job:
    """Choose, read and repair the student's notebooks (no execution); never raises."""
    res = Result(sub.student, sub.assignment, notes=list(sub.notes))
    job = _Job(sub, {}, res)
    chosen = []
    if sub.problem:
        res.status = "rejected: " + sub.problem
        res.digest = digest("rejected", sub.problem, *(p.name for p in sub.notebooks))
        return job
    parts = [lesson.digest, settings]
    for name in lesson.names:
        path = choose_notebook(sub, name, only_one=len(lesson.names) == 1,
                               notes=res.notes)
        if path is None:
            res.notes.append(f"missing notebook '{name}'")
            continue
        res.file = res.file or str(path)
        chosen.append(path)
        try:
            data = path.read_bytes()
            parts += [name, data]
            nb, notes = read_notebook_text(data, max_bytes)
            repairs = repair_notebook(nb, lesson.release[name], lesson.sources,
                                      lesson.earlier[name])
            res.notes += notes + repairs
            job.review += [n for n in repairs if TAMPERING in n]
        except SubmissionRejected as exc:
            res.status = f"rejected: '{path.name}': {exc}"
            break
        except Exception as exc:   # a notebook so odd that repair fails: a person must look
            res.status = f"needs manual review: could not repair '{path.name}' " \
                         f"({type(exc).__name__}: {str(exc)[:150]})"
            break
        job.notebooks[name] = nb
    for rel, path in sub.data_files:   # files carried beside the notebook change the run
        parts += [rel, path.read_bytes()]
    res.attempt = digest("attempt", *parts[2:])   # what was handed in, whatever grades it
    if res.status == "graded" and not job.notebooks:
        res.status = "rejected: none of the expected notebooks was submitted " \
                     f"(expected {', '.join(lesson.names)})"
    res.digest = digest(*parts, res.status)
    res.submitted_at, res.submitted_at_source = _submitted_at(sub, chosen[0] if chosen else None)
    return job


def grade_class(root: Path, submissions=None, out: Path = Path("grades"),
                options: GradingOptions = None, progress: bool = True, jobs: int = None,
                force: bool = False, db_url=None, max_bytes: int = MAX_NOTEBOOK_BYTES,
                scheduler: str = None, term=None) -> list:
    """Grade every submission in ``submissions`` (folder or zip; default: the demo class).

    Writes ``out/grades.csv`` (this class, one row per student and assignment),
    ``out/feedback/<student>/<assignment>/<notebook>.html``, the journal ``out/results/`` and
    nbgrader's course folder ``out/work`` (the gradebook ``out/work/gradebook.db`` unless
    ``db_url`` names another, e.g. PostgreSQL). Results already in the journal for the same
    bytes are reused unless ``force``; an interrupted run resumes. ``options`` (GradingOptions)
    sets the time, memory and output limits; ``jobs`` students are graded at once (default 1),
    each kernel with this machine's cores divided by ``jobs`` as its torch/OpenMP threads unless
    ``options.kernel_threads`` is set.
    ``scheduler`` (a Dask scheduler address) runs each submission on that cluster's workers
    (autograder.engine.distributed; ``jobs`` then defaults to twice its worker threads) and writes
    each worker's isolation notes to ``out/isolation.txt``. ``term`` (autograder.term.termfile.Term)
    gives due dates, late rule and extensions, applied to grades.csv and the report (never in
    the gradebook), and is recorded in ``out`` for later runs (None: the recorded one, if
    any); ``out/overrides.csv`` is read (never written) and checked before anything runs.
    Returns the Results sorted by assignment, then student. Raises FileNotFoundError /
    ValueError when ``submissions`` holds no class, results.OverrideError for a bad row of
    overrides.csv, term.TermError when the recorded term file is gone or invalid,
    sandbox.SandboxUnavailable when the OS sandbox cannot run (here, or on a worker)
    and ``options.unsandboxed`` is not set, distributed.ClusterError when the cluster cannot
    be used or is lost (the results committed before it are kept), and journal.FolderInUse when
    another ``grade`` or ``report`` is writing into ``out``.
    """
    root, out = Path(root).resolve(), Path(out).resolve()   # nbgrader chdirs while it works
    with folder_in_use(out, "grade"):   # a second run into ``out`` stops here, naming this one
        return _grade_class(root, submissions, out, options, progress, jobs, force, db_url,
                            max_bytes, scheduler, term)


def _grade_class(root, submissions, out, options, progress, jobs, force, db_url, max_bytes,
                 scheduler, term) -> list:
    options = options or GradingOptions()
    if not scheduler and not options.kernel_threads:   # this machine's cores, shared by the jobs
        options = replace(options, kernel_threads=jail.shared_threads(jobs))
    if not scheduler:   # on a cluster each worker checks its own sandbox
        sandbox.check_sandbox(options)
    submissions = DEMO_SUBMISSIONS if submissions is None else Path(submissions).resolve()
    cwd = os.getcwd()
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o700)    # the gradebook and the autograded notebooks: the grader's eyes only
    if (work / "incoming").exists():
        shutil.rmtree(work / "incoming")
    assignments = list_assignments(root)
    names = {a: sorted(p.name for p in (root / "solutions" / a).glob("*.ipynb")) for a in assignments}
    subs = sorted(collect(submissions, assignments, work / "incoming", names, max_bytes=max_bytes),
                  key=lambda s: (s.assignment, s.student))
    needed = sorted({s.assignment for s in subs if not s.problem})
    update_releases(root, work, needed, db_url)
    lessons = {a: _with_earlier(Release(work, a), root) for a in needed}
    kept = EarlierLessons(out, {s.assignment for s in subs})
    overrides = read_overrides(out / OVERRIDES_FILE, {   # a bad row stops the run before any kernel
        **kept.known(),
        **{(s.student, s.assignment): lessons[s.assignment].maxima
           if s.assignment in lessons else {} for s in subs}})
    # a row written without an attempt decides the attempt graded when it is read: the one in
    # the journal now, before this run grades another (stamped in the file, with a warning)
    overrides = stamp_overrides(out / OVERRIDES_FILE, overrides, attempts_of(
        Result.from_dict(r) for r in (load_result(out, o.assignment, o.student)
                                      for o in overrides if not o.attempt) if r))
    if term is None:   # the term file of an earlier --term, read again, else none
        term = remembered_term(out, assignments)
    else:
        remember_term(out, term)
    settings = f"{GRADER_VERSION} {options}"
    prepared = [_prepare(s, lessons.get(s.assignment), settings, max_bytes) for s in subs]
    # nbgrader reads student ids as globs and path patterns: it sees only safe internal ids,
    # the Result (grades.csv, journal, feedback folder) keeps the id as the LMS wrote it.
    internal = ids.internal_ids(job.sub.student for job in prepared)
    for job in prepared:
        job.sub = replace(job.sub, student=internal[job.sub.student])
    run = sandbox.GradingRun(sandbox.LocalExecutor(root))
    config = nbgrader_config(work, root, options, db_url, run)
    grader = Grader(work, out, config, options, run)
    results, todo = {}, []
    for job in prepared:
        old = load_result(out, job.result.assignment, job.result.student)
        if old and old.get("digest") == job.result.digest and not force and not old.get("retry"):
            results[id(job)] = Result.from_dict({   # the time as handed in now
                **old, "reused": True, "submitted_at": job.result.submitted_at,
                "submitted_at_source": job.result.submitted_at_source})
        elif job.result.status != "graded":   # rejected or unrepairable: nothing to run
            results[id(job)] = job.result
            save_result(out, asdict(job.result))
        else:
            todo.append(job)
    max_scores = {}
    if scheduler and todo:   # connect only when something is left to run
        from autograder.engine.distributed import DaskExecutor
        grader.cluster = DaskExecutor(scheduler, options)
        run.executor = grader.cluster
        jobs = jobs or 2 * max(1, grader.cluster.threads)
        if progress:
            tqdm.write(grader.cluster.describe(jobs), file=sys.stderr)
    jobs = jobs or 1

    def isolation():   # this machine's notes, or each worker's
        if grader.cluster is not None:
            return grader.cluster.isolation_lines()
        return sandbox.isolation_notes(options) or ["fully isolated"]
    noted = isolation()
    if grader.cluster is not None or not scheduler:   # else: nothing ran, the last file stands
        atomic_write(out / "isolation.txt", "".join(f"{n}\n" for n in noted))

    def commit(job, res):   # in this thread only: the journal entry, then grades.csv
        nonlocal noted
        _publish_feedback(out, job.sub.student, res)
        results[id(job)] = res
        save_result(out, asdict(res))
        _write_partial(out, prepared, results, lessons, max_scores, term, overrides, kept)
        if isolation() != noted:   # a worker that joined during the batch
            noted = isolation()
            atomic_write(out / "isolation.txt", "".join(f"{n}\n" for n in noted))

    # grades.csv exists from the start (what is reused or rejected); each commit rewrites it after
    # its journal entry, so a kill (SIGKILL) leaves it at most the one interrupted commit behind
    # the journal, and the next run rewrites it whole.
    _write_partial(out, prepared, results, lessons, max_scores, term, overrides, kept)
    bar = tqdm(total=len(todo), desc="grading", unit="notebook", disable=not progress)
    with warnings.catch_warnings():
        # nbgrader's gradebook code trips SQLAlchemy autoflush warnings; they say nothing of the class.
        warnings.filterwarnings("ignore", category=SAWarning)
        pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="grade")
        try:
            futures = {pool.submit(grader.grade, job): job for job in todo}
            again = []   # reached a time limit beside the others: graded again alone, below
            for fut in as_completed(futures):
                if Status.of(fut.result().status).kind == TIMED_OUT:
                    again.append(futures[fut])
                    continue
                commit(futures[fut], fut.result())
                bar.set_postfix_str(f"{futures[fut].sub.student}/{futures[fut].sub.assignment}")
                bar.update()
            pool.shutdown()
            for job in again:   # nothing else of this run is running now
                res = grader.grade(job)
                res.notes.append(ALONE_NOTE)
                commit(job, res)
                bar.update()
        except BaseException:   # Ctrl-C, a lost cluster: stop the runs, keep what is committed
            pool.shutdown(wait=False, cancel_futures=True)
            if grader.cluster is None:
                run.executor.kill_all()
            else:   # its calls in flight end with it: let them
                grader.cluster.close()
                pool.shutdown()
            # Ctrl-C between a journal entry and its grades.csv row: the row is written now
            _write_partial(out, prepared, results, lessons, max_scores, term, overrides, kept)
            raise
        finally:
            bar.close()
            if grader.cluster is not None:
                grader.cluster.close()
            os.chdir(cwd)
        pool.shutdown()
    _write_partial(out, prepared, results, lessons, max_scores, term, overrides, kept)
    _write_report(root, out, prepared, lessons, term, kept)
    return [results[id(j)] for j in prepared if id(j) in results]


def _write_report(root: Path, out: Path, prepared: list, lessons: dict, term=None,
                  kept=None) -> None:
    """The class report, insights.csv and the CSVs with hints (autograder.reporting.report), from what
    this run committed and the lessons ``kept`` from earlier runs; a failure here is a warning
    (every grade is already saved)."""
    entries = [(j.result.student, j.result.assignment, j.sub.student) for j in prepared]
    columns = {a: lessons[a].columns for a in lessons}
    if kept is not None:
        entries += [tuple(e) for e in kept.entries]
        columns.update(kept.columns)
    write_manifest(out, sorted(entries, key=lambda e: (e[1], e[0])),
                   {a: columns[a] for a in sorted(columns)})
    try:
        write_class_outputs(root, out, term=term)
    except Exception as exc:   # noqa: BLE001 (reported, then the run ends as usual)
        warnings.warn(f"the class report could not be written ({type(exc).__name__}: {exc}); "
                      f"grades are saved: run `python -m autograder report {out}` after fixing it")


def _publish_feedback(out: Path, internal: str, res: Result) -> None:
    """Move the feedback nbgrader wrote under the internal id to the student's own id (made
    safe for the file system by ids.folder_name), and point ``res.feedback`` at it."""
    src = out / "feedback" / internal / res.assignment
    dst = out / "feedback" / ids.folder_name(res.student) / res.assignment
    if src == dst or not src.is_dir():
        return
    if dst.exists():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, dst)
    if not any(src.parent.iterdir()):
        src.parent.rmdir()
    res.feedback = [str(dst / Path(f).name) for f in res.feedback]


def _write_partial(out, prepared, results, lessons, max_scores, term=None, overrides=(),
                   kept=None) -> None:
    """grades.csv of this class so far: committed results and the lessons ``kept`` from
    earlier runs, in table order (lesson, then student)."""
    done = [results[id(j)] for j in prepared if id(j) in results]
    for r in done:   # a rejected submission still shows what it could have scored
        if not r.max_score and r.assignment in lessons:
            r.max_score = max_scores.setdefault(r.assignment, lessons[r.assignment].max_score)
    columns = {a: lessons[a].columns for a in lessons}
    if kept is not None:
        done = sorted(done + kept.results, key=lambda r: (r.assignment, r.student))
        columns.update(kept.columns)
    columns = [g for a in sorted(columns) for g in columns[a]]
    write_csv(out / "grades.csv", done, columns, hints={},   # hints: filled when the batch ends
              term=term, overrides=overrides)


def write_csv(path: Path, results: list, exercise_columns: list, hints=None, term=None,
              overrides=()) -> None:
    """grades.csv from Results: one row per student and assignment, BASE_COLUMNS, then points
    per graded cell, then ``hints`` when given ((student, assignment) -> mistake ids). With
    ``term`` (autograder.term.termfile.Term) and ``overrides`` ([results.Override]) the late rule and the
    instructor's decisions are applied as ``report`` applies them (autograder.term.policy.grade_rows,
    the Moodle worksheets' times included). Atomic; every text
    cell is spreadsheet-safe (an id like ``=HYPERLINK(...)`` is shown, never run)."""
    write_grades_csv(path, grade_rows(results, term, overrides), exercise_columns, hints)


def _num(x: float) -> str:
    return f"{x:g}"


def format_table(results: list) -> str:
    """A plain-text table: student, assignment, score/max, status (with notes in brackets)."""
    rows = [("student", "assignment", "score", "status")]
    rows += [(ids.printable(r.student), r.assignment, f"{_num(r.score)}/{_num(r.max_score)}",
              ids.printable(r.status + (f" ({'; '.join(r.notes)})" if r.notes else "")))
             for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths)) + "  " + row[3]
             for row in rows]
    lines.insert(1, "-" * min(max(len(ln) for ln in lines), 100))
    return "\n".join(lines)
