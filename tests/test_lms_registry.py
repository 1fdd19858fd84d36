"""A fourth LMS is one class registered in autograder.lms.base.LMSS (issue 42: "Adding a fourth
LMS format in a test touches only lms/ and tests").

The made-up LMS "Slate" lives in this file only: its zip names ``slate-<user>[-late]--<YYYYMMDD
HHMMSS>--<file name>``, its gradebook a CSV keyed by ``Student`` with a column per assignment
named ``<assignment> [<points> pts]``. Registered with monkeypatch (the registry is as it was after
each test), it is read by the ordinary entry points: collect finds its submissions, grade's
submission time reads its source, export and ``--lms`` fill its gradebook. And what the command
line and export offer is the registry: an LMS taken out of it is refused by both.
"""
import re
import zipfile
from datetime import datetime

import pytest

from autograder.cli import main
from autograder.grading.grade import Result, _submitted_at, write_csv
from autograder.intake.collect import choose_notebook, collect
from autograder.lms import layouts
from autograder.lms.base import LMSS, Lms, LmsFile, by_layout
from autograder.lms.gradebooks import Column, _Gradebook, _no_column
from autograder.term.export import ExportError, export_gradebook, format_export

ASSIGNMENT, NOTEBOOK = "toy", "toy.ipynb"
NB = b'{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'


class _SlateBook(_Gradebook):
    name, kind, id_column = "Slate", "grade sheet", "Student"
    how = "In Slate: Grades > Download as CSV."
    HEADER = re.compile(r"(?P<name>.*?) \[(?P<pts>\d+) pts\]\Z")

    def column(self, lesson, wanted):
        i = self.find(wanted)
        if i is None:
            return None, _no_column(wanted, self.head[2:])
        return Column(i, self.head[i], float(self.HEADER.match(self.head[i])["pts"])), ""


class Slate(Lms):
    name, title = "slate", "Slate"
    pattern = r"^slate-(?P<user>[a-z0-9]+)(?P<late>-late)?--(?P<when>\d{14})--(?P<file_id>[^/]+)$"
    described = "Slate: slate-<user>--<YYYYMMDDHHMMSS>--<notebook>.ipynb"
    gradebook = _SlateBook
    stamp_source = "Slate upload time"
    late_note, late_source = "marked late by Slate", "unknown (Slate said late)"

    def read(self, rel, found):
        when = datetime.strptime(found["when"], "%Y%m%d%H%M%S")
        late = bool(found.get("late"))
        return LmsFile(rel, found["user"], found["file_id"], time=when.timestamp(),
                       stamp=when.isoformat(), late=late, note=self.late_note if late else "")


@pytest.fixture
def slate(monkeypatch):
    lms = Slate()
    monkeypatch.setitem(LMSS, lms.name, lms)
    return lms


def slate_zip(path):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"slate-ann--20261001093000--{NOTEBOOK}", NB)
        zf.writestr(f"slate-ann--20261002100000--{NOTEBOOK}", NB)     # the later upload
        zf.writestr(f"slate-bob-late--20261003120000--{NOTEBOOK}", NB)
        zf.writestr("slate-bob-late--20261003120000--data.txt", b"1 2 3")
    return path


def test_the_registry_holds_the_three_lmss_in_order():
    assert list(LMSS)[:3] == ["canvas", "moodle", "blackboard"]
    assert [by_layout(t).name for t in ("Canvas", "Moodle", "Blackboard")] == list(LMSS)[:3]
    assert by_layout("folder") is None


def test_collect_reads_a_fourth_lmss_zip_and_grade_its_times(tmp_path, slate):
    assert "Slate: slate-<user>" in layouts.describe_layouts()
    subs = {s.student: s for s in collect(slate_zip(tmp_path / "slate.zip"), [ASSIGNMENT],
                                          tmp_path / "unpacked", {ASSIGNMENT: [NOTEBOOK]})}
    assert sorted(subs) == ["ann", "bob"]
    assert all(s.layout == "Slate" and s.assignment == ASSIGNMENT and not s.problem
               for s in subs.values())
    assert subs["bob"].notes == ["marked late by Slate"]
    assert [rel for rel, _ in subs["bob"].data_files] == ["data.txt"]
    chosen = {s: choose_notebook(sub, NOTEBOOK, True, []) for s, sub in subs.items()}
    assert chosen["ann"].name == f"slate-ann--20261002100000--{NOTEBOOK}"
    assert _submitted_at(subs["ann"], chosen["ann"]) == ("2026-10-02T10:00:00", "Slate upload time")
    assert _submitted_at(subs["bob"], chosen["bob"]) == ("2026-10-03T12:00:00", "Slate upload time")
    bob = subs["bob"]
    bob.stamps.clear()      # a late mark without a time: the LMS's own late source
    assert _submitted_at(bob, chosen["bob"]) == ("", "unknown (Slate said late)")


def test_without_the_registration_the_zip_is_no_layout(tmp_path):
    with pytest.raises(ValueError, match="Layouts understood"):
        collect(slate_zip(tmp_path / "slate.zip"), [ASSIGNMENT], tmp_path / "unpacked",
                {ASSIGNMENT: [NOTEBOOK]})


def graded(tmp_path):
    out = tmp_path / "graded"
    out.mkdir()
    write_csv(out / "grades.csv", [Result("ann", ASSIGNMENT, score=3, max_score=4),
                                   Result("cat", ASSIGNMENT, score=1, max_score=4)], [])
    page = out / "feedback" / "ann" / ASSIGNMENT / f"{ASSIGNMENT}.html"
    page.parent.mkdir(parents=True)
    page.write_text("<html><body><h4>toy</h4>feedback for ann</body></html>")
    book = tmp_path / "slate-grades.csv"
    book.write_bytes(b"Student,Name,toy [10 pts],Total\r\nann,Ann,,\r\nbob,Bob,5,\r\n")
    return out, book


def test_export_fills_a_fourth_lmss_gradebook(tmp_path, slate):
    out, book = graded(tmp_path)
    result = export_gradebook(out, "slate", book, tmp_path / "filled.csv",
                              feedback=tmp_path / "feedback.zip")
    assert result.filled == {("ann", ASSIGNMENT): "7.5"}
    assert result.unmatched_students == ["cat"] and result.kept == ["bob"]
    assert (tmp_path / "filled.csv").read_bytes() == (
        b"Student,Name,toy [10 pts],Total\r\nann,Ann,7.5,\r\nbob,Bob,5,\r\n")
    assert result.feedback == ["toy/ann (ann).html"]       # the base's feedback_name
    with zipfile.ZipFile(tmp_path / "feedback.zip") as zf:
        page = zf.read("toy/ann (ann).html").decode()
    assert "Your grade for toy in Slate: <span class='lms-score'>7.5</span> of 10" in page
    assert "upload it to Slate" in format_export(result)


def test_the_command_line_takes_a_fourth_lms(tmp_path, slate, capsys):
    out, book = graded(tmp_path)
    code = main(["export", str(out), "--lms", "slate", "--gradebook", str(book),
                 "--out", str(tmp_path / "filled.csv")])
    assert code in (0, 3), capsys.readouterr()
    assert b"ann,Ann,7.5," in (tmp_path / "filled.csv").read_bytes()


def test_cli_and_export_offer_what_the_registry_holds(tmp_path, monkeypatch, capsys):
    out, book = graded(tmp_path)
    monkeypatch.delitem(LMSS, "blackboard")
    with pytest.raises(SystemExit):
        main(["export", str(out), "--lms", "blackboard", "--gradebook", str(book),
              "--out", str(tmp_path / "filled.csv")])
    assert "invalid choice: 'blackboard'" in capsys.readouterr().err
    with pytest.raises(ExportError, match="one of canvas, moodle$"):
        export_gradebook(out, "blackboard", book, tmp_path / "filled.csv")
    assert not (tmp_path / "filled.csv").exists()
