"""Rules decided by what a call costs, as the operating system counts it: :func:`work_grows`.

A chunkwise form and a wrong method can compute the same numbers; what tells them apart is what the
computation costs. The CPU time a call takes grows about like T for the chunkwise form and like T^2
for work over every pair of tokens, however that work is spelled; the memory a call adds to its
process at its peak is a few copies of the inputs for the chunkwise form and a D_k x D_v state per
token, or a T x T matrix, for the methods that keep one. Neither is something the student's process
reports about itself: in grading both are read by the grader from outside the student's kernel
(autograder.engine.calls.KernelLink.measured_call: the kernel's control group or process tree for
the CPU time, the kernel's peak resident memory reset and read through /proc for the memory); in the
student's own notebook, from this process (``time.process_time()``, ``/proc/self``).
"""
from __future__ import annotations

import time
from pathlib import Path

__all__ = ["work_grows", "peak_reset", "peak_growth"]


def work_grows(fn, make_args, *, lengths, at_most: float, too_fast: str, reference, repeats: int = 5,
               slowest: float = None, memory: int = None, too_big: str = ""):
    """Fail with the rule's hint when the CPU time ``fn`` takes grows more than ``at_most`` times from the first of
    ``lengths`` to the second: the sign of work that grows faster than the exercise allows, however it is spelled
    (a T x T product computed in pieces, a state rebuilt from every earlier token at each chunk).
    ``make_args(T)``: the arguments for length T; ``reference``: a function that gives the right result for them
    (each measured call must return it, to rounding); ``too_fast``: what such growth means in the exercise's
    terms, for the hint; ``slowest``: fail too when, at the longer length, ``fn`` takes more than this many times
    the CPU time ``reference`` takes (timed on the same inputs, in this process, on one thread): a ratio alone is
    met by adding a fixed cost to every call, which makes the long call at least as slow as the wrong method it
    hides (issue 51); ``memory``: fail with ``too_big`` when the call at the longer length raises its process's
    peak resident memory by more than this many bytes (arguments, result and every intermediate included), where
    the operating system can say (Linux; a lower bound: memory the process freed before and reuses reads as nothing
    new).

    The time is the CPU time the operating system gave the process that ran the call, never the wall clock, so a
    busy machine does not change the verdict. For a grader's proxy of a student function (``_measured_call``) the
    grader reads it from outside the student's kernel, from the operating system's count for the kernel's
    processes; elsewhere (the student's own notebook) it is this process's ``time.process_time()``, on one torch
    thread. Each length is called ``repeats`` times, the lengths in turn (short, long, short, ...), and each keeps
    its least time and memory: what else the machine does (a neighbour on the same core, a page fault, a
    collection) can only add to a call, and in turns a slow spell falls on both lengths alike. Before each call
    every element of every floating-point tensor argument is multiplied by a fresh random number in [0.5, 1)
    (signs and ranges kept), so no result can be prepared for inputs known in advance, nor rescaled from an
    earlier call's. A call under a millisecond counts as one millisecond."""
    import random
    import torch
    from .rules import RULE_HINT, _name
    times, peaks, own = {T: [] for T in lengths}, [], []
    offs = {T: [] for T in lengths}     # a grader's proxy: the kernel's own checksum of each result
    for _ in range(repeats):
        for T in lengths:
            gen = torch.Generator().manual_seed(random.SystemRandom().randrange(2 ** 63))
            args = [a * (0.5 + 0.5 * torch.rand(a.shape, generator=gen, dtype=a.dtype))
                    if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in make_args(T)]
            expected = _measured(reference, args, None, T, own if T == lengths[-1] else [])
            seconds, peak, off = _measured(fn, args, expected, T)
            times[T].append(seconds)
            offs[T].append(off)
            if T == lengths[-1] and peak is not None:
                peaks.append(peak)
    least = [max(min(times[T]) - min(offs[T]), 0.001) for T in lengths]   # each least: noise only adds
    growth, slower = least[-1] / least[0], least[-1] / max(min(own), 0.001)
    if growth > at_most or (slowest and slower > slowest):
        what = (f"from T = {lengths[0]} to T = {lengths[-1]} (x{lengths[-1] / lengths[0]:g}) {_name(fn)}'s CPU time "
                f"grew x{growth:.0f}, more than the x{at_most:g} this form allows" if growth > at_most else
                f"at T = {lengths[-1]} {_name(fn)} took x{slower:.1f} the CPU time of the course's own form, more than "
                f"the x{slowest:g} this form allows, however that time is spent")
        raise AssertionError(f"Hint: {RULE_HINT} with work that grows the way it asks: {what}. {too_fast}")
    if memory and peaks and min(peaks) > memory:
        raise AssertionError(f"Hint: {RULE_HINT} with the memory it needs: at T = {lengths[-1]} {_name(fn)}'s call "
                             f"took {min(peaks) / 2**20:,.0f} MB more memory at its peak, more than the "
                             f"{memory / 2**20:,.0f} MB this form needs (its arguments and result included). {too_big}")


def _measured(fn, args, expected, T, times=None):
    """(CPU seconds, bytes added to the peak resident memory or None, CPU seconds to take off) of
    ``fn(*args)``, which must return ``expected``; or, with ``times`` (a list), its result, the seconds
    put in ``times``. What to take off: for a grader's proxy, the kernel's checksum of the result as the
    grader timed it (``_measured_call``); here, nothing."""
    import torch
    from .rules import _name
    remote = getattr(fn, "_measured_call", None)
    if callable(remote):
        return remote(args, {}, expected)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)     # idle worker threads spin: their time is not the function's work
    try:
        before = peak_reset() if times is None else None
        start = time.process_time()
        got = fn(*args)
        used = time.process_time() - start
        peak = peak_growth(before)
    finally:
        torch.set_num_threads(threads)
    if times is not None:
        return times.append(used) or got
    if not (isinstance(got, torch.Tensor) and got.shape == expected.shape
            and float((got - expected).abs().max()) <= 1e-3 * float(expected.abs().max()) + 1e-6):
        raise AssertionError(f"Hint: while the test measured its work at T = {T}, {_name(fn)} returned "
                             "other values than the reference: it must give the right output at every "
                             "length, the long ones too.")
    return used, peak, 0.0


def _status_kb(pid, key: str):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_reset(pid="self"):
    """Start a peak-memory measure of process ``pid``: its resident memory now, in kB, after setting
    its peak (VmHWM) back to it (``/proc/PID/clear_refs``, Linux 4.0+); None where that cannot be done."""
    rss = _status_kb(pid, "VmRSS")
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return None
    return rss


def peak_growth(before, pid="self"):
    """Bytes by which process ``pid``'s peak resident memory rose above ``before`` (:func:`peak_reset`), or None."""
    peak = _status_kb(pid, "VmHWM")
    return None if before is None or peak is None else max(0, peak - before) * 1024
