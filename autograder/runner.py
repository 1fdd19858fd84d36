"""The worker: execute one prepared notebook with nbclient and write it back (run as a child).

``python -m autograder.runner JOB.json`` is started by ``autograder.sandbox`` inside the limits
it sets (own process group, time, memory, CPU, no network, a scratch working directory). It
reads ``JOB["input"]``, runs every cell with a per-cell timeout (errors do not stop the run),
wraps each graded test cell in the guard of ``autograder.guard`` and writes the executed
notebook to ``JOB["output"]`` and a JSON report to ``JOB["report"]``. It never touches a
gradebook: the parent scores the notebook it gets back.
"""
import json
import re
import sys
from pathlib import Path

# jsonschema (under nbformat) imports rfc3987_syntax when installed, which builds a grammar for
# seconds at import; notebooks never use that format, so this worker starts without it.
sys.modules.setdefault("rfc3987_syntax", None)

import nbformat  # noqa: E402
from nbclient import NotebookClient  # noqa: E402
from nbclient.exceptions import DeadKernelError  # noqa: E402
from nbformat.v4 import new_code_cell  # noqa: E402

from .guard import DEFAULT_WATCH, OPTIONAL_WATCH, guard_source, new_token, setup_source  # noqa: E402

__all__ = ["run_job", "watched_modules", "is_test_cell"]

GUARD_MARK = "autograder_guard"
IMPORT_RE = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w., ]+))", re.M)


def is_test_cell(cell) -> bool:
    """An autograded test cell: a graded code cell that is not a solution cell."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")


def watched_modules(nb) -> list:
    """Modules whose functions the guard snapshots: those imported by test cells, the defaults,
    and numpy / torch / mlexp (with the mlexp submodules named) when any cell mentions them."""
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    watch = set(DEFAULT_WATCH)
    watch.update(m for m in OPTIONAL_WATCH if re.search(rf"\b{m}\b", text))
    watch.update(re.findall(r"\b(mlexp(?:\.\w+)+)", text))
    for cell in filter(is_test_cell, nb.cells):
        for frm, imp in IMPORT_RE.findall(cell.source):
            names = [frm] if frm else [n.split(" as ")[0].strip() for n in imp.split(",")]
            watch.update(n.split(".")[0] for n in names if n)
    return sorted(watch)


def _guard_cell(source: str):
    return new_code_cell(source, metadata={GUARD_MARK: True})


def _changed(cell) -> list:
    """The names a guard cell reported restoring (its marker line), or [] when it printed none."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            for line in out.get("text", "").splitlines():
                if line.startswith(cell.metadata[GUARD_MARK]):
                    try:
                        return json.loads(line[len(cell.metadata[GUARD_MARK]):])["changed"]
                    except (ValueError, KeyError, TypeError):
                        return ["(the guard's report was unreadable)"]
    return ["(the guard did not run: " + _error_text(cell) + ")"] if _error_text(cell) else []


def _error_text(cell) -> str:
    errs = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    return f"{errs[0].get('ename')}: {errs[0].get('evalue')}"[:200] if errs else ""


def _kill_group(pgid) -> None:
    import os
    import signal
    if pgid and hasattr(os, "killpg") and pgid != os.getpgid(0):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def run_job(job: dict) -> dict:
    """Execute ``job["input"]``; write ``job["output"]``; return the report dict.

    job keys: input, output, cell_timeout (s), kernel_name, cwd, guard (bool). Report keys:
    restored_before / changed_during ({grade_id: [names]}), reply_errors ([grade_id]: cells the
    kernel answered with an error), kernel_died (str, empty when it did not).
    """
    nb = nbformat.read(job["input"], as_version=4)
    token = new_token()
    cells, graded_at = [], {}
    if job.get("guard", True):
        cells.append(_guard_cell(setup_source(token, watched_modules(nb))))
    for cell in nb.cells:
        if job.get("guard", True) and is_test_cell(cell):
            before = _guard_cell(guard_source(token))
            before.metadata[GUARD_MARK] = token
            cells.append(before)
            graded_at[len(cells)] = cell.metadata["nbgrader"]["grade_id"]
            cells.append(cell)
            after = _guard_cell(guard_source(token))
            after.metadata[GUARD_MARK] = token
            cells.append(after)
        else:
            if is_test_cell(cell):
                graded_at[len(cells)] = cell.metadata["nbgrader"]["grade_id"]
            cells.append(cell)
    nb.cells = cells
    report = {"restored_before": {}, "changed_during": {}, "reply_errors": [], "kernel_died": ""}

    def on_executed(cell, cell_index, execute_reply, **_):
        if cell_index in graded_at and execute_reply.get("content", {}).get("status") != "ok":
            report["reply_errors"].append(graded_at[cell_index])

    client = NotebookClient(
        nb, timeout=job["cell_timeout"], allow_errors=True, interrupt_on_timeout=True,
        kernel_name=job.get("kernel_name", "python3"), extra_arguments=job.get("kernel_args", []),
        error_on_timeout={"ename": "CellTimeoutError", "evalue": "",
                          "traceback": [f"CellTimeoutError: the cell ran longer than "
                                        f"{job['cell_timeout']} s and was interrupted"]},
        resources={"metadata": {"path": job["cwd"]}}, on_cell_executed=on_executed)
    if job.get("transport"):
        client.km = client.kernel_manager_class(kernel_name=client.kernel_name,
                                                transport=job["transport"],
                                                ip=str(Path(job["cwd"]) / ".kernel-ipc"))
    kernel_group = []

    def on_start(**_):   # the kernel runs in its own session: remember it to clean up after
        kernel_group.append(getattr(client.km.provisioner, "pgid", None))

    client.on_notebook_start = on_start
    try:
        client.execute()
    except DeadKernelError:
        report["kernel_died"] = "the kernel died"
    except Exception as exc:   # a kernel that never starts, a broken client: report, keep outputs
        report["kernel_died"] = f"{type(exc).__name__}: {exc}"[:300]
    _kill_group(kernel_group[0] if kernel_group else None)   # background processes it left
    kept = []
    for i, cell in enumerate(nb.cells):
        if GUARD_MARK in cell.metadata:
            if cell.metadata[GUARD_MARK] is True:
                continue
            changed = _changed(cell)
            grade_id = graded_at.get(i + 1) or graded_at.get(i - 1)
            key = "restored_before" if (i + 1) in graded_at else "changed_during"
            if changed and grade_id:
                report[key][grade_id] = changed
            continue
        kept.append(cell)
    nb.cells = kept
    nbformat.write(nb, job["output"])
    return report


def apply_limits(job: dict) -> None:
    """Limit this process and the kernel it starts (they inherit): address space, CPU time;
    on Linux also ask to be killed when the grading process dies. No-op where unsupported."""
    try:
        import resource
    except ImportError:   # Windows
        return
    if job.get("memory_mb"):
        mem = int(job["memory_mb"]) * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    if job.get("cpu_seconds"):
        cpu = int(job["cpu_seconds"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    if sys.platform.startswith("linux"):
        import ctypes
        import os
        import signal
        try:   # PR_SET_PDEATHSIG (1): SIGKILL this worker when the grading process dies
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
        if job.get("parent_pid") and os.getppid() != job["parent_pid"]:
            sys.exit(3)   # the grading process is already gone


def main(argv=None) -> int:
    """Entry point: ``python -m autograder.runner JOB.json``."""
    argv = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(argv[0]).read_text())
    apply_limits(job)
    report = run_job(job)
    Path(job["report"]).write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
