"""Where a lesson is running: under the auto-grader (token-sized experiments) or for real; and
running a block under other environment variables (:func:`temporary_environ`), the way the course's
tools run lessons at one size or another."""
import contextlib
import os

__all__ = ["is_grading", "budget", "temporary_environ"]


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


@contextlib.contextmanager
def temporary_environ(values=(), **more):
    """Run the ``with`` block with environment variables set or removed, then put back what was there.

    ``values`` (a mapping) and the keywords give {name: value}: a string sets the variable, None
    removes it (absent is fine). On leaving the block, by its end or by an exception (which goes
    on), each named variable gets back its value from before, or is removed if it had none; other
    variables are left as the block left them. Changes ``os.environ`` of this process, so child
    processes (kernels) started inside the block see them too. A value that is neither a string
    nor None raises TypeError before anything is changed::

        with temporary_environ(NBGRADER_EXECUTION="validate"):    # the experiments at token size
            ...
    """
    changes = {**dict(values), **more}
    for name, value in changes.items():
        if value is not None and not isinstance(value, str):
            raise TypeError(f"environment variable {name}: a str or None, not {type(value).__name__}")
    saved = {name: os.environ.get(name) for name in changes}
    try:
        _put(changes)
        yield
    finally:
        _put(saved)


def _put(values):
    """Set each variable of {name: str} and remove each of {name: None} in os.environ."""
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
