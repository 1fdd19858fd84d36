"""Where the course lives and the nbgrader settings every grader command shares."""
import os
import shutil
import sys
from pathlib import Path

from traitlets.config import Config

# The course root and the lessons are known in one place, autograder.course; re-exported here.
from autograder.course import PACKAGE_PARENT, find_course_root  # noqa: F401
from autograder.mistakes import MISTAKES_FILE
from autograder.options import GradingOptions

__all__ = ["CELL_TIMEOUT_S", "KERNEL_ARGS", "FEEDBACK_PREPROCESSORS", "find_course_root",
           "list_assignments", "apply_course_settings", "ensure_venv_on_path", "new_gradebook",
           "work_config", "use_feedback_template", "sqlalchemy_url", "PACKAGE_PARENT"]

# A graded submission runs its experiments at token size (mlexp.budget), so a cell that needs
# more than a minute is stuck (an endless loop, a full-size training run) rather than slow. The
# default lives in autograder.options with every other limit.
CELL_TIMEOUT_S = GradingOptions().cell_timeout

# nbgrader's feedback shows the autograded notebook as it ran, hidden tests included (autograde
# restores every test cell from the gradebook). HideHiddenTests removes them before rendering;
# ExerciseFeedback names each exercise and puts its hint first (for the template below);
# SanitizeFeedback removes what a student's markdown or outputs could run in the page.
FEEDBACK_PREPROCESSORS = [
    "nbgrader.preprocessors.GetGrades",
    "autograder.engine.feedback.HideHiddenTests",
    "autograder.engine.feedback.ExerciseFeedback",
    "autograder.engine.feedback.SanitizeFeedback",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]

# ipykernel 7 warns on stderr at every start that its local TCP sockets are unencrypted; for a
# batch of kernels that line is noise (each student's kernel talks over its own IPC sockets).
KERNEL_ARGS = ["--IPKernelApp.log_level=ERROR"]

FEEDBACK_TEMPLATES = Path(__file__).resolve().parent / "templates"   # holds feedback/<FEEDBACK_TEMPLATE>
FEEDBACK_TEMPLATE = "mlexp_feedback.html.j2"


def list_assignments(root: Path) -> list:
    """Assignment ids: the folders ``solutions/<id>/`` that hold at least one notebook, sorted."""
    src = Path(root) / "solutions"
    return sorted(p.name for p in src.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and any(p.glob("*.ipynb")))


def apply_course_settings(c, timeout=CELL_TIMEOUT_S):
    """Put the settings shared by ``nbgrader_config.py`` and this package onto config ``c``."""
    c.Execute.timeout = timeout
    c.Execute.extra_arguments = list(KERNEL_ARGS)
    c.GenerateFeedback.preprocessors = list(FEEDBACK_PREPROCESSORS)
    # A lesson's mistake catalogue (autograder.mistakes) stays with the instructor: never released.
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback",   # nbgrader's
                                MISTAKES_FILE]
    return c


def ensure_venv_on_path() -> None:
    """Put this Python's bin/ folder on PATH when nbgrader's helper programs are not found.

    nbgrader's Gradebook runs the ``alembic`` program by name, which fails when the virtual
    environment is used through ``.venv/bin/python`` without being activated.
    """
    if shutil.which("alembic") is None:
        bindir = os.path.dirname(sys.executable)
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def new_gradebook(path: Path) -> None:
    """Create an empty SQLite gradebook at ``path`` stamped with nbgrader's schema version.

    nbgrader creates a missing gradebook by running ``alembic heads`` as a separate program
    just to learn that version (seconds on a busy machine, every run). Reading it in-process
    and writing the stamp first gives the same database without the subprocess.
    """
    import sqlite3

    import nbgrader
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(os.path.join(os.path.dirname(nbgrader.__file__), "alembic")).get_current_head()
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        db.execute("INSERT INTO alembic_version (version_num) VALUES (?)", (head,))
    db.close()


def sqlalchemy_url(url: str) -> str:
    """``url`` with a PostgreSQL driver SQLAlchemy can load: a plain ``postgresql://`` URL means
    psycopg (v3) to SQLAlchemy 2.1 but psycopg2 (the grade extra's driver) to earlier versions,
    so name psycopg2 explicitly when psycopg is not installed."""
    import importlib.util
    scheme, sep, rest = url.partition("://")
    if scheme in ("postgresql", "postgres") and importlib.util.find_spec("psycopg") is None:
        return "postgresql+psycopg2://" + rest
    return url


def work_config(work: Path, timeout=CELL_TIMEOUT_S, db_url=None) -> Config:
    """nbgrader config for a private course directory ``work`` and its gradebook.

    ``work`` gets nbgrader's default layout (source/, release/, submitted/, autograded/,
    feedback/). The gradebook is ``db_url`` when given (any SQLAlchemy URL, e.g.
    ``postgresql://user@host/db``; nbgrader creates its tables), else ``work/gradebook.db``
    (created here when missing); nothing is written in the course checkout.
    """
    ensure_venv_on_path()
    Path(work).mkdir(parents=True, exist_ok=True)
    if not db_url:
        db = Path(work) / "gradebook.db"
        if not db.exists():
            new_gradebook(db)
        db_url = "sqlite:///" + os.fspath(db)
    c = Config()
    c.CourseDirectory.root = os.fspath(work)
    c.CourseDirectory.db_url = sqlalchemy_url(db_url)
    # nbgrader's Gradebook registers this course on first use; PostgreSQL enforces the link
    # from assignments to it, which an empty id (nbgrader's default) never satisfies.
    c.CourseDirectory.course_id = "default_course"
    c.NbGraderAPI.log_level = "WARN"
    return use_feedback_template(apply_course_settings(c, timeout))


def use_feedback_template(c):
    """Render feedback pages on config ``c`` through autograder/templates/feedback/
    mlexp_feedback.html.j2 (exercise titles, the hint first), which extends nbgrader's feedback
    template (the one NbGraderAPI.generate_feedback always names). Set for the grader's own
    work folder only, not in apply_course_settings: the formgrader renders its pages through
    the same HTMLExporter settings with a template of its own."""
    import nbgrader
    c.HTMLExporter.extra_template_basedirs = [
        os.path.join(os.path.dirname(nbgrader.__file__), "server_extensions", "formgrader", "templates"),
        os.fspath(FEEDBACK_TEMPLATES)]
    c.HTMLExporter.template_name = "feedback"
    c.HTMLExporter.template_file = FEEDBACK_TEMPLATE
    return c
