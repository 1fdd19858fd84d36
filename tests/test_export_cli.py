"""What the command line tells an instructor, checked line by line without grading anything.

Export's own command-line behaviour is in test_export.py; this file holds the lines of ``grade``
and ``publish`` an instructor reported as untrue (the time estimate's jobs, what publish scanned
for with --with-solutions). Nothing here starts a kernel.
"""
import os
from argparse import Namespace

import pytest

from autograder import cli
from autograder.grading import console


@pytest.mark.parametrize("jobs, shown", [(None, 1), (1, 1), (2, 2), (3, 3)])
def test_the_time_estimate_names_the_jobs_of_this_run(capsys, jobs, shown):
    console.announce(Namespace(sample=None, jobs=jobs, out="grades", submissions=None), None)
    err = capsys.readouterr().err
    cores = os.cpu_count() or 1
    assert f"{shown} at a time, into grades/" in err
    assert f"(with {shown} at a time on {cores} core{'s' * (cores != 1)}, " in err
    lo, hi = console.SECONDS_EACH_2_JOBS
    parallel = max(1, min(shown, cores))
    per = [max(1, round(s * 2 / parallel)) for s in (lo, hi)]
    assert f", {per[0]}-{per[1]} s a submission" in err
    if shown != 2:
        assert "with 2 at a time" not in err


@pytest.mark.parametrize("with_solutions", [False, True])
def test_publish_says_what_its_scan_checked(monkeypatch, capsys, tmp_path, with_solutions):
    from autograder.publishing import publish
    from autograder.course import PLACEHOLDER_REPO
    got = {}

    def fake(root, out, repo=None, with_solutions=False):
        got["with_solutions"] = with_solutions
        return {"files": 3, "lessons": ["01_running_sum"], "repo": PLACEHOLDER_REPO}
    monkeypatch.setattr(publish, "publish", fake)
    argv = ["publish", str(tmp_path / "edition")] + ["--with-solutions"] * with_solutions
    assert cli.main(argv) == 0 and got["with_solutions"] == with_solutions
    out = capsys.readouterr().out
    assert "hidden test, mistake catalogue, demo notebook or grader code" in out
    if with_solutions:
        assert "scanned: no solution" not in out and "solutions are in it on purpose" in out
    else:
        assert "scanned: no solution, hidden test" in out


def test_the_pages_leave_the_demo_class_size_and_the_estimate_to_grade(monkeypatch):
    """`make grade-all`: the demo class's size and the minutes _minutes prints for it (the Makefile's
    -j 2 on a 2-core machine) are printed by `grade` before it starts, never typed into the README
    or docs/ (where they would go stale, issue 42): the catalogue and the submissions agree, and no
    page states the number or the estimate, while the README and the instructor's guide say that
    `grade` prints them."""
    import re
    from pathlib import Path

    from autograder.publishing.demo import load_catalog
    repo = Path(__file__).resolve().parent.parent
    pages = {p.relative_to(repo).as_posix(): " ".join(p.read_text().split())
             for p in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]}
    total = sum(len(c["students"]) for c in load_catalog().values())
    assert total == sum(1 for p in (repo / "autograder" / "demo" / "submissions").rglob("*.ipynb")
                        if ".ipynb_checkpoints" not in p.parts)
    assert re.search(r"^JOBS \?= 2$", (repo / "Makefile").read_text(), re.M)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    estimate = console.minutes(total, 2)                     # "about 11-61 minutes"
    assert console.minutes(total, 1) != estimate            # -j 1: "twice that"
    for name, flat in pages.items():
        assert not re.search(r"\b%d submissions" % total, flat), name
        assert estimate not in flat, name
    for name in ("README.md", "docs/instructors.md"):
        assert "the whole demo class (it says how many and how long first)" in pages[name]
