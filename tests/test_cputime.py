"""autograder.engine.cputime: the CPU time of a process tree, read from outside, to the millisecond,
threads that have ended included (issue 51, item 2)."""
import subprocess
import sys
import time

import pytest

from autograder.engine.cputime import tree_cpu_ns

CHILD = r"""
import sys, threading, time
t = threading.Thread(target=lambda: sum(range(3_000_000)))
t.start(); t.join()                        # a thread that worked, then ended
end = time.process_time() + 0.012
while time.process_time() < end:           # 12 ms more, under one clock tick and a bit
    pass
print(time.process_time_ns(), flush=True)  # what the process counts for itself
sys.stdin.readline()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_tree_time_is_the_process_own_count_ended_threads_included():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        own = int(proc.stdout.readline())
        first = tree_cpu_ns(proc.pid)
        time.sleep(0.3)                    # idle: the reading must not move
        second = tree_cpu_ns(proc.pid)
    finally:
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(10)
    assert abs(first - own) < 3_000_000, (first, own)     # to 3 ms, not to a 10 ms clock tick
    assert abs(second - first) < 3_000_000, (first, second)
