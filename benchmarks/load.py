"""One piece of work, one grade, whatever the machine's load (issue 52): a lesson's demo class graded
once on a quiet machine and once with every core shared by CPU- and memory-bound processes, in one
run; both tables are printed and the grades compared.

    .venv/bin/python benchmarks/load.py                                  # lesson 03's demo class
    .venv/bin/python benchmarks/load.py --students abe_all_correct,sam_chunk_tail_dropped
    .venv/bin/python benchmarks/load.py --lesson 01_running_sum --hogs 4

The load: ``--hogs`` processes per core, each pinned to a core with ``os.sched_setaffinity``, half
spinning on arithmetic and half sweeping a buffer larger than the caches. The grader keeps every
limit in CPU time (autograder/engine/cputime.py), so the verdicts must not move; the wall time does,
and both are printed. Exit status 1 when any student's score, status or failed tests differ.
"""
import argparse
import csv
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grading import DEMO, REPO, make_class, time_ours  # noqa: E402


def _spin(core: int) -> None:
    os.sched_setaffinity(0, {core})
    x = 0
    while True:
        x = (x * 1103515245 + 12345) % 2**31


def _sweep(core: int) -> None:
    os.sched_setaffinity(0, {core})
    buf = bytearray(64 * 2**20)
    while True:
        for i in range(0, len(buf), 4096):
            buf[i] = (buf[i] + 1) % 256


def hogs(per_core: int) -> list:
    """Start ``per_core`` processes on each core (alternately CPU- and memory-bound); returns them."""
    procs = []
    for core in sorted(os.sched_getaffinity(0)):
        for i in range(per_core):
            p = multiprocessing.Process(target=_spin if i % 2 == 0 else _sweep, args=(core,), daemon=True)
            p.start()
            procs.append(p)
    return procs


def table(out: Path) -> dict:
    """{student: (score, status, each test's points)} from a grading folder's grades.csv."""
    with open(out / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {r["student_id"]: (r["score"], r["status"], tuple(v for k, v in r.items() if k.startswith("test_")))
            for r in rows}


def show(title: str, rows: dict, seconds: float) -> None:
    print(f"\n{title} ({seconds:.0f} s wall)")
    for student, (score, status, points) in sorted(rows.items()):
        print(f"  {student:36s} {score:>6s}  {' '.join(points):24s} {status}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lesson", default="03_gates_and_delta_rule")
    ap.add_argument("--students", default="", help="comma-separated demo students (default: all of the lesson's)")
    ap.add_argument("--hogs", type=int, default=2, help="load processes per core (default 2)")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=60)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="load-bench-") as tmp:
        tmp = Path(tmp)
        cls = tmp / "class"
        if args.students:
            import shutil
            for s in args.students.split(","):
                shutil.copytree(DEMO / s / args.lesson, cls / s / args.lesson)
        else:
            make_class(args.lesson, 1, cls)
        quiet_s = time_ours(cls, tmp / "quiet", args.j, args.timeout, REPO)
        procs = hogs(args.hogs)
        try:
            time.sleep(1)
            loaded_s = time_ours(cls, tmp / "loaded", args.j, args.timeout, REPO)
        finally:
            for p in procs:
                p.terminate()
        quiet, loaded = table(tmp / "quiet"), table(tmp / "loaded")
    show("quiet", quiet, quiet_s)
    show(f"loaded ({args.hogs} CPU- and memory-bound processes pinned to each core)", loaded, loaded_s)
    differ = sorted(s for s in set(quiet) | set(loaded) if quiet.get(s) != loaded.get(s))
    print(f"\nwall time loaded / quiet: {loaded_s / quiet_s:.2f}")
    print("the same grades" if not differ else f"DIFFERENT grades: {', '.join(differ)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
