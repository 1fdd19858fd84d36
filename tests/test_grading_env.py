"""Grading writes nothing to the grading process's environment (issue 27).

nbgrader's autograde sets NBGRADER_EXECUTION in os.environ around each notebook and deletes it
afterwards, from whichever thread grades; two grade_class runs at once in one process then
delete it under each other (KeyError: "autograde failed"). The grader runs nbgrader's
autograde without that (autograder.engine.autograde.SandboxedAutograde) and gives the variable to each
harness from the job's mode instead. No kernel is started here: the sandboxed run is replaced by
one that returns the notebook as it came, after a pause, so that the runs overlap.
"""
import inspect
import os
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import nbformat
from nbgrader.converters import Autograde

from autograder.engine import sandbox
from autograder.engine.autograde import SandboxedAutograde
from autograder.publishing.build import build
from autograder.publishing.demo import student_notebook
from autograder.grading.grade import grade_class
from autograder.options import GradingOptions
from autograder.engine.protocol import Report
from toy_course import ADD_SOLUTION, ASSIGNMENT, NOTEBOOK, make_toy_course


def test_the_converter_is_nbgraders_without_its_setenv():
    """SandboxedAutograde.convert_single_notebook is nbgrader's, line for line, less the
    ``utils.setenv``: when nbgrader's changes, this fails and the copy must be read again."""
    theirs = textwrap.dedent(inspect.getsource(Autograde.convert_single_notebook)).splitlines()
    setenv = "with utils.setenv(NBGRADER_EXECUTION='autograde'):"
    assert [line.strip() for line in theirs].count(setenv) == 1, \
        "nbgrader's autograde no longer sets NBGRADER_EXECUTION as it did"
    at = [line.strip() for line in theirs].index(setenv)
    theirs = theirs[:at] + [line[4:] for line in theirs[at + 1:at + 2]] + theirs[at + 2:]
    theirs = [line.replace("super(Autograde, self).convert_single_notebook(notebook_filename)",
                           "BaseConverter.convert_single_notebook(self, notebook_filename)")
              for line in theirs]
    ours = textwrap.dedent(inspect.getsource(SandboxedAutograde.convert_single_notebook))
    assert ours.splitlines() == theirs


def test_two_classes_graded_at_once_leave_the_environment_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.chdir(tmp_path)
    seen, lock = [], threading.Lock()

    def run_submission(nb, data_dir, options, course_root=None, **kwargs):   # no kernel
        with lock:
            seen.append((threading.current_thread().name, os.environ.get("NBGRADER_EXECUTION")))
        time.sleep(0.3)   # the other class's students are in flight meanwhile
        return nb, Report().to_dict()
    monkeypatch.setattr(sandbox, "run_submission", run_submission)
    course = make_toy_course(tmp_path / "course")
    build(course)
    lesson = nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    classes = []
    for c in range(2):
        cls = tmp_path / f"class{c}"
        for s in range(3):
            (cls / f"student{s}" / ASSIGNMENT).mkdir(parents=True)
            nbformat.write(student_notebook(lesson, {"add": ADD_SOLUTION}),
                           cls / f"student{s}" / ASSIGNMENT / NOTEBOOK)
        classes.append(cls)
    options = GradingOptions(unsandboxed=True)
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(grade_class, course, cls, tmp_path / f"out{c}", options=options,
                            progress=False, jobs=3) for c, cls in enumerate(classes)]
        results = [run.result() for run in runs]
    assert [len(r) for r in results] == [3, 3]
    assert all(r.status == "graded" for rs in results for r in rs), \
        [(r.student, r.status) for rs in results for r in rs]
    assert len(seen) == 6 and all(value is None for _, value in seen), seen
    assert "NBGRADER_EXECUTION" not in os.environ


def test_a_harness_gets_the_mode_of_its_job(monkeypatch):
    monkeypatch.setenv("NBGRADER_EXECUTION", "from-the-grader")
    assert sandbox._harness_env("validate")["NBGRADER_EXECUTION"] == "validate"
    assert os.environ["NBGRADER_EXECUTION"] == "from-the-grader"
