"""Grading speed: our `python -m autograder grade -j N` vs plain `nbgrader autograde` and vs an
earlier version of our grader, on the same class in one run.

    .venv/bin/python benchmarks/grading.py                      # lesson 01's demo class, -j 2
    .venv/bin/python benchmarks/grading.py --lesson 03_gates_and_delta_rule --copies 2 -j 2
    .venv/bin/python benchmarks/grading.py --baseline-rev de86df2   # vs the grader of that commit
    .venv/bin/python benchmarks/grading.py --dask        # -j 1, -j 2 and two Dask workers

``--baseline-rev REV`` checks REV out into a temporary git worktree and times its grader on the
same class, so a change to the grading path is measured against the path it replaced (for the
trusted harness: seconds per submission, new / old, goal at most 1.5).

Both grade the same class (the lesson's demo students, each repeated ``--copies`` times under
new ids) in fresh folders, one after the other in this run, and the script prints both wall
times and their ratio. nbgrader is timed from `nbgrader autograde` alone (its release is
generated beforehand, untimed); ours is the whole command: collecting, generating the release,
repairing, sandboxed execution, scoring, feedback and grades.csv. The ratio, not the seconds,
carries over between machines; on a busy machine repeat it.

``--dask`` times, instead, the same class at local ``-j 1``, ``-j 2`` and through two Dask
workers of one thread each (`dask scheduler` and `dask worker` started on 127.0.0.1 before the
timing; the command is the whole `grade --scheduler`), and prints seconds per submission and the
ratio two workers / ``-j 2`` (goal on a 2-core machine: at most 1.3) with the load average.
"""
import argparse
import contextlib
import filecmp
import os
import resource
import signal
import shutil
import socket
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


def time_ours(cls: Path, out: Path, jobs: int, timeout: int, repo: Path = REPO,
              extra=()) -> float:
    """Seconds for `python -m autograder grade CLASS --out OUT -j JOBS` (the whole command), run
    from the checkout ``repo`` (its own autograder and mlexp come first on the path); ``jobs``
    None leaves -j to its default, ``extra`` adds arguments."""
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(repo)}
    jobs = ["-j", str(jobs)] if jobs else []
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(cls), "--out", str(out),
                           *jobs, "--timeout", str(timeout), "--no-progress", *extra],
                          cwd=repo, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(proc.stdout + proc.stderr)
    return seconds


@contextlib.contextmanager
def dask_cluster(folder: Path, workers: int):
    """A `dask scheduler` and ``workers`` one-thread `dask worker` processes on 127.0.0.1;
    yields the scheduler's address once every worker has joined."""
    from distributed import Client
    folder.mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address, dask, procs = f"tcp://127.0.0.1:{port}", Path(sys.executable).parent / "dask", []
    commands = [["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"]]
    commands += [["worker", address, "--nthreads", "1", "--no-dashboard"]] * workers
    try:
        for i, args in enumerate(commands):
            with open(folder / f"{i}.log", "wb") as log:
                procs.append(subprocess.Popen([str(dask), *args], cwd=folder, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        with Client(address, timeout=60, set_as_default=False) as client:
            client.wait_for_workers(workers, timeout=300)
        yield address
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()


def compare_dask(cls: Path, tmp: Path, n: int, timeout: int) -> None:
    """Seconds per submission at -j 1, -j 2 and on two Dask workers; the ratios of the three."""
    load = [os.getloadavg()[0]]
    one = time_ours(cls, tmp / "j1", 1, timeout)
    two = time_ours(cls, tmp / "j2", 2, timeout)
    with dask_cluster(tmp / "cluster", 2) as address:
        load.append(os.getloadavg()[0])
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        dask = time_ours(cls, tmp / "dask", None, timeout, extra=["--scheduler", address])
        after = resource.getrusage(resource.RUSAGE_CHILDREN)   # the grading command alone
        cpu = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    load.append(os.getloadavg()[0])
    for name, t in [("local -j 1", one), ("local -j 2", two), ("two Dask workers", dask)]:
        print(f"{name:17s} {t:7.1f} s  ({t / n:.1f} s per submission)")
    print("(two Dask workers run with grade's default for a cluster: 4 submissions in flight)")
    same = all(filecmp.cmp(tmp / "j1" / "grades.csv", tmp / d / "grades.csv", shallow=False)
               for d in ("j2", "dask"))
    print(f"same grades.csv from all three: {'yes' if same else 'NO'}")
    print(f"ratio -j 1 / -j 2: {one / two:.2f}x (the speed-up of a second local job)")
    print(f"CPU of the grading command with Dask: {cpu / n:.2f} s per submission (nbgrader's "
          "scoring and feedback, the part that stays on one machine), startup included")
    print(f"ratio two Dask workers / -j 2: {dask / two:.2f}x (goal at most 1.3: "
          f"{'PASS' if dask / two <= 1.3 else 'FAIL'})")
    print("load average (1 min) before -j 1, before Dask, after: "
          + ", ".join(f"{x:.1f}" for x in load) + f" on {os.cpu_count()} cores: above the core "
          "count, other work shared the machine and the ratios are noisy")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lesson", default="01_running_sum")
    p.add_argument("--copies", type=int, default=1, help="each demo student this many times")
    p.add_argument("-j", "--jobs", type=int, default=2)
    p.add_argument("--timeout", type=int, default=120, help="per-cell limit for both (s)")
    p.add_argument("--baseline-rev", metavar="REV",
                   help="also time the grader of this git revision on the same class")
    p.add_argument("--rounds", type=int, default=2,
                   help="with --baseline-rev: alternate the two graders this many times and "
                        "report the median ratio (the load of a shared machine drifts)")
    p.add_argument("--no-nbgrader", action="store_true", help="skip plain nbgrader autograde")
    p.add_argument("--dask", action="store_true",
                   help="time -j 1, -j 2 and two Dask workers instead (needs mlexp-autograder[dask])")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grading-bench-") as tmp:
        tmp = Path(tmp)
        n = make_class(a.lesson, a.copies, tmp / "class")
        print(f"class: {n} submissions of {a.lesson}; load average before: {os.getloadavg()[0]:.1f}")
        if a.dask:
            return compare_dask(tmp / "class", tmp, n, a.timeout)
        ours = time_ours(tmp / "class", tmp / "ours", a.jobs, a.timeout)
        print(f"python -m autograder grade -j {a.jobs}: {ours:7.1f} s  ({ours / n:.1f} s per submission)")
        if a.baseline_rev:
            old = tmp / "baseline"
            subprocess.run(["git", "worktree", "add", "--detach", str(old), a.baseline_rev],
                           cwd=REPO, check=True, capture_output=True)
            ratios = []
            try:
                for r in range(a.rounds):
                    if r:
                        ours = time_ours(tmp / "class", tmp / f"ours{r}", a.jobs, a.timeout)
                    then = time_ours(tmp / "class", tmp / f"old{r}", a.jobs, a.timeout, repo=old)
                    ratios.append(ours / then)
                    print(f"round {r + 1}: ours {ours / n:.1f} s, {a.baseline_rev} {then / n:.1f} s per "
                          f"submission: ratio {ours / then:.2f}x (load {os.getloadavg()[0]:.1f})")
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=REPO,
                               capture_output=True)
            ratios.sort()
            print(f"median ratio ours / {a.baseline_rev}: {ratios[len(ratios) // 2]:.2f}x over "
                  f"{len(ratios)} rounds (below 1: ours is faster)")
        if not a.no_nbgrader:
            theirs = time_nbgrader(a.lesson, tmp / "class", tmp / "nbgrader", a.timeout)
            print(f"nbgrader autograde (serial):   {theirs:7.1f} s  ({theirs / n:.1f} s per submission)")
            print(f"ratio nbgrader / ours: {theirs / ours:.2f}x  (above 1: ours is faster)")
        print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
