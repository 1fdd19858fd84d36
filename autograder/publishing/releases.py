"""The released lessons of a grading DIR: made from the course, kept up to date, remembered.

`grade` grades against the release of each assignment in ``DIR/work/release``. It is generated
(autograder.publishing.build) when the course's solutions changed since the last run, and each release it
replaces is kept in the assignment's history, beside the releases the course's git history
holds, so that a notebook handed in against an earlier release is not blamed for what changed
since (autograder.intake.repair's ``earlier``). A regenerated assignment leaves nbgrader's gradebook
first (nbgrader refuses to change the cells of an assignment with submissions).
"""
import json
import warnings
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry
from sqlalchemy.exc import SAWarning

from autograder.publishing.build import generate_release
from autograder.config import work_config
from autograder.journal import atomic_write, digest
from autograder.intake.repair import release_cells
from autograder.engine.versions import git_versions

__all__ = ["update_releases", "release_history", "git_releases"]


def history_path(work: Path, assignment: str) -> Path:
    return work / "release" / f".{assignment}.history.json"


def release_history(work: Path, assignment: str) -> list:
    """The assignment's releases into this DIR, oldest first: each {notebook: release_cells}."""
    try:
        history = json.loads(history_path(work, assignment).read_text())
    except (OSError, ValueError):
        return []
    return history if isinstance(history, list) else []


def git_releases(root: Path, assignment: str, name: str, limit: int = 30) -> list:
    """The released notebook ``lessons/<assignment>/<name>`` as each of its last ``limit``
    commits held it, oldest first, each as repair.release_cells: what students downloaded
    before this DIR existed. [] when the course is not a git checkout (or git is missing)."""
    return [release_cells(nb) for nb in git_versions(root, f"lessons/{assignment}/{name}", limit)]


def record_release(work: Path, assignment: str) -> None:
    """Append the assignment's current release to its history (when it differs from the last)."""
    folder = work / "release" / assignment
    if not folder.is_dir():
        return
    now = {p.name: release_cells(nbformat.read(p, as_version=4))
           for p in sorted(folder.glob("*.ipynb"))}
    history = release_history(work, assignment)
    if not history or history[-1] != now:
        atomic_write(history_path(work, assignment), json.dumps(history + [now], indent=1))


def forget_assignments(work: Path, assignments: list, db_url) -> None:
    """Remove ``assignments`` (their notebooks, cells and submissions) from the gradebook.

    nbgrader refuses to add, remove or change the cells of an assignment that has submissions
    ("Cannot add or remove cells ... there are submissions"), so a lesson changed after a
    batch could never be regraded into the same DIR. The journal (DIR/results/), not the
    gradebook, is the record of every grade: a result whose lesson is unchanged is reused from
    it, and every submission of a changed lesson is graded again, which recreates its rows.
    """
    config = work_config(work, db_url=db_url)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=SAWarning)
        with Gradebook(config.CourseDirectory.db_url, config.CourseDirectory.course_id) as gb:
            for a in assignments:
                try:
                    gb.remove_assignment(a)
                except MissingEntry:
                    pass


def update_releases(root: Path, work: Path, needed: list, db_url) -> None:
    """Generate the release of each needed assignment, unless its source is unchanged.

    A release replaced in this DIR is kept in the assignment's history (release_history), so
    that a notebook of an earlier release is not said to have deleted what was added since
    (autograder.intake.repair), and the assignment's stale rows leave the gradebook first
    (forget_assignments)."""
    stale = []
    for a in needed:
        src = Path(root) / "solutions" / a
        stamp = digest(*(p.read_bytes() for p in sorted(src.rglob("*")) if p.is_file()
                         and ".ipynb_checkpoints" not in p.parts and "__pycache__" not in p.parts))
        mark = work / "release" / f".{a}.digest"
        if not mark.is_file() or mark.read_text() != stamp + str(db_url):
            stale.append((a, mark, stamp))
    if stale:
        for a, _, _ in stale:
            record_release(work, a)   # a release made before histories were kept
        forget_assignments(work, [a for a, _, _ in stale], db_url)
        generate_release(root, [a for a, _, _ in stale], work, db_url)
        for a, mark, stamp in stale:
            record_release(work, a)
            atomic_write(mark, stamp + str(db_url))
