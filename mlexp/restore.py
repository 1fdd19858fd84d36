"""The one rule for putting a lesson's graded cells back into a notebook, and for finding the lesson
from a file name: ``python -m mlexp.check`` (the student's check), ``python -m autograder check``
and ``grade`` (``autograder.intake.repair``) all call this module, so that the three give the same
verdicts on the same notebook (issue 52, item 2). It lives in mlexp because the student edition
ships mlexp and not the grader; it needs only the standard library and nbformat.

- :func:`normalise_name`: the lesson notebook a file name is a copy of, once what browsers,
  Colab, JupyterLab and LMSs add is undone (``Copy of x (2).ipynb``, ``x-Copy1.ipynb``,
  ``x-checkpoint.ipynb``, ``x (1).ipynb``, ``x - Copy.ipynb``, ``x_2.ipynb``);
  :func:`find_lesson` finds it in a ``lessons/`` folder.
- :func:`restore_cells`: every cell of the release that carries nbgrader metadata (solution,
  test, read-only, task) is found in the notebook by its ``grade_id``, else by its cell id, else
  by source similarity (``difflib`` ratio over tokens, exact only for the few candidates whose
  cheap upper bound can win, so linear in the notebook's size) among the unmatched cells between
  its matched neighbours; its metadata, cell type (a test turned markdown or raw is code again)
  and (for read-only and test cells) source are restored from the release; a duplicated graded
  cell keeps its last copy and earlier copies become ordinary cells; a deleted cell is inserted
  again (a deleted solution cell comes back blank); grader metadata on cells the release does
  not know is removed; cell ids are made unique.
"""
import copy
import difflib
import hashlib
import re
import uuid
from collections import Counter
from pathlib import Path

__all__ = ["nbgrader_meta", "normal_text", "normalise_name", "find_lesson", "restore_cells",
           "release_cells"]

SIMILAR_TEST = 0.6       # a test or read-only cell must look this much like the release's
SIMILAR_SOLUTION = 0.3   # a solution cell is the student's code; only its frame must match
CELL_ID = re.compile(r"^[a-zA-Z0-9-_]{1,64}$")
MAX_EXACT = 64           # exact comparisons per release cell at most, best upper bounds first
GRADE_KEYS = ("grade", "solution", "locked", "points", "task")   # what a student may not change


def nbgrader_meta(cell) -> dict:
    """The cell's nbgrader metadata, {} when it has none (mlexp's one accessor: the grader reads
    it through ``autograder.cells``; mlexp never imports the grader)."""
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def normal_text(text: str) -> str:
    """``text`` as compared, not as stored: line endings made ``\\n``, trailing whitespace of
    each line and blank lines at either end dropped (what Jupyter, Colab and editors change)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n")


COPY_PREFIX = re.compile(r"^(copy of |kopie von |copie de )+", re.I)
# " (1)" (browsers), "-Copy1" (JupyterLab's Duplicate), " - Copy" (Windows), "-checkpoint",
# "_2" / "-2" (LMS resubmissions)
COPY_SUFFIX = re.compile(r"(\s*\(\d+\)|\s*-\s*copy\d*|-checkpoint|_\d+|-\d+)+$", re.I)


def normalise_name(name: str) -> str:
    """``'Copy of toy (1).ipynb'``, ``'toy-Copy1.ipynb'`` -> ``'toy.ipynb'``: undo what browsers,
    Colab, JupyterLab and LMSs add to a notebook's file name."""
    stem = re.sub(r"\.ipynb$", "", name.strip(), flags=re.I)
    stem = COPY_SUFFIX.sub("", COPY_PREFIX.sub("", stem))
    return stem.strip().lower().replace(" ", "_") + ".ipynb"


def find_lesson(name: str, lessons) -> "Path | None":
    """The lesson notebook ``lessons/<id>/<id>.ipynb`` that a file called ``name`` is a copy of
    (:func:`normalise_name`), or None; ``lessons`` is a course's lessons folder."""
    lessons, want = Path(lessons), normalise_name(Path(name).name)
    if not lessons.is_dir():
        return None
    for folder in sorted(p for p in lessons.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for candidate in sorted(folder.glob("*.ipynb")):
            if normalise_name(candidate.name) == want and candidate.is_file():
                return candidate
    return None


def _kind(meta: dict) -> str:
    if meta.get("solution"):
        return "solution cell"
    if meta.get("grade"):
        return "test cell"
    if meta.get("task"):
        return "task cell"
    return "read-only cell"


TOKEN = re.compile(r"\w+|\S")


class _Text:
    """One cell's source prepared for comparison: normalised text, tokens, token counts."""
    __slots__ = ("text", "tokens", "counts")

    def __init__(self, source: str):
        self.text = normal_text(source)
        self.tokens = TOKEN.findall(self.text)
        self.counts = Counter(self.tokens)


def _bound(a: "_Text", b: "_Text", need: float) -> float:
    """An upper bound of :func:`_similarity` (difflib's ``real_quick_ratio``, then, when that
    reaches ``need``, ``quick_ratio`` from the counts made once per cell): linear in the
    distinct tokens, never in the product of the lengths."""
    la, lb = len(a.tokens), len(b.tokens)
    if not la + lb:
        return 1.0
    bound = 2 * min(la, lb) / (la + lb)
    if bound < need:
        return bound
    small, large = (a.counts, b.counts) if len(a.counts) < len(b.counts) else (b.counts, a.counts)
    return 2 * sum(min(n, large.get(t, 0)) for t, n in small.items()) / (la + lb)


def _similarity(a: "_Text", b: "_Text") -> float:
    """How much two cells look alike, 0..1: difflib's ratio over their tokens (words and single
    symbols, whitespace ignored); 1.0 for equal normalised text."""
    if a.text == b.text:
        return 1.0
    return difflib.SequenceMatcher(None, a.tokens, b.tokens, autojunk=False).ratio()


def _best_match(key: "_Text", candidates: list, need: float):
    """(score, index) of the candidate most like ``key``, or (0.0, None);
    ``candidates`` are (index, _Text). Exact scores are computed in order of their upper bound,
    stopping when no candidate left can beat the best, and for at most MAX_EXACT of them: linear
    in the number of candidates, each exact comparison bounded by the release's own cell (the
    length bound keeps out cells more than a few times its size)."""
    same = [j for j, t in candidates if t.text == key.text]
    if same:
        return 1.0, same[0]
    bounded = sorted(((_bound(key, t, need), j, t) for j, t in candidates),
                     key=lambda x: (-x[0], x[1]))
    best, best_j = 0.0, None
    for n, (bound, j, text) in enumerate(bounded):
        if bound < need or bound <= best or n >= MAX_EXACT:
            break
        score = _similarity(text, key)
        if score > best:
            best, best_j = score, j
    return best, best_j


def _text_digest(source: str) -> str:
    return hashlib.sha256(normal_text(source).encode()).hexdigest()[:16]


def release_cells(release) -> dict:
    """{grade_id: digest of its source} for every cell of a released notebook with grader
    metadata: what :func:`repair_notebook` compares a submission with (``earlier``)."""
    return {nbgrader_meta(c)["grade_id"]: _text_digest(c.source) for c in release.cells
            if nbgrader_meta(c).get("grade_id")}


def _match(sub_cells, keys, notes, retired=()) -> dict:
    """Map release key index -> submission cell index; demotes duplicate copies in place.

    ``retired``: grade ids of earlier releases that the lesson no longer has."""
    key_ids = {nbgrader_meta(c)["grade_id"]: i for i, c in enumerate(keys)}
    matched, by_gid = {}, {}
    for j, cell in enumerate(sub_cells):
        gid = nbgrader_meta(cell).get("grade_id")
        if gid in key_ids:
            by_gid.setdefault(gid, []).append(j)
        elif nbgrader_meta(cell):
            notes.append(f"{_kind(nbgrader_meta(cell))} '{gid}' was removed from the lesson after this "
                         "notebook was released: not graded" if gid in retired else
                         f"removed grader metadata from a cell the lesson does not have ('{gid}')")
            cell.metadata.pop("nbgrader", None)
    for gid, js in by_gid.items():
        if len(js) > 1:
            notes.append(f"{_kind(nbgrader_meta(keys[key_ids[gid]]))} '{gid}' appeared {len(js)} times: "
                         "kept the last copy")
            for j in js[:-1]:
                sub_cells[j].metadata.pop("nbgrader", None)
        matched[key_ids[gid]] = js[-1]
    taken = set(matched.values())
    ids = {c.get("id"): j for j, c in enumerate(sub_cells)}
    by_id, by_source = [], []
    for i, key in enumerate(keys):
        j = ids.get(key.get("id"))
        if i not in matched and j is not None and j not in taken and not nbgrader_meta(sub_cells[j]):
            matched[i], taken = j, taken | {j}
            by_id.append(nbgrader_meta(key)["grade_id"])
    prepared = {}

    def texts(cells, j):   # each cell prepared once, whatever the number of release cells
        at = (id(cells), j)
        if at not in prepared:
            prepared[at] = _Text(cells[j].source)
        return prepared[at]

    # Test and read-only cells first (their source is fixed), then solution cells between them.
    for i in sorted(range(len(keys)), key=lambda i: bool(nbgrader_meta(keys[i]).get("solution"))):
        key = keys[i]
        if i in matched:
            continue
        lo = max([matched[k] for k in matched if k < i], default=-1)
        hi = min([matched[k] for k in matched if k > i], default=len(sub_cells))
        meta = nbgrader_meta(key)
        need = SIMILAR_SOLUTION if meta.get("solution") else SIMILAR_TEST
        free = [j for j in range(lo + 1, hi) if j not in taken and not nbgrader_meta(sub_cells[j])]
        best, best_j = _best_match(texts(keys, i), [(j, texts(sub_cells, j)) for j in free],
                                   need)
        window = [j for j in free if sub_cells[j].cell_type == "code"]
        if best_j is not None and best >= need:
            matched[i], taken = best_j, taken | {best_j}
            by_source.append(f"{meta['grade_id']} {best:.2f}")
        elif meta.get("solution") and window and hi < len(sub_cells):
            # a solution cell sits right before its test: take the last free code cell there
            matched[i], taken = window[-1], taken | {window[-1]}
            by_source.append(f"{meta['grade_id']} by position")
    if by_id:
        notes.append(f"grader metadata lost on {len(by_id)} cell(s): re-attached by cell id "
                     f"({', '.join(by_id)})")
    if by_source:
        notes.append(f"grader metadata lost on {len(by_source)} cell(s): re-attached by source "
                     f"similarity ({', '.join(by_source)})")
    return matched


def _predates(missing: set, current: set, earlier) -> set:
    """The missing cells explained by an earlier release: the largest set of cells added since
    one of them that the submission lacks entirely (a notebook of that release lacks them all)."""
    best = set()
    for cells in earlier:
        added = current - set(cells)
        if added and added <= missing and len(added) > len(best):
            best = added
    return best



def restore_cells(nb, release, sources=None, earlier=()) -> list:
    """Put the ``release`` notebook's graded cells back into ``nb`` (in place, as the module's
    docstring says); return one note per change (may be []).

    ``sources`` maps grade_id -> the instructor's version of each test cell (hidden tests
    included): a submitted test cell equal to it, or to the release, is not reported as edited.
    ``earlier``: the lesson's earlier releases, each as :func:`release_cells` gives it, so that
    a notebook of an earlier release is not reported as having deleted or edited what the
    lesson added or changed since.
    """
    import nbformat   # here, so that mlexp.check says itself when nbformat is missing

    sources = sources or {}
    notes = []
    keys = [c for c in release.cells if nbgrader_meta(c).get("grade_id")]
    current = {nbgrader_meta(c)["grade_id"] for c in keys}
    retired = {g for cells in earlier for g in cells} - current
    matched = _match(nb.cells, keys, notes, retired)
    added = _predates({nbgrader_meta(keys[i])["grade_id"] for i in range(len(keys)) if i not in matched},
                      current, earlier)
    old_texts = {}
    for cells in earlier:
        for gid, text in cells.items():
            old_texts.setdefault(gid, set()).add(text)
    # Insert deleted cells after the cell matched to the previous key, walking in release order.
    cells = list(nb.cells)
    position = {i: cells[j] for i, j in matched.items()}
    for i, key in enumerate(keys):
        if i in position:
            continue
        fresh = nbformat.from_dict(copy.deepcopy(key))
        fresh["id"] = uuid.uuid4().hex[:12]
        prev = position.get(i - 1)
        at = (next(k for k, c in enumerate(cells) if c is prev) + 1) if prev is not None else 0
        cells.insert(at, fresh)
        position[i] = fresh
        meta = nbgrader_meta(key)
        if meta["grade_id"] in added:
            what = "put in blank" if meta.get("solution") else "it was put in"
            notes.append(f"{_kind(meta)} '{meta['grade_id']}' was added to the lesson after "
                         f"this notebook was released: {what}")
            continue
        what = "put back blank" if meta.get("solution") else "restored from the lesson"
        notes.append(f"{_kind(meta)} '{meta['grade_id']}' was deleted: {what}")
    for i, key in enumerate(keys):
        cell, meta = position[i], nbgrader_meta(key)
        if cell.cell_type != key.cell_type:
            notes.append(f"{_kind(meta)} '{meta['grade_id']}' had been changed to "
                         f"{cell.cell_type}: changed back to {key.cell_type}")
            cell.cell_type = key.cell_type
            if key.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
            else:
                cell.pop("outputs", None)
                cell.pop("execution_count", None)
        had = nbgrader_meta(cell)
        changed = sorted(k for k in GRADE_KEYS if had and had.get(k, meta.get(k)) != meta.get(k))
        if changed:   # a graded cell kept its id but not its points or role: not an accident
            notes.append(f"grader settings of {_kind(meta)} '{meta['grade_id']}' had been "
                         f"changed ({', '.join(changed)}): restored")
        cell.metadata["nbgrader"] = copy.deepcopy(dict(meta))
        for flag in ("deletable", "editable"):
            if flag in key.metadata:
                cell.metadata[flag] = key.metadata[flag]
        if meta.get("locked") and not meta.get("solution") and cell.source != key.source:
            if _text_digest(cell.source) in old_texts.get(meta["grade_id"], ()):
                notes.append(f"{_kind(meta)} '{meta['grade_id']}' was changed in the lesson "
                             "after this notebook was released: the new version was put in")
            elif normal_text(cell.source) not in {normal_text(key.source), normal_text(
                    sources.get(meta["grade_id"], key.source))}:
                notes.append(f"{_kind(meta)} '{meta['grade_id']}' had been edited: restored")
            cell.source = key.source
    nb.cells = cells
    seen = set()
    for cell in nb.cells:   # unique, valid cell ids (duplicated cells share theirs)
        if not CELL_ID.match(str(cell.get("id", ""))) or cell["id"] in seen:
            cell["id"] = uuid.uuid4().hex[:12]
        seen.add(cell["id"])
    return notes
