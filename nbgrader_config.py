"""nbgrader settings for this course: instructor notebooks in solutions/, student ones in lessons/.

Read by nbgrader's own commands run from this folder (formgrader, `nbgrader autograde`, ...).
`python -m autograder` applies the same settings (autograder/config.py) to a private work folder.
"""
import os
import sys

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)
here = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.root = here
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "lessons"

# Per-cell timeout and feedback without hidden tests, shared with the autograder package.
sys.path.insert(0, here)
from autograder.config import apply_course_settings  # noqa: E402

apply_course_settings(c)
