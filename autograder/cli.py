"""Command line: build, publish, book, grade, report, export, canvas, check, demo and seeds (see `python -m autograder COMMAND --help`)."""
import argparse
import sys
import time
from pathlib import Path

from autograder.publishing.build import BuildError
from autograder.config import find_course_root
from autograder.options import add_arguments, from_arguments
from autograder.engine.sandbox import SandboxUnavailable
from autograder.lms.base import LMSS
from autograder.grading.console import announce, summary_lines

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m autograder", description=__doc__)
    p.add_argument("--course", metavar="PATH",
                   help="course root holding solutions/ and lessons/ (default: the current "
                        "directory, else the checkout this package is installed from)")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="generate lessons/ from solutions/ with nbgrader")
    b.add_argument("--check", action="store_true",
                   help="only compare: exit 1 and list the files when lessons/ is out of date")
    b.add_argument("--colab", nargs="?", const="dist", metavar="DIR",
                   help="instead, write the course file students upload to Colab (a wheel of mlexp) "
                        "into DIR (default dist/)")
    b.add_argument("--repo", metavar="OWNER/NAME",
                   help="first set the course's GitHub repository (autograder/course.py) and rewrite "
                        "every badge, setup cell and README link for it, then build")

    pb = sub.add_parser("publish", help="write the student edition (lessons, mlexp, a student "
                                         "README; no solutions, hidden tests or grader) into OUT")
    pb.add_argument("out", metavar="OUT", help="folder to write; empty, new, or an edition "
                                               "written before (all but .git is replaced)")
    pb.add_argument("--repo", metavar="OWNER/NAME",
                    help="the public repository OUT is pushed to: its Colab badges and setup "
                         "cells point there (default: COURSE_REPO of autograder/course.py)")
    pb.add_argument("--with-solutions", action="store_true",
                    help="also write worked/<id>/<id>.ipynb, the solutions without their hidden "
                         "tests (self-study, or after the last deadline)")

    bk = sub.add_parser("book", help="build the course as a static web site into OUT (Sphinx, "
                                     "myst-nb; offline): lesson pages with outputs, no answers")
    bk.add_argument("out", metavar="OUT", help="folder to write; empty, new, or a book built before")
    bk.add_argument("--size", choices=["full", "grading"], default="full",
                    help="run the experiments at full size (default, as a reader does) or at the "
                         "grader's token size (NBGRADER_EXECUTION=validate: seconds, for tests)")
    bk.add_argument("--lessons", nargs="+", metavar="ID",
                    help="only these lessons (ids or prefixes, e.g. 01 04; default all)")
    bk.add_argument("--with-solutions", action="store_true",
                    help="self-study edition: the worked solution folded under each exercise")
    bk.add_argument("--repo", metavar="OWNER/NAME",
                    help="the student edition's public repository, for the Open in Colab links "
                         "(default: COURSE_REPO of autograder/course.py)")
    bk.add_argument("--cache", metavar="DIR",
                    help="executed lessons (jupyter-cache) and Sphinx's work (default build/book-cache)")
    bk.add_argument("--rerun", action="store_true",
                    help="run every lesson again, also those the cache holds (the cache knows a "
                         "lesson's code, not mlexp's: use it after changing the library)")

    g = sub.add_parser("grade", help="grade a class; print a table, write grades.csv and feedback")
    g.add_argument("submissions", nargs="?",
                   help="folder of <student>/<assignment>/*.ipynb or a .zip of one "
                        "(default: the demo class in autograder/demo/submissions)")
    g.add_argument("--out", required=True, metavar="DIR",
                   help="output folder: grades.csv, feedback/, and nbgrader's work/ folder")
    add_arguments(g)
    add_term_argument(g)
    g.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    g.add_argument("-j", "--jobs", type=int, metavar="N",
                   help="students graded at once, each in its own process (default 1; with "
                        "--scheduler, twice the cluster's worker threads)")
    g.add_argument("--scheduler", metavar="ADDRESS",
                   help="run each submission on the workers of this Dask scheduler, e.g. "
                        "tcp://10.0.0.5:8786 (needs pip install 'mlexp-autograder[dask]'; docs/instructors.md: "
                        "Grading on a cluster); grades, feedback and the gradebook stay here")
    g.add_argument("--force", action="store_true",
                   help="regrade every submission, also those already graded with the same bytes")
    g.add_argument("--db", metavar="URL",
                   help="gradebook URL, e.g. postgresql://user@host/course "
                        "(default: SQLite in DIR/work/gradebook.db)")
    g.add_argument("--sample", type=int, metavar="N",
                   help="demo class only: grade N students per lesson (a typical mistake first, "
                        "then the all-correct one), copied to DIR/demo-sample; `make grade` uses 1")

    c = sub.add_parser("check", help="run a notebook's visible tests; print PASS/FAIL and hints")
    c.add_argument("notebook", help="path of the .ipynb to check")
    add_arguments(c, only={"cell_timeout", "notebook_timeout", "memory_mb"})

    r = sub.add_parser("report", help="rebuild DIR/report.html, insights.csv and the CSVs' hints "
                                      "from a graded class, without regrading")
    r.add_argument("out", metavar="DIR", help="the --out folder of an earlier `grade`")
    add_term_argument(r)
    r.add_argument("--similarity", type=float, default=None, metavar="FRACTION",
                   help="list pairs of students who share at least this fraction of their answer "
                        "code (default 0.8)")

    rv = sub.add_parser("review", help="a page in the browser for what needs a person (held, timed out, "
                                       "rejected, stale); each decision a row of DIR/overrides.csv")
    rv.add_argument("out", metavar="DIR", help="the --out folder of an earlier `grade`")
    rv.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)")
    rv.add_argument("--by", default="", help="your name, filled into each decision's by column")
    rv.add_argument("--no-browser", action="store_true", help="print the address, open no browser")

    e = sub.add_parser("export", help="fill in the gradebook file Canvas, Moodle or Blackboard "
                                      "downloads with a graded class's scores, to upload back")
    e.add_argument("out", metavar="DIR", help="the --out folder of an earlier `grade`")
    e.add_argument("--lms", required=True, choices=list(LMSS))   # lms/: one module per LMS
    e.add_argument("--gradebook", required=True, metavar="FILE",
                   help="the file the LMS downloads: Canvas's gradebook export (.csv), Moodle's "
                        "grading worksheet (.csv), Blackboard's Grade Centre download (.xls/.csv)")
    e.add_argument("--out", dest="dest", required=True, metavar="FILE",
                   help="where to write the filled-in copy (the gradebook itself is not changed)")
    e.add_argument("--term", metavar="FILE",
                   help="the term file: its lms_column entries name each lesson's column")
    e.add_argument("--lesson", metavar="ID",
                   help="Moodle: the lesson this worksheet is for (default: the lesson whose "
                        "lms_column is in the worksheet's file name, or grades.csv's only one); "
                        "Canvas, Blackboard: fill only this lesson's column")
    e.add_argument("--feedback", metavar="ZIP",
                   help="also write the feedback pages as the LMS takes them back (Moodle: its "
                        "feedback files zip; Canvas, Blackboard: one page per student)")
    e.add_argument("--send-undecided", action="store_true",
                   help="fill in grades no one decided too (an undecided manual review: its "
                        "machine score; rejected work: 0) and exit 0 although a graded student "
                        "is missing from the gradebook; without it, export holds them back, "
                        "lists them and exits 3")

    cv = sub.add_parser("canvas", help="Canvas through its REST API: pull submissions with "
                                       "their times, push grades and feedback pages (the "
                                       "grader's canvas extra)")
    add_canvas_arguments(cv)

    d = sub.add_parser("demo", help="regenerate the demo class from its catalogue")
    d.add_argument("--check", action="store_true",
                   help="only compare: exit 1 when the committed demo class is out of date")
    d.add_argument("--check-hints", action="store_true",
                   help="run each exercise's tests (in this process, no kernel) against every "
                        "catalogued demo student: exit 1 naming each student who no longer gets "
                        "the score and hints it was built for")

    s = sub.add_parser("seeds", help="re-run lessons with shifted seeds; mean +- sd of their RESULT lines")
    from autograder.publishing.seeds import add_arguments as seed_arguments
    seed_arguments(s, course=False)
    return p


def add_canvas_arguments(cv: argparse.ArgumentParser) -> None:
    """``canvas pull`` and ``canvas push`` (autograder.term.canvas_sync; docs/instructors.md:
    Grades back into the LMS)."""
    sub = cv.add_subparsers(dest="canvas_command", required=True)
    pl = sub.add_parser("pull", help="download each student's latest notebook with its "
                                     "submission time into a folder grade reads")
    pl.add_argument("course_arg", metavar="COURSE", help="Canvas course id (.../courses/COURSE)")
    pl.add_argument("assignment", metavar="ASSIGNMENT",
                    help="Canvas assignment id (.../assignments/ASSIGNMENT)")
    pl.add_argument("--out", required=True, metavar="SUBMISSIONS",
                    help="folder to write <login>_<user id>/<lesson>/ into (kept: a second "
                         "pull downloads only what changed)")
    ph = sub.add_parser("push", help="post decided grades and feedback pages of a graded "
                                     "lesson to the assignment (never an undecided one)")
    ph.add_argument("out", metavar="DIR", help="the --out folder of an earlier `grade`")
    ph.add_argument("course_arg", metavar="COURSE", help="Canvas course id")
    ph.add_argument("assignment", metavar="ASSIGNMENT", help="Canvas assignment id")
    ph.add_argument("--dry-run", action="store_true",
                    help="print what would be posted; send nothing")
    for p in (pl, ph):
        p.add_argument("--lesson", metavar="ID",
                       help="the lesson this assignment is (default: the term file's lesson whose "
                            "lms_column ends in (ASSIGNMENT), else DIR's only lesson)")
        p.add_argument("--term", metavar="FILE", help="the term file (its lms_column entries)")
        p.add_argument("--url", metavar="URL",
                       help="the Canvas address, e.g. https://canvas.example.edu (default: "
                            "$CANVAS_URL)")
        p.add_argument("--token-file", metavar="FILE",
                       help="a file holding the API token, readable by you only (chmod 600); "
                            "default: the environment variable CANVAS_TOKEN")


def add_term_argument(p: argparse.ArgumentParser) -> None:
    """``--term FILE`` for grade, report (and export): the term file (autograder.term.termfile)."""
    p.add_argument("--term", metavar="FILE",
                   help="term file (TOML): due dates, late rule, extensions, LMS columns "
                        "(docs/instructors.md: 'A term'); applied when results become grades, without "
                        "regrading; remembered in DIR for later runs without --term")


def read_term(args, root: Path):
    """The Term of ``--term FILE`` checked against the lessons of the course at ``root``, or
    None without ``--term``. Raises term.TermError (a ValueError) for a bad file."""
    if not getattr(args, "term", None):
        return None
    from autograder.config import list_assignments
    from autograder.term.termfile import load_term
    return load_term(args.term, list_assignments(root))


def _build(args) -> int:
    from autograder.publishing.build import build, check_build
    root = find_course_root(args.course)
    if args.colab is not None:
        from autograder.publishing.colab import STUDENT_STEPS, build_wheel
        if args.check or args.repo:
            raise ValueError("--colab writes only the course file; run --check or --repo on their own.")
        wheel = build_wheel(root, root / args.colab if not Path(args.colab).is_absolute() else Path(args.colab))
        print(f"wrote {wheel} ({wheel.stat().st_size / 1024:.0f} KiB): the course library for Colab.\n"
              f"{STUDENT_STEPS}")
        return 0
    if args.repo:
        if args.check:
            raise ValueError("--repo rewrites the lessons; it cannot be combined with --check.")
        _set_repo(root, args.repo)
        for a in build(root):
            print(f"wrote lessons/{a}/")
        if (root / "autograder" / "demo" / "catalog").is_dir():   # the demo class is made from lessons/
            from autograder.publishing.demo import write_demo
            print(f"wrote {len(write_demo(root, root / 'autograder' / 'demo'))} demo notebooks")
        return 0
    if args.check:
        from autograder.publishing.build import check_test_cells
        problems = check_test_cells(root)
        if problems:
            print("test cells that would not grade as written:", *problems, sep="\n  ")
        diffs = check_build(root)
        if diffs:
            print("lessons/ is out of date with solutions/; run `python -m autograder build`. "
                  "Differing:", *diffs, sep="\n  ")
            return 1
        print("lessons/ is in sync with solutions/")
        return 1 if problems else 0
    for a in build(root):
        print(f"wrote lessons/{a}/")
    return 0


def _set_repo(root: Path, repo: str) -> None:
    """Write ``repo`` into autograder/course.py and rewrite what is made from it (badges, setup
    cells, the README table) with scripts/lesson_cells.py of the course at ``root``."""
    import importlib.util

    from autograder.course import set_course_repo
    script = root / "scripts" / "lesson_cells.py"
    if not script.is_file():
        raise FileNotFoundError(f"{script} is missing: --repo rewrites the lessons with it.")
    set_course_repo(root, repo)   # validates the name first
    spec = importlib.util.spec_from_file_location("lesson_cells", script)
    cells = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cells)
    cells.run(check=False, repo=repo, root=root)
    print(f"the course's repository is now {repo}: badges, setup cells and the README link there; "
          "the build below and the demo class follow; then commit, push and try one 'Open in Colab' link.")


def _grade(args) -> int:
    from autograder.journal import folder_in_use
    with folder_in_use(Path(args.out), "grade"):   # another grade or report there: stop now
        return _grade_held(args)


def _grade_held(args) -> int:
    from autograder.grading.grade import format_table, grade_class
    root = find_course_root(args.course)
    options = from_arguments(args)
    term = read_term(args, root)   # a bad term file stops the run before anything is graded
    submissions, sample = args.submissions, None
    if args.sample is not None:
        from autograder.publishing.demo import write_sample
        if submissions is not None:
            raise ValueError("--sample picks students from the demo class; to try a real class on "
                             "a few students, copy their folders into a folder of their own.")
        picked, total = write_sample(Path(args.out) / "demo-sample", args.sample)
        submissions, sample = Path(args.out) / "demo-sample", (picked, total)
    announce(args, sample)
    stops = (KeyboardInterrupt,)
    if args.scheduler:   # Dask is imported only for a cluster
        from autograder.engine.distributed import ClusterError
        stops += (ClusterError,)
    start = time.perf_counter()
    try:
        results = grade_class(root, submissions, Path(args.out), options=options,
                              progress=not args.no_progress, jobs=args.jobs, force=args.force,
                              db_url=args.db, max_bytes=int(options.max_size_mb * 2**20),
                              scheduler=args.scheduler, term=term)
    except stops as exc:
        kept = (f"every grade committed so far is kept in {args.out}/results and "
                f"{args.out}/grades.csv; run the same command again to finish.")
        if isinstance(exc, KeyboardInterrupt):
            print(f"\ninterrupted: {kept}", file=sys.stderr)
            return 130
        print(f"error: {exc}.\n{kept[0].upper()}{kept[1:]}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    print(format_table(results))
    notes = Path(args.out) / "isolation.txt"   # this machine's notes, or each Dask worker's
    notes = [n for n in (notes.read_text().splitlines() if notes.is_file() else [])
             if not n.endswith("fully isolated")]
    print("\n" + "\n".join(summary_lines(results, seconds, Path(args.out), notes)))
    from autograder.term.policy import OVERRIDES_FILE
    from autograder.term.termfile import TERM_RECORD
    if term is not None or any((Path(args.out) / n).is_file() for n in (OVERRIDES_FILE, TERM_RECORD)):
        print("the scores above are the tests' own; grades.csv's score has the term's late "
              "penalties and DIR/overrides.csv applied (raw_score, late_penalty, override)")
    return 0


def _report(args) -> int:
    from autograder.reporting.report import write_class_outputs
    from autograder.reporting.similarity import THRESHOLD
    root = find_course_root(args.course)
    threshold = THRESHOLD if args.similarity is None else args.similarity
    if not 0 < threshold <= 1:
        raise ValueError(f"--similarity takes a fraction in (0, 1], got {threshold}")
    from autograder.journal import folder_in_use
    with folder_in_use(Path(args.out), "report", create=False):   # never beside a grade writing there
        done = write_class_outputs(root, Path(args.out), threshold=threshold,
                                   term=read_term(args, root))
    late = sum(1 for g in done["grades"] if g.late_penalty)
    undecided = sum(1 for g in done["grades"] if g.review == "undecided")
    print(f"wrote {done['report']}, {done['insights']}, {len(done['csv'])} grade CSV(s) and the "
          f"grade box of {done['feedback']} feedback page(s); {done['pairs']} pair(s) of similar "
          f"answers listed; {late} late penalt{'ies' if late != 1 else 'y'}, {undecided} manual "
          "review(s) or timeout(s) undecided (decide them in DIR/overrides.csv)")
    if done["unknown_extensions"]:
        print(f"warning: the term file gives extensions to {', '.join(done['unknown_extensions'])}, "
              "who have no submission of that lesson in this folder: write each id as grades.csv "
              "shows it", file=sys.stderr)
    return 0


def _publish(args) -> int:
    from autograder.course import PLACEHOLDER_REPO
    from autograder.publishing.publish import PublishError, publish
    root = find_course_root(args.course)
    try:
        done = publish(root, Path(args.out), repo=args.repo, with_solutions=args.with_solutions)
    except PublishError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    # publish.scan allows the solutions' lines with --with-solutions: say only what it checked
    print(f"wrote the student edition into {args.out}: {done['files']} files, "
          f"{len(done['lessons'])} lessons" + (", worked solutions without hidden tests"
                                               if args.with_solutions else "")
          + "; scanned: no " + ("" if args.with_solutions else "solution, ")
          + "hidden test, mistake catalogue, demo notebook or grader code"
          + (" (the solutions are in it on purpose)." if args.with_solutions else "."))
    if done["repo"] == PLACEHOLDER_REPO:
        print(f"note: its Colab badges point at the placeholder {PLACEHOLDER_REPO}; give --repo "
              "OWNER/NAME, the public repository you push it to.")
    else:
        print(f"next: cd {args.out} && git init -b main (once) && git add -A && git commit -m "
              f"'student edition' && git push to github.com/{done['repo']}. Keep this repository "
              "(the instructor's) private.")
    return 0


def _book(args) -> int:
    try:
        from autograder.publishing.book import BookError, book
    except ImportError as exc:
        print(f"error: {exc}; the book needs the grader's book extra: bash scripts/setup.sh book "
              "(or pip install -e './autograder[book]')", file=sys.stderr)
        return 2
    try:
        done = book(find_course_root(args.course), Path(args.out), size=args.size,
                    lessons=args.lessons, with_solutions=args.with_solutions, repo=args.repo,
                    cache_dir=args.cache, rerun=args.rerun)
    except (BookError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    exercises = sum(c["exercises"] for c in done["counts"].values())
    hidden = sum(c["hidden_outputs"] for c in done["counts"].values())
    n = len(done["lessons"])
    print(f"wrote the book into {args.out} ({n} lesson{'s' if n != 1 else ''} at {args.size} size, "
          f"{exercises} exercises, {hidden} outputs computed from answers left out, "
          f"{len(done['warnings'])} Sphinx warnings) in {done['seconds']:.0f} s; scanned: no "
          + ("hidden test (worked solutions folded in)" if args.with_solutions else
             "solution or hidden test") + f". Open {done['index']}")
    return 0


def _export(args) -> int:
    """Without --term, export_gradebook reads the term file recorded in DIR (term-file.txt) whole:
    the late rules the scores have and the lms_column that places them. An export that fills no
    cell prints what it matched, then exits 2 like any other export that cannot be used. One that
    held a grade back (no one decided it) or met a graded student the gradebook lacks exits 3,
    unless --send-undecided says the instructor means it; two rows on one LMS user (NEEDS YOU)
    are never sent, so they exit 3 whatever --send-undecided says."""
    from autograder.journal import folder_in_use
    from autograder.term.export import export_gradebook, export_outcome, format_export, term_for
    with folder_in_use(Path(args.out), "export", create=False):   # never half a grade run's results
        term = term_for(args.term, Path(args.out)) if args.term else None
        result = export_gradebook(Path(args.out), args.lms, Path(args.gradebook), Path(args.dest),
                                  term=term, lesson=args.lesson,
                                  feedback=Path(args.feedback) if args.feedback else None,
                                  send_undecided=args.send_undecided)
    print(format_export(result))
    code, error = export_outcome(result, args.gradebook, args.dest)
    if error:
        print(f"error: {error}", file=sys.stderr)
    return code


def _canvas(args) -> int:
    """canvas pull / push. Exit 2 without the canvas extra or on an error that names what to
    fix (the token never in it); push exits 3 when it held a grade back or met a student Canvas
    does not have, as export does."""
    import os
    from autograder.lms.canvas_api import URL_ENV, CanvasCut, MissingExtra, Session, read_token, require_canvasapi
    try:
        require_canvasapi()
    except MissingExtra as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from autograder.term import canvas_sync as cs
    token = read_token(args.token_file)
    session = Session(args.url or os.environ.get(URL_ENV, ""), token,
                      say=lambda line: print(line, file=sys.stderr, flush=True))
    try:
        if args.canvas_command == "pull":
            from autograder.config import list_assignments
            root = find_course_root(args.course)
            term = read_term(args, root)
            lesson = cs.lesson_for(args.assignment, args.lesson, term, set(list_assignments(root)))
            print(cs.format_pull(cs.pull(session, args.course_arg, args.assignment, lesson,
                                         Path(args.out))))
            return 0
        plan = cs.push_command(session, Path(args.out), args.course_arg, args.assignment, args.lesson,
                               args.term, args.dry_run)
        print(cs.format_push(plan, args.dry_run))
    except CanvasCut as exc:
        print(f"error: {session.redact(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted: what was written or posted is kept; run the same command again to "
              "go on (nothing is posted twice)", file=sys.stderr)
        return 130
    return 3 if plan.held or plan.not_found else 0


def _check(args) -> int:
    from autograder.engine.check import check_notebook, format_report
    results, notes = check_notebook(args.notebook, from_arguments(args), course=args.course)
    print(format_report(Path(args.notebook).name, results, notes))
    return 0 if results and all(r.passed for r in results) else 1


def _demo(args) -> int:
    from autograder.publishing.demo import check_demo, write_demo
    root = find_course_root(args.course)
    demo_dir = root / "autograder" / "demo"   # the course's own catalogue, also for a scratch copy
    if not (demo_dir / "catalog").is_dir():
        from autograder.publishing.demo import DEMO_DIR as demo_dir
    status = 0
    if args.check_hints:
        from autograder.publishing.demo import check_hints, format_hint_report
        problems, checked = check_hints(root, demo_dir, progress=True)
        print(format_hint_report(problems, checked))
        status = 1 if problems else 0
        if not args.check:
            return status
    if args.check:
        diffs = check_demo(root, demo_dir)
        if diffs:
            print("autograder/demo/submissions is out of date; run `python -m autograder demo`. "
                  "Differing:", *diffs, sep="\n  ")
            return 1
        print("the demo class is in sync with its catalogue")
        return status
    written = write_demo(root, demo_dir)
    print(f"wrote {len(written)} demo notebooks under {demo_dir / 'submissions'}/")
    return 0


def _seeds(args) -> int:
    from autograder.publishing.seeds import run
    return run(args)


def _review(args) -> int:
    from autograder.reporting.review import serve
    serve(Path(args.out), args.port, find_course_root(args.course), args.by, not args.no_browser)
    return 0


def main(argv=None) -> int:
    """Parse ``argv`` and run the command; errors a user can fix print one line and exit 2."""
    args = parser().parse_args(argv)
    try:
        return {"build": _build, "grade": _grade, "check": _check, "demo": _demo, "publish": _publish, "book": _book,
                "report": _report, "export": _export, "seeds": _seeds,
                "canvas": _canvas, "review": _review}[args.command](args)
    except (FileNotFoundError, ValueError, BuildError, SandboxUnavailable) as exc:   # NotebookError is a ValueError
        if args.command == "check":   # it may quote the notebook: no escape code reaches the terminal
            from mlexp.check import terminal_safe
            exc = terminal_safe(exc)
        print(f"error: {exc}", file=sys.stderr)
        return 2
