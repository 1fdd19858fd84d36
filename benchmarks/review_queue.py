"""How fast the review page lists a large class (issue 53, item 6: a queue of 1,000 items in well
under a second; nbgrader's formgrader took 28 s for 1,125 records).

    .venv/bin/python benchmarks/review_queue.py            # 2,000 submissions, half of them held
    .venv/bin/python benchmarks/review_queue.py --students 5000

A graded folder is written as ``grade`` leaves it (a release of two exercises, the journal,
class.json; every other submission held for review or timed out, some decided in overrides.csv),
the page is served on the loopback, and the queue page is fetched ``--repeats`` times over HTTP
with its secret. Prints the median time of a fetch, the items listed, and the time of the same
folder's final grades alone (``load_final_grades``, what ``report`` and ``export`` read), timed
in the same run: their ratio is the page's own cost over reading the journal.
"""
import argparse
import csv
import hashlib
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import nbformat  # noqa: E402

from autograder.journal import save_result, write_manifest  # noqa: E402
from autograder.results import Result  # noqa: E402
from autograder.reporting.review import serve  # noqa: E402
from autograder.term.policy import load_final_grades  # noqa: E402

LESSON = "01_running_sum"
MAXIMA = {"test_add": 2.0, "test_mul": 3.0}


def graded_folder(out: Path, students: int) -> None:
    nb = nbformat.v4.new_notebook()
    for gid, pts in MAXIMA.items():
        cell = nbformat.v4.new_code_cell("assert True")
        cell.metadata["nbgrader"] = {"grade": True, "grade_id": gid, "points": pts, "solution": False,
                                     "locked": True, "schema_version": 3}
        nb.cells.append(cell)
    (out / "work" / "release" / LESSON).mkdir(parents=True)
    nbformat.write(nb, out / "work" / "release" / LESSON / f"{LESSON}.ipynb")
    statuses = ["graded", "needs manual review: the grader's channel was touched (your In [4])",
                "graded", "timed out: test_mul ran past the 60 s limit per cell (scored as failed)"]
    decided = []
    for n in range(students):
        sid = f"student_{n:05d}"
        status = statuses[n % 4]
        digest = hashlib.sha256(sid.encode()).hexdigest()
        save_result(out, Result(sid, LESSON, 4, 5, status, {"test_add": 2.0, "test_mul": 2.0},
                                digest=digest, attempt=digest).__dict__)
        if n % 40 == 1:
            decided.append([sid, LESSON, "", "keep", "checked", "prof", digest])
    write_manifest(out, [(f"student_{n:05d}", LESSON, f"student_{n:05d}") for n in range(students)],
                   {LESSON: list(MAXIMA)})
    with open(out / "overrides.csv", "w", newline="") as f:
        csv.writer(f).writerows([["student_id", "assignment", "exercise", "points", "comment", "by", "attempt"]]
                                + decided)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--students", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "graded"
        graded_folder(out, a.students)
        started, ready = {}, threading.Event()
        threading.Thread(target=serve, args=(out,), daemon=True,
                         kwargs=dict(open_browser=False,
                                     started=lambda url, server: (started.update(url=url), ready.set()))).start()
        ready.wait(30)
        fetches, reads, listed = [], [], ""
        for _ in range(a.repeats):
            t = time.perf_counter()
            with urllib.request.urlopen(started["url"], timeout=120) as r:
                body = r.read().decode()
            fetches.append(time.perf_counter() - t)
            t = time.perf_counter()
            load_final_grades(out)
            reads.append(time.perf_counter() - t)
            listed = body.split("<h1>", 1)[1].split("</h1>", 1)[0]
        page, read = statistics.median(fetches), statistics.median(reads)
        print(f"{a.students} submissions, {listed}: the queue page in {page:.3f} s (median of {a.repeats}); "
              f"the final grades alone {read:.3f} s; page / grades {page / read:.2f}x")


if __name__ == "__main__":
    main()
