"""Grading on a Dask cluster: each submission's sandboxed run goes to a worker, the rest stays here.

``python -m autograder grade ... --scheduler ADDRESS`` grades exactly as on one machine, except
that the one call that runs a submission (:func:`autograder.engine.sandbox.run_submission`: harness,
sandboxed kernel, test cells) happens on a ``dask.distributed`` worker. What travels is data: the
repaired notebook (JSON), the files beside it (bytes), the GradingOptions and the lesson and
student ids (naming the task) go out; the executed notebook (JSON), the harness report and the
worker's isolation notes come back.
The grading process keeps everything that writes: nbgrader's gradebook, feedback, the results
journal, grades.csv and isolation.txt. On a worker, isolation is what it is on one machine (the
same bubblewrap sandbox, the same limits); a worker that cannot give it stops the batch before
any of its results is used.

Faults (distributed's scheduler reschedules a task whose worker dies):

- a worker lost mid-batch costs nothing: its submissions run again elsewhere, and every result
  already committed is in the journal;
- a submission during whose run :data:`WORKER_DEATHS` workers died is not run again: it comes
  back "needs manual review" (counted on the scheduler, see :func:`_deaths`; the scheduler's own
  ``allowed-failures`` limit, if lower, ends it the same way through ``KilledWorker``);
- the scheduler going away raises :class:`ClusterError`: the batch stops, nothing in flight is
  committed, and the next run resumes from the journal.

Workers need the grading environment this process has (the same autograder and mlexp sources,
Python and kernel packages: one image or one shared virtual environment; docs/instructors.md,
"Grading on a cluster") and bubblewrap. :class:`GradingPlugin` (a Dask worker plugin) checks each
worker as it joins and kills its harnesses when it closes; every task checks again, so a worker that differs
is named, never silently used. ``dask[distributed]`` is optional (``pip install 'mlexp-autograder[dask]'``):
this module imports without it, and only :class:`DaskExecutor` needs it.
"""
import hashlib
import logging
import socket
import sys
import tempfile
import uuid
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import nbformat

from autograder.engine import sandbox
from autograder.engine.jail import jail
from autograder.options import GradingOptions
from autograder.engine.protocol import ProtocolMismatch, RemoteJob, Report

try:   # the plugin's base class; without dask the module still imports (and the CLI says why)
    from distributed.diagnostics.plugin import WorkerPlugin
except ImportError:   # pragma: no cover - exercised where dask is not installed
    WorkerPlugin = object

__all__ = ["DaskExecutor", "ClusterError", "WorkerUnfit", "GradingPlugin", "run_remote",
           "environment", "WORKER_DEATHS"]

WORKER_DEATHS = 2      # workers that may die under one submission before a person must look
PACKAGES = ("nbgrader", "nbclient", "nbformat", "ipykernel", "jupyter_client", "torch", "numpy")
DATA_LIMIT = 200 * 2**20   # bytes beside one notebook sent to a worker (nbgrader: 100 MB a file)


class ClusterError(RuntimeError):
    """The batch cannot go on on this cluster: the scheduler is unreachable or gone, or a worker
    cannot grade as this machine would. Every result committed before it is kept."""


class WorkerUnfit(ClusterError):
    """A worker whose environment or sandbox differs from what grading needs (raised there)."""


def _sources_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def environment() -> dict:
    """What a worker must share with the grading process for a grade to be the same: a digest of
    the autograder and mlexp sources, the Python version and the versions of the packages that
    run a notebook (``None`` for one not installed)."""
    import mlexp
    grader = Path(__file__).resolve().parents[1]     # the autograder package's folder
    env = {"autograder and mlexp sources": _sources_digest(grader)
           + _sources_digest(Path(mlexp.__file__).resolve().parent),
           "python": "%d.%d" % sys.version_info[:2]}
    for name in PACKAGES:
        try:
            env[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            env[name] = None
    return env


def worker_course_root():
    """The checkout this worker's mlexp comes from (an editable install or PYTHONPATH), so that
    the sandbox never mounts it whole (it holds solutions/); None for an installed package."""
    import mlexp
    root = Path(mlexp.__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def check_worker(expected: dict, options=None, checked: dict = None) -> dict:
    """This worker's fitness for grading: ``{"host", "notes", "unfit"}``; ``unfit`` is the reason
    it must not grade ("" when it may). ``checked`` (the worker's GradingPlugin.checked) keeps
    each answer, so that the sandbox probe runs once per worker; without it, it runs each call."""
    if isinstance(options, dict):
        options = GradingOptions(**options)
    options = options or GradingOptions()
    key = repr(sorted(expected.items())) + repr(options.unsandboxed)
    checked = {} if checked is None else checked
    if key not in checked:
        here = environment()
        differ = [f"{k} {here.get(k)} here, {v} on the grading machine" for k, v in expected.items()
                  if here.get(k) != v]
        probe = jail.probe()
        unfit = ""
        if differ:
            unfit = "its grading environment differs: " + "; ".join(differ)
        elif not probe["ok"] and not options.unsandboxed:
            unfit = f"it cannot run the sandbox: {probe['why']}"
        checked[key] = {"host": socket.gethostname(), "unfit": unfit,
                        "notes": sandbox.isolation_notes(options)}
    return checked[key]


def _check_here(expected: dict, options: dict, dask_worker=None) -> dict:
    """check_worker on a worker, with its plugin's answers (``client.run`` passes the worker)."""
    return check_worker(expected, options, _plugin_state(dask_worker, "checked", dict))


class GradingPlugin(WorkerPlugin):
    """Dask worker plugin: checks each worker as it joins (the sandbox probe takes a second or
    two, so the first submission does not pay it) and kills the harnesses still running when
    the worker closes. Idempotent: a batch already grading on the cluster keeps its plugin
    (replacing it would tear it down, killing that batch's harnesses)."""
    name = "autograder"
    idempotent = True

    def __init__(self, expected: dict, options: dict):
        self.expected, self.options = expected, options
        self.harnesses = None   # on the worker: its running harnesses (run_remote)
        self.checked = None     # on the worker: check_worker's answers, by environment and options

    def setup(self, worker):
        self.harnesses = sandbox.Harnesses()
        self.checked = {}
        # never raises: a task reports an unfit worker
        check_worker(self.expected, self.options, self.checked)

    def teardown(self, worker):
        if self.harnesses is not None:
            self.harnesses.kill_all()


def _plugin_state(worker, name: str, fresh):
    """The worker's GradingPlugin's ``name`` (its harnesses, its checks), or ``fresh()`` when the
    plugin is not there (then nothing is kept between tasks)."""
    plugin = getattr(worker, "plugins", {}).get(GradingPlugin.name)
    state = getattr(plugin, name, None)
    return state if state is not None else fresh()


def _deaths(key, worker: str) -> int:
    """Record on the scheduler that task ``key`` starts on ``worker``; return how many workers
    died while running it before (0 when the scheduler refuses to run code: its own
    allowed-failures limit then ends it).

    The scheduler counts a death against every task assigned to the dying worker, also those
    still queued there behind the one that ran (``TaskState.suspicious``); the earlier starts
    of this task (an event topic per task) count only attempts that ran. A death counts when
    both saw it, so a submission queued behind one that kills its worker is not blamed.
    """
    try:
        from distributed import get_client

        def autograder_attempt(dask_scheduler, key=key, worker=worker):   # sent by value
            topic = f"autograder-starts-{key}"
            ran = len(dask_scheduler.get_events(topic))
            dask_scheduler.log_event(topic, {"worker": worker})
            ts = dask_scheduler.tasks.get(key)
            return min(ran, ts.suspicious if ts is not None else ran)
        return int(get_client().run_on_scheduler(autograder_attempt))
    except Exception:
        return 0


def _write_files(folder: Path, files) -> None:
    for rel, data in files:
        path = (folder / rel).resolve()
        if folder.resolve() not in path.parents:
            raise ValueError(f"a data file outside its folder: {rel!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def run_remote(payload: dict) -> dict:
    """The task a worker runs for one submission: :func:`sandbox.run_submission` on the notebook
    and files of ``payload`` (built by :meth:`DaskExecutor.payload`). Returns ``{"notebook":
    executed notebook JSON or None, "report", "worker", "host", "notes"}`` (the report also
    names the worker, and how many workers died under this submission before). Raises WorkerUnfit
    when this worker differs from the grading machine (or reads another protocol version,
    :data:`autograder.engine.protocol.VERSION`); returns a report asking for review, without running,
    when :data:`WORKER_DEATHS` workers already died under this submission."""
    from distributed import get_worker

    worker = get_worker()
    try:
        job = RemoteJob.from_dict(payload)
    except ProtocolMismatch as exc:
        raise WorkerUnfit(f"worker {worker.address}: {exc}") from None
    options = GradingOptions(**job.options)
    check = check_worker(job.environment, options, _plugin_state(worker, "checked", dict))
    out = {"notebook": None, "worker": worker.address, "host": check["host"],
           "notes": check["notes"]}
    if check["unfit"]:
        raise WorkerUnfit(f"worker {worker.address} on {check['host']}: {check['unfit']}")
    deaths = _deaths(worker.get_current_task(), worker.address)
    if deaths >= WORKER_DEATHS:
        out["report"] = _review_report(f"{deaths} grading workers died while running it "
                                       "(killed, or out of memory); it was not run again")
        return out
    nb = nbformat.reads(job.notebook, as_version=4)
    if not options.kernel_threads:   # this worker's cores, shared by the submissions it runs at once
        options = replace(options, kernel_threads=jail.shared_threads(worker.state.nthreads))
    harnesses = _plugin_state(worker, "harnesses", sandbox.Harnesses)
    with tempfile.TemporaryDirectory(prefix="autograder-data-") as tmp:
        _write_files(Path(tmp), job.files)
        executed, report = sandbox.run_submission(nb, Path(tmp), options,
                                                  course_root=worker_course_root(),
                                                  harnesses=harnesses)
    out["notebook"] = nbformat.writes(executed) if executed is not None else None
    done = Report.from_dict(report)
    done.worker, done.worker_deaths = worker.address, deaths
    out["report"] = done.to_dict()
    return out


def _review_report(reason: str) -> dict:
    return Report.needs_review(reason).to_dict()


def _pack(folder) -> list:
    """The files beside a notebook as (relative path, bytes): what a worker gets as data files."""
    files, total = [], 0
    for top in sandbox._data_files(folder):
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*")
                                                   if p.is_file() and not p.is_symlink())
        for p in paths:
            files.append((p.relative_to(folder).as_posix(), p.read_bytes()))
            total += len(files[-1][1])
    if total > DATA_LIMIT:
        raise ValueError(f"{total / 2**20:.0f} MiB of files beside the notebook: over the "
                         f"{DATA_LIMIT // 2**20} MiB sent to a worker")
    return files


# distributed's client-side loggers that print a lost scheduler as tracebacks (client: each failed
# reconnection; batched: the background send that found the connection closed; core, comm: the RPCs)
QUIET_LOGGERS = ("distributed.client", "distributed.batched", "distributed.core", "distributed.comm")


class DaskExecutor:
    """The grading process's side: connects to the scheduler, checks the workers present, and
    runs one submission per call on the cluster (the executor of an
    :class:`autograder.engine.sandbox.GradingRun`, called from nbgrader's Execute step with the
    gradebook lock released).

    Raises ClusterError when dask.distributed is not installed, the scheduler cannot be reached
    within ``timeout`` seconds, or a worker present cannot grade (named, with the reason).
    """

    def __init__(self, address: str, options: GradingOptions, timeout: float = 20):
        try:
            from distributed import Client
        except ImportError:
            raise ClusterError("--scheduler needs Dask: pip install 'mlexp-autograder[dask]' "
                               "(dask.distributed)") from None
        self.address, self.options = address, options
        self.expected = environment()
        # the client's own logs would print each failed reconnection, and the send that found the
        # scheduler gone, as a traceback: the loss is reported once, by ClusterError
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        try:
            self.client = Client(address, timeout=timeout, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise ClusterError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
        self.error = None          # set once the batch must stop; every later call raises it
        self.workers = {}          # worker address -> (host, isolation notes)
        self.name = f"dask-{uuid.uuid4().hex[:8]}"
        self.closed = False
        try:
            self.client.register_plugin(GradingPlugin(self.expected, options.as_dict()))
            for addr, check in sorted(self.client.run(_check_here, self.expected,
                                                      options.as_dict()).items()):
                if check["unfit"]:
                    raise WorkerUnfit(f"worker {addr} on {check['host']}: {check['unfit']}")
                self.workers[addr] = (check["host"], check["notes"])
        except BaseException:
            self.client.close()
            raise

    @property
    def threads(self) -> int:
        """Worker threads now in the cluster (each runs one submission at a time)."""
        return sum(w["nthreads"] for w in self.client.scheduler_info()["workers"].values())

    def describe(self, jobs: int) -> str:
        """One line for the start of a batch: workers, threads, submissions in flight, dashboard."""
        info = self.client.scheduler_info()["workers"]
        line = (f"dask: {len(info)} worker(s), {self.threads} thread(s) at {self.address}; "
                f"{jobs} submission(s) in flight")
        try:
            link = self.client.dashboard_link
        except Exception:   # a scheduler started without its dashboard
            link = ""
        return line + (f"; dashboard: {link}" if link else "")

    def isolation_lines(self) -> list:
        """isolation.txt: one line per worker seen, its notes or "fully isolated"."""
        return [f"worker {addr} on {host}: " + ("; ".join(notes) or "fully isolated")
                for addr, (host, notes) in sorted(self.workers.items())]

    def payload(self, nb, data_dir, options: GradingOptions, label: str) -> dict:
        """What one task carries: the notebook, the files beside it, the limits, the label
        (lesson/student) and this machine's environment, for the worker to compare."""
        return RemoteJob(notebook=nbformat.writes(nb), files=_pack(Path(data_dir)),
                         options=options.as_dict(), label=label,
                         environment=self.expected).to_dict()

    def __call__(self, nb, data_dir, options: GradingOptions, label: str = "") -> tuple:
        """Run one submission on the cluster; returns (executed notebook or None, report) as
        sandbox.run_submission does. Raises ClusterError when the batch must stop."""
        from distributed import KilledWorker
        self.raise_if_stopped()
        key = f"autograde-{label or 'submission'}-{uuid.uuid4().hex[:8]}".replace("/", "-")
        future = self.client.submit(run_remote, self.payload(nb, data_dir, options, label), key=key,
                                    pure=False, retries=0)
        try:
            out = future.result()
        except KilledWorker as exc:
            return None, _review_report(f"{exc.allowed_failures + 1} grading workers died while "
                                        "running it (killed, or out of memory)")
        except WorkerUnfit as exc:
            self.stop(ClusterError(f"{exc}; fix or retire that worker and run again"))
        except BaseException as exc:
            if self.client.status != "running":
                why = getattr(exc, "reason", "") or type(exc).__name__
                self.stop(ClusterError(f"lost the Dask scheduler at {self.address} ({why}); "
                                       "the batch stopped"))
            raise
        finally:
            future.release()
        self.workers[out["worker"]] = (out["host"], out["notes"])
        executed = nbformat.reads(out["notebook"], as_version=4) if out["notebook"] else None
        return executed, out["report"]

    def stop(self, error: ClusterError):
        """Stop the batch: this and every later call raise ``error``."""
        self.error = self.error or error
        raise self.error

    def raise_if_stopped(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Disconnect (once): tasks in flight are released, and the calls waiting for them
        raise at once."""
        if self.closed:
            return
        self.closed = True
        try:
            self.client.close(timeout=5)
        except Exception:   # the scheduler is already gone
            pass
