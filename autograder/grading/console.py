"""What ``python -m autograder grade`` says around the batch: before it starts, how many
submissions it grades and how long that takes on this machine (:func:`announce`, on stderr beside
the progress bar); after it, what was graded or kept, what was written and what to do next
(:func:`summary_lines`)."""
import argparse
import math
import os
import sys
import zipfile
from pathlib import Path

from autograder.publishing.demo import load_catalog
from autograder.results import NEEDS_REVIEW, REJECTED, TIMED_OUT, Status

__all__ = ["SECONDS_EACH_2_JOBS", "announce", "minutes", "summary_lines", "ISOLATION_ADVICE"]


# Wall-clock seconds per submission when grading with -j 2 on 2 cores (what a run prints as
# "s each"): about 5 s on a quiet machine, 30 s measured on the course's shared 2-core build
# machine under a load average of 16 (6 demo submissions in 182 s, 2026-11-30).
SECONDS_EACH_2_JOBS = (5, 30)


def parallel_jobs(jobs: int, n: int = None) -> int:
    """How many of ``n`` submissions run at once with ``jobs`` on this machine's cores."""
    return max(1, min(jobs, os.cpu_count() or 1, n if n is not None else jobs))


def minutes(n: int, jobs: int) -> str:
    """'about 1-3 minutes' for ``n`` submissions graded ``jobs`` at a time on this machine."""
    parallel = parallel_jobs(jobs, n)
    lo, hi = (max(1, math.ceil(n * s * 2 / parallel / 60)) for s in SECONDS_EACH_2_JOBS)
    return f"about {hi} minute{'s' * (hi != 1)}" if lo == hi else f"about {lo}-{hi} minutes"


def pace(jobs: int) -> str:
    """What minutes assumes, for ``jobs`` at a time on this machine: SECONDS_EACH_2_JOBS
    (measured 2 at a time on 2 cores) turned into seconds a submission at this run's pace."""
    cores = os.cpu_count() or 1
    lo, hi = (max(1, round(s * 2 / parallel_jobs(jobs))) for s in SECONDS_EACH_2_JOBS)
    return (f"(with {jobs} at a time on {cores} core{'s' * (cores != 1)}, {lo}-{hi} s a "
            "submission, from a quiet laptop to a busy shared server; less for any graded before)")


def announce(args, sample) -> None:
    """Say what this run grades and how long it will take, before it starts (on stderr, with the
    progress bar: stdout holds the table of grades)."""
    if getattr(args, "scheduler", None):   # the cluster says its own size once connected
        print(f"Grading {args.submissions or 'the demo class'} on the Dask cluster at {args.scheduler}, "
              f"into {args.out}/; the progress bar counts the submissions.", file=sys.stderr, flush=True)
        return
    args = argparse.Namespace(**{**vars(args), "jobs": args.jobs or 1})   # grade_class's default
    per = pace(args.jobs)
    if sample is not None:
        picked, total = sample
        which = ["a typical mistake", "a typical mistake and the all-correct student",
                 "a typical mistake, the all-correct student and others"][min(args.sample, 3) - 1]
        print(f"Grading a sample of the demo class: {len(picked)} of its {total} submissions "
              f"({args.sample} per lesson: {which}), {args.jobs} at a time, into {args.out}/. This "
              f"takes {minutes(len(picked), args.jobs)} {per}.\n"
              f"The whole demo class: `make grade-all` ({minutes(total, args.jobs)}); a real class: "
              "`.venv/bin/python -m autograder grade SUBMISSIONS --out DIR` (docs/instructors.md).",
              file=sys.stderr, flush=True)
    elif args.submissions is None:
        total = sum(len(c["students"]) for c in load_catalog().values())
        print(f"Grading the whole demo class: {total} submissions, {args.jobs} at a time, into "
              f"{args.out}/. This takes {minutes(total, args.jobs)} {per}.",
              file=sys.stderr, flush=True)
    else:
        n = count_notebooks(Path(args.submissions))
        found = (f"{n} notebook{'s' * (n != 1)} found" if n is not None else "a class of 100")
        print(f"Grading {args.submissions}, {args.jobs} at a time, into {args.out}/: {found}, which "
              f"takes {minutes(n or 100, args.jobs)} {per}; the progress bar counts the rest.",
              file=sys.stderr, flush=True)


def count_notebooks(path: Path):
    """How many .ipynb files a class folder or zip holds (a first estimate: the batch itself
    decides what is a submission), or None when that cannot be read."""
    try:
        if path.is_dir():
            return sum(1 for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        with zipfile.ZipFile(path) as zf:
            return sum(1 for name in zf.namelist() if name.endswith(".ipynb")
                       and ".ipynb_checkpoints" not in name and not name.startswith("__MACOSX"))
    except (OSError, zipfile.BadZipFile):
        return None


# What an instructor can do about each isolation note of autograder.engine.sandbox.isolation_notes.
ISOLATION_ADVICE = {
    "NO SANDBOX": "regrade this class on Linux with bubblewrap installed (sudo apt-get install "
                  "bubblewrap) before publishing grades; until then treat them as provisional.",
    "the sandbox runs under your own uid": "for a class you do not trust, run the same command "
                  "as root (sudo .venv/bin/python -m autograder grade ...); for a class you "
                  "trust, nothing to do.",
}


def summary_lines(results, seconds: float, out: Path, notes) -> list:
    """The run's last lines: what was graded or kept, what was written, and what to do next
    (unchanged submissions, isolation notes, submissions that need a person)."""
    reused = sum(r.reused for r in results)
    ran = len(results) - reused
    if ran == 0 and results:
        lines = [f"all {reused} unchanged since the last run: nothing regraded "
                 "(use --force to regrade)"]
    else:
        lines = [f"{ran} submissions graded in {seconds:.0f} s ({seconds / max(ran, 1):.1f} s each), "
                 f"{reused} unchanged since the last run (kept; --force regrades)"]
    report = out / "report.html"
    lines.append(f"wrote {out / 'grades.csv'}, {out / 'feedback'}/" +
                 (f", and the class report {report} (with insights.csv)" if report.is_file() else ""))
    for note in notes:
        advice = next((a for key, a in ISOLATION_ADVICE.items() if note.startswith(key)), "")
        lines.append(f"isolation: {note}" + (f"\n  what to do: {advice}" if advice else ""))
    review = [r for r in results if Status.of(r.status).kind == NEEDS_REVIEW]
    rejected = [r for r in results if Status.of(r.status).kind == REJECTED]
    timed_out = [r for r in results if Status.of(r.status).kind == TIMED_OUT]
    if review or rejected:
        lines.append(f"{len(review)} submission(s) need manual review and {len(rejected)} were "
                     "rejected; the status column says why, the report groups them with what to do.")
    if timed_out:
        lines.append(f"{len(timed_out)} submission(s) timed out: export and push hold them back "
                     "until a row of DIR/overrides.csv decides each (points, or keep); a slow "
                     "answer regrades with a larger --timeout or --cpu-time.")
    return lines
