"""nbgrader for one student at a time: the configuration of a class's run and the autograde call.

`grade.grade_class` prepares the submissions and commits the results; this module is what lies
between: nbgrader's configuration for the run (its Execute step replaced by
autograder.engine.sandbox.SandboxedExecute, which hands each notebook to the run's executor), and
:class:`Grader`, which writes one student's repaired notebooks where nbgrader looks, lets
nbgrader autograde them and render feedback under the run's gradebook lock, and reads the
score, the harness's Report and the status back into the student's Result.
"""
import os
import re
import shutil
import threading
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.apps import NbGraderAPI
from nbgrader.converters import Autograde
from nbgrader.converters.base import BaseConverter
from nbgrader.utils import capture_log, temp_attrs

from autograder.engine import sandbox
from autograder.config import work_config
from autograder.journal import atomic_write
from autograder.options import GradingOptions
from autograder.engine.protocol import Report
from autograder.results import GRADED, Result

__all__ = ["Grader", "SandboxedAutograde", "nbgrader_config", "status_of", "library_changes", "reason_of",
           "SANDBOX_PREPROCESSORS"]

# No nbgrader AssignLatePenalties: late penalties are applied once, when results become grades
# (autograder.term.policy.final_grades, in `report`), from the term file; never in the gradebook.
SANDBOX_PREPROCESSORS = (
    "autograder.engine.sandbox.SandboxedExecute", "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor", "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades", "nbgrader.preprocessors.CheckCellMetadata")


def nbgrader_config(work, root, options: GradingOptions, db_url, run):
    """nbgrader's configuration for one grade_class run: the course folder ``work``, autograde
    with the sandboxed Execute step, and ``run`` (the sandbox.GradingRun: executor and lock)
    reaching that step through the config, so two runs in one process share nothing."""
    config = work_config(work, options.cell_timeout, db_url)
    config.Autograde.autograde_preprocessors = list(SANDBOX_PREPROCESSORS)
    config.SandboxedExecute.options = options.as_dict()
    config.SandboxedExecute.course_root = str(root)
    config.SandboxedExecute.report_dir = str(work / "reports")
    config.SandboxedExecute.release_dir = str(work / "release")
    config.SandboxedExecute.run = run
    return config


# What a change the kernel reports (autograder.engine.kernel.kernel_server's tamper report) can
# reach (issue 51). The tests run outside the kernel, on data, so a function of these modules
# replaced in the kernel changes only what the student's own code computes there, which the tests
# check: it is said in the notes, never held. Everything else reported is the grader's own
# machinery: the rules' watch and the modules a rule forbids (the watch's evidence), IPython's
# hooks around every cell (the grader's requests run as cells), the way replies leave the kernel.
STUDENT_SIDE = ("builtins.", "math.", "operator.", "functools.", "cmath.", "statistics.", "json.",
                "numpy.", "torch.", "IPython.display.", "IPython.core.display_functions.")


def touches_the_grader(name: str) -> bool:
    """Whether a change the kernel reported (or the harness found in the channel) is to the
    grader's own machinery."""
    return not str(name).startswith(STUDENT_SIDE)


def status_of(report: dict, review: list, options: GradingOptions) -> str:
    """The status of a graded submission from the harness report and the repair's findings.

    "needs manual review" means the grader's own machinery was touched, or the grader could not
    finish: a change the kernel reported to a function of torch, numpy, math or the builtins in
    the student's own kernel holds nothing (the tests ran outside it: :func:`library_changes`
    says it in the notes), while the rules' watch, IPython's hooks and the channel do (issue 51)."""
    report = Report.from_dict(report) if isinstance(report, dict) else report
    held = Report.from_dict({**report.to_dict(), "tampered": [t for t in report.tampered if touches_the_grader(t)]})
    reasons = list(dict.fromkeys(review + held.reasons()))
    if reasons:
        return "needs manual review: " + "; ".join(reasons)
    if report.timeouts:
        return (f"timed out: {', '.join(report.timeouts[:6])} ran past the "
                f"{options.cell_timeout} s limit of CPU time per cell (scored as failed)")
    return "graded"


def library_changes(report) -> str:
    """A note of what the notebook replaced in its own kernel that no grade depends on, or ""."""
    report = Report.from_dict(report) if isinstance(report, dict) else report
    changed = [t for t in report.tampered if not touches_the_grader(t)]
    if not changed:
        return ""
    shown = ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
    return (f"the notebook replaced {shown} in its own kernel (the tests ran outside it, so no "
            "grade depends on it)")


def reason_of(text: str) -> str:
    """The final exception of a traceback, one line: 'NbGraderException: ...' (200 chars)."""
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    starts = [i for i, ln in enumerate(lines) if re.match(r"^[\w.]+(Error|Exception): ", ln)]
    picked = lines[starts[-1]:] if starts else lines[-1:]
    reason = re.sub(r"^(\w+\.)+", "", " ".join(picked))   # a.b.NbGraderException -> NbGraderException
    return (reason or "(no message)")[:200]



class SandboxedAutograde(Autograde):
    """nbgrader's ``autograde`` converter, without the process-wide NBGRADER_EXECUTION it sets.

    nbgrader (0.9.6) wraps the grading pass of ``Autograde.convert_single_notebook`` in
    ``utils.setenv(NBGRADER_EXECUTION="autograde")``: it writes ``os.environ`` from whichever
    thread grades, then deletes the variable whatever it held before (setenv looks the old value
    up under the wrong key), raising KeyError when another thread, or another grade_class run in
    this process, deleted it first. Nothing in the grading process reads the variable: the
    harness and the student's kernel get it from the Job's mode (sandbox.run_submission,
    jail.kernel_env), a Dask worker's the same way. So this converter runs nbgrader's two passes
    (sanitize, then autograde: nbgrader's method, line for line) without that setenv, and no
    submission writes the process's environment. tests/test_grading_env.py fails when
    nbgrader's method changes, so that this copy is read again.
    """

    def convert_single_notebook(self, notebook_filename: str) -> None:
        self.log.info("Sanitizing %s", notebook_filename)
        self._sanitizing = True
        self._init_preprocessors()
        BaseConverter.convert_single_notebook(self, notebook_filename)

        notebook_filename = os.path.join(self.writer.build_directory, os.path.basename(notebook_filename))
        self.log.info("Autograding %s", notebook_filename)
        self._sanitizing = False
        self._init_preprocessors()
        try:
            BaseConverter.convert_single_notebook(self, notebook_filename)
        finally:
            self._sanitizing = True


def autograde(api: NbGraderAPI, assignment: str, student: str) -> dict:
    """``api.autograde(assignment, student, force=True, create=True)`` with
    :class:`SandboxedAutograde` as the converter (NbGraderAPI.autograde's body, which names
    nbgrader's own class): ``{"success", "error", "log"}``."""
    with temp_attrs(api.coursedir, assignment_id=assignment, student_id=student):
        app = SandboxedAutograde(coursedir=api.coursedir, parent=api)
        app.force = True
        app.create_student = True
        return capture_log(app)


class Grader:
    """Runs nbgrader for one student at a time per thread, under the run's gradebook lock."""

    def __init__(self, work: Path, out: Path, config, options: GradingOptions, run):
        self.work, self.out, self.config, self.options = work, out, config, options
        self.run = run             # the sandbox.GradingRun: its executor and gradebook lock
        self.local = threading.local()
        self.cluster = None        # a distributed.DaskExecutor, when the runs go to a cluster

    def api(self) -> NbGraderAPI:
        if not hasattr(self.local, "api"):   # one per thread: the API keeps per-call state
            self.local.api = NbGraderAPI(config=self.config)
        return self.local.api

    def grade(self, job) -> Result:
        res = job.result
        report_file = sandbox.report_path(self.work / "reports", job.sub.assignment, job.sub.student)
        report_file.unlink(missing_ok=True)
        with self.run.lock:
            try:
                self._autograde(job)
            except Exception as exc:   # one student's failure never stops the batch
                res.status = f"needs manual review: grading failed ({reason_of(str(exc))})"
                res.retry = True
        if self.cluster is not None:   # ...but losing the cluster does: nothing is committed
            self.cluster.raise_if_stopped()
        report = Report.read(report_file)
        if res.status == "graded":
            res.status = status_of(report, job.review, self.options)
        if job.page_missing and res.status == "graded":   # the status says it, else a note does
            res.status = f"{GRADED}: no feedback page ({job.page_missing})"
        elif job.page_missing:
            res.notes.append("feedback failed: " + job.page_missing)
        if report.retry:   # the harness failed, not the student: grade it again next run
            res.retry = True
        res.notes += [n for n in report.notes + [library_changes(report)] if n and n not in res.notes]
        if report.capped:
            res.notes.append(f"output capped in {len(report.capped)} cell(s) "
                             f"({self.options.cell_output_kb} KiB per cell, "
                             f"{self.options.notebook_output_kb} KiB per notebook)")
        return res

    def _autograde(self, job) -> None:
        res, sub, api = job.result, job.sub, self.api()
        dest = self.work / "submitted" / sub.student / sub.assignment
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        for name, nb in job.notebooks.items():
            nbformat.write(nb, dest / name)
        for rel, path in sub.data_files:   # within nbgrader's size limits (collect checked)
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / rel)
        auto = autograde(api, sub.assignment, sub.student)
        if not auto["success"]:
            res.status = "needs manual review: autograde failed: " + reason_of(
                auto.get("error") or auto.get("log"))
            res.retry = True
            (self.out / "logs").mkdir(exist_ok=True)
            atomic_write(self.out / "logs" / f"{sub.student}.{sub.assignment}.log",
                         f"{auto.get('log', '')}\n{auto.get('error', '')}")
            return
        with Gradebook(api.coursedir.db_url) as gb:
            try:
                submitted = gb.find_submission(sub.assignment, sub.student)
            except MissingEntry:
                res.status = "needs manual review: nbgrader recorded no grades"
                return
            res.score, res.max_score = float(submitted.score), float(submitted.max_score)
            res.exercises = {g.name: float(g.score) for nb in submitted.notebooks
                             for g in nb.grades}
            if submitted.needs_manual_grade:
                job.review.append("nbgrader marked cells for manual grading")
        try:
            fb = api.generate_feedback(sub.assignment, sub.student, force=True)
        except Exception as exc:   # the grade stands; the page is the grader's to fix
            fb = {"success": False, "error": f"{type(exc).__name__}: {exc}"}
        src = self.work / "feedback" / sub.student / sub.assignment
        dst = self.out / "feedback" / sub.student / sub.assignment
        for html in sorted(src.glob("*.html")):
            dst.mkdir(parents=True, exist_ok=True)
            res.feedback.append(str(shutil.copyfile(html, dst / html.name)))
        pages = {Path(p).stem for p in res.feedback}
        unwritten = [name for name in job.notebooks if Path(name).stem not in pages]
        if not fb["success"] or unwritten:
            job.page_missing = (f"{', '.join(unwritten) or 'a notebook'}: "
                                f"{reason_of(fb.get('error')) if not fb['success'] else 'nbconvert wrote none'}")
            res.retry = True   # the grader's fault, not the student's: written again next run
