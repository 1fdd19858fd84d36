"""The rules an exercise states ("write it yourself", "without a Python loop"), checked by behaviour.

A lesson's exercise may say what the answer must not use: a library entry point that computes the
answer (``mlexp.ops.linear_attention`` with any ``impl``, ``mlexp.kvcache``, ...), or a Python
loop over the sequence. The test cell checks it by watching what the student's function does
while it runs, where it runs, never by reading its source:

- :func:`watching` records every Python function entered from a watched module (a ``sys``
  profile hook, so an alias such as ``from mlexp.ops import linear_attention as f`` is caught
  too), counts the torch operations run and notes the largest tensor one of them returned (a
  :class:`torch.overrides.TorchFunctionMode`);
- :func:`call` runs a function under :func:`watching` and returns ``(result, Trace)``. For a
  grader's proxy of a student function (it has ``_watched_call``, see autograder.harness) the
  watching happens in the student's kernel, where the function runs, and the trace comes back as
  data; in the student's own notebook (the self-check) it happens here;
- :func:`write_it_yourself`, :func:`no_loop` and :func:`bounded` turn a broken rule into the
  test's ``AssertionError("Hint: this exercise asks you to write it yourself ...")``.

The trace only says which watched functions ran, how many torch operations and how many elements
the largest tensor they returned holds; it never reports values, so it can be shown to a student
as it is.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field

__all__ = ["Trace", "watching", "call", "write_it_yourself", "no_loop", "bounded", "digest", "RULE_HINT"]

RULE_HINT = "this exercise asks you to write it yourself"
MAX_USED = 8


@dataclass
class Trace:
    """What one watched call did: the watched entry points it entered (``"module.function"``,
    with ``impl=...`` when the function has that argument), the number of torch operations, and
    ``largest``, the most elements (``numel``) of one tensor that a torch operation returned (a
    view counts as its own shape; the call's arguments count only if an operation returns them)."""
    used: list = field(default_factory=list)
    ops: int = 0
    largest: int = 0

    def as_dict(self) -> dict:
        return {"used": list(self.used)[:MAX_USED], "ops": int(self.ops), "largest": int(self.largest)}

    @classmethod
    def from_dict(cls, data) -> "Trace":
        if not isinstance(data, dict):
            raise ValueError("no trace")
        used = data.get("used") if isinstance(data.get("used"), list) else []
        ops = data.get("ops") if type(data.get("ops")) is int else 0
        largest = data.get("largest") if type(data.get("largest")) is int else 0
        return cls([str(u)[:120] for u in used[:MAX_USED]], ops, largest)


def _watched(module: str, forbid) -> bool:
    return any(module == m or module.startswith(m + ".") for m in forbid)


def _elements(value, depth: int = 2) -> int:
    """The most elements of one tensor in ``value``: a tensor, or a tuple or list of them (as
    ``torch.split`` and ``torch.linalg.eigh`` return), two levels deep; 0 for anything else."""
    import torch
    if isinstance(value, torch.Tensor):
        return value.numel()
    if depth and isinstance(value, (tuple, list)):
        return max((_elements(v, depth - 1) for v in value[:64]), default=0)
    return 0


def _entry_name(frame, forbid) -> str:
    code = frame.f_code
    module = frame.f_globals.get("__name__", "?")
    root = next((m for m in forbid if module == m or module.startswith(m + ".")), module)
    name = f"{root}.{getattr(code, 'co_qualname', code.co_name)}"
    impl = frame.f_locals.get("impl") if "impl" in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount] else None
    return f"{name}(impl={impl!r})" if isinstance(impl, str) else name


@contextlib.contextmanager
def watching(forbid=()):
    """Watch the code run inside the block; yields the :class:`Trace` it fills.

    ``forbid``: module names (``"mlexp.ops"``, ``"mlexp.kvcache"``); a function of such a module
    (or of a module inside it) entered from code outside them is recorded as used.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    forbid = tuple(str(m) for m in forbid)
    trace = Trace()

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            trace.ops += 1
            result = func(*args, **(kwargs or {}))
            trace.largest = max(trace.largest, _elements(result))
            return result

    def profile(frame, event, _arg):
        if event != "call" or len(trace.used) >= MAX_USED:
            return
        module = frame.f_globals.get("__name__", "")
        if not _watched(module, forbid):
            return
        caller = frame.f_back
        if caller is not None and _watched(caller.f_globals.get("__name__", ""), forbid):
            return                                     # inside the library: its entry point is recorded
        name = frame.f_code.co_name
        if name.startswith("__") and name.endswith("__"):
            return                                     # a library class's constructor or dunder: not an entry point
        name = _entry_name(frame, forbid)
        if name not in trace.used:
            trace.used.append(name)

    old = sys.getprofile()
    if forbid:
        sys.setprofile(profile)
    try:
        with Count():
            yield trace
    finally:
        if forbid:
            sys.setprofile(old)


def call(fn, *args, forbid=(), **kwargs):
    """``fn(*args, **kwargs)`` under :func:`watching`: returns ``(result, Trace)``.

    A grader's proxy of a student function is watched where the function runs (its
    ``_watched_call``); any other callable is watched here.
    """
    remote = getattr(fn, "_watched_call", None)
    if callable(remote):
        result, data = remote(args, kwargs, list(forbid))
        try:
            return result, Trace.from_dict(data)
        except ValueError:
            raise AssertionError(f"Hint: the grader could not watch {_name(fn)} run (the "
                                 "notebook's kernel sent no trace): restart the kernel and run "
                                 "the notebook from the top.") from None
    with watching(forbid) as trace:
        result = fn(*args, **kwargs)
    return result, trace


def _name(fn) -> str:
    return getattr(fn, "__name__", "the function")


def write_it_yourself(fn, *args, forbid, instead: str = "", **kwargs):
    """``fn(*args, **kwargs)``; fails with the rule's hint when it entered a function of one of
    the ``forbid`` modules. ``instead``: what the exercise asks for, for the hint."""
    result, trace = call(fn, *args, forbid=forbid, **kwargs)
    _refuse(fn, trace, forbid, instead)
    return result


def _refuse(fn, trace, forbid, instead):
    if trace.used:
        raise AssertionError(f"Hint: {RULE_HINT}: {_name(fn)} called {', '.join(trace.used[:3])}. "
                             + (instead or f"Write it without {', '.join(forbid)}") + "; the library "
                             "is only the reference the test checks against.")


def no_loop(fn, make_args, *, over: str = "t", lengths=(8, 32), forbid=(), instead: str = ""):
    """Fail with the rule's hint when ``fn`` runs more torch operations for a longer sequence:
    the sign of a Python loop over ``over`` (a vectorised form runs the same operations at any
    length). ``make_args(T)``: the arguments for length T. ``forbid`` is checked on each call as
    by :func:`write_it_yourself`. Returns the results, one per length."""
    results, counts = [], []
    for T in lengths:
        result, trace = call(fn, *make_args(T), forbid=forbid)
        _refuse(fn, trace, forbid, "")
        results.append(result)
        counts.append(trace.ops)
    if counts[-1] > counts[0]:
        raise AssertionError(f"Hint: {RULE_HINT} without a Python loop over {over}: {_name(fn)} runs "
                             f"more torch operations the longer the sequence (a loop over {over}). "
                             + (instead or "Use whole-tensor operations over the sequence") + ".")
    return results


def bounded(fn, *args, limit: int, bound: str, forbid=(), instead: str = "", **kwargs):
    """``fn(*args, **kwargs)``; fails with the rule's hint when a torch operation inside it
    returned a tensor of more than ``limit`` elements: the sign that the work is not bounded the
    way the exercise asks (a whole T x T score matrix where chunks of C tokens were asked for).

    Only the sizes are measured, never the values, so an exact answer that computes too much is
    told apart from one that computes what was asked. ``bound``: the limit in the exercise's
    terms, for the hint ("8 x B x H x T x max(C, D) numbers"); ``forbid`` is checked as by
    :func:`write_it_yourself`. Returns the result."""
    result, trace = call(fn, *args, forbid=forbid, **kwargs)
    _refuse(fn, trace, forbid, "")
    if trace.largest > limit:
        raise AssertionError(f"Hint: {RULE_HINT} with no tensor larger than {bound}: {_name(fn)} made "
                             f"one of {trace.largest:,} numbers, more than the {limit:,} that allows. "
                             + (instead or "Keep every tensor within that bound") + ".")
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
