"""Grading speed: our `python -m autograder grade -j N` vs plain `nbgrader autograde` and vs an
earlier version of our grader, on the same class in one run.

    .venv/bin/python benchmarks/grading.py                      # lesson 01's demo class, -j 2
    .venv/bin/python benchmarks/grading.py --lesson 03_gates_and_delta_rule --copies 2 -j 2
    .venv/bin/python benchmarks/grading.py --baseline-rev de86df2   # vs the grader of that commit

``--baseline-rev REV`` checks REV out into a temporary git worktree and times its grader on the
same class, so a change to the grading path is measured against the path it replaced (for the
trusted harness: seconds per submission, new / old, goal at most 1.5).

Both grade the same class (the lesson's demo students, each repeated ``--copies`` times under
new ids) in fresh folders, one after the other in this run, and the script prints both wall
times and their ratio. nbgrader is timed from `nbgrader autograde` alone (its release is
generated beforehand, untimed); ours is the whole command: collecting, generating the release,
repairing, sandboxed execution, scoring, feedback and grades.csv. The ratio, not the seconds,
carries over between machines; on a busy machine repeat it.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "autograder" / "demo" / "submissions"


def make_class(lesson: str, copies: int, dest: Path) -> int:
    """Copy the demo students of ``lesson`` into ``dest/<student>/<lesson>/``; returns how many."""
    n = 0
    for student in sorted(p.name for p in DEMO.iterdir() if (p / lesson).is_dir()):
        for c in range(copies):
            sid = student if c == 0 else f"{student}_copy{c}"
            shutil.copytree(DEMO / student / lesson, dest / sid / lesson)
            n += 1
    if not n:
        raise SystemExit(f"no demo students for {lesson} under {DEMO}")
    return n


def time_nbgrader(lesson: str, cls: Path, work: Path, timeout: int) -> float:
    """Seconds for `nbgrader autograde LESSON` over the whole class in a fresh course folder."""
    shutil.copytree(REPO / "solutions" / lesson, work / "source" / lesson)
    shutil.copytree(cls, work / "submitted")
    (work / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        f"c.CourseDirectory.root = {str(work)!r}\n"
        f"c.CourseDirectory.db_url = {'sqlite:///' + str(work / 'gradebook.db')!r}\n"
        f"c.Execute.timeout = {timeout}\n"
        "c.Execute.extra_arguments = ['--IPKernelApp.log_level=ERROR']\n")
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]}
    nbgrader = [sys.executable, "-m", "nbgrader"]
    subprocess.run(nbgrader + ["generate_assignment", lesson, "--force"], cwd=work, env=env,
                   check=True, capture_output=True)
    start = time.perf_counter()
    subprocess.run(nbgrader + ["autograde", lesson, "--force"], cwd=work, env=env, check=True,
                   capture_output=True)
    return time.perf_counter() - start


def _cpu() -> float:
    """CPU seconds (user + system) of every finished child of this process and their children."""
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def time_ours(cls: Path, out: Path, jobs: int, timeout: int, repo: Path = REPO) -> tuple:
    """(wall seconds, CPU seconds) of `python -m autograder grade CLASS --out OUT -j JOBS` (the
    whole command, its kernels included), run from the checkout ``repo`` (its own autograder and
    mlexp come first on the path). CPU seconds hardly depend on what else the machine runs."""
    cpu = _cpu()
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(cls), "--out", str(out),
                           "-j", str(jobs), "--timeout", str(timeout), "--no-progress"],
                          cwd=repo, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(proc.stdout + proc.stderr)
    return seconds, _cpu() - cpu


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lesson", default="01_running_sum")
    p.add_argument("--copies", type=int, default=1, help="each demo student this many times")
    p.add_argument("-j", "--jobs", type=int, default=2)
    p.add_argument("--timeout", type=int, default=120, help="per-cell limit for both (s)")
    p.add_argument("--baseline-rev", metavar="REV",
                   help="also time the grader of this git revision on the same class")
    p.add_argument("--no-nbgrader", action="store_true", help="skip plain nbgrader autograde")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grading-bench-") as tmp:
        tmp = Path(tmp)
        n = make_class(a.lesson, a.copies, tmp / "class")
        print(f"class: {n} submissions of {a.lesson}; load average before: {os.getloadavg()[0]:.1f}")
        ours, ours_cpu = time_ours(tmp / "class", tmp / "ours", a.jobs, a.timeout)
        print(f"python -m autograder grade -j {a.jobs}: {ours:7.1f} s  ({ours / n:.1f} s per submission, "
              f"{ours_cpu / n:.1f} CPU s per submission)")
        if a.baseline_rev:
            old = tmp / "baseline"
            subprocess.run(["git", "worktree", "add", "--detach", str(old), a.baseline_rev],
                           cwd=REPO, check=True, capture_output=True)
            try:
                then, then_cpu = time_ours(tmp / "class", tmp / "old", a.jobs, a.timeout, repo=old)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=REPO,
                               capture_output=True)
            print(f"the grader of {a.baseline_rev} -j {a.jobs}: {then:7.1f} s  "
                  f"({then / n:.1f} s per submission, {then_cpu / n:.1f} CPU s per submission)")
            print(f"ratio ours / {a.baseline_rev}: wall {ours / then:.2f}x, CPU {ours_cpu / then_cpu:.2f}x "
                  "(below 1: ours is cheaper; on a busy machine trust the CPU ratio)")
        if not a.no_nbgrader:
            theirs = time_nbgrader(a.lesson, tmp / "class", tmp / "nbgrader", a.timeout)
            print(f"nbgrader autograde (serial):   {theirs:7.1f} s  ({theirs / n:.1f} s per submission)")
            print(f"ratio nbgrader / ours: {theirs / ours:.2f}x  (above 1: ours is faster)")
        print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
