"""`demo`: write the fictional demo class from the catalogue and the released lessons."""
import filecmp
import json
import shutil
import tempfile
from pathlib import Path

import nbformat

from autograder.cells import grade_id_of, is_solution
from autograder.mistakes import NO_MATCH, load_mistakes, match_mistake
from autograder.engine.dryrun import run_exercises

__all__ = ["DEMO_DIR", "load_catalog", "student_notebook", "generate_demo", "check_demo", "write_demo",
           "sample_students", "write_sample", "demo_answers", "check_hints", "format_hint_report"]

DEMO_DIR = Path(__file__).resolve().parents[1] / "demo"
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
        if is_solution(cell):
            lines = [ln for ln in cell.source.splitlines() if ln.strip() not in MARKERS]
            answers[grade_id_of(cell)] = "\n".join(lines)
    return answers


def student_notebook(lesson_nb, answers: dict, where: str = "catalogue"):
    """A copy of the released ``lesson_nb`` with each listed solution cell's source replaced.

    ``answers`` maps grade_id -> cell source. Raises ValueError for a grade_id that is not a
    solution cell of the lesson (a typo in the catalogue would otherwise grade silently).
    """
    nb = nbformat.from_dict(json.loads(json.dumps(lesson_nb)))   # deep copy
    cells = {grade_id_of(c): c for c in nb.cells}
    for grade_id, source in answers.items():
        cell = cells.get(grade_id)
        if cell is None or not is_solution(cell):
            raise ValueError(f"{where}: '{grade_id}' is not a solution cell of the lesson; "
                             f"solution cells are {sorted(g for g, c in cells.items() if g and is_solution(c))}.")
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


# ----------------------------------------------------------------------------- a quick sample
def sample_students(per_lesson: int, demo_dir: Path = DEMO_DIR) -> list:
    """(assignment, student) pairs: ``per_lesson`` catalogued students of each lesson: the first
    one with a single typical mistake (a partial score and a hint to read), then the first
    all-correct one, then the others in catalogue order. Raises ValueError when ``per_lesson`` < 1."""
    if per_lesson < 1:
        raise ValueError(f"--sample needs at least 1 student per lesson, not {per_lesson}.")
    picked = []
    for a, cat in load_catalog(demo_dir).items():
        students = cat["students"]

        def rank(student):
            expect = students[student]["expect"]
            if len(expect["hints"]) == 1 and 0 < expect["score"] < expect["max_score"]:
                return 0
            return 1 if students[student].get("from_solution") and not expect["hints"] else 2
        mistakes, correct = [s for s in students if rank(s) == 0], [s for s in students if rank(s) == 1]
        order = mistakes[:1] + correct[:1]
        order += [s for s in students if s not in order]
        picked += [(a, s) for s in order[:per_lesson]]
    return picked


def write_sample(dest: Path, per_lesson: int, demo_dir: Path = DEMO_DIR) -> tuple:
    """Copy the committed notebooks of ``sample_students(per_lesson)`` to
    ``dest/<student>/<assignment>/`` (replacing ``dest``); returns (the pairs, the number of
    submissions in the whole demo class)."""
    picked = sample_students(per_lesson, demo_dir)
    source = Path(demo_dir) / "submissions"
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    for a, student in picked:
        shutil.copytree(source / student / a, dest / student / a)
    total = sum(len(cat["students"]) for cat in load_catalog(demo_dir).values())
    return picked, total


# ----------------------------------------------------------------------------- the hints check
def demo_answers(solution_nb, spec: dict, blank_nb) -> dict:
    """{grade_id: source} of every answer cell of a catalogued student: the solution's answers
    (markers dropped) for a ``from_solution`` student, else the released lesson's (``blank_nb``),
    then the catalogue's own answers on top, as ``generate_demo`` writes them."""
    answers = _solution_answers(solution_nb) if spec.get("from_solution") else {
        grade_id_of(c): c.source for c in blank_nb.cells if is_solution(c)}
    answers.update(spec.get("answers", {}))
    return answers


def _released_answers(solution_nb):
    """The solution notebook with each answer cleared as nbgrader releases it (no gradebook)."""
    from nbgrader.preprocessors import ClearSolutions
    nb = nbformat.from_dict(json.loads(json.dumps(solution_nb)))
    ClearSolutions().preprocess(nb, {})
    return nb


def check_hints(root: Path, demo_dir: Path = DEMO_DIR, progress: bool = False, students=None) -> tuple:
    """Grade every catalogued demo student in this process (autograder.engine.dryrun) against the
    current ``solutions/`` and compare with the catalogue's ``expect``.

    Each student is rebuilt from the solution notebook (not from lessons/ or the committed demo
    notebooks, which may lag behind an edit) with the catalogue's answers. Returns (problems,
    number of students checked); each problem is a dict with ``assignment``, ``student``,
    ``test`` (None for the score alone), ``expected`` and ``got``, ready for
    :func:`format_hint_report`. ``students``: only these student ids (default: all).
    """
    from tqdm.auto import tqdm

    problems, checked = [], 0
    catalogs = load_catalog(demo_dir)
    chosen = {a: {s: spec for s, spec in cat["students"].items() if students is None or s in students}
              for a, cat in catalogs.items()}
    mistakes = {a: load_mistakes(Path(root), a) for a in catalogs}
    bar = tqdm(total=sum(map(len, chosen.values())), desc="demo hints",
               unit="student", disable=not progress)
    for a, cat in catalogs.items():
        if not chosen[a]:
            continue
        path = Path(root) / "solutions" / a / cat["notebook"]
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing; the catalogue {a}.json needs it.")
        solution = nbformat.read(path, as_version=4)
        blank = _released_answers(solution)
        for student, spec in chosen[a].items():
            answers = demo_answers(solution, spec, blank)
            nb = student_notebook(blank, answers, where=f"catalogue {a}, student {student}")
            outcomes = run_exercises(nb, solution, path.parent)
            problems += _compare(a, student, spec["expect"], outcomes, mistakes[a])
            checked += 1
            bar.update()
    bar.close()
    return problems, checked


def _compare(a, student, expect, outcomes, mistakes=None) -> list:
    """Problems of one student: a hint not drawn, a score that moved, or (with the lesson's
    ``mistakes`` catalogue) a hint that the class report would file under another mistake id."""
    found = []
    ids = dict(zip(expect["hints"], expect.get("mistakes", []))) if mistakes else {}
    partial = expect.get("partial", {})     # {test: points} of a test that gives part of its points
    for test, hint in expect["hints"].items():
        got = outcomes.get(test)
        if got is None:
            found.append(dict(assignment=a, student=student, test=test, expected=hint,
                              got="no such test in the lesson any more"))
        elif got.passed:
            found.append(dict(assignment=a, student=student, test=test, expected=hint, got="passes"))
        elif got.score != partial.get(test, 0):
            found.append(dict(assignment=a, student=student, test=test, expected=hint,
                              got=f"{got.score:g} of its {got.points:g} points, not the "
                                  f"{partial.get(test, 0):g} catalogued (\"partial\"): {got.error}"))
        elif hint not in got.error:
            found.append(dict(assignment=a, student=student, test=test, expected=hint, got=got.error))
        elif test in ids and (match_mistake(mistakes, test, got.error) or NO_MATCH) != ids[test]:
            filed = match_mistake(mistakes, test, got.error) or NO_MATCH
            found.append(dict(assignment=a, student=student, test=test, expected=hint,
                              got=f"the hint, but the class report files it under the mistake {filed!r}, "
                                  f"not {ids[test]!r} (solutions/{a}/mistakes.json: make its hint "
                                  "piece one that only this mistake's hint contains)"))
    score = sum(o.score for o in outcomes.values())
    total = sum(o.points for o in outcomes.values())
    if (score, total) != (expect["score"], expect["max_score"]):
        others = [f"{t} {'passes' if o.passed else 'fails: ' + o.error}" for t, o in outcomes.items()
                  if t not in expect["hints"] and not o.passed]
        found.append(dict(assignment=a, student=student, test=None,
                          expected=f"score {expect['score']:g}/{expect['max_score']:g}",
                          got=f"score {score:g}/{total:g}" + (f" ({'; '.join(others)})" if others else "")))
    return found


def format_hint_report(problems: list, checked: int) -> str:
    """The check's report: one paragraph per problem naming the student, the exercise, the hint
    it was built for and what it gets now; or one line saying all is well."""
    if not problems:
        return f"every demo student ({checked}) still gets the score and hints it was built for"
    lines = [f"{len(problems)} demo answer(s) no longer show the mistake they were built for "
             f"({checked} students checked):"]
    for p in problems:
        where = f"{p['assignment']}, student {p['student']}"
        if p["test"] is None:
            lines.append(f"- {where}: catalogued {p['expected']}, now {p['got']}")
        else:
            now = ("it passes" if p["got"] == "passes" else p["got"] if p["got"].startswith("no such")
                   else f"it draws {p['got']}" if p["got"].startswith("the hint, but")
                   else f"it gets: {p['got']}")
            lines.append(f"- {where}, exercise {p['test']}: built to draw the hint {p['expected']!r}; now {now}")
    lines.append("Fix the exercise or the student's answer and expectation in "
                 "autograder/demo/catalog/<lesson>.json, then `make lessons`.")
    return "\n".join(lines)
