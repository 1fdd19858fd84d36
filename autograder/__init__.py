"""The course's auto-grader: nbgrader as the engine, plus build, grade, check and a demo class.

Run ``python -m autograder --help``. Commands: ``build [--check | --colab | --repo OWNER/NAME]``
(lessons/ from solutions/; the Colab course file; publish),
``grade [SUBMISSIONS] --out DIR`` (a class), ``check NOTEBOOK`` (a student's self-check),
``demo [--check] [--check-hints]`` (the fictional demo class), ``seeds LESSON`` (seed runs),
``book OUT [--size grading]`` (the course as a static web site, :mod:`autograder.publishing.book`).
The course itself (lessons, repository, root) is described in ``autograder.course``.
"""
__all__ = ["main"]


def main(argv=None) -> int:
    """Entry point of ``python -m autograder``; returns the exit code."""
    from autograder.cli import main as _main
    return _main(argv)
