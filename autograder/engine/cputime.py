"""CPU time of a kernel, read by the trusted side from the operating system (issue 51, item 2).

A limit that separates a slow method from a right one ("work that grows faster than the sequence")
is judged on the CPU time the operating system gave the student's kernel, read here from
``/proc``, never on the wall clock (a busy machine stretches it) or on anything the student's
process reports about itself. :func:`tree_cpu_ns` adds up every thread of every process under the
kernel's launcher (the jail, bubblewrap, the kernel and anything it started): each process's CPU
clock in nanoseconds (``clock_gettime`` of the process's clock, ``CLOCK_PROCESS_CPUTIME_ID`` as
seen from outside: every thread, the ended ones too), and the time of the children each process
has already reaped (``cutime`` + ``cstime`` of ``/proc/PID/stat``, in clock ticks), so work handed
to a child process counts too. Where a process's clock cannot be read, the larger of its live
threads' nanoseconds (``/proc/PID/task/TID/schedstat``) and its clock ticks stands in.

One measure per process, always the same one: a difference of two readings taken from two
measures (live threads' nanoseconds before, ticks after) counted a thread that had ended long
before as work of the call between them (a chunkwise form that grows x4 read as x30 in CI).
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["tree_cpu_ns", "children", "CpuGroup", "ignores_children"]

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


_CHILDREN_FILES = Path(f"/proc/self/task/{os.getpid()}/children").exists()


def children(root: int) -> list:
    """``root`` and every process under it: from each thread's list of the children it started
    (/proc/PID/task/TID/children), or, where Linux keeps no such list, one pass over /proc."""
    if _CHILDREN_FILES:
        found, todo = [], [root]
        while todo:
            pid = todo.pop()
            found.append(pid)
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tasks:
                try:
                    todo.extend(int(k) for k in Path(f"/proc/{pid}/task/{tid}/children").read_text().split())
                except (OSError, ValueError):
                    pass
        return found
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


def _clock_ns(pid: int):
    """The CPU clock of process ``pid`` (all its threads, ended ones included) in nanoseconds,
    or None where it cannot be read. The clock id is Linux's MAKE_PROCESS_CPUCLOCK(pid, SCHED),
    what ``clock_getcpuclockid(pid)`` gives in C."""
    import time
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)
    except (OSError, OverflowError, AttributeError):
        return None


def tree_cpu_ns(root: int) -> int:
    """Nanoseconds of CPU that ``root`` and every process under it have used so far (module
    docstring); 0 when ``root`` is gone or /proc cannot be read (not Linux)."""
    if not Path("/proc/self/schedstat").exists():
        return 0
    total = 0
    for pid in children(root):
        got = _stat(pid)
        if got is not None:
            own = _clock_ns(pid)
            total += (max(_threads_ns(pid), got[1]) if own is None else own) + got[2]
    return total


def ignores_children(root: int) -> list:
    """The processes under ``root`` that ignore SIGCHLD: Linux reaps their children itself and adds
    none of the children's CPU time to theirs, so :func:`tree_cpu_ns` misses the work of a child
    that ended (a kernel that forks its work to a child after ``signal(SIGCHLD, SIG_IGN)``)."""
    found = []
    for pid in children(root):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("SigIgn:") and int(line.split()[1], 16) >> 16 & 1:   # signal 17 (SIGCHLD)
                found.append(pid)
    return found


class CpuGroup:
    """A control group of its own for one kernel, whose CPU count takes in every process that ever
    ran in it: the ones that ended, the ones whose parent ignored SIGCHLD and the ones that left
    the kernel's process tree (a double fork) alike, which no reading of a process tree can. The
    jail joins it before it drops root (``limits["cgroup"]``, :mod:`autograder.engine.jail.jail`)
    and a process inside the sandbox can neither see nor leave it (no /sys there, no root).

    Made under this process's own group (so a CPU quota set on the grading run still holds the
    kernel): cgroup v1's ``cpuacct`` (``cpuacct.usage``, nanoseconds) or cgroup v2's ``cpu.stat``
    (``usage_usec``). :meth:`create` returns None where neither can be made (not root, nothing
    delegated); the caller then reads :func:`tree_cpu_ns`."""

    def __init__(self, path: Path, v1: bool):
        self.path, self.v1 = Path(path), v1

    @classmethod
    def create(cls):
        import secrets
        try:
            own = Path("/proc/self/cgroup").read_text().splitlines()
            mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        except OSError:
            return None
        for line in mounts:
            left, _, right = line.partition(" - ")
            fields, kind = left.split(), right.split()
            if len(fields) < 5 or len(kind) < 3:
                continue
            v1 = kind[0] == "cgroup" and "cpuacct" in kind[2].split(",")
            if not (v1 or kind[0] == "cgroup2"):
                continue
            mine = [g.split(":", 2)[2] for g in own if g.count(":") >= 2 and
                    (("cpuacct" in g.split(":")[1].split(",")) if v1 else g.startswith("0::"))]
            if not mine:
                continue
            rel = os.path.relpath(mine[0], fields[3])      # this process's group, from the mount's root
            parent = Path(fields[4], "" if rel == "." else rel)
            cls.sweep(parent)
            path = parent / f"{cls._owner_prefix()}{secrets.token_hex(6)}"
            try:
                path.mkdir()
            except OSError:
                continue
            group = cls(path, v1)
            try:
                group.ns()
                return group
            except (OSError, ValueError):
                group.close()
        return None

    @staticmethod
    def _namespace_prefix() -> str:
        """The start of the names of this pid namespace's groups: ``autograder-NS-``."""
        return f"autograder-{os.stat('/proc/self/ns/pid').st_ino}-"

    @classmethod
    def _owner_prefix(cls) -> str:
        """A group's name starts with its maker's pid namespace and pid: ``autograder-NS-PID-``."""
        return f"{cls._namespace_prefix()}{os.getpid()}-"

    @classmethod
    def sweep(cls, parent: Path) -> list:
        """Close the groups under ``parent`` that a grader made and could not remove: its process
        was killed (SIGKILL, an out-of-memory kill, a lost machine) before :meth:`close` ran. Only
        groups of this pid namespace whose maker is gone are touched (what is left in them, the
        dead grader's kernel, is stopped); a running grader's groups, and those of graders in other
        namespaces, are kept. Returns the paths removed."""
        try:
            prefix = cls._namespace_prefix()
            names = [p for p in Path(parent).iterdir() if p.name.startswith(prefix)]
        except OSError:
            return []
        removed = []
        for path in names:
            pid = path.name.split("-")[2]
            if not pid.isdigit() or Path("/proc", pid).exists():
                continue
            cls(path, (path / "cpuacct.usage").exists()).close(wait=1.0)
            if not path.exists():
                removed.append(path)
        return removed

    def ns(self) -> int:
        """Nanoseconds of CPU every process that has run in the group used so far."""
        if self.v1:
            return int((self.path / "cpuacct.usage").read_text())
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines() if line.strip())
        return int(stat["usage_usec"]) * 1000

    def holds(self, pid: int) -> bool:
        try:
            return str(pid) in (self.path / "cgroup.procs").read_text().split()
        except OSError:
            return False

    def close(self, wait: float = 5.0) -> None:
        """Stop what is left in the group (the kernel's processes, once the kernel is shut down: its
        launcher may outlive the shutdown by seconds) and remove it."""
        import signal
        import time
        end = time.monotonic() + wait
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > end:
                    return
            try:
                for pid in (self.path / "cgroup.procs").read_text().split():
                    os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass
            time.sleep(0.05)


WALL_CEILING = 10     # a limit's wall-clock ceiling, as a multiple of it: only against hangs
IDLE_S = 5.0          # a run that used under IDLE_CPU of CPU in its last IDLE_S seconds is idle
IDLE_CPU = 0.05


class Budget:
    """A time limit in CPU seconds: how much CPU the grading process and everything under it (the
    kernel, the room) may use for one cell, test or call, as the operating system counts it, so a
    busy machine, which stretches the wall clock, changes no verdict. ``threads``: the torch threads
    of each kernel (a kernel working on n threads may use n CPU seconds each second).

    The wall clock only catches hangs: a run past its limit on the wall clock that has been idle
    (under ``IDLE_CPU`` s of CPU in its last ``IDLE_S`` s: a ``sleep``, a lock, ``input()``), or past
    ``WALL_CEILING`` times its limit whatever it does."""

    def __init__(self, seconds: float, threads: int = 1, root: int = None):
        import time
        self.seconds, self.scale = max(0.0, float(seconds)), max(1, int(threads))
        self.root = os.getpid() if root is None else root
        self._wall = time.monotonic
        self.started_wall = self._wall()
        self.started_cpu = self._cpu()
        self.samples = [(self.started_wall, self.started_cpu)]

    def _cpu(self) -> float:
        return tree_cpu_ns(self.root) / 1e9 / self.scale

    def used(self) -> float:
        """CPU seconds used so far (per thread)."""
        return self._cpu() - self.started_cpu

    def remaining(self) -> float:
        """CPU seconds left (per thread), at least 0."""
        return max(0.0, self.seconds - self.used())

    def sub(self, seconds=None) -> "Budget":
        """A budget inside this one: the rest of it, or ``seconds`` when that is less."""
        rest = self.remaining()
        return Budget(rest if seconds is None else min(rest, seconds), self.scale, self.root)

    def wall_ceiling(self) -> float:
        """Seconds on the wall clock after which the run is stopped whatever it does."""
        return max(1.0, self.seconds * WALL_CEILING)

    def exceeded(self) -> str:
        """Why the run is over its limit: "cpu", "hang" (idle past its limit on the wall clock),
        "ceiling" (past WALL_CEILING times its limit on the wall clock), or ""."""
        now, cpu = self._wall(), self._cpu()
        if cpu - self.started_cpu > self.seconds:
            return "cpu"
        elapsed = now - self.started_wall
        if elapsed > self.wall_ceiling():
            return "ceiling"
        self.samples.append((now, cpu))
        while len(self.samples) > 2 and now - self.samples[1][0] >= IDLE_S:
            self.samples.pop(0)
        first_wall, first_cpu = self.samples[0]
        if elapsed > self.seconds and now - first_wall >= IDLE_S and (cpu - first_cpu) * self.scale < IDLE_CPU:
            return "hang"
        return ""
