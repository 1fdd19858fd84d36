"""Repair a submitted notebook against the released lesson before nbgrader sees it.

Students, browsers and Colab break notebooks in a few typical ways. nbgrader refuses some of
them (a duplicated graded cell stops its autograde) and scores others wrongly (a test cell that
lost its metadata is no longer graded; a deleted test cell scores as "needs manual grading").
:func:`repair_notebook` puts the released lesson's structure back and returns one note per
change, which the per-student status reports. The rules of the cells are
:func:`mlexp.restore.restore_cells` (and a file's lesson, :func:`mlexp.restore.normalise_name`),
which the student's check (``python -m mlexp.check``) and the grader's ``check`` call too: one
rule, so the three give the same verdicts on the same notebook (issue 52, item 2). What it does:

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
import json

import nbformat

from mlexp.restore import CELL_ID, normalise_name, release_cells, restore_cells

__all__ = ["repair_notebook", "read_notebook_text", "not_a_notebook", "SubmissionRejected",
           "normalise_name", "release_cells"]


class SubmissionRejected(ValueError):
    """The file cannot be graded at all (empty, too large, not JSON, not a notebook)."""


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
    notes = restore_cells(nb, release, sources, earlier)
    note = _repair_widget_state(nb)
    if note:
        notes.append(note)
    kernel = nb.metadata.get("kernelspec", {}).get("name")
    want = release.metadata.get("kernelspec", {})
    if want and kernel != want.get("name"):
        notes.append(f"kernel '{kernel or 'none'}' replaced by '{want.get('name')}'")
        nb.metadata["kernelspec"] = copy.deepcopy(want)
    return notes
