"""`demo`: write the fictional demo class from the catalogue and the released lessons."""
import filecmp
import json
import shutil
import tempfile
from pathlib import Path

import nbformat

__all__ = ["DEMO_DIR", "load_catalog", "student_notebook", "generate_demo", "check_demo", "write_demo"]

DEMO_DIR = Path(__file__).resolve().parent / "demo"
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def load_catalog(demo_dir: Path = DEMO_DIR) -> dict:
    """All catalogue files ``demo_dir/catalog/<assignment>.json``, keyed by assignment id."""
    catalogs = {}
    for path in sorted(Path(demo_dir, "catalog").glob("*.json")):
        with open(path) as f:
            cat = json.load(f)
        for key in ("assignment", "notebook", "students"):
            if key not in cat:
                raise ValueError(f"{path}: the catalogue lacks the key '{key}'.")
        catalogs[cat["assignment"]] = cat
    return catalogs


def _solution_answers(solution_nb) -> dict:
    """The solution cells' code as a student would type it (the BEGIN/END markers dropped)."""
    answers = {}
    for cell in solution_nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            lines = [ln for ln in cell.source.splitlines() if ln.strip() not in MARKERS]
            answers[meta["grade_id"]] = "\n".join(lines)
    return answers


def student_notebook(lesson_nb, answers: dict, where: str = "catalogue"):
    """A copy of the released ``lesson_nb`` with each listed solution cell's source replaced.

    ``answers`` maps grade_id -> cell source. Raises ValueError for a grade_id that is not a
    solution cell of the lesson (a typo in the catalogue would otherwise grade silently).
    """
    nb = nbformat.from_dict(json.loads(json.dumps(lesson_nb)))   # deep copy
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    for grade_id, source in answers.items():
        cell = cells.get(grade_id)
        if cell is None or not cell.metadata["nbgrader"].get("solution"):
            raise ValueError(f"{where}: '{grade_id}' is not a solution cell of the lesson; "
                             f"solution cells are {sorted(g for g, c in cells.items() if g and c.metadata['nbgrader'].get('solution'))}.")
        cell.source = source
    return nb


def generate_demo(root: Path, out: Path, demo_dir: Path = DEMO_DIR) -> list:
    """Write ``out/<student>/<assignment>/<notebook>`` for every catalogued student.

    Starts from ``root/lessons/<assignment>/<notebook>`` (run ``build`` first); students with
    ``"from_solution": true`` get every solution cell of ``root/solutions``. Returns the paths
    written. Raises FileNotFoundError when a lesson notebook is missing.
    """
    written = []
    for a, cat in load_catalog(demo_dir).items():
        lesson = Path(root) / "lessons" / a / cat["notebook"]
        if not lesson.is_file():
            raise FileNotFoundError(f"{lesson} is missing: run `python -m autograder build` first.")
        lesson_nb = nbformat.read(lesson, as_version=4)
        solution_nb = nbformat.read(Path(root) / "solutions" / a / cat["notebook"], as_version=4)
        for student, spec in cat["students"].items():
            answers = _solution_answers(solution_nb) if spec.get("from_solution") else {}
            answers.update(spec.get("answers", {}))
            nb = student_notebook(lesson_nb, answers, where=f"catalogue {a}, student {student}")
            path = Path(out) / student / a / cat["notebook"]
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, path)
            written.append(path)
    return written


def _files(folder: Path) -> set:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} \
        if folder.is_dir() else set()


def check_demo(root: Path, demo_dir: Path = DEMO_DIR) -> list:
    """Regenerate the demo class in a temporary folder; return the differing paths (relative)."""
    committed = Path(demo_dir) / "submissions"
    with tempfile.TemporaryDirectory(prefix="autograder-demo-") as tmp:
        generate_demo(root, Path(tmp), demo_dir)
        new, old = _files(Path(tmp)), _files(committed)
        return sorted(rel for rel in new | old
                      if rel not in new or rel not in old
                      or not filecmp.cmp(Path(tmp, rel), committed / rel, shallow=False))


def write_demo(root: Path, demo_dir: Path = DEMO_DIR) -> list:
    """Replace ``demo_dir/submissions`` by a freshly generated demo class; returns the paths."""
    target = Path(demo_dir) / "submissions"
    if target.exists():
        shutil.rmtree(target)
    return generate_demo(root, target, demo_dir)
