"""The rules an exercise states ("write it yourself", "without a Python loop"), checked by behaviour.

A lesson's exercise may say what the answer must not use: a library entry point that computes the answer
(``mlexp.ops.linear_attention`` with any ``impl``, ``mlexp.kvcache``, ...), or a Python loop over the sequence.
The test cell checks it by watching what the student's function does while it runs, where it runs, never by
reading its source:

- :func:`watching` records every Python function entered from a watched module (a ``sys`` profile hook, so an
  alias such as ``from mlexp.ops import linear_attention as f`` is caught too); counts the torch operations run
  and notes the largest tensor one of them took or returned (a :class:`torch.overrides.TorchFunctionMode`);
  counts the lines of the notebook's own Python run (a ``sys`` trace hook, so a Python loop is seen even where
  it runs numpy or no torch at all); and notes what would take the work out of its sight (see
  :attr:`Trace.escaped`: torch's function handling switched off, another thread or process);
- :func:`call` runs a function under :func:`watching` and returns ``(result, Trace)``. For a grader's proxy of a
  student function (it has ``_watched_call``, see autograder.engine.harness) the watching happens in the
  student's kernel, where the function runs, and the trace comes back as data; in the student's own notebook
  (the self-check) it happens here;
- :func:`write_it_yourself`, :func:`no_loop` and :func:`bounded` turn a broken rule into the test's
  ``AssertionError("Hint: this exercise asks you to write it yourself ...")``.

In grading the watch should decide no point (it runs in the student's process, which could tell it anything): for
a grader's proxy, each finding but a call into a forbidden module is then kept as a hint (:func:`watch_as_hints`),
and a test fails on what the grader computed or measured itself (the results, :func:`work_grows`'s CPU time and
memory, :func:`in_time`, the source); the student's own check fails at the finding, as it always did. That is
built and switched off (:data:`WATCH_DECIDES`) until its cost is met.

The trace only says which watched functions ran, how many operations and lines ran, how many elements the
largest tensor held and what escaped the watch; it never reports values, so it can be shown to a student as it
is.

What the watch cannot see. It runs in the student's own process, so it is evidence, not proof: the tamper report
(autograder.engine.kernel.kernel_server) catches code that replaces the watcher itself. Torch's function
handling switched off is seen at each line and at each C function the notebook's code calls, and a tensor's
numbers taken into numpy or a list at the call that takes them (refused by the rules that count or measure).
Code that torch itself runs inside an operation (a backward hook, ``Tensor.apply_``'s function) runs with the
mode popped: its lines count, its operations do not. Not seen: a loop that runs inside C code
(``functools.reduce``, ``itertools``, or ``[*iterator]``, which calls nothing) with torch's function handling
switched off by C code too (``torch._C._disabled_torch_function_impl``); a frame that stops its own line tracing
(``sys._getframe().f_trace = None``) and still runs one torch operation the watch sees; work handed to another
thread or process through a library that the watch does not know; and, for :func:`bounded`, a large tensor built
in pieces that are each within the bound (the bound is on each tensor, not on the total; :func:`summed_work`
bounds the total that the products, sums and scans return). Where a rule can be checked by its physical
consequence instead (a chunkwise form must run at a length whose T x T matrix fits in no memory), the lesson's
test does that as well.
"""
from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time
from dataclasses import dataclass, field

# What the watch tells apart (whose code a frame runs, how large a tensor is, what takes work out
# of its sight): mlexp/rules_sight.py. Imported into this module, whose names the grader's tamper
# report watches, and called from here.
from .rules_measure import work_grows  # noqa: E402  (measured from outside the kernel in grading)
from .rules_sight import (_HANDOFF_BUILTINS, _elements, _entry_name, _Forbidden, _handoffs, _may_work, _on_stack,
                          _Sources, _starters, _thread_clocks, _total)

__all__ = ["Trace", "watching", "call", "write_it_yourself", "in_time", "no_loop", "bounded", "summed_work",
           "work_grows", "uses_argument", "watch_as_hints", "digest", "RULE_HINT"]

RULE_HINT = "this exercise asks you to write it yourself"
MAX_USED = 8
# Whether the watch's findings fail a graded test (issue 51, item 7: they should not, :func:`_watch_says`). Still
# True: with the findings kept as hints, a wrong chunkwise answer (a T x T product, a state per token) runs on
# through every costly measure of lesson 03's test cell, 20-80 s of grading each instead of 1-3, and may reach
# the cell's time limit; the measures that would decide instead must first be made cheap.
WATCH_DECIDES = True
IDLE_CPU_S = 0.0002     # CPU seconds another thread may use during a watched call (a pool's idle wake-ups)
# Operations that sum over an axis (products, reductions, scans): what they return is counted in Trace.summed.
SUMMING = frozenset({"matmul", "__matmul__", "__rmatmul__", "__imatmul__", "mm", "bmm", "mv", "dot", "vdot", "inner",
                     "einsum", "tensordot", "addmm", "addbmm", "baddbmm", "addmv", "vecdot", "sum", "nansum", "mean",
                     "cumsum", "cumsum_", "cumprod", "cumprod_", "logcumsumexp", "cummax", "cummin"})


@dataclass
class Trace:
    """What one watched call did.

    - ``used``: the watched entry points it entered (``"module.function"``, with ``impl=...``
      when the function has that argument);
    - ``ops``: torch operations as the code called them (``torch.matmul``, ``@``, ``x.tril()``);
    - ``largest``: the most elements (``numel``) of one tensor an operation took or returned (a
      view counts as its own shape);
    - ``lines``: lines of Python run in the notebook's own code (not in a library's);
    - ``escaped``: what took part of the call out of the watch's sight, in words ("started a
      thread", "switched off torch's function handling", ...); empty for plain code;
    - ``exported``: the calls that took a tensor's numbers out of torch (``"Tensor.numpy"``,
      ``"Tensor.tolist"``): harmless where only the library's use is checked, but work done on
      those numbers is beyond the counts and sizes, so :func:`no_loop` and :func:`bounded` refuse it;
    - ``summed``: the elements, all together, of what the operations that sum over an axis returned
      (matrix products, einsum, ``sum``, ``cumsum``: :data:`SUMMING`), the work :func:`summed_work` bounds.
    """
    used: list = field(default_factory=list)
    ops: int = 0
    largest: int = 0
    lines: int = 0
    escaped: list = field(default_factory=list)
    exported: list = field(default_factory=list)
    summed: int = 0

    def as_dict(self) -> dict:
        return {"used": list(self.used)[:MAX_USED], "ops": int(self.ops), "largest": int(self.largest),
                "lines": int(self.lines),
                "escaped": [str(e)[:120] for e in self.escaped[:MAX_USED]],
                "exported": [str(e)[:120] for e in self.exported[:MAX_USED]], "summed": int(self.summed)}

    @classmethod
    def from_dict(cls, data) -> "Trace":
        if not isinstance(data, dict):
            raise ValueError("no trace")

        def count(key):
            return data.get(key) if type(data.get(key)) is int else 0

        def names(key):
            items = data.get(key) if isinstance(data.get(key), list) else []
            return [str(u)[:120] for u in items[:MAX_USED]]
        return cls(names("used"), count("ops"), count("largest"), count("lines"), names("escaped"), names("exported"),
                   count("summed"))

    def _escape(self, what: str) -> None:
        if what not in self.escaped and len(self.escaped) < MAX_USED:
            self.escaped.append(what)


# The watches running now, as (thread, trace). A process-wide audit hook (added once, when this
# module is imported; Python has no way to remove one) reports into them what the watched thread
# does that the watch cannot otherwise see: its trace or profile hook replaced.
_ACTIVE: list = []
_ESCAPES = {"sys.settrace": "replaced the interpreter's trace hook",
            "sys.setprofile": "replaced the interpreter's profile hook"}


def _audit(event, _args):
    if not _ACTIVE or event not in _ESCAPES:
        return
    if sys._getframe(1).f_code.co_filename == __file__:
        return                                         # the watch setting or restoring its own hooks
    me = threading.get_ident()
    for thread, trace in list(_ACTIVE):
        if thread == me:
            trace._escape(_ESCAPES[event])


sys.addaudithook(_audit)




@contextlib.contextmanager
def watching(forbid=()):
    """Watch the code run inside the block; yields the :class:`Trace` it fills.

    ``forbid``: module names (``"mlexp.ops"``, ``"mlexp.kvcache"``); a function of such a module
    (or of a module inside it) entered from code outside them is recorded as used. Runs in the
    calling thread; a thread or process started inside the block, the notebook's code running
    in another thread meanwhile, or the block replacing the trace or profile hook is recorded
    in ``escaped``.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    forbid = tuple(str(m) for m in forbid)
    trace = Trace()
    sources, starters, handoffs, forbidden = _Sources(), _starters(), _handoffs(), _Forbidden(forbid)
    thread_start = threading.Thread.start.__code__

    exports = {torch.Tensor.numpy: "Tensor.numpy", torch.Tensor.__array__: "Tensor.__array__ (numpy)",
               torch.Tensor.tolist: "Tensor.tolist", torch.Tensor.__dlpack__: "Tensor.__dlpack__"}
    inside = [0]      # > 0 while this mode's handler runs an operation: torch pops the mode for that time

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            trace.ops += 1
            if func in exports and exports[func] not in trace.exported:   # numbers the counts cannot follow
                trace.exported.append(exports[func])
            inside[0] += 1
            try:
                result = func(*args, **(kwargs or {}))
            finally:
                inside[0] -= 1
            trace.largest = max(trace.largest, _elements(result), _elements(args))
            if getattr(func, "__name__", "") in SUMMING:
                trace.summed += _total(result)
            return result

    def handling_off() -> bool:
        """Torch's function handling switched off by the notebook: inside this mode's own handler
        the mode is popped by torch (code run there, such as a namedtuple's generated __new__
        when a tensor is printed, is not switching anything off) but handling stays enabled."""
        if inside[0]:
            return not torch._C._is_torch_function_enabled()
        return not (modes_on() and _on_stack(count))

    def profile(frame, event, arg):
        if event == "c_call":
            if sources.own(frame.f_code.co_filename) and handling_off():
                trace._escape("switched off torch's function handling")   # also inside one line, which has no line event
            try:
                started = starters.get(arg)
            except TypeError:
                started = None
            if started and (started != "started a thread" or sources.own(frame.f_code.co_filename)):
                trace._escape(started)                 # a thread: when the notebook's code starts it itself
            elif getattr(arg, "__qualname__", "") in _HANDOFF_BUILTINS and sources.own(frame.f_code.co_filename):
                trace._escape("handed work to another thread or process")
            return
        if event == "call" and frame.f_code in handoffs and frame.f_back is not None \
                and sources.own(frame.f_back.f_code.co_filename):
            trace._escape(handoffs[frame.f_code])          # called by the notebook's code, not a library's
        if event == "call" and frame.f_code is thread_start and _may_work(frame.f_locals.get("self"), sources):
            trace._escape("started a thread")              # one that runs the notebook's code or a pool's work
        if event != "call" or not forbid or len(trace.used) >= MAX_USED:
            return
        root = forbidden(frame)
        if not root:
            return
        caller = frame.f_back
        if caller is not None and forbidden(caller):
            return                                     # inside the library: its entry point is recorded
        name = frame.f_code.co_name
        if name.startswith("__") and name.endswith("__"):
            return                                     # a library class's constructor or dunder: not an entry point
        name = _entry_name(frame, root)
        if name not in trace.used:
            trace.used.append(name)

    def line(frame, event, _arg):
        if event == "line":
            trace.lines += 1
            if handling_off():                          # the notebook's code never runs inside the mode
                trace._escape("switched off torch's function handling")
        return line

    def tracer(frame, event, _arg):
        if event == "call" and sources.own(frame.f_code.co_filename):
            return line
        return None

    count, modes_on = Count(), torch._C._is_torch_function_mode_enabled
    old_profile, old_trace = sys.getprofile(), sys.gettrace()
    clocks = _thread_clocks(sources)
    sys.setprofile(profile)
    sys.settrace(tracer)
    _ACTIVE.append(watch := (threading.get_ident(), trace))
    try:
        with count:
            yield trace
    finally:
        after = _thread_clocks(sources)
        if any(after.get(ident, spent) - spent > IDLE_CPU_S for ident, spent in clocks.items()):
            trace._escape("ran work in another thread")
        _ACTIVE.remove(watch)
        if sys.gettrace() is not tracer:
            trace._escape("replaced the interpreter's trace hook")
        if sys.getprofile() is not profile:
            trace._escape("replaced the interpreter's profile hook")
        sys.settrace(old_trace)
        try:
            sys.setprofile(old_profile)
        except TypeError:                              # a C profiler (cProfile): Python cannot put it back
            sys.setprofile(None)


def call(fn, *args, forbid=(), **kwargs):
    """``fn(*args, **kwargs)`` under :func:`watching`: returns ``(result, Trace)``.

    A grader's proxy of a student function is watched where the function runs (its
    ``_watched_call``); any other callable is watched here. A tensor result that is none of the
    arguments, made with no torch operation the watch saw (TorchScript, torch's function
    handling switched off), is recorded in ``escaped``.
    """
    return _call(fn, args, kwargs, forbid)


def _call(fn, args, kwargs, forbid, limit=None):
    """:func:`call`; ``limit`` (seconds, hint) is passed to a grader's proxy, which stops the call
    on its own clock (see :func:`in_time`)."""
    remote = getattr(fn, "_watched_call", None)
    if callable(remote):
        result, data = remote(args, kwargs, list(forbid), **({"limit": limit} if limit else {}))
        try:
            trace = Trace.from_dict(data)
        except ValueError:
            raise AssertionError(f"Hint: the grader could not watch {_name(fn)} run (the "
                                 "notebook's kernel sent no trace): restart the kernel and run "
                                 "the notebook from the top.") from None
    else:
        with watching(forbid) as trace:
            result = fn(*args, **kwargs)
    if trace.ops == 0 and _fresh_tensor(result, (*args, *kwargs.values())):
        trace._escape("made its result with no torch operation the test could see")
    return result, trace


# What the watch found while a test cell ran in grading (see :func:`watch_as_hints`); None elsewhere.
_WATCH_HINTS: contextvars.ContextVar = contextvars.ContextVar("mlexp_rules_watch_hints", default=None)


def _watch_says(fn, hint: str) -> None:
    """The watch found a broken rule, with ``hint``. In the student's own check (``fn`` a plain function) the
    test fails with it. For a grader's proxy of a student function the watch ran inside the student's process,
    which could have told it anything, so it decides no point: the hint is kept (:func:`watch_as_hints`) and names
    the slip only if the test fails on what the grader measured itself (the results, the CPU time and memory the
    operating system counted, the source). While :data:`WATCH_DECIDES` is set, the test fails with it there too."""
    if WATCH_DECIDES or not callable(getattr(fn, "_watched_call", None)):
        raise AssertionError(hint)
    kept = _WATCH_HINTS.get()
    if kept is not None and hint not in kept:
        kept.append(hint)


@contextlib.contextmanager
def watch_as_hints():
    """Run a graded test cell with the watch's findings kept as hints (:func:`_watch_says`); yields the list they
    go to, in the order found. The grader (autograder.engine.testcell) gives a failed test the first of them as its
    message, the hint the student's own check gives for the same slip."""
    token = _WATCH_HINTS.set([])
    try:
        yield _WATCH_HINTS.get()
    finally:
        _WATCH_HINTS.reset(token)


def uses_argument(fn, one, other, *, name: str, forbid=(), instead: str = ""):
    """``fn(*one)`` and ``fn(*other)``, two calls that differ only in the argument ``name``, watched: fails with the
    hint "``name`` is not used" and ``instead`` (through :func:`_watch_says`) when both ran the same torch operations
    and lines with tensors of the same sizes, the sign that ``name`` is ignored. Returns the two results. In grading
    the same rule is read from the source (autograder.engine.audit: a function that never reads its argument
    ``name`` fails with the same words); the watch only names the slip."""
    first, a = call(fn, *one, forbid=forbid)
    second, b = call(fn, *other, forbid=forbid)
    if (a.ops, a.lines, a.largest) == (b.ops, b.lines, b.largest):
        _watch_says(fn, f"Hint: {name} is not used: {_name(fn)} ran the same torch operations and lines, with tensors "
                        f"of the same sizes, whatever {name} was. " + (instead or f"Use {name}") + ".")
    return first, second


def _fresh_tensor(result, args) -> bool:
    import torch
    if not isinstance(result, torch.Tensor):
        return False
    return not any(isinstance(a, torch.Tensor) and a.shape == result.shape and a.dtype == result.dtype
                   and torch.equal(a, result) for a in args)


def _name(fn) -> str:
    return getattr(fn, "__name__", "the function")


def write_it_yourself(fn, *args, forbid, instead: str = "", **kwargs):
    """``fn(*args, **kwargs)``; fails with the rule's hint when it entered a function of one of
    the ``forbid`` modules. ``instead``: what the exercise asks for, for the hint."""
    result, trace = call(fn, *args, forbid=forbid, **kwargs)
    _refuse(fn, trace, forbid, instead)
    return result


def in_time(fn, *args, seconds: float, too_slow: str, forbid, instead: str = "", **kwargs):
    """:func:`write_it_yourself` within ``seconds``: the rule by its physical consequence, a length
    at which a form whose work grows faster than the exercise allows cannot finish in time.

    ``seconds`` are CPU seconds, never the wall clock, so a busy machine changes nothing. For a
    grader's proxy of a student function the grader keeps them, outside the student's process, from
    the operating system's count for the kernel (autograder.engine.calls: the call is stopped once
    it has used ``seconds`` and the test fails with the hint), so nothing the notebook does changes
    the verdict; elsewhere (the student's own check) the call's ``time.process_time()`` is read
    here and it fails afterwards. ``too_slow``: what running out of time means in the exercise's
    terms, for the hint. Returns the result."""
    hint = (f"Hint: {RULE_HINT} with work that grows the way it asks: {_name(fn)} did not finish within {seconds:g} s "
            f"of CPU time. {too_slow}")
    start = time.process_time()
    result, trace = _call(fn, args, kwargs, forbid, limit=(seconds, hint))
    used = time.process_time() - start
    _refuse(fn, trace, forbid, instead)
    if not callable(getattr(fn, "_watched_call", None)) and used > seconds:
        raise AssertionError(hint.replace("did not finish within", f"took {used:.1f} s, more than the"))
    return result


def _refuse(fn, trace, forbid, instead, measured=False):
    """``measured``: the rule is judged on the counts or sizes, which work on numbers taken out of
    torch escapes (``Trace.exported``). What took work out of the watch's sight is the watch's finding
    (:func:`_watch_says`); a call into a forbidden module fails the test wherever it is seen (in grading
    the call runs in a room where that module does not exist, autograder.engine.room, so it is seen
    only in the student's own check and the grader's dry run)."""
    if measured and trace.exported:
        _watch_says(fn, f"Hint: the test could not measure the work of {_name(fn)}: it took a tensor's numbers out "
                        f"of torch ({', '.join(trace.exported[:2])}), and the rule is checked by counting torch "
                        "operations and the sizes of the tensors they make. Do the work with torch operations "
                        "(printing a tensor, its shape or x.item() is fine).")
    if trace.escaped:
        _watch_says(fn, f"Hint: the test could not watch {_name(fn)} run: it {' and '.join(trace.escaped[:2])}. "
                        "The exercise's rule is checked by watching the function do its work here, in the "
                        "calling thread: write it as plain code that computes its result itself.")
    if trace.used:
        raise AssertionError(f"Hint: {RULE_HINT}: {_name(fn)} called {', '.join(trace.used[:3])}. "
                             + (instead or f"Write it without {', '.join(forbid)}") + "; the library "
                             "is only the reference the test checks against.")


def no_loop(fn, make_args, *, over: str = "t", lengths=(8, 32), forbid=(), instead: str = ""):
    """Fail with the rule's hint when ``fn`` does more steps for a longer sequence: the sign of a
    Python loop over ``over`` (a vectorised form runs the same operations at any length).
    ``make_args(T)``: the arguments for length T. ``forbid`` is checked on each call as by
    :func:`write_it_yourself`. Returns the results, one per length.

    Two counts are compared between the shortest and the longest length: torch operations (any
    growth fails) and lines of the notebook's Python run (a growth of at least half the extra
    tokens fails: a loop over them runs one or more per token)."""
    results, traces = [], []
    for T in lengths:
        result, trace = call(fn, *make_args(T), forbid=forbid)
        _refuse(fn, trace, forbid, "", measured=True)
        results.append(result)
        traces.append(trace)
    first, last = traces[0], traces[-1]
    extra = max(1, (lengths[-1] - lengths[0]) // 2)
    if last.ops > first.ops or last.lines - first.lines >= extra:
        grew = "torch operations" if last.ops > first.ops else "lines of Python"
        _watch_says(fn, f"Hint: {RULE_HINT} without a Python loop over {over}: {_name(fn)} runs "
                             f"more {grew} the longer the sequence (a loop over {over}). "
                             + (instead or "Use whole-tensor operations over the sequence") + ".")
    return results


def bounded(fn, *args, limit: int, bound: str, forbid=(), instead: str = "", **kwargs):
    """``fn(*args, **kwargs)``; fails with the rule's hint when a torch operation inside it took
    or returned a tensor of more than ``limit`` elements (:attr:`Trace.largest`): the sign that the work is not bounded the
    way the exercise asks (a whole T x T score matrix where chunks of C tokens were asked for).

    Only the sizes are measured, never the values, so an exact answer that computes too much is
    told apart from one that computes what was asked. ``bound``: the limit in the exercise's
    terms, for the hint ("8 x B x H x T x max(C, D) numbers"); ``forbid`` is checked as by
    :func:`write_it_yourself`. Returns the result."""
    result, trace = call(fn, *args, forbid=forbid, **kwargs)
    _refuse(fn, trace, forbid, "", measured=True)
    if trace.largest > limit:
        _watch_says(fn, f"Hint: {RULE_HINT} with no tensor larger than {bound}: {_name(fn)} made "
                             f"one of {trace.largest:,} numbers, more than the {limit:,} that allows. "
                             + (instead or "Keep every tensor within that bound") + ".")
    return result


def summed_work(fn, make_args, *, lengths, limit, grows: str, over: str, forbid=(), instead: str = ""):
    """Fail with the rule's hint when the work of ``fn`` that sums over an axis (:attr:`Trace.summed`)
    grows faster than the sequence, or exceeds ``limit`` at the longest length.

    ``make_args(T)``: the arguments for length T; ``lengths``: two lengths, the second a multiple
    of the first. Growth beyond 1.5 times the ratio of the lengths (a linear form with a fixed
    overhead grows at most by the ratio) fails with ``grows``, what such growth means in the
    exercise's terms; more than ``limit`` at the longer length fails with ``over``. Only sizes are
    measured, never values. Returns the result at the longer length."""
    counts, result = [], None
    for T in lengths:
        result, trace = call(fn, *make_args(T), forbid=forbid)
        _refuse(fn, trace, forbid, "", measured=True)
        counts.append(trace.summed)
    short, long = counts[0], counts[-1]
    ratio = lengths[-1] / lengths[0]
    if short and long > 1.5 * ratio * short:
        _watch_says(fn, f"Hint: {RULE_HINT} with work that grows like the sequence: from T = {lengths[0]} to "
                             f"T = {lengths[-1]} the elements your products and sums return grew {long / short:.1f}x "
                             f"({short:,} to {long:,}), not about {ratio:g}x. {grows}.")
    if long > limit:
        _watch_says(fn, f"Hint: {RULE_HINT} with no more work than the chunkwise form: at T = {lengths[-1]} "
                             f"{_name(fn)}'s products, sums and scans returned {long:,} numbers in all, more than "
                             f"the {limit:,} allowed. {over}.")
    return result


def digest(value, salt: str, rounds: int = 100_000) -> str:
    """A one-way mark of an answer, so that a visible test can recognise the right answer and the
    typical wrong ones without holding them: numbers to 6 significant digits (ints and floats
    alike), lists and tuples item by item. Slow on purpose (PBKDF2), so a table of guesses costs
    time. Anything else (a string, None) gets a mark of its type, which matches no number's."""
    import hashlib
    return hashlib.pbkdf2_hmac("sha256", _canonical(value).encode(), salt.encode(), rounds).hex()[:24]


def _canonical(value) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_canonical(v) for v in value) + "]"
    try:
        if isinstance(value, (str, bytes, bool)) or value is None:
            raise TypeError
        return f"{float(value) + 0.0:.6g}"
    except (TypeError, ValueError, OverflowError):
        return f"<{type(value).__name__}>"
