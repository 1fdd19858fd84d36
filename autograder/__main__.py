"""`python -m autograder`: run the grader's command line."""
import sys

from .cli import main

sys.exit(main())
