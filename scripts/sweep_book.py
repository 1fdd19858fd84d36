"""What lesson 06's sweeps (lr_sweep.py, state_sweep.py) record about their own cost, and their pool.

A sweep's JSON file may be built by several calls (``--resume`` keeps the runs already there):
``wall_seconds`` and ``cpu_seconds`` are summed over the calls, ``calls`` lists each call's own
share, and ``load_before`` and ``load_after`` (the load average) are the last call's. A sweep's
runs each go to a process of a pool (:func:`run_all`), and the file is rewritten after every run
(:func:`write`), so a sweep cut short keeps what finished.
"""
from __future__ import annotations

import datetime
import json
import os
import resource
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path


def children_cpu() -> float:
    """CPU seconds used so far by this process's finished children (the pool's workers)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def start_call(data: dict) -> float:
    """Note the load average before this call in ``data``; returns the call's start (perf_counter)."""
    data.setdefault("wall_seconds", 0.0)
    data.setdefault("cpu_seconds", 0.0)
    data["load_before"] = round(os.getloadavg()[0], 2)
    return time.perf_counter()


def run_all(fn, plan, jobs: int):
    """``fn(*args)`` for every ``args`` of ``plan``, ``jobs`` processes at a time; yields each
    result as it finishes."""
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        for fut in as_completed([pool.submit(fn, *args) for args in plan]):
            yield fut.result()


def write(path: Path, data: dict) -> None:
    """Write the sweep's file, with the load average now as ``load_after``."""
    data["load_after"] = round(os.getloadavg()[0], 2)
    path.write_text(json.dumps(data, indent=1) + "\n")


def end_call(data: dict, start: float, **call) -> None:
    """Add this call's wall and CPU seconds to the file's totals and its entry to ``calls``:
    ``call`` (what it ran) first, then its seconds, the load before it and the date."""
    wall, cpu = time.perf_counter() - start, children_cpu()
    data["wall_seconds"] = round(data["wall_seconds"] + wall, 1)
    data["cpu_seconds"] = round(data["cpu_seconds"] + cpu, 1)
    data.setdefault("calls", []).append(dict(call, wall_seconds=round(wall, 1), cpu_seconds=round(cpu, 1),
                                             load_before=data["load_before"], date=datetime.date.today().isoformat()))
