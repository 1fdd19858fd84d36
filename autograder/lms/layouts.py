"""How collect reads an LMS's "download all submissions" zip: the LMS whose names fit.

Each LMS puts one assignment's submissions in one zip and encodes the student in each file's
name. The names are read with nbgrader's own :class:`FileNameCollectorPlugin` (the plugin
``nbgrader zip_collect`` uses), one regular expression per LMS: each registered LMS's
``pattern`` (``lms/base.py``; the names of each in its own module: ``canvas.py``, ``moodle.py``,
``blackboard.py``). :func:`match_layout` tries every registered LMS and keeps the one whose
names fit most notebooks.

Formats as documented by each LMS and as seen in their exports; an institution's own naming
(anonymous grading, group submissions) may differ and is then reported as an unknown layout.
"""
import logging

from nbgrader.plugins.zipcollect import FileNameCollectorPlugin

from autograder.lms.base import LMSS, LmsFile

__all__ = ["LmsFile", "FOLDER", "match_layout", "describe_layouts"]

FOLDER = ("a folder per student: <student>/<assignment>/<notebook>.ipynb (or "
          "<student>/<notebook>.ipynb), inside up to three wrapping folders")

_QUIET = logging.getLogger("autograder.lms.layouts")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False     # the plugin warns for every name that does not match


def _plugin(pattern: str, rels) -> FileNameCollectorPlugin:
    exts = sorted({"." + r.rsplit(".", 1)[1] if "." in r.rsplit("/", 1)[-1] else "" for r in rels})
    return FileNameCollectorPlugin(named_regexp=pattern, valid_ext=exts, log=_QUIET)


def match_layout(rels, read=None) -> tuple:
    """(layout, [LmsFile], [unmatched rel]) for the LMS whose names fit most notebooks.

    ``rels`` are the '/'-separated paths of every file in the export; ``read(rel)`` (optional)
    returns the text of a small file of the export, or None: it reads Blackboard's receipts,
    which tell the user name from the assignment name. The layout is the LMS's title
    (``Lms.title``: "Canvas", "Moodle", "Blackboard"). Returns (None, [], rels) when no LMS's
    names fit a single notebook.
    """
    rels = list(rels)
    best = (None, [], rels, 0, None, {})
    for lms in list(LMSS.values()):
        if not lms.pattern:
            continue
        plugin, files, unmatched, found = _plugin(lms.pattern, rels), [], [], {}
        for rel in rels:
            found[rel] = plugin.collect(rel)
            if found[rel] is None:
                unmatched.append(rel)
                continue
            item = lms.read(rel, found[rel])
            if item is not None:     # None: a receipt or an online-text part, not a file
                files.append(item)
        score = sum(f.file_id.lower().endswith(".ipynb") for f in files)
        if score > best[3]:
            best = (lms.title, files, unmatched, score, lms, found)
    if best[4] is not None:
        best = (best[0], best[4].settle(best[1], best[5], read), best[2])
    return best[:3]


def describe_layouts() -> str:
    """The layouts collect understands, one per line, for error messages."""
    return "\n".join(f"  - {d}" for d in [FOLDER] + [lms.described for lms in LMSS.values()
                                                     if lms.pattern])
