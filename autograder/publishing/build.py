"""`build`: generate the student notebooks in lessons/ from the instructor notebooks in solutions/."""
import filecmp
import shutil
import tempfile
from pathlib import Path

import nbformat
from nbgrader.apps import NbGraderAPI

from autograder.cells import grade_id_of, is_test_cell
from autograder.config import list_assignments, work_config
from autograder.mistakes import MISTAKES_FILE
from autograder.publishing.seeds import answer_results, student_table
from autograder.engine.audit import _rules_of
from autograder.engine.partial import last_expression_problems

SEED_TABLE = "seeds.md"   # a lesson's seed table (autograder.publishing.seeds), released without answer rows

__all__ = ["BuildError", "generate_release", "build", "check_build", "check_test_cells", "unread_rules"]


class BuildError(RuntimeError):
    """nbgrader could not generate a student version (bad cell metadata, unmatched markers)."""


def generate_release(root: Path, assignments, work: Path, db_url=None) -> Path:
    """Run nbgrader generate_assignment for ``assignments`` in the private course dir ``work``.

    Copies ``root/solutions/<id>/`` to ``work/source/<id>/`` and writes the student version to
    ``work/release/<id>/``; the gradebook is ``db_url`` or ``work/gradebook.db``. Returns
    ``work/release``.
    Raises BuildError with nbgrader's message when an assignment fails.
    """
    work = Path(work)
    for a in assignments:
        dest = work / "source" / a
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(Path(root) / "solutions" / a, dest,   # mistakes.json: for the grader only
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", MISTAKES_FILE))
    api = NbGraderAPI(config=work_config(work, db_url=db_url))
    for a in assignments:
        result = api.generate_assignment(a, force=True, create=True)
        if not result["success"]:
            detail = result.get("error", "").strip().splitlines()[-1:] or ["(no message)"]
            raise BuildError(f"nbgrader generate_assignment failed for solutions/{a}: {detail[0]}\n"
                             f"{result.get('log', '')}")
        _student_seed_table(Path(root) / "solutions" / a, work / "release" / a)
    return work / "release"


def _student_seed_table(source: Path, release: Path) -> None:
    """The release's seeds.md without the rows computed from exercise answers (the reference
    run's values would be the answers: autograder.publishing.seeds.answer_results)."""
    table = release / SEED_TABLE
    if not table.is_file():
        return
    hidden = [n for nb in sorted(source.glob("*.ipynb")) for n in answer_results(nbformat.read(nb, as_version=4))]
    table.write_text(student_table(table.read_text(), hidden))


def _files(folder: Path) -> set:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)}


def check_build(root: Path) -> list:
    """Regenerate every lesson in a temporary folder and compare it with ``lessons/``.

    Returns the differing paths relative to ``root`` (empty when in sync): files that differ,
    files missing from lessons/, stray files in lessons/<id>/, and lessons/<id>/ folders whose
    source is gone from solutions/.
    """
    root = Path(root)
    assignments = list_assignments(root)
    diffs = []
    with tempfile.TemporaryDirectory(prefix="autograder-build-") as tmp:
        release = generate_release(root, assignments, Path(tmp))
        for a in assignments:
            new, old = release / a, root / "lessons" / a
            have = _files(old) if old.is_dir() else set()
            for rel in sorted(_files(new) | have):
                if rel not in have or not (new / rel).is_file() or \
                        not filecmp.cmp(new / rel, old / rel, shallow=False):
                    diffs.append(f"lessons/{a}/{rel}")
    lessons = root / "lessons"
    if lessons.is_dir():
        for p in sorted(lessons.iterdir()):
            if p.is_dir() and not p.name.startswith(".") and p.name not in assignments:
                diffs.append(f"lessons/{p.name}/ (no solutions/{p.name}/)")
    return diffs


def check_test_cells(root: Path) -> list:
    """Test cells of ``solutions/`` that would not grade as their author means; [] when none.

    A test cell whose last statement is an expression is read as a partial-credit score
    (nbgrader's convention, autograder.engine.partial); one whose expression may carry a value of the
    student's code would be refused when grading (scored 0, sent for review), so it is reported
    here first: ``solutions/<id>/<nb>.ipynb: test cell 'x': <why>``. So is every exercise rule
    the grader cannot read (:func:`unread_rules`).
    """
    import nbformat

    root, found = Path(root), unread_rules(root)
    for a in list_assignments(root):
        for path in sorted((root / "solutions" / a).glob("*.ipynb")):
            for cell in nbformat.read(path, as_version=4).cells:
                if not is_test_cell(cell):
                    continue
                found += [f"{path.relative_to(root).as_posix()}: test cell "
                          f"'{grade_id_of(cell)}': {why}"
                          for why in last_expression_problems(cell.source)]
    return found


def unread_rules(root: Path) -> list:
    """Every exercise rule in a test cell of ``solutions/`` that the grader cannot read on its
    trusted side (autograder.engine.audit._rules_of: an argument it cannot resolve without running
    the cell), one line each: ``solutions/<id>/<nb>.ipynb: test cell 'x' (cell N): the rule
    rules.f(fn, ...) cannot be read: its instead=NAME: why``. Such a rule would leave its lesson's
    rule unread when grading, so it is the author's error; [] when every rule is read."""
    root, found = Path(root), []
    for a in list_assignments(root):
        for path in sorted((root / "solutions" / a).glob("*.ipynb")):
            for number, cell in enumerate(nbformat.read(path, as_version=4).cells, start=1):
                if not is_test_cell(cell):
                    continue
                problems = []
                _rules_of(cell.source, problems)
                found += [f"{path.relative_to(root).as_posix()}: test cell '{grade_id_of(cell)}' "
                          f"(cell {number}): {why}" for why in problems]
    return found


def build(root: Path) -> list:
    """Regenerate ``lessons/<id>/`` for every ``solutions/<id>/``; returns the ids written.

    Each lessons/<id>/ folder is replaced as a whole, so it holds exactly what nbgrader
    generates. The temporary gradebook is deleted; nothing else is written in the checkout.
    Raises BuildError, before writing anything, when an exercise rule cannot be read
    (:func:`unread_rules`): a lesson is never released with a rule the grader would not read.
    """
    root = Path(root)
    unread = unread_rules(root)
    if unread:
        raise BuildError("exercise rules the grader cannot read (bind their arguments to "
                         "constants in the test cell, before the rule's call):\n  " + "\n  ".join(unread))
    assignments = list_assignments(root)
    with tempfile.TemporaryDirectory(prefix="autograder-build-") as tmp:
        release = generate_release(root, assignments, Path(tmp))
        for a in assignments:
            dest = root / "lessons" / a
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(release / a, dest)
    return assignments
