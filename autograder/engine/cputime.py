"""CPU time of a kernel, read by the trusted side from the operating system (issue 51, item 2).

A limit that separates a slow method from a right one ("work that grows faster than the sequence")
is judged on the CPU time the operating system gave the student's kernel, read here from
``/proc``, never on the wall clock (a busy machine stretches it) or on anything the student's
process reports about itself. :func:`tree_cpu_ns` adds up every thread of every process under the
kernel's launcher (the jail, bubblewrap, the kernel and anything it started): each live thread's
time on a CPU in nanoseconds (``/proc/PID/task/TID/schedstat``), and the time of the children each
process has already reaped (``cutime`` + ``cstime`` of ``/proc/PID/stat``, in clock ticks), so work
handed to a child process counts too; a process's own ticks stand in for its live threads' sum
when they are more (a thread that ended took its nanoseconds with it).
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["tree_cpu_ns", "children"]

_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 10_000_000


def _stat(pid: int):
    """(ppid, own CPU ns, reaped children's CPU ns) of ``pid`` from /proc/PID/stat (in clock
    ticks), or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()   # the command name may hold spaces and ")"
    return (int(fields[1]), (int(fields[11]) + int(fields[12])) * _TICK_NS,
            (int(fields[13]) + int(fields[14])) * _TICK_NS)


def children(root: int) -> list:
    """``root`` and every process under it (one pass over /proc)."""
    parent = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            got = _stat(int(entry.name))
            if got is not None:
                parent[int(entry.name)] = got[0]
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(p for p, pp in parent.items() if pp == pid)
    return found


def _threads_ns(pid: int) -> int:
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def tree_cpu_ns(root: int) -> int:
    """Nanoseconds of CPU that ``root`` and every process under it have used so far (module
    docstring); 0 when ``root`` is gone or /proc cannot be read (not Linux)."""
    if not Path("/proc/self/schedstat").exists():
        return 0
    total = 0
    for pid in children(root):
        got = _stat(pid)
        if got is not None:
            # live threads to the nanosecond; the clock ticks also count threads that have ended
            total += max(_threads_ns(pid), got[1]) + got[2]
    return total
