"""Run one submission in the trusted harness, its kernel in the OS sandbox; nbgrader's Execute step.

nbgrader's ``autograde`` executes notebooks inside the grading process. Here its ``Execute`` step
is :class:`SandboxedExecute`: it hands the notebook to a separate harness process
(``python -m autograder.engine.harness``, :func:`run_submission`), which runs the student's cells in a
bubblewrap sandbox (:mod:`autograder.engine.jail.jail`) and the test cells itself, and waits for the executed
notebook. What a submission gets, per platform (also in docs/instructors.md's sandbox table):

=========================  ===================================  ==============================
                           Linux with bubblewrap                elsewhere (only with
                                                                --unsafe-run-student-code-
                                                                unsandboxed)
=========================  ===================================  ==============================
where test cells run       the harness, never the kernel        the harness, never the kernel
user                       own user namespace; as root, a uid   the grader's own user
                           of its own per submission
files                      read-only: /usr, the Python and its  everything this user can
                           environment, mlexp, the lesson's     read and write
                           data; writable: tmpfs working
                           folder, /tmp, /dev/shm (sharing
                           --scratch-mb), a 1 MiB connection
                           folder; no other place writable
system calls               seccomp filter (autograder.engine.jail.seccomp)  all
processes                  own PID namespace, all killed with   own process group, killed at
                           the job; process count capped        the end
network, sockets, IPC      none (own network and IPC            not isolated
                           namespaces, no host /tmp)
environment                cleared to a short allow-list        the grader's
memory, CPU, file size     RLIMIT_AS, RLIMIT_CPU, RLIMIT_FSIZE  same where the OS has them
time                       per cell and per notebook            same
output                     capped per cell and per notebook     same
=========================  ===================================  ==============================

Only the parent writes grades: the harness returns a notebook and a report, and nbgrader scores
the notebook. A test cell that did not complete carries an error, so it scores 0.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Any, Dict, Unicode

from autograder.engine.cputime import WALL_CEILING
from autograder.engine.jail import jail
from autograder.options import UNSANDBOXED_FLAG, GradingOptions
from autograder.engine.protocol import Job, Report
from autograder.cells import is_test_cell
from autograder.engine.notebook_client import NOT_RUN_ENAME
from autograder.engine.audit import apply_audit, audit_notebook
from autograder.engine.versions import git_versions

__all__ = ["SandboxedExecute", "GradingRun", "LocalExecutor", "Harnesses", "run_submission",
           "isolation_notes", "check_sandbox", "SandboxUnavailable", "report_path"]

HARNESS_MEMORY_MB = 8192        # the harness holds decoded values and outputs, never student code


class Harnesses:
    """The harness processes one owner has running (an executor, a Dask worker's plugin), so
    that it can kill them all (Ctrl-C, a worker closing)."""

    def __init__(self):
        self._procs = set()
        self._lock = threading.Lock()

    def add(self, proc) -> None:
        """Count ``proc`` (a subprocess.Popen) as running."""
        with self._lock:
            self._procs.add(proc)

    def discard(self, proc) -> None:
        """Forget ``proc`` (it has ended and was reaped)."""
        with self._lock:
            self._procs.discard(proc)

    def kill_all(self) -> None:
        """Kill every running harness and its sandbox (their process groups)."""
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            _kill(proc)


class LocalExecutor:
    """Runs each submission on this machine (:func:`run_submission`): the executor of a
    grading run without a cluster. Any executor is a callable ``(nb, data_dir, options,
    label) -> (executed notebook or None, report dict)``, such as
    :class:`autograder.engine.distributed.DaskExecutor`."""

    def __init__(self, course_root=None):
        self.course_root = course_root
        self.harnesses = Harnesses()

    def __call__(self, nb, data_dir, options: GradingOptions, label: str = "") -> tuple:
        """Run one submission here; see :func:`run_submission`."""
        return run_submission(nb, data_dir, options, self.course_root, harnesses=self.harnesses)

    def kill_all(self) -> None:
        """Kill the harnesses of this executor still running (Ctrl-C)."""
        self.harnesses.kill_all()

    def close(self) -> None:
        """Nothing to release: a harness ends with its submission."""


class GradingRun:
    """What one grading run shares with nbgrader's Execute step (:class:`SandboxedExecute`):
    the executor that runs each submission and the lock that everything touching nbgrader
    or the gradebook holds. A notebook's execution (the slow part) releases the lock, so with
    -j N up to N submissions run while the parent scores. Passed through nbgrader's config as
    the ``run`` trait; traitlets deep-copies config values, and this object is shared instead.
    """

    def __init__(self, executor):
        self.executor = executor
        self.lock = threading.Lock()

    def __deepcopy__(self, memo):
        return self

    def execute(self, nb, data_dir, options: GradingOptions, label: str) -> tuple:
        """Run one submission with the lock released (the caller holds it); returns what the
        executor returns."""
        self.lock.release()
        try:
            return self.executor(nb, data_dir, options, label)
        finally:
            self.lock.acquire()


class SandboxUnavailable(RuntimeError):
    """The OS sandbox cannot run here and the instructor did not accept running without it."""


def isolation_notes(options: GradingOptions) -> list:
    """One line per isolation this machine cannot give, with what to do; empty when complete."""
    probe = jail.probe()
    if not probe["ok"]:
        return [f"NO SANDBOX: {probe['why']}. Student code ran with this user's rights "
                f"({UNSANDBOXED_FLAG}); grade untrusted classes on Linux with bubblewrap."]
    notes = []
    if jail.seccomp_missing():
        notes.append(f"the kernel's system calls are not filtered: {jail.seccomp_missing()}")
    if not probe["as_root"]:
        return notes + ["the sandbox runs under your own uid (in its own user namespace); run the grader "
                "as root to give each submission a uid of its own and a process-count limit"]
    return notes


def check_sandbox(options: GradingOptions) -> None:
    """Raise SandboxUnavailable unless the sandbox runs or ``options.unsandboxed`` accepts it."""
    probe = jail.probe()
    if not probe["ok"] and not options.unsandboxed:
        fix = ("This is a fault of the grader's sandbox, not of bubblewrap: please report it with "
               "this message; meanwhile grade from a checkout and venv outside that folder"
               if probe.get("cause") == "layout" else
               "Install bubblewrap (Debian/Ubuntu: sudo apt-get install bubblewrap) and allow user "
               "namespaces")
        raise SandboxUnavailable(
            f"{probe['why']}. Students' code would run with your rights: refusing to grade. {fix}, "
            f"or, for a class you trust completely, pass {UNSANDBOXED_FLAG}.")


def report_path(report_dir, assignment: str, student: str) -> Path:
    """Where SandboxedExecute leaves the harness's report of one submission."""
    return Path(report_dir) / assignment / f"{student}.json"


def _data_files(folder: Path) -> list:
    """The files the kernel may read: everything beside the notebook except notebooks and links."""
    if not folder or not Path(folder).is_dir():
        return []
    return sorted(p for p in Path(folder).iterdir()
                  if not p.name.startswith(".") and p.suffix != ".ipynb" and not p.is_symlink())


HARNESS_ATTEMPTS = 2             # a harness that fails (not a student's kernel) runs once more


def run_submission(nb, data_dir, options: GradingOptions, course_root=None, mode="autograde",
                   show_call_output=False, cwd=None, harnesses: Harnesses = None) -> tuple:
    """Run ``nb`` in a harness process; returns (executed notebook or None, report dict).

    ``data_dir`` holds the files the notebook may read (mounted read-only, notebooks excluded).
    Never raises for what the student's code does. A harness past ``options.notebook_timeout``
    (plus a grace for its start) is killed with everything it started; the result is then None
    and the report says why. A harness that fails otherwise is the grader's failure, not the
    student's (what the student's code does ends in its kernel, inside its own caps): it is run
    again, up to HARNESS_ATTEMPTS times in all, with a fresh job folder; if none succeeds the
    report has ``"retry": True`` (grade_class then grades the submission again next run) and
    says so under ``review``. ``harnesses`` counts the harness process while it runs (so that
    its owner can kill it).
    """
    harnesses = harnesses if harnesses is not None else Harnesses()
    for attempt in range(1, HARNESS_ATTEMPTS + 1):
        executed, report = _run_once(nb, data_dir, options, course_root, mode, show_call_output,
                                     cwd, harnesses)
        if not report.get("retry"):
            if attempt > 1:
                report.setdefault("notes", []).append(
                    f"the grading harness failed and was run again ({attempt} runs)")
            return executed, report
    return executed, report


def _run_once(nb, data_dir, options, course_root, mode, show_call_output, cwd,
              harnesses: Harnesses) -> tuple:
    """One harness run of run_submission; a failed harness gives ``report["retry"] = True``."""
    sandbox = jail.probe()["ok"]
    if not sandbox and not options.unsandboxed:
        raise SandboxUnavailable(jail.probe()["why"])
    job = Path(tempfile.mkdtemp(prefix="autograder-job-"))
    os.chmod(job, 0o711)   # the sandbox's uid may pass through, not list or read
    report = Report()
    proc = None
    try:
        scratch = None
        if not sandbox and cwd is None:   # unsandboxed grading: a copy, never the grader's folder
            scratch = job / "work"
            scratch.mkdir()
            for f in _data_files(data_dir):
                (shutil.copytree if f.is_dir() else shutil.copy)(f, scratch / f.name)
        spec = Job(input=str(job / "in.ipynb"), output=str(job / "out.ipynb"),
                   report=str(job / "report.json"), job_dir=str(job), options=options,
                   sandbox=sandbox, mode=mode, data_files=[str(p) for p in _data_files(data_dir)],
                   course_root=str(course_root) if course_root else None,
                   show_call_output=show_call_output, parent_pid=os.getpid(),
                   cwd=str(cwd or scratch) if not sandbox else None)
        nbformat.write(nb, spec.input)
        spec.write(job / "job.json")
        log = open(job / "harness.log", "wb")
        proc = subprocess.Popen(harness_command(job / "job.json"), env=_harness_env(mode),
                                cwd=job, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_limit_harness if os.name == "posix" else None)
        log.close()
        harnesses.add(proc)
        try:
            # the harness keeps every limit in CPU time (cputime.Budget); this is the backstop
            proc.wait(timeout=options.notebook_timeout * WALL_CEILING + 60)
        except subprocess.TimeoutExpired:
            _kill(proc)
            report.review.append(f"the notebook ran past its {options.notebook_timeout} s limit "
                                 f"({WALL_CEILING} times over, on the wall clock) and was stopped")
            return None, report.to_dict()
        if proc.returncode != 0 or not Path(spec.output).is_file():
            tail = (job / "harness.log").read_bytes()[-4000:].decode(errors="replace").strip()
            last = (tail.splitlines() or [""])[-1]
            report.review.append(f"the grading harness failed (exit {proc.returncode}): "
                                 f"{last[:200]}")
            report.retry = True
            return None, report.to_dict()
        report = Report.from_dict(json.loads((job / "report.json").read_text()))
        return nbformat.read(spec.output, as_version=4), report.to_dict()
    finally:
        if proc is not None:
            _kill(proc)   # whatever of its process group is left
            harnesses.discard(proc)
        shutil.rmtree(job, ignore_errors=True)


def harness_command(job_file: Path) -> list:
    """The command line of one harness process for the job described in ``job_file``."""
    return [sys.executable, "-m", "autograder.engine.harness", str(job_file)]


def _harness_env(mode: str) -> dict:
    """The harness's environment: this process's, with NBGRADER_EXECUTION the job's ``mode``
    (what nbgrader's autograde once put into this whole process while a notebook ran; the grader
    never writes it there: autograde.SandboxedAutograde)."""
    return {**os.environ, "NBGRADER_EXECUTION": mode}


def _limit_harness():
    import resource
    mem = HARNESS_MEMORY_MB * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        proc.kill()
    proc.wait()


def review_reasons(report: dict) -> list:
    """The reasons a person should look at a submission, from a harness report."""
    return Report.from_dict(report).reasons()


_LESSON_CODE = {}   # SandboxedExecute.lesson_code's, by release and its modification time


class SandboxedExecute(NbGraderPreprocessor):
    """nbgrader autograde's Execute step, run by the harness (see the module docstring).

    Traits (set through nbgrader's config): ``options`` (a GradingOptions as a dict),
    ``course_root``, ``report_dir`` (each submission's report is written to
    ``report_dir/<assignment>/<student>.json``) and ``run`` (a :class:`GradingRun`: its
    executor runs the notebook, with its lock released; the grader holds it around nbgrader's
    own work). Without a run, :func:`run_submission` runs the notebook here.
    """
    options = Dict(help="GradingOptions fields").tag(config=True)
    course_root = Unicode("", help="course root (never mounted into the sandbox)").tag(config=True)
    report_dir = Unicode("", help="folder for the per-submission reports").tag(config=True)
    release_dir = Unicode("", help="the grading folder's releases (work/release)").tag(config=True)
    run = Any(None, help="the GradingRun (executor and gradebook lock)").tag(config=True)

    def lesson_code(self, assignment: str, notebook: str) -> list:
        """The sources of the lesson's own code cells (not test cells) of ``notebook``: in its
        release in this grading folder and in every version of ``lessons/`` the course's git
        history holds (a notebook handed in against an earlier release), read once per process
        and release."""
        release = Path(self.release_dir) / assignment / f"{notebook}.ipynb" if self.release_dir else None
        key = (self.release_dir, self.course_root, assignment, notebook,
               release.stat().st_mtime_ns if release is not None and release.is_file() else None)
        cache = _LESSON_CODE     # nbgrader makes this step anew for every notebook: kept per process
        if key not in cache:
            versions = [nbformat.read(release, as_version=4)] if key[-1] is not None else []
            if self.course_root:
                versions += git_versions(Path(self.course_root), f"lessons/{assignment}/{notebook}.ipynb")
            cache[key] = list(dict.fromkeys(
                c.source for v in versions for c in v.cells
                if c.cell_type == "code" and not is_test_cell(c)))
        return cache[key]

    def preprocess(self, nb, resources):
        options = GradingOptions(**self.options)
        data_dir = Path(resources.get("metadata", {}).get("path") or ".")
        original = nbformat.from_dict(json.loads(json.dumps(nb)))
        info = resources.get("nbgrader", {})
        # The student's source is read here, before it runs and where nothing of it runs
        # (autograder.engine.audit): what it shows about the exercise rules outranks the kernel's word.
        audit = audit_notebook(original, self.lesson_code(info.get("assignment", ""),
                                                          info.get("notebook", "")))
        if self.run is not None:
            label = f"{info.get('assignment', '?')}/{info.get('student', '?')}"
            executed, report = self.run.execute(nb, data_dir, options, label)
        else:
            executed, report = run_submission(nb, data_dir, options, self.course_root or None)
        apply_audit(executed, report, audit)
        if self.report_dir and info.get("student"):
            path = report_path(self.report_dir, info.get("assignment", "?"), info["student"])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report))
        return finish_notebook(executed, original, report), resources


def finish_notebook(executed, original, report=None):
    """The notebook nbgrader scores; ``executed`` None means nothing came back.

    Every test cell that has no outputs from a completed run gets an error (nbgrader gives full
    points to a test cell without an error), and so does each test cell of a notebook that never
    came back.
    """
    nb = executed if executed is not None else original
    why = "; ".join(Report.from_dict(report).review) or "the grader stopped before this test ran"
    for cell in nb.cells:
        ran = executed is not None and (cell.get("execution_count") is not None or any(
            o.get("output_type") == "error" for o in cell.get("outputs", [])))
        if is_test_cell(cell) and not ran:
            cell.outputs = [nbformat.v4.new_output("error", ename=NOT_RUN_ENAME, evalue=why,
                                                   traceback=[f"{NOT_RUN_ENAME}: {why}"])]
    return nb
