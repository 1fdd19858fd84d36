"""The LMSs the grader reads and writes, one module each behind lms/base.py (README.md here).

Importing the package registers them, in this order, in ``autograder.lms.base.LMSS``.
"""
# each module registers its LMS; in this order (collect prefers the first LMS on a tie)
from autograder.lms import canvas
from autograder.lms import moodle
from autograder.lms import blackboard
from autograder.lms.base import LMSS, Lms, LmsFile, by_layout, register

__all__ = ["LMSS", "Lms", "LmsFile", "by_layout", "register", "canvas", "moodle", "blackboard"]
