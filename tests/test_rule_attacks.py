"""Issue 51: answers that take the points an exercise rule protects, by a dishonest route.

The class of tests/corpus/rule_attacks.py (each attack kind of lessons 01, 03, 05 and 06, with a
blank and an honest student per lesson; a submission may carry two kinds, one per ruled exercise)
is graded once, in one command at -j 2, against the course in this repository. Then:

- each kind, in the test whose points it goes for, scores at most what the blank notebook scores
  there (it fails it, with the rule's hint or another);
- each attack submission is graded ("graded", not held for review, timed out or rejected: a rule
  broken is a failed test, not a case for a person) and scores at most the blank in all; the
  library's code run as the student's (``corpus.HELD_IS_FINE``) may instead be held for a
  person's review, as a paste is;
- the honest student of each lesson, graded beside the attacks, keeps full marks and "graded".

Each kind took rule-protected points, "graded", on the code the issue was filed against; this file
states the behaviour wanted, so a kind fails here until the grader stops it.
"""
import csv
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "corpus"))
import rule_attacks as corpus  # noqa: E402

pytestmark = pytest.mark.slow
ATTACKS = corpus.cases(REPO)
KINDS = corpus.kinds(REPO)
CONTROLS = corpus.controls()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """grades.csv's rows by student, after one grading run of the whole class."""
    tmp = tmp_path_factory.mktemp("rule_attacks")
    cls = corpus.write_class(tmp / "class", REPO)
    out = tmp / "out"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "autograder", "--course", str(REPO), "grade", str(cls),
                           "--out", str(out), "-j", "2", "--no-progress"],
                          capture_output=True, text=True, cwd=REPO, timeout=1800)
    print(f"\nrule attacks: {len(ATTACKS) + len(CONTROLS)} submissions graded in {time.monotonic() - start:.0f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "grades.csv") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == sorted([*ATTACKS, *CONTROLS]), "every student gets exactly one row"
    return rows


def test_the_class_covers_every_kind():
    """Each kind the issue names is in the corpus, in a ruled test of each lesson it was found in."""
    assert set(corpus.ROUTES) == {kind for *_, kind in KINDS}
    for _case, student, lesson, test, _kind in KINDS:
        assert test in corpus.RULED[lesson], (student, test)
    assert {lesson for _, _, lesson, _, _ in KINDS} == set(corpus.LESSONS)
    assert len({(student, test) for _, student, _, test, _ in KINDS}) == len(KINDS), "one kind per answer"


@pytest.mark.parametrize("student", sorted(CONTROLS))
def test_controls(graded, student):
    """The blank is graded; the honest student, graded beside every attack, keeps full marks."""
    lesson, who = CONTROLS[student]
    row = graded[student]
    assert row["status"] == "graded", (student, row["status"], row["notes"])
    if who == "honest":
        assert float(row["score"]) == float(row["max_score"]), (student, row["score"], row["hints"])
        for test, points in corpus.RULED[lesson].items():
            assert float(row[test]) == points, (student, test, row[test])


@pytest.mark.parametrize("case, student, lesson, test, kind", KINDS,
                         ids=[f"{case}-{test}" for case, _, _, test, _ in KINDS])
def test_attack_takes_no_ruled_points(graded, case, student, lesson, test, kind):
    """The kind scores at most what the blank notebook scores on the test whose points it goes for."""
    row, blank = graded[student], graded[f"{corpus.PREFIX[lesson]}_blank"]
    if kind in corpus.HELD_IS_FINE and row["status"].startswith("needs manual review"):
        return            # the library's code run as the student's: held with its points, as a paste is
    assert float(row[test] or 0) <= float(blank[test] or 0), \
        f"{case} ({corpus.ROUTES[kind]}) took {row[test]} of {test}'s points ({student}: {row['status']})"


@pytest.mark.parametrize("student", sorted(ATTACKS))
def test_attack_is_graded_at_most_blank(graded, student):
    """Each attack submission is graded (not held, timed out or rejected) and scores at most the blank."""
    lesson, _answers = ATTACKS[student]
    row, blank = graded[student], graded[f"{corpus.PREFIX[lesson]}_blank"]
    kinds = {kind for _, who, _, _, kind in KINDS if who == student}
    if kinds <= corpus.HELD_IS_FINE and row["status"].startswith("needs manual review"):
        return
    assert row["status"] == "graded", (student, sorted(kinds), row["status"], row["notes"])
    assert float(row["score"]) <= float(blank["score"]), (student, sorted(kinds), row["score"], blank["score"])
