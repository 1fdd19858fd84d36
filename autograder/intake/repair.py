"""Repair a submitted notebook against the released lesson before nbgrader sees it.

Students, browsers and Colab break notebooks in a few typical ways. nbgrader refuses some of
them (a duplicated graded cell stops its autograde) and scores others wrongly (a test cell that
lost its metadata is no longer graded; a deleted test cell scores as "needs manual grading").
:func:`repair_notebook` puts the released lesson's structure back and returns one note per
change, which the per-student status reports:

- every cell of the release that carries nbgrader metadata (solution, test, read-only, task) is
  found in the submission: by its ``grade_id``, else by its cell id, else by source similarity
  (``difflib`` ratio over tokens, exact only for the few candidates whose cheap upper bound can
  win, so linear in the notebook's size) among the unmatched cells between its matched
  neighbours; its metadata,
  cell type and (for read-only and test cells) source are restored from the release;
- a duplicated graded cell keeps its last copy; earlier copies become ordinary cells;
- a deleted cell is inserted again from the release (a deleted solution cell comes back blank);
- grader metadata on cells the release does not know is removed;
- the kernelspec is set to the release's; notebooks older than nbformat 4.5 get cell ids.

A lesson may change after students got it. Given the lesson's earlier releases
(:func:`release_cells` of each), a notebook that matches an earlier release is told so instead
of being blamed: a cell added since is "added to the lesson after this notebook was released",
a locked cell whose text is an earlier release's was "changed in the lesson since", and a
graded cell the lesson no longer has was "removed from the lesson".
"""
import copy
import difflib
import hashlib
import json
import re
import uuid
from collections import Counter

import nbformat

from mlexp.check import normal_text

from autograder.cells import nbgrader_meta

__all__ = ["repair_notebook", "read_notebook_text", "not_a_notebook", "SubmissionRejected",
           "normalise_name", "release_cells"]

SIMILAR_TEST = 0.6       # a test or read-only cell must look this much like the release's
SIMILAR_SOLUTION = 0.3   # a solution cell is the student's code; only its frame must match
CELL_ID = re.compile(r"^[a-zA-Z0-9-_]{1,64}$")
MAX_EXACT = 64           # exact comparisons per release cell at most, best upper bounds first
GRADE_KEYS = ("grade", "solution", "locked", "points", "task")   # what a student may not change


class SubmissionRejected(ValueError):
    """The file cannot be graded at all (empty, too large, not JSON, not a notebook)."""


def normalise_name(name: str) -> str:
    """``'Copy of toy (1).ipynb'`` -> ``'toy.ipynb'``: undo what browsers, Colab and LMSs add."""
    stem = re.sub(r"\.ipynb$", "", name.strip(), flags=re.I)
    stem = re.sub(r"^(copy of |kopie von |copie de )+", "", stem, flags=re.I)
    stem = re.sub(r"(\s*\(\d+\)|\s*-\s*copy|-checkpoint|_\d+|-\d+)+$", "", stem, flags=re.I)
    return stem.strip().lower().replace(" ", "_") + ".ipynb"


def read_notebook_text(data: bytes, max_bytes: int):
    """Parse submitted bytes into an nbformat 4 notebook; returns (nb, notes).

    Raises SubmissionRejected with a reason a student understands: empty file, too large
    (over ``max_bytes``), not valid JSON, or JSON that is not a Jupyter notebook.
    """
    if not data.strip():
        return _reject("the file is empty (0 bytes or only whitespace); re-download it from "
                       "Jupyter or Colab with File > Download .ipynb")
    if len(data) > max_bytes:
        return _reject(f"the file is {len(data) / 2**20:.2g} MiB, over the {max_bytes / 2**20:g}"
                       " MiB limit; clear the outputs (Edit > Clear all outputs) and resubmit")
    try:
        text = data.decode("utf-8-sig")
        shape = not_a_notebook(json.loads(text))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return _reject(f"not valid notebook JSON ({str(exc)[:120]})")
    if shape:
        return _reject(f"valid JSON but not a Jupyter notebook: {shape}")
    try:
        raw = nbformat.reader.reads(text)
    except Exception as exc:
        return _reject(f"a notebook nbformat cannot read ({type(exc).__name__}: {str(exc)[:120]})")
    notes = []
    major, minor = raw.get("nbformat", 0), raw.get("nbformat_minor", 0)
    try:
        nb = nbformat.convert(nbformat.from_dict(raw), 4)
    except Exception as exc:
        return _reject(f"a notebook nbformat cannot read ({type(exc).__name__}: {str(exc)[:120]})")
    if major < 4:
        notes.append(f"converted from nbformat {major}")
    if (major, minor) < (4, 5) or any(not CELL_ID.match(str(c.get("id", ""))) for c in nb.cells):
        if major == 4:
            notes.append(f"nbformat 4.{minor} without cell ids: added ids")
    nb.nbformat, nb.nbformat_minor = 4, 5
    return nb, notes


def _what(value) -> str:
    """A JSON value named for a reader: 'a list', 'the number 3', 'the string "abc"'."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return f"the number {value!r}"[:60]
    if isinstance(value, str):
        return f"the string {json.dumps(value[:30])}"
    return "a list" if isinstance(value, list) else "an object"


def _cells_problem(cells, where: str) -> str:
    if not isinstance(cells, list):
        return f"{where} is {_what(cells)}, not a list of cells"
    for i, cell in enumerate(cells, 1):
        if not isinstance(cell, dict):
            return f"cell {i} is {_what(cell)}, not a cell object"
        if not isinstance(cell.get("cell_type"), str):
            return f"cell {i} has no 'cell_type'"
        for key in ("source", "input"):   # v4 'source', v3 code cells 'input'
            value = cell.get(key, "")
            if not (isinstance(value, str) or isinstance(value, list)
                    and all(isinstance(line, str) for line in value)):
                return f"cell {i}'s '{key}' is {_what(value)}, not text"
        if "metadata" in cell and not isinstance(cell["metadata"], dict):
            return f"cell {i}'s 'metadata' is {_what(cell['metadata'])}, not an object"
        if "outputs" in cell and not isinstance(cell["outputs"], list):
            return f"cell {i}'s 'outputs' is {_what(cell['outputs'])}, not a list"
    return ""


def not_a_notebook(raw) -> str:
    """Why the parsed JSON ``raw`` is not a Jupyter notebook, or "" when it has a notebook's shape.

    Checks what nbformat and the repair rely on before they touch it: an object with a version
    number and a list of cell objects (``cells``, or nbformat 3's ``worksheets``), each with a
    ``cell_type`` and text source. Finer errors are left to nbformat and the repair.
    """
    if not isinstance(raw, dict):
        return f"the file holds {_what(raw)}; a notebook is a JSON object with 'cells'"
    version = raw.get("nbformat", 4)
    if isinstance(version, bool) or not isinstance(version, int):
        return f"'nbformat' is {_what(version)}, not a version number"
    if not isinstance(raw.get("metadata", {}), dict):
        return f"'metadata' is {_what(raw['metadata'])}, not an object"
    if "cells" in raw:
        return _cells_problem(raw["cells"], "'cells'")
    if "worksheets" in raw:
        sheets = raw["worksheets"]
        if not isinstance(sheets, list) or not all(isinstance(w, dict) for w in sheets):
            return f"'worksheets' is {_what(sheets)}, not a list of worksheets"
        problems = (_cells_problem(w.get("cells", []), "a worksheet's 'cells'") for w in sheets)
        return next((p for p in problems if p), "")
    keys = ", ".join(f"'{k}'" for k in list(raw)[:4]) or "none"
    return f"an object without 'cells' (its keys: {keys})"


def _reject(reason: str):
    raise SubmissionRejected(reason)


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


WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _repair_widget_state(nb) -> str:
    """Give the notebook's saved widget state the shape nbconvert reads, or drop it; the note
    ("" when nothing was wrong).

    The widget state lives in ``metadata.widgets["application/vnd.jupyter.widget-state+json"]``
    as ``{"state": {model id: model}, "version_major": 2, "version_minor": 0}`` (the
    ipywidgets embedding format). Google Colab saves the models without the ``"state"`` level,
    and nbconvert's HTML export then fails on the first widget output (KeyError 'state'): no
    feedback page. Models saved flat are wrapped; anything else unreadable is dropped (a widget
    output then shows its text fallback)."""
    widgets = nb.metadata.get("widgets")
    if widgets is None:
        return ""
    saved = widgets.get(WIDGET_STATE) if isinstance(widgets, dict) else None
    if isinstance(saved, dict) and isinstance(saved.get("state"), dict):
        return ""
    if isinstance(saved, dict) and saved and all(isinstance(m, dict) for m in saved.values()):
        widgets[WIDGET_STATE] = {"state": saved, "version_major": 2, "version_minor": 0}
        return ("the notebook's widget state was saved without its 'state' level (as Colab "
                "saves it): put back in the shape the feedback page reads")
    nb.metadata.pop("widgets")
    return "the notebook's widget state could not be read: removed (widgets show as text)"


def repair_notebook(nb, release, sources: dict, earlier=()) -> list:
    """Repair ``nb`` in place against the ``release`` notebook; return the notes (may be []).

    ``sources`` maps grade_id -> the instructor's version of each test cell (hidden tests
    included): a submitted test cell equal to it, or to the release, is not reported as edited.
    ``earlier``: the lesson's earlier releases, each as :func:`release_cells` gives it, so that
    a notebook of an earlier release is not reported as having deleted or edited what the
    lesson added or changed since.
    """
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
    note = _repair_widget_state(nb)
    if note:
        notes.append(note)
    kernel = nb.metadata.get("kernelspec", {}).get("name")
    want = release.metadata.get("kernelspec", {})
    if want and kernel != want.get("name"):
        notes.append(f"kernel '{kernel or 'none'}' replaced by '{want.get('name')}'")
        nb.metadata["kernelspec"] = copy.deepcopy(want)
    return notes
