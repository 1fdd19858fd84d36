"""Dask worker preload for tests/test_grading_dask.py: a notebook that holds KILL_MARK kills its
worker process mid-run (SIGKILL, as the kernel's out-of-memory killer would), every time.

`dask worker ... --preload tests/dask_preload.py` calls dask_setup when the worker starts; every
other notebook runs as usual, and importing this module changes nothing.
"""
import os
import signal

KILL_MARK = "kill-my-dask-worker"


def dask_setup(worker):
    from autograder.engine import sandbox
    run_submission = sandbox.run_submission

    def killing_run_submission(nb, *args, **kwargs):
        if any(KILL_MARK in cell.get("source", "") for cell in nb.cells):
            os.kill(os.getpid(), signal.SIGKILL)
        return run_submission(nb, *args, **kwargs)
    sandbox.run_submission = killing_run_submission
