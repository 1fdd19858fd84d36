"""The trusted harness: a submission's own cells run in its sandboxed kernel, its tests run here.

``run_notebook`` starts the student's kernel inside the OS sandbox (:mod:`autograder.engine.jail.jail`), runs
every cell that is not a graded test there with nbclient, and runs every graded test cell in this
process, in a fresh namespace where each name the test uses but does not define is fetched from
the kernel as data (:mod:`autograder.engine.kernel.wire`): values are rebuilt as plain Python types and tensors,
student functions become :class:`StudentFunction` proxies. So nothing the student's process
prints, patches or returns can make a test pass: a test passes only when its own code, here,
runs to the end. A test that ends in a number scores that much (nbgrader's partial credit),
unless the number may carry a student value (:mod:`autograder.engine.partial`): see :func:`run_test`.
Hidden test source never reaches the kernel. Outputs are capped per cell and per notebook; a
cell or a test past its time limit fails with a message that says so.

The parts, each a module of its own: :mod:`autograder.engine.notebook_client` (the kernel and its
client), :mod:`autograder.engine.calls` (the channel, proxies and calls), :mod:`autograder.engine.testcell`
(running one test); this module runs a notebook.

``python -m autograder.engine.harness JOB.json`` is how the grader runs it (autograder.engine.sandbox): a
separate process per submission, which writes the executed notebook and a JSON report.
"""
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

# jsonschema (under nbformat) imports rfc3987_syntax when installed, which builds a grammar for
# seconds at import; notebooks never use that format, so the harness starts without it.
sys.modules.setdefault("rfc3987_syntax", None)

import nbformat  # noqa: E402
from nbclient.exceptions import DeadKernelError  # noqa: E402

from autograder.engine.jail import jail
from autograder.engine.kernel import wire  # noqa: E402
from autograder.engine.calls import KernelLink, StudentFunction  # noqa: E402
from autograder.cells import grade_id_of, is_test_cell  # noqa: E402
from autograder.engine.notebook_client import (KERNEL_MODULE, NOT_RUN_ENAME, TIMEOUT_ENAME,  # noqa: E402
                                               HarnessClient, KernelGone, SandboxKernelManager, StudentTimeout,
                                               _error)
from autograder.options import GradingOptions  # noqa: E402
from autograder.engine.protocol import Job, KernelRequest, Report  # noqa: E402
from autograder.engine.testcell import run_test  # noqa: E402
from autograder.engine.kernel.wire import WIRE_MIME  # noqa: E402
from autograder.engine.jail.ipcfs import confine
from autograder.engine.cputime import Budget, CpuGroup
from autograder.engine.room import Room, ruled_names

__all__ = ["run_notebook", "is_test_cell", "run_test", "KernelLink", "StudentFunction",
           "StudentTimeout", "KernelGone", "TIMEOUT_ENAME", "NOT_RUN_ENAME", "main"]


def _watch_list(nb) -> list:
    """Modules the tamper snapshot imports first: those the notebook mentions (so that their own
    import-time changes, such as matplotlib's inline hooks, are not blamed on the student)."""
    import re
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    wanted = ["math", "operator", "functools", "json"]
    for mod, pattern in (("numpy", r"\bnumpy\b|\bnp\."), ("torch", r"\btorch\b"),
                         ("torch.nn.functional", r"\bF\.|functional"),
                         ("matplotlib.pyplot", r"matplotlib|plt\."),
                         ("mlexp", r"\bmlexp\b"), ("mlexp.ops", r"mlexp\.ops"),
                         ("mlexp.rules", r"\bmlexp\b"),   # its audit hook is then in place before any student cell
                         ("mlexp.rules_sight", r"\bmlexp\b"),   # the watcher's helpers, watched with it
                         ("mlexp.kvcache", r"kvcache"), ("mlexp.capstone", r"capstone"),
                         ("mlexp.inattention", r"inattention")):   # modules the rules forbid: watched
        if re.search(pattern, text):
            wanted.append(mod)
    return wanted


CHANNEL_NAMES = (KERNEL_MODULE, "kernel_request", WIRE_MIME)   # what only the grader's code names


def _tamper_reports(link, fresh_copy=True) -> list:
    """What the student's code changed in its kernel, asked twice: of the copy of the kernel
    side that took the snapshot, and (``fresh_copy``) of a fresh copy sent in now under a random
    name (the notebook cannot have replaced it in advance). A report that cannot be read is
    itself a finding, so silencing the channel flags the submission instead of clearing it."""
    import secrets
    found = []
    for fresh in (False, True) if fresh_copy else (False,):
        try:
            if fresh:
                link.install(f"{KERNEL_MODULE}_{secrets.token_hex(8)}")
            reply = link.request(KernelRequest.tamper_report(), "the kernel's tamper report")
        except RuntimeError:
            continue   # blocked: said by the caller
        value = reply.value
        if not isinstance(value, list):
            found.append("the kernel's tamper report (it could not be read)")
            continue
        found += [str(x)[:200] for x in value if str(x)[:200] not in found]
    return found


def _ask_tamper(link, report, fresh_copy=True) -> None:
    """Add to ``report.tampered`` what the kernel reports changed now (a kernel too busy to
    answer in time is left to the next asking). After each test only the first copy is asked
    (silencing it takes code that names or searches for the channel, which is flagged by
    itself and by autograder.engine.audit); after the last cell a fresh copy is asked too."""
    try:
        found = _tamper_reports(link, fresh_copy)
    except StudentTimeout:
        return
    report.tampered += [x for x in found if x not in report.tampered]


def _names_the_channel(cell) -> bool:
    """A student cell whose code names the grader's channel (read here, on the trusted side)."""
    return any(name in cell.source for name in CHANNEL_NAMES)


def run_notebook(nb, *, options: GradingOptions, job_dir: Path, data_files=(), course_root=None,
                 sandbox=True, show_call_output=False, mode="autograde", cwd=None):
    """Execute ``nb`` (its tests here, the rest in a sandboxed kernel); returns (nb, report).

    ``job_dir``: a folder of this run (0711 or private); ``data_files``: files put read-only in
    the kernel's working folder; ``sandbox=False`` runs the kernel as a plain local process in
    ``cwd`` (only where the caller accepts that risk). ``mode`` is the kernel's
    NBGRADER_EXECUTION ("autograde" or "validate"); ``show_call_output`` keeps what student
    functions print while tests call them (the self-check) in the tests' output. The report has ``review`` (reasons a person should look),
    ``timeouts`` (cells that ran out of time), ``kernel`` (why the kernel ended early, or ""),
    ``capped`` (cell indexes whose output was cut), ``tampered`` (what the student's code changed).
    """
    job_dir = Path(job_dir)
    for cell in nb.cells:   # nothing of an earlier run counts
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    ipc = job_dir / "ipc"
    ipc.mkdir(exist_ok=True)
    measure = job_dir / "measure"     # a measured call's arguments (KernelLink.measured_call)
    measure.mkdir(mode=0o755, exist_ok=True)
    lesson_files, data_files = list(data_files), [*data_files, measure]
    uid = jail.pick_uid() if sandbox else None
    km = SandboxKernelManager(kernel_name="python3", transport="ipc", ip=str(ipc / "kernel"),
                              connection_file=str(ipc / "kernel.json"))
    km.kernel_spec.interrupt_mode = "message"
    # The jail's own environment (the kernel's is cleared by bubblewrap): nothing of the grader's.
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG", "LC_ALL")}
    group = CpuGroup.create() if sandbox else None   # the kernel's CPU count (KernelLink.measured_call)
    if sandbox:
        if uid is not None:
            os.chown(ipc, uid, uid)
        km.owner_uid = uid
        km.jail_prefix = jail.sandbox_command(ipc_dir=ipc, job_dir=job_dir, data_files=data_files,
                                              options=options, course_root=course_root, uid=uid,
                                              mode=mode, cgroup=group.path if group else None)
        cwd = job_dir
    else:
        env = {**os.environ, "NBGRADER_EXECUTION": mode, "MPLBACKEND": jail.INLINE_BACKEND,
               **jail.thread_env(options)}
        cwd = cwd or job_dir
    client = HarnessClient(nb, options, km=km)
    link = KernelLink(client)
    rules = ruled_names(nb)
    room = Room(nb, rules, options=options, job_dir=job_dir, data_files=lesson_files, course_root=course_root,
                sandbox=sandbox, mode=mode, cwd=cwd, env=env) if rules else None
    report = Report()
    notebook = Budget(options.notebook_timeout, client.threads)   # CPU time, as the cells' (cputime)
    count = 0
    stopped = ""
    channel_cell = None   # the first student cell that names the grader's channel
    try:
        with client.setup_kernel(env=env, cwd=str(cwd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), \
                (room or contextlib.nullcontext()):
            link.cpu_root = client.cpu_root = km.provisioner.pid
            link.cpu_group = group if group is not None and group.holds(km.provisioner.pid) else None
            link.measure_dir = (measure, f"{jail.SANDBOX_HOME}/{measure.name}" if sandbox else measure)
            link.install()
            link.request(KernelRequest.snapshot(_watch_list(nb)), "the kernel's snapshot")
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                if stopped:
                    if is_test_cell(cell):
                        cell.outputs = [_error(NOT_RUN_ENAME, f"this test did not run: {stopped}")]
                    continue
                limit = min(options.cell_timeout, notebook.remaining())
                if limit <= 0.5 or notebook.exceeded():
                    stopped = f"the notebook ran past its {options.notebook_timeout} s limit of CPU time"
                    report.review.append(stopped + " and was stopped")
                    if is_test_cell(cell):
                        cell.outputs = [_error(NOT_RUN_ENAME, f"this test did not run: {stopped}")]
                    continue
                timed_out = False
                if is_test_cell(cell):
                    if room is not None and room.uses(cell.source):
                        room.prepare(index + 1, limit)
                    review = run_test(cell, link, options, limit, show_call_output, room)
                    if review:
                        report.review.append(review)
                    timed_out = any(o.get("ename") == TIMEOUT_ENAME for o in cell.outputs)
                    if not timed_out:   # asked at each test: a change undone by a later cell counts
                        _ask_tamper(link, report, fresh_copy=False)
                elif cell.source.strip():
                    if _names_the_channel(cell) and channel_cell is None:
                        channel_cell = count + 1      # its In [n], as the student sees it
                    timed_out = client.run_cell(cell, index, limit)
                    client.note_interactive_figures(cell)
                if cell.source.strip():
                    count += 1
                    cell.execution_count = count
                if timed_out:
                    grade_id = grade_id_of(cell)
                    report.timeouts.append(grade_id or f"In [{count}]")
                    if limit < options.cell_timeout:
                        stopped = f"the notebook ran past its {options.notebook_timeout} s limit of CPU time"
                        report.review.append(stopped + " and was stopped")
                    if not client.responsive():
                        stopped = ("the kernel did not stop after a cell ran past its time limit, "
                                   "so it was shut down")
                        report.kernel = stopped
            if not stopped:
                _ask_tamper(link, report)
            if link.touched:   # a request answered by the notebook's code (KernelReply.of_request)
                report.tampered.append("the grader's channel was touched: "
                                       + "; ".join(link.touched[:3]))
            elif link.blocked:
                report.tampered.append("the grader's requests to the kernel (they were "
                                          "blocked or rewritten)")
            if channel_cell is not None:
                report.tampered.append(f"the grader's channel to the kernel (In [{channel_cell}] "
                                          "names it)")
    except (KernelGone, DeadKernelError) as exc:
        report.kernel = f"the kernel died {exc}" if isinstance(exc, KernelGone) else "the kernel died"
        for cell in nb.cells:
            if is_test_cell(cell) and cell.get("execution_count") is None:
                cell.outputs = [_error(NOT_RUN_ENAME, f"this test did not run: {report.kernel}")]
    except StudentTimeout as exc:   # the snapshot or the report: the kernel is stuck
        report.kernel = f"the kernel stopped answering ({exc})"
    except Exception as exc:   # the kernel never started, a broken channel: report it
        report.kernel = f"{type(exc).__name__}: {exc}"[:300]
    if group is not None:    # the kernel has stopped
        group.close()
    for cell in nb.cells:    # a test that never ran scores nothing
        if is_test_cell(cell) and cell.get("execution_count") is None and not any(
                o.get("output_type") == "error" for o in cell.get("outputs", [])):
            cell.outputs = [_error(NOT_RUN_ENAME, "this test did not run: "
                                   + (report.kernel or stopped or "the grader stopped before it"))]
    client.settle_widget_text(nb)
    report.capped = client.truncated
    if client.unfinished:
        report.notes.append("output lost in cell(s) " + ", ".join(str(i + 1) for i in client.unfinished)
                            + f": still arriving {client.iopub_timeout} s after the cell finished")
    return nb, report.to_dict()


def main(argv=None) -> int:
    """``python -m autograder.engine.harness JOB.json``: run the job's notebook, write its results."""
    argv = sys.argv[1:] if argv is None else argv
    job = Job.read(argv[0])
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # die with the grader (PR_SET_PDEATHSIG)
    except (OSError, AttributeError):
        pass
    if job.parent_pid and os.getppid() != job.parent_pid:
        return 3   # the grader is already gone
    if job.sandbox:   # the kernel's sockets on a 1 MiB tmpfs, never the grader's disk
        (Path(job.job_dir) / "ipc").mkdir(exist_ok=True)
        confine(Path(job.job_dir) / "ipc")   # one thread yet; an OSError is the grader's
    nb = nbformat.read(job.input, as_version=4)
    nb, report = run_notebook(nb, options=job.options, job_dir=Path(job.job_dir),
                              data_files=[Path(p) for p in job.data_files],
                              course_root=job.course_root, sandbox=job.sandbox,
                              show_call_output=job.show_call_output, mode=job.mode, cwd=job.cwd)
    # A string the notebook made may hold lone surrogates (an assertion's message quoting a
    # returned value): written out as text, since a file of UTF-8 text cannot hold them.
    nbformat.write(nbformat.from_dict(wire.visible(nb)), job.output)
    Path(job.report).write_text(json.dumps(wire.visible(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
