"""Where a lesson is running: under the auto-grader (token-sized experiments) or for real."""
import os

__all__ = ["is_grading", "budget"]


def is_grading() -> bool:
    """True while nbgrader executes the notebook (autograde or validate).

    nbgrader sets the environment variable ``NBGRADER_EXECUTION`` to ``"autograde"`` or
    ``"validate"`` for the kernel it starts; the course's own grader sets it too. Experiment
    cells read this so that grading a class stays fast (see "Grading time" in the design notes).
    """
    return bool(os.environ.get("NBGRADER_EXECUTION"))


def budget(full, grading):
    """Return ``grading`` while the notebook is being graded, else ``full``.

    Use it for the size of an experiment: ``steps = budget(full=1000, grading=10)``.
    Exercises never depend on an experiment's output, so a token-sized run while grading changes
    no score.
    """
    return grading if is_grading() else full
