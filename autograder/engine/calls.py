"""Values and functions of the student's notebook as the trusted side sees them: the channel to
the kernel (:class:`KernelLink`), proxies of student functions, and the namespace a test runs in.
"""
import builtins
import dataclasses
import secrets
import time
from pathlib import Path

from autograder.engine.cputime import children, ignores_children, tree_cpu_ns
from mlexp.rules_measure import peak_growth, peak_reset
from autograder.engine.kernel import kernel_server
from autograder.engine.kernel import measure
from autograder.engine.kernel import wire
from autograder.engine.kernel import wire_decode
from autograder.engine.kernel import wire_encode
from autograder.engine.kernel import wire_format
from autograder.engine.notebook_client import KERNEL_MODULE, RECOVER_S, StudentTimeout
from autograder.engine.protocol import KernelReply, KernelRequest
from autograder.engine.kernel.wire import Opaque, WireError, decode, encode

# what KernelLink.install sends into the kernel, in this order (each part's imports run only on
# the trusted side: in the kernel they share one module's namespace)
KERNEL_SOURCES = (wire_format, wire_encode, wire_decode, wire, measure, kernel_server)
BIG_REQUEST = 64 * 1024   # characters of a request above which it reaches the kernel as a file

__all__ = ["KernelLink", "StudentFunction", "StudentNamespace"]


class StudentFunction:
    """A student function or callable, called through the kernel; arguments and results cross as
    data (:mod:`autograder.engine.kernel.wire`). An exception inside it is raised here as the same built-in type
    with its message. A tensor argument changed in place fails the call (AssertionError with a
    hint) and never changes the test's own tensor; autograd flows through the call when the
    arguments require grad."""

    def __init__(self, link, ref: int, type_name: str, name: str):
        self._link, self._ref, self._type = link, ref, type_name
        self.__name__ = name or type_name

    def __call__(self, *args, **kwargs):
        return self._link.call(self, args, kwargs)

    def _watched_call(self, args, kwargs, forbid, limit=None):
        """The call watched in the kernel by mlexp.rules (the exercise's stated rules): returns
        (result, the trace as data, or None when the kernel sent none). ``limit``: (seconds,
        hint) from :func:`mlexp.rules.in_time`: the call is stopped here, on the grader's clock,
        after that many seconds, and the test fails with the hint (nothing in the kernel can
        stretch that time)."""
        return self._link.call(self, tuple(args), dict(kwargs), watch=[str(m) for m in forbid],
                               limit=limit)

    def _measured_call(self, args, kwargs, expected):
        """(CPU seconds, peak memory added, the seconds of the kernel's checksum to take off) of one
        call, as the operating system counts them for the kernel, read on the grader's side; the
        result must be ``expected`` (KernelLink.measured_call).
        For :func:`mlexp.rules_measure.work_grows`."""
        return self._link.measured_call(self, tuple(args), dict(kwargs), expected)

    def __repr__(self):
        return f"<{self._type} {self.__name__} from the student's notebook>"


class StudentNamespace(dict):
    """The globals of one test cell: what the test defines, else the student's names, fetched
    from the kernel on first use. Built-in names and dunder names are never fetched, so a student
    global called ``abs`` or ``print`` does not replace the built-in in a test. ``room``: the
    notebook's :class:`autograder.engine.room.Room`, which answers the names an exercise rule
    forbids a module to (their calls run where that module does not exist), or None."""

    def __init__(self, link, room=None):
        super().__init__(__builtins__=builtins, __name__="__main__")
        self._link = link
        self._room = room
        self.fetched = set()     # the names whose value came from the kernel (autograder.engine.partial)

    def _fetch(self, name):
        if not isinstance(name, str) or name.startswith("__") or hasattr(builtins, name):
            raise KeyError(name)
        if self._room is not None and name in self._room.rules:
            self._link.lookup(name)   # the notebook must hold it (a cell that raised before its def did not)
            value = self._room.lookup(name)
        else:
            value = self._link.lookup(name)
        dict.__setitem__(self, name, value)
        self.fetched.add(name)
        return value

    def __missing__(self, name):
        return self._fetch(name)

    def __contains__(self, name):
        if dict.__contains__(self, name):
            return True
        try:
            self._fetch(name)
        except KeyError:
            return False
        return True

    def get(self, name, default=None):
        try:
            return self[name]
        except KeyError:
            return default


class _RemoteBackward:
    """Builds the torch.autograd.Function that sends a backward pass to the kernel."""
    fn = None

    @classmethod
    def get(cls):
        if cls.fn is None:
            import torch

            class RemoteBackward(torch.autograd.Function):
                @staticmethod
                def forward(ctx, link, graph, n_in, *tensors):
                    ctx.link, ctx.graph, ctx.n_in = link, graph, n_in
                    return tuple(t.detach().clone() for t in tensors[n_in:])

                @staticmethod
                def backward(ctx, *grads):
                    got = ctx.link.backward(ctx.graph, grads, ctx.n_in)
                    return (None, None, None, *got, *([None] * len(grads)))

            cls.fn = RemoteBackward
        return cls.fn


def _replace_tensors(value, mapping):
    """``value`` with each tensor found in ``mapping`` (by identity) replaced."""
    if id(value) in mapping:
        return mapping[id(value)]
    if isinstance(value, (list, tuple)):
        items = [_replace_tensors(v, mapping) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {k: _replace_tensors(v, mapping) for k, v in value.items()}
    return value


class KernelLink:
    """The harness's channel to the kernel: one request cell per lookup or call (not stored in
    the kernel's history), one reply read from the display message of type WIRE_MIME, bound to
    its request by a fresh nonce (protocol.KernelReply.of_request says when a reply counts)."""

    def __init__(self, client):
        self.client = client
        self.budget = None       # the current test's CPU time (autograder.engine.cputime.Budget)
        self.busy = False        # a request is running (it has its own time limit)
        self.expired = False     # the test's alarm rang while a request was running
        self.blocked = False     # a request ran but sent no reply: the notebook intercepted it
        self.touched = []        # evidence that code of the notebook answered a request itself
        self.module = KERNEL_MODULE   # the name of the kernel side's copy the requests go to
        self.cpu_root = None     # the pid of the kernel's launcher, for measured_call
        self.cpu_group = None    # the kernel's CpuGroup, where it has one: read instead of cpu_root's tree
        self.measure_dir = None  # (this side's folder, the kernel's view of it), for measured_call

    def request(self, req: KernelRequest, what: str, limit=None) -> KernelReply:
        """Send ``req`` to the kernel within the test's time; its reply. Raises StudentTimeout
        past the limit and RuntimeError when the request was not answered: no reply came (the
        channel was blocked), or the replies were not the kernel side's one reply to this
        request, bound by a nonce made here for it (then ``touched`` says why).
        ``limit``: (seconds, hint), a shorter limit for this request; past it the StudentTimeout
        carries the hint."""
        remaining = None if self.budget is None else self.budget.remaining()
        if remaining is not None and remaining <= 0:
            raise StudentTimeout(f"time ran out before {what}")
        own = None
        if limit is not None:
            seconds, hint = float(limit[0]), str(limit[1])
            if remaining is None or seconds < remaining:
                remaining, own = seconds, (seconds, hint)
        nonce = secrets.token_hex(16)
        req = dataclasses.replace(req, nonce=nonce)
        text, sent = req.to_json(), None
        if self.measure_dir is not None and len(text) > BIG_REQUEST:
            # a large request (tensors of a long sequence) goes as a file: the kernel takes about
            # 1.3 s to read a cell of 8 MB of text, and a file of the same size in milliseconds
            here, there = self.measure_dir
            sent = Path(here) / f"{secrets.token_hex(8)}.json"
            sent.write_text(text, encoding="utf-8")
            sent.chmod(0o644)      # the kernel's user reads it, whatever this process's umask
            code = (f"__import__('sys').modules[{self.module!r}]"
                    f".kernel_request_file({f'{there}/{sent.name}'!r})")
        else:
            code = f"__import__('sys').modules[{self.module!r}].kernel_request({text!r})"
        self.busy = True
        try:
            replies, timed_out, error = self.client.run_request(code, remaining)
        finally:
            self.busy = False
            if sent is not None:
                sent.unlink(missing_ok=True)
        if timed_out and own is not None:
            raise StudentTimeout(f"{what} did not finish within the {own[0]:g} s this test allows it",
                                 hint=own[1])
        if timed_out or self.expired:
            raise StudentTimeout(f"{what} did not finish within the time limit")
        reply, evidence = KernelReply.of_request(replies, nonce, ended_cleanly=not error)
        if evidence:
            self.blocked = True
            self.touched += [e for e in evidence if e not in self.touched]
            raise RuntimeError(f"the grader could not read {what} from the notebook's kernel: it "
                               f"was not answered (the grader's channel was touched: "
                               f"{'; '.join(evidence)})")
        if reply is None:   # no reply, or not one the kernel side writes
            self.blocked = True
            raise RuntimeError(f"the grader could not read {what} from the notebook's kernel: it "
                               "was not answered" + (f" ({error})" if error else "") + ": was the "
                               f"grader's channel (sys.modules[{KERNEL_MODULE!r}]) removed or "
                               "replaced by a cell?")
        return reply

    def measured_call(self, fn, args: tuple, kwargs: dict, expected):
        """Call ``fn`` measured: the CPU seconds the call took, as the operating system counts them
        for the kernel's process tree (autograder.engine.cputime, read here; ``cpu_root``: the pid
        of the kernel's launcher), for :func:`mlexp.rules.work_grows`.

        The tensor arguments reach the kernel as files (``measure_dir``: (this side's folder, the
        kernel's view of it)) rather than as text, and only a checksum of the result comes back
        (:func:`autograder.engine.kernel.measure.checksum`, under weights from a seed drawn
        here), so the time is the function's work. The result must be ``expected`` (the test's
        reference result for these arguments) to rounding, or the call fails with a hint: what
        is measured is the same computation as what is graded. Returns (CPU seconds, bytes the
        kernel's processes added to their peak resident memory, read from /proc, or None where it
        cannot be reset: :func:`mlexp.rules_measure.peak_reset`), and the CPU seconds of the
        kernel's checksum, timed as this side computes the same one on this thread. work_grows
        takes the least checksum off the least call, so the time compares with a reference timed
        in this process; taken off call by call, one slow checksum reading made an honest form's
        growth read x9 in CI."""
        import torch
        if self.cpu_root is None or self.measure_dir is None:
            raise RuntimeError("the grader cannot measure this kernel's CPU time")
        here, there = self.measure_dir
        items = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.dtype in (torch.float32, torch.float64) and a.numel():
                name = f"{secrets.token_hex(8)}-{i}.bin"
                a.detach().contiguous().numpy().tofile(Path(here) / name)
                items.append({"file": f"{there}/{name}", "dtype": str(a.dtype).removeprefix("torch."),
                              "shape": list(a.shape)})
            else:
                try:
                    items.append({"node": encode(a)})
                except WireError as exc:
                    raise TypeError(f"the test passed {fn.__name__} something that cannot be sent to the "
                                    f"notebook ({exc}); this is a fault of the test") from None
        seed = secrets.randbelow(2**31)
        req = KernelRequest.measure(fn._ref, items, encode(dict(kwargs)), seed)
        clock = self.cpu_group.ns if self.cpu_group is not None else lambda: tree_cpu_ns(self.cpu_root)
        try:
            starts = {pid: peak_reset(pid) for pid in children(self.cpu_root)}   # each process's resident kB
            before = clock()
            reply = self.request(req, f"the measured call of {fn.__name__}")
            used = (clock() - before) / 1e9
            peak = (sum(peak_growth(starts.get(pid, 0), pid) or 0 for pid in children(self.cpu_root))
                    if None not in starts.values() else None)
            hidden = [] if self.cpu_group is not None else ignores_children(self.cpu_root)
        finally:
            for f in Path(here).iterdir():
                f.unlink()
        if reply.error is not None:
            raise reply.raised()
        if hidden or used <= 0:   # the process tree's count missed work (CpuGroup's docstring)
            raise AssertionError(f"Hint: the test could not count the CPU time of {fn.__name__}'s measured call: "
                                 + ("a process of your kernel ignores SIGCHLD, so the work of a child process "
                                    "that ends is counted nowhere" if hidden else "a process ended during the call "
                                    "and its time left the count") + ". Compute the result in the function itself.")
        got = self._decode(reply.value, f"the measured call of {fn.__name__}")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:    # the kernel's own part of the call, timed here as the kernel ran it: taken off by
            start = time.thread_time()     # work_grows; this thread only (the grader's other threads,
            want = measure.checksum(expected, seed)    # its budget's watch, are not the checksum)
            checking = time.thread_time() - start
        finally:
            torch.set_num_threads(threads)
        scale = measure.checksum(expected.abs(), seed) if isinstance(expected, torch.Tensor) else 0.0
        if not isinstance(got, float) or not abs(got - want) <= 1e-3 * scale + 1e-6:
            shape = tuple(args[0].shape) if args and isinstance(args[0], torch.Tensor) else ()
            raise AssertionError(f"Hint: while the test measured its work at inputs of shape {shape}, "
                                 f"{fn.__name__} returned other values than the reference: it must give the "
                                 "right output at every length, the long ones too.")
        return used, peak, checking

    def install(self, module: str = KERNEL_MODULE) -> None:
        """Put the kernel side (:mod:`autograder.engine.kernel.wire`'s codec and :mod:`autograder.engine.kernel.kernel_server`)
        into the kernel, before any student cell.

        The student library ``mlexp`` carries nothing of the grader, so the module's source is
        sent as one request cell (no file of the grader is mounted into the sandbox) and kept
        as ``sys.modules[KERNEL_MODULE]``. It is the untrusted side's copy: a student cell may
        replace it, which can only change what the student's own names look like, and a request
        it then fails to answer is reported as blocked."""
        source = "\n".join(Path(m.__file__).read_text(encoding="utf-8") for m in KERNEL_SOURCES)
        setup = ", m.kernel_safe_messages()" if module == KERNEL_MODULE else ""   # once per kernel
        code = (f"(lambda m: (__import__('builtins').exec(__import__('builtins').compile("
                f"{source!r}, '<autograder.engine.kernel.wire>', 'exec'), m.__dict__), "
                f"__import__('sys').modules.__setitem__(m.__name__, m){setup}))"
                f"(__import__('types').ModuleType({module!r}));")
        _reply, timed_out, error = self.client.run_request(code, RECOVER_S)
        if timed_out or error:
            self.blocked = True
            raise RuntimeError("the grader could not set up its channel in the notebook's kernel"
                               + (f" ({error})" if error else " (timed out)"))
        self.module = module

    def lookup(self, name: str):
        """The student's global ``name`` as data or a proxy; KeyError when it has none (or it
        is a module)."""
        reply = self.request(KernelRequest.lookup(name), f"`{name}`")
        if reply.missing or reply.is_module:
            raise KeyError(name)
        if reply.error is not None:
            raise RuntimeError(f"the grader could not read `{name}`: {reply.error.get('message', '')}")
        return self._decode(reply.value, f"`{name}`")

    def _decode(self, node, where, leaves=None):
        try:
            value = decode(node, leaves=leaves, ref_factory=lambda i, t, n: StudentFunction(self, i, t, n))
        except WireError as exc:
            raise TypeError(f"{where} could not be read from the notebook: {exc}") from None
        if isinstance(value, Opaque):
            value._where = where
        return value

    def call(self, fn: StudentFunction, args: tuple, kwargs: dict, watch=None, limit=None):
        """Call ``fn`` in the kernel. ``watch`` (a list of module names): run it under
        mlexp.rules.watching there and return (value, trace data) instead of the value.
        ``limit``: (seconds, hint) for this call, see :meth:`request`."""
        import torch
        grad_leaves = [] if torch.is_grad_enabled() else None
        try:
            args_node = encode(tuple(args), grad_leaves=grad_leaves)
            kwargs_node = encode(dict(kwargs), grad_leaves=grad_leaves)
        except WireError as exc:
            raise TypeError(f"the test passed {fn.__name__} something that cannot be sent to the "
                            f"notebook ({exc}); this is a fault of the test") from None
        grad = bool(grad_leaves)
        req = KernelRequest.call(fn._ref, args_node, kwargs_node, grad, watch)
        reply = self.request(req, f"the call of {fn.__name__}", limit)
        if reply.error is not None:
            raise reply.raised()
        out_leaves = {}
        value = self._decode(reply.value, f"the value returned by {fn.__name__}",
                             leaves=out_leaves if grad else None)
        self._refuse_in_place(fn, args, kwargs, reply)
        if grad and reply.graph and out_leaves:
            outputs = [out_leaves[i].detach() for i in sorted(out_leaves)]
            linked = _RemoteBackward.get().apply(self, reply.graph, len(grad_leaves),
                                                 *grad_leaves, *outputs)
            value = _replace_tensors(value, {id(out_leaves[i]): t
                                             for i, t in zip(sorted(out_leaves), linked)})
        if watch is not None:
            trace = reply.watch
            return value, (trace if isinstance(trace, dict) else None)
        return value

    def _refuse_in_place(self, fn, args, kwargs, reply):
        """Fail the call when the student function changed a tensor argument in place.

        The arguments the kernel received are its own copies; what it did to them never flows
        back into the test's tensors (a test that computes its expected value after the call
        must see the inputs it made). Changing an argument is the exercise's mistake, not a
        value the test can use, so the call raises AssertionError with a hint naming the
        parameter. Raises nothing when no tensor argument changed.
        """
        import torch
        try:
            new_args = decode(reply.args)
            new_kwargs = decode(reply.kwargs)
        except WireError:
            return
        names = reply.names
        names = [n if isinstance(n, str) and n.isidentifier() else "" for n in names]
        pairs = [(names[i] if i < len(names) and names[i] else f"argument {i + 1}", old, new)
                 for i, (old, new) in enumerate(zip(args, new_args or []))]
        pairs += [(str(k) if str(k).isidentifier() else "an argument", kwargs.get(k), v)
                  for k, v in (new_kwargs or {}).items()]
        for name, old, new in pairs:
            if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and (
                    old.shape != new.shape or old.dtype != new.dtype or not torch.equal(old, new)):
                raise AssertionError(f"Hint: {fn.__name__} changed {name} in place. Return a new "
                                     "tensor and leave the arguments as they were given.")

    def backward(self, graph, grads, n_in):
        """Send the gradients of call ``graph``'s outputs; the ``n_in`` input gradients."""
        reply = self.request(KernelRequest.backward(graph, encode(list(grads))),
                             "the backward pass through the notebook's function")
        if reply.error is not None:
            raise reply.raised()
        got = self._decode(reply.value, "the gradients")
        if not isinstance(got, list) or len(got) != n_in:
            return [None] * n_in
        return got
