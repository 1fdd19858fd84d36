"""The three contracts that cross a process boundary while a submission is graded, as dataclasses.

- :class:`Job`: what the grading process (:func:`autograder.engine.sandbox.run_submission`) asks one
  harness process (``python -m autograder.engine.harness JOB.json``) to run; :class:`RemoteJob` is the
  same request sent to a Dask worker (:mod:`autograder.engine.distributed`), checked by its ``version``.
- :class:`Report`: what a harness says about the run besides the executed notebook.
- :class:`KernelRequest` / :class:`KernelReply`: one request of a test cell to the student's
  kernel and its answer (:mod:`autograder.engine.kernel.wire` serves them inside the kernel).

Each is written and read only through these classes: no other module builds or parses their
dicts, and every default lives here.
"""
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Optional

from autograder.options import GradingOptions

__all__ = ["VERSION", "Job", "RemoteJob", "Report", "KernelRequest", "KernelReply",
           "ProtocolMismatch"]

# Bumped whenever a field of Job, RemoteJob or Report changes meaning: a Dask worker running an
# older or newer grader refuses a job it would misread.
VERSION = 1


class ProtocolMismatch(ValueError):
    """A job written by a grader whose protocol version differs from this one."""


def _known(cls, data: dict) -> dict:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class Job:
    """One harness run: where the notebook is and where its results go, the limits, and how
    the kernel runs (sandboxed, in which mode, with which data files)."""
    input: str                         # the notebook to run (nbformat JSON)
    output: str                        # where the executed notebook is written
    report: str                        # where the Report is written
    job_dir: str                       # this run's folder (0711)
    options: GradingOptions = field(default_factory=GradingOptions)
    sandbox: bool = True               # False: the kernel is a plain local process in ``cwd``
    mode: str = "autograde"            # the kernel's NBGRADER_EXECUTION
    data_files: list = field(default_factory=list)   # paths put read-only beside the notebook
    course_root: Optional[str] = None  # never mounted whole into the sandbox
    show_call_output: bool = False     # keep what student functions print in the tests' output
    parent_pid: Optional[int] = None   # the grader: the harness exits when it is gone
    cwd: Optional[str] = None          # the kernel's folder when unsandboxed
    version: int = VERSION

    def to_dict(self) -> dict:
        """The job as JSON-ready data (options as a plain dict)."""
        return {**asdict(self), "options": self.options.as_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> "Job":
        """The job ``data`` describes; raises ProtocolMismatch for another version."""
        if data.get("version", VERSION) != VERSION:
            raise ProtocolMismatch(f"a job of protocol version {data.get('version')}, "
                                   f"this grader reads version {VERSION}")
        data = _known(cls, data)
        return cls(**{**data, "options": GradingOptions(**data.get("options", {}))})

    def write(self, path) -> None:
        """Write the job file the harness reads (:meth:`read`)."""
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def read(cls, path) -> "Job":
        """The job in the file at ``path``."""
        return cls.from_dict(json.loads(Path(path).read_text()))


@dataclass
class Report:
    """What a harness reports of one run, besides the executed notebook.

    ``review``: reasons a person should look; ``timeouts``: cells (grade ids, else "In [n]", the execution count the student sees)
    that ran out of time; ``kernel``: why the kernel ended early, or ""; ``capped``: indexes of
    cells whose output was cut; ``tampered``: what the student's code changed. On a Dask worker
    ``worker`` and ``worker_deaths`` name the worker and how many died under this submission.
    ``retry``: the harness itself failed (not the student's kernel), so the next grading run
    grades the submission again; ``notes``: remarks for the student's status (a harness run again).
    """
    review: list = field(default_factory=list)
    timeouts: list = field(default_factory=list)
    kernel: str = ""
    capped: list = field(default_factory=list)
    tampered: list = field(default_factory=list)
    worker: Optional[str] = None
    worker_deaths: Optional[int] = None
    retry: bool = False
    notes: list = field(default_factory=list)

    @classmethod
    def needs_review(cls, reason: str) -> "Report":
        """The report of a run that did not happen or did not finish, for ``reason``."""
        return cls(review=[reason])

    def to_dict(self) -> dict:
        """The report as data; the worker fields only when set (a local run has none)."""
        out = asdict(self)
        for key in ("worker", "worker_deaths"):
            if out[key] is None:
                del out[key]
        return out

    def reasons(self) -> list:
        """The reasons a person should look at the submission."""
        reasons = list(self.review)
        if self.kernel:
            reasons.append(f"{self.kernel} (killed, or over a memory or process limit)")
        if self.tampered:
            shown = ", ".join(self.tampered[:5]) + (" ..." if len(self.tampered) > 5 else "")
            reasons.append(f"the notebook's code changed {shown} in its kernel (this is what the "
                           "kernel reported when asked after each test: it proves a change, not its "
                           "effect, and a change it missed is possible. The tests' own checks ran "
                           "outside the notebook, but an exercise rule's verdict, such as a library op "
                           "forbidden, is watched inside it: check the points those rules guard)")
        return reasons

    @classmethod
    def from_dict(cls, data) -> "Report":
        """The report ``data`` holds (missing fields: their defaults; unknown ones ignored)."""
        return cls(**_known(cls, data if isinstance(data, dict) else {}))

    @classmethod
    def read(cls, path) -> "Report":
        """The report in the file at ``path``; an empty report when it is missing or unreadable."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError):
            return cls()


@dataclass
class RemoteJob:
    """One submission sent to a Dask worker: the notebook, the files beside it, the limits,
    the label (lesson/student) and the grading machine's environment, for the worker to
    compare with its own (:func:`autograder.engine.distributed.run_remote`)."""
    notebook: str                     # nbformat JSON
    files: list                       # (relative path, bytes) of the files beside it
    options: dict                     # GradingOptions.as_dict()
    label: str = ""
    environment: dict = field(default_factory=dict)
    version: int = VERSION

    def to_dict(self) -> dict:
        """What the task carries (a plain dict, pickled by Dask)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RemoteJob":
        """The job a worker received; raises ProtocolMismatch for another version."""
        if not isinstance(data, dict) or data.get("version") != VERSION:
            got = data.get("version") if isinstance(data, dict) else None
            raise ProtocolMismatch(f"a grading job of protocol version {got}, this worker's "
                                   f"grader reads version {VERSION}")
        return cls(**_known(cls, data))


# ---------------------------------------------------------------------------------------------
# The kernel channel. The kernel side (autograder.engine.kernel.wire.KernelServer) runs inside the student's
# kernel, which holds nothing of the grader but the wire module itself; it reads the request
# dict and writes the reply dict, each in one place (its dispatch and its handlers).


@dataclass
class KernelRequest:
    """One request of the harness to the kernel: ``op`` and its arguments.

    Ops: ``lookup`` (name), ``call`` (ref, args, kwargs, grad, watch), ``backward`` (graph,
    grads), ``snapshot`` (import) and ``tamper_report``. ``nonce``: set for each request as it is
    sent (:meth:`autograder.engine.calls.KernelLink.request`, a fresh ``secrets.token_hex``);
    the kernel side echoes it in its reply (:meth:`KernelReply.of_request`).
    """
    op: str
    args: dict = field(default_factory=dict)
    nonce: str = ""

    @classmethod
    def lookup(cls, name: str) -> "KernelRequest":
        """Fetch the student's global ``name``."""
        return cls("lookup", {"name": name})

    @classmethod
    def call(cls, ref: int, args_node, kwargs_node, grad: bool, watch=None) -> "KernelRequest":
        """Call the referenced callable with encoded arguments; ``watch`` (module names): run it
        under mlexp.rules.watching."""
        body = {"ref": ref, "args": args_node, "kwargs": kwargs_node, "grad": grad}
        if watch is not None:
            body["watch"] = list(watch)
        return cls("call", body)

    @classmethod
    def measure(cls, ref: int, items: list, kwargs_node, seed: int) -> "KernelRequest":
        """Call the referenced callable once, its tensor arguments read from files (``items``:
        ``{"file": path, "dtype": name, "shape": [...]}`` or ``{"node": wire node}`` each), and
        reply with the result's checksum under weights drawn from ``seed`` (KernelServer.measure)."""
        return cls("measure", {"ref": ref, "items": list(items), "kwargs": kwargs_node, "seed": int(seed)})

    @classmethod
    def backward(cls, graph: int, grads_node) -> "KernelRequest":
        """Run the backward pass of call ``graph`` with the encoded output gradients."""
        return cls("backward", {"graph": graph, "grads": grads_node})

    @classmethod
    def snapshot(cls, modules: list) -> "KernelRequest":
        """Import ``modules`` and record the kernel's state before the first student cell."""
        return cls("snapshot", {"import": list(modules)})

    @classmethod
    def tamper_report(cls) -> "KernelRequest":
        """What the student's code changed since the snapshot."""
        return cls("tamper_report")

    def to_json(self) -> str:
        """The request as the kernel side's ``kernel_request`` reads it."""
        body = {"op": self.op, **self.args}
        if self.nonce:
            body["nonce"] = self.nonce
        return json.dumps(body, allow_nan=True)


@dataclass
class KernelReply:
    """The kernel's answer to a request, read with the defaults the harness relies on.

    ``value``: an encoded value (autograder.engine.kernel.wire); ``missing``: no such name; ``module``: the
    name is a module (never fetched); ``error``: ``{"types", "type", "message"}`` of an
    exception raised there; for a call also ``args``/``kwargs`` (the arguments as the function
    left them), ``names`` (its parameter names), ``graph`` (the call's number, for a backward
    pass) and ``watch`` (mlexp.rules' trace); ``nonce``: the request's, echoed.
    """
    value: object = None
    missing: bool = False
    module: Optional[str] = None
    error: Optional[dict] = None
    args: object = None
    kwargs: object = None
    names: list = field(default_factory=list)
    graph: object = None
    watch: object = None
    is_module: bool = False
    nonce: Optional[str] = None

    @classmethod
    def from_dict(cls, data: dict) -> "KernelReply":
        """The reply the kernel sent (a dict; unknown keys ignored)."""
        names = data.get("names")
        nonce = data.get("nonce")
        return cls(value=data.get("value"), missing=bool(data.get("missing")),
                   module=data.get("module"), error=data.get("error"),
                   args=data.get("args", {"t": "list", "v": []}),
                   kwargs=data.get("kwargs", {"t": "dict", "v": []}),
                   names=names if isinstance(names, list) else [], graph=data.get("graph"),
                   watch=data.get("watch"), is_module="module" in data,
                   nonce=nonce if isinstance(nonce, str) else None)

    @classmethod
    def of_request(cls, replies: list, nonce: str, ended_cleanly: bool) -> tuple:
        """The answer to one request, from every reply its request cell sent: ``(reply or None,
        evidence)``. ``evidence``: why the replies show the channel touched ([] when they do not).

        A request is answered only by exactly one reply that carries the request's ``nonce``
        (fresh for each request, so no code written before the request can know it), sent by the
        request cell the harness started (nbclient reads only the messages whose parent is that
        cell's execution) and followed by that cell's clean end (``ended_cleanly``: its
        execute_reply has status "ok"). The kernel side publishes its one reply as the last
        thing the cell does, so a second reply, a reply without the nonce, or a reply and then an
        error (the called function answered for the grader, then ended the cell before the
        kernel side could) can only come from code of the notebook: the request is unanswered.
        No reply at all is unanswered with no evidence (the caller says why)."""
        replies = list(replies or [])
        evidence = []
        if len(replies) > 1:
            evidence.append(f"{len(replies)} replies to one request")
        if any(not isinstance(r, dict) or r.get("nonce") != nonce for r in replies):
            evidence.append("a reply that does not carry the request's nonce")
        if replies and not ended_cleanly:
            evidence.append("a reply from a request cell that did not end cleanly")
        if evidence or not replies or not nonce:
            return None, evidence
        return cls.from_dict(replies[0]), []

    def raised(self):
        """The exception the kernel raised, as the same built-in type here (RuntimeError for
        any other type, such as SystemExit, its name before the message), or None when the
        request succeeded."""
        import builtins
        if self.error is None:
            return None
        err = self.error if isinstance(self.error, dict) else {}
        message = str(err.get("message", ""))[:2000]
        for name in err.get("types") or []:
            cls = getattr(builtins, str(name), None)
            if isinstance(cls, type) and issubclass(cls, Exception):
                return cls(message)
        kind = str(err.get("type", ""))[:100]
        return RuntimeError(f"{kind}: {message}" if kind and kind not in message else message)
