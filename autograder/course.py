"""The course in one place: its lessons (id, title, minutes), its GitHub repository and its root.

Everything that needs to know the course reads it from here: the grader (``autograder``), the
seed runner (``python -m autograder seeds``) and
``scripts/lesson_cells.py`` (the badge, **Time.** paragraph and setup cell of every lesson, and
the README's lesson table). The module imports only the standard library, so any of them (and a
student's Colab) can read it without torch, nbformat or nbgrader.

To add a lesson: add its ``Lesson`` below, write ``solutions/<id>/<id>.ipynb``, then ``make
lessons``. To publish the course: ``python -m autograder build --repo OWNER/NAME`` rewrites
``COURSE_REPO`` here and every badge, setup cell and README link generated from it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Lesson", "LESSONS", "COURSE_REPO", "PLACEHOLDER_REPO", "BRANCH", "PACKAGE_PARENT",
           "find_course_root", "lesson_notebook", "set_course_repo", "validate_repo"]


@dataclass(frozen=True)
class Lesson:
    """One lesson: ``solutions/<id>/<id>.ipynb`` and its student copy ``lessons/<id>/<id>.ipynb``.

    minutes: reading and exercises, the author's estimate (the measured run time is added by
    scripts/lesson_cells.py). heavy: what takes the time when every cell runs at full size
    ("nothing: ..." for a lesson that trains no model).
    """
    id: str
    title: str
    minutes: int
    heavy: str


LESSONS = {lesson.id: lesson for lesson in (
    Lesson("00_token_mixing", "Token mixing: convolution, recurrence, attention", 60,
           "the recall probe (section 5, four models of 1,000 steps) and the five language models "
           "(section 6); section 7 lists what each run cost"),
    Lesson("01_running_sum", "Attention as a running sum", 75, "the decode-cost measurements and timings"),
    Lesson("02_fixed_state_recall", "What a fixed state cannot hold", 60, "the recall training in section 6"),
    Lesson("03_gates_and_delta_rule", "Gates and the delta rule", 90, "the recall-with-overwrites training"),
    Lesson("04_hybrid_kv_cache", "Hybrid models and their cache", 45, "nothing: no model is trained"),
    Lesson("05_inattention", "InAttention: attend to the initial states", 60,
           "the recall probe (two models of 1,000 steps), the prefill memory sweep and the small "
           "language models"),
    Lesson("06_recall_per_byte", "Recall per byte: the capstone", 75, "training the designs of section 3"),
)}

# The course's GitHub repository as "owner/name". PLACEHOLDER_REPO until the course is published;
# `python -m autograder build --repo OWNER/NAME` rewrites this line (and everything made from it).
COURSE_REPO = "OWNER/REPO"
PLACEHOLDER_REPO = "OWNER/REPO"
BRANCH = "main"
_REPO_LINE = re.compile(r'^COURSE_REPO = "[^"\n]*"$', re.M)
_REPO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$")

# The folder this package sits in: the course checkout for an editable install (`make`, pip -e).
PACKAGE_PARENT = Path(__file__).resolve().parent.parent


def find_course_root(course=None) -> Path:
    """Return the course root: the folder holding ``solutions/`` (and ``lessons/``).

    Looks at ``course`` when given, else the current directory, else the checkout this package
    was installed from. Raises FileNotFoundError saying where it looked when none has
    ``solutions/``.
    """
    candidates = [Path(course)] if course else [Path.cwd(), PACKAGE_PARENT]
    for root in candidates:
        if (root / "solutions").is_dir():
            return root.resolve()
    looked = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"No course found: none of [{looked}] has a solutions/ folder. Run the command from the "
        "course checkout or pass --course PATH.")


def lesson_notebook(root: Path, lesson: str) -> Path:
    """``solutions/<id>/<id>.ipynb`` for a lesson id or a unique prefix of one ("00").

    Raises ValueError when ``lesson`` matches no lesson folder or several, FileNotFoundError
    when the folder holds no notebook.
    """
    solutions = Path(root) / "solutions"
    ids = sorted(p.name for p in solutions.iterdir() if p.is_dir() and p.name.startswith(lesson))
    if len(ids) != 1:
        raise ValueError(f"lesson {lesson!r} matches {ids or 'nothing'} in {solutions}; give one "
                         f"lesson id (the course has {', '.join(LESSONS)}).")
    own = solutions / ids[0] / f"{ids[0]}.ipynb"
    notebooks = [own] if own.is_file() else sorted((solutions / ids[0]).glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"{solutions / ids[0]} holds no notebook.")
    return notebooks[0]


def validate_repo(repo: str) -> None:
    """Raise ValueError unless ``repo`` is "owner/name" as GitHub accepts it (or PLACEHOLDER_REPO)."""
    if repo != PLACEHOLDER_REPO and not _REPO_NAME.match(repo):
        raise ValueError(f"{repo!r} is not a GitHub repository name: give OWNER/NAME, e.g. "
                         "my-university/linear-attention-course.")


def set_course_repo(root: Path, repo: str) -> bool:
    """Write ``repo`` ("owner/name", or PLACEHOLDER_REPO) as COURSE_REPO into the course's copy of
    this module, ``root/autograder/course.py``; returns True when the file changed.

    Only that one line is rewritten. Raises ValueError for a name GitHub would not accept and
    FileNotFoundError when ``root`` has no autograder/course.py (a course outside a checkout).
    """
    validate_repo(repo)
    path = Path(root) / "autograder" / "course.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: --repo rewrites the course's own copy of "
                                "autograder/course.py, so run it in the course checkout.")
    text = path.read_text()
    if len(_REPO_LINE.findall(text)) != 1:
        raise ValueError(f"{path} must hold exactly one line COURSE_REPO = \"...\" to rewrite.")
    new = _REPO_LINE.sub(f'COURSE_REPO = "{repo}"', text)
    if new != text:
        path.write_text(new)
    return new != text
