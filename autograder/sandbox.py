"""Run a student's notebook in a separate, limited process and score only what it sends back.

nbgrader's ``autograde`` executes notebooks inside the grading process. Here its ``Execute``
step is replaced by :class:`SandboxedExecute`, which hands the notebook to a child process
(``python -m autograder.runner``) and waits for the executed copy. What the child gets, per
platform (this text is also in the README's grader section):

=====================  =============================  =========================================
limit                  Linux                          macOS / other POSIX; Windows
=====================  =============================  =========================================
own process            yes (own session, killed       yes / yes (no session kill on Windows)
                       with its kernel at the limit)
wall clock, per cell   yes (nbclient timeout)         yes
wall clock, notebook   yes (the parent kills it)      yes
memory (address space) yes (RLIMIT_AS)                POSIX: RLIMIT_AS where the OS honours it;
                                                      Windows: none
CPU time               yes (RLIMIT_CPU, per process)  POSIX: yes; Windows: none
network                none, when run as root or      not isolated (recorded in each result)
                       with user namespaces
                       (``unshare --net``); else
                       not isolated, with a note
other user             as root: runs as ``nobody``,   no
                       so it cannot write the
                       gradebook or read DIR/work
files                  a scratch folder holding only  same
                       the notebook and the lesson's
                       data files: no solutions/, no
                       gradebook. Absolute paths stay
                       readable where file
                       permissions allow.
=====================  =============================  =========================================

Only the parent writes grades: the child returns a notebook and a report; the parent marks
test cells that never ran as failed, turns library warnings on stderr in test cells into
ordinary output (nbgrader would score such a cell 0), and nbgrader scores the result.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

from .config import KERNEL_ARGS, PACKAGE_PARENT

__all__ = ["Limits", "SandboxReport", "SandboxedExecute", "CONTEXT", "GRADEBOOK_LOCK",
           "run_sandboxed", "isolation_notes", "finish_notebook", "kill_all"]

# Everything that touches nbgrader or the gradebook holds this lock; a notebook's execution
# (the slow part) releases it, so with -j N up to N children run while the parent scores.
GRADEBOOK_LOCK = threading.Lock()
CONTEXT = threading.local()     # .limits, .report (a SandboxReport), .holds_lock
ACTIVE = set()                  # the running children, killed by kill_all() on Ctrl-C
NOBODY = 65534


@dataclass
class Limits:
    """Per-notebook limits: seconds per cell and per notebook, MiB of memory, CPU seconds."""
    cell_timeout: int = 60
    notebook_timeout: int = 600
    memory_mb: int = 4096
    cpu_seconds: int = 900
    network: bool = False
    guard: bool = True


@dataclass
class SandboxReport:
    """What happened to one notebook's execution, for the per-student status."""
    review: list = field(default_factory=list)     # reasons a person should look at it
    restored: dict = field(default_factory=dict)   # grade_id -> names restored before/during


_PROBE = {}


def _probe() -> dict:
    """What this machine permits, tried once per process: a new network namespace, and
    (as root) running this Python as ``nobody``."""
    if not _PROBE:
        linux = sys.platform.startswith("linux") and shutil.which("unshare") is not None
        run = lambda cmd: subprocess.run(cmd, capture_output=True).returncode == 0  # noqa: E731
        _PROBE["net"] = linux and run(["unshare", "--net", "true"])
        _PROBE["nobody"] = (_PROBE["net"] and os.geteuid() == 0 and run(
            ["unshare", "--net", "--setuid", str(NOBODY), "--setgid", str(NOBODY), "--",
             sys.executable, "-c", "import nbclient, autograder"]))
    return _PROBE


def isolation_notes(limits: Limits) -> list:
    """One line per isolation this platform cannot apply (empty on Linux as root)."""
    probe, notes = _probe(), []
    if not limits.network and not probe["net"]:
        notes.append("network not isolated (a network namespace is not permitted here)")
    if hasattr(os, "geteuid") and os.geteuid() == 0 and not probe["nobody"]:
        notes.append("runs as root: user nobody cannot run this Python (the gradebook is "
                     "protected only by its folder not being the working directory)")
    if os.name != "posix":
        notes.append("memory and CPU limits not applied on this platform")
    return notes


def _command(job_path: Path, limits: Limits, as_nobody: bool) -> list:
    cmd = [sys.executable, "-m", "autograder.runner", str(job_path)]
    if not limits.network and _probe()["net"]:
        prefix = ["unshare", "--net"]
        if as_nobody:
            prefix += ["--setuid", str(NOBODY), "--setgid", str(NOBODY)]
        cmd = prefix + ["--"] + cmd
    return cmd


def run_sandboxed(nb: NotebookNode, data_dir: Path, limits: Limits) -> tuple:
    """Execute ``nb`` in a child process; return (executed notebook or None, SandboxReport).

    ``data_dir`` holds the files the notebook may read (copied, notebooks excluded). Never
    raises for what the student's code does; a child that exceeds the notebook time limit is
    killed with its whole process group and the result is None.
    """
    report, proc = SandboxReport(), None
    as_nobody = _probe()["nobody"]
    scratch = Path(tempfile.mkdtemp(prefix="autograder-job-"))
    try:
        cwd = scratch / "work"
        shutil.copytree(data_dir, cwd, ignore=shutil.ignore_patterns("*.ipynb", ".*"))
        job = {"input": str(scratch / "in.ipynb"), "output": str(scratch / "out.ipynb"),
               "report": str(scratch / "report.json"), "cwd": str(cwd),
               "cell_timeout": limits.cell_timeout, "kernel_name": "python3",
               "kernel_args": list(KERNEL_ARGS), "guard": limits.guard,
               "transport": "ipc" if not limits.network else "",
               "memory_mb": limits.memory_mb, "cpu_seconds": limits.cpu_seconds,
               "parent_pid": os.getpid()}
        nbformat.write(nb, job["input"])
        (scratch / "job.json").write_text(json.dumps(job))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NBGRADER_", "JPY_"))}
        env.update(NBGRADER_EXECUTION="autograde", HOME=str(cwd), MPLBACKEND="Agg",
                   MPLCONFIGDIR=str(scratch / "mpl"), JUPYTER_RUNTIME_DIR=str(scratch / "rt"),
                   JUPYTER_DATA_DIR=str(scratch / "jd"), IPYTHONDIR=str(scratch / "ipy"),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(PACKAGE_PARENT),
                                                            os.environ.get("PYTHONPATH")])))
        if as_nobody:
            for p in [scratch, *scratch.rglob("*")]:
                os.chown(p, NOBODY, NOBODY)
        proc = subprocess.Popen(_command(scratch / "job.json", limits, as_nobody), cwd=cwd, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        ACTIVE.add(proc)
        try:
            log, _ = proc.communicate(timeout=limits.notebook_timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            report.review.append(f"the notebook ran past its {limits.notebook_timeout} s limit "
                                 "and was stopped")
            return None, report
        if proc.returncode != 0 or not Path(job["output"]).is_file():
            tail = (log or b"").decode(errors="replace").strip().splitlines()[-1:] or [""]
            report.review.append(f"the grading worker failed (exit {proc.returncode}): "
                                 f"{tail[0][:200]}")
            return None, report
        child = json.loads(Path(job["report"]).read_text())
        if child["kernel_died"]:
            report.review.append(child["kernel_died"] + " (killed, or over the memory limit of "
                                 f"{limits.memory_mb} MiB)")
        for key, verb in (("restored_before", "redefined before"),
                          ("changed_during", "redefined while running")):
            for grade_id, names in child[key].items():
                report.restored.setdefault(grade_id, []).extend(names)
                report.review.append(f"{', '.join(names[:4])} {verb} test '{grade_id}' "
                                     "(restored; the score uses the real functions)")
        executed = nbformat.read(job["output"], as_version=4)
        for cell in executed.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if gid in child["reply_errors"] and not any(o.output_type == "error" for o in cell.outputs):
                cell.outputs.append(_error("HiddenError", "the kernel reported an error in this "
                                                          "test cell but no traceback was shown"))
        return executed, report
    finally:
        if proc is not None:
            _kill(proc)   # whatever of the worker's process group is left
            ACTIVE.discard(proc)
        shutil.rmtree(scratch, ignore_errors=True)


def kill_all() -> None:
    """Kill every running child and its kernel (their process groups): used on Ctrl-C."""
    for proc in list(ACTIVE):
        _kill(proc)


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        proc.kill()
    proc.wait()


def _error(ename: str, evalue: str) -> NotebookNode:
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue,
                                  traceback=[f"{ename}: {evalue}"])


def finish_notebook(executed, original) -> NotebookNode:
    """Make the executed notebook safe to score; ``executed`` None means nothing came back.

    Test cells that never ran (a time limit, a dead kernel) get an error output, since nbgrader
    gives full points to a test cell without an error. In test cells without an error, output
    on stderr (a library warning) becomes stdout, since nbgrader gives 0 to a cell that wrote
    to stderr.
    """
    from .runner import is_test_cell
    nb = executed if executed is not None else original
    for cell in nb.cells:
        if not is_test_cell(cell):
            continue
        ran = executed is not None and cell.get("execution_count") is not None
        if not ran:
            cell.outputs = [_error("NotExecuted", "the grader stopped before this test ran "
                                                  "(time or memory limit)")]
        elif not any(o.output_type == "error" for o in cell.outputs):
            for o in cell.outputs:
                if o.output_type == "stream" and o.name == "stderr":
                    o.name = "stdout"
    return nb


class SandboxedExecute(NbGraderPreprocessor):
    """nbgrader autograde's Execute step, run in a sandboxed child (see the module docstring).

    Reads its limits from ``CONTEXT.limits`` (the grading thread sets it) and adds what it saw
    to ``CONTEXT.report``. Releases GRADEBOOK_LOCK while the child runs when the thread holds it.
    """

    def preprocess(self, nb, resources):
        limits = getattr(CONTEXT, "limits", None) or Limits()
        data_dir = Path(resources.get("metadata", {}).get("path") or ".")
        original = nbformat.from_dict(json.loads(json.dumps(nb)))
        holds = getattr(CONTEXT, "holds_lock", False)
        if holds:
            GRADEBOOK_LOCK.release()
        try:
            executed, report = run_sandboxed(nb, data_dir, limits)
        finally:
            if holds:
                GRADEBOOK_LOCK.acquire()
            # nbgrader's setenv() deletes NBGRADER_EXECUTION after this step whatever was there
            # before; with several students in flight another one may have deleted it already.
            os.environ["NBGRADER_EXECUTION"] = "autograde"
        sink = getattr(CONTEXT, "report", None)
        if sink is not None:
            sink.review.extend(report.review)
            sink.restored.update(report.restored)
        return finish_notebook(executed, original), resources
