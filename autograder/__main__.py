"""`python -m autograder`: run the grader's command line."""
import sys

# jsonschema (under nbformat) imports rfc3987_syntax when it is installed, which builds a grammar
# for seconds at import; notebook validation never uses that format, so the command skips it.
sys.modules.setdefault("rfc3987_syntax", None)

from autograder.cli import main  # noqa: E402

sys.exit(main())
