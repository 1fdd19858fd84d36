"""The small base each LMS implements, and the one registry of them, :data:`LMSS`.

An LMS is one module of this folder (``canvas.py``, ``moodle.py``, ``blackboard.py``) holding a
subclass of :class:`Lms` that says what the grader needs to know of it, and registering one
instance of it (:func:`register`); ``lms/__init__.py`` imports the modules. What an LMS says:

- its name: ``name``, the ``--lms`` value and the key in :data:`LMSS`; ``title``, as the LMS calls
  itself and as collect records the layout of a zip it read (``Submission.layout``);
- its "download all submissions" zip names: ``pattern``, a regular expression for nbgrader's
  :class:`FileNameCollectorPlugin` (``lms/layouts.py`` runs it), ``described`` (one line for the
  error that lists the layouts understood), :meth:`Lms.read` (the plugin's groups as an
  :class:`LmsFile`) and :meth:`Lms.settle` (what needs the whole export);
- its gradebook: ``gradebook``, the ``lms/gradebooks._Gradebook`` subclass export fills;
- its submission times: ``stamp_source`` (the ``submitted_at_source`` of a time its file names
  carry), ``late_note`` and ``late_source`` (the note a file its names mark late gives the
  submission, and the source of a time known only to be late).

Everything outside ``lms/`` that names or lists the LMSs reads :data:`LMSS`.
"""
from dataclasses import dataclass

__all__ = ["Lms", "LmsFile", "LMSS", "register", "by_layout", "unclaimed_id", "unclaimed_rel"]


@dataclass
class LmsFile:
    """One file of an LMS export, read from its name."""
    rel: str                 # path inside the export, '/'-separated
    student: str
    file_id: str             # the file name as the student uploaded it (may hold folders)
    time: float = None       # upload time from the name (seconds since the epoch), if any
    late: bool = False
    stamp: str = ""          # that time as written (ISO 8601, no zone: the LMS's wall clock)
    problem: str = ""        # why the file cannot be tied to one student; empty when it can
    note: str = ""           # what the name says that the submission's notes keep (Lms.late_note)


class Lms:
    """One LMS, as the grader reads its zips and fills its gradebook (module docstring)."""
    name = ""             # the --lms value: "canvas"
    title = ""            # as the LMS calls itself; the layout collect records: "Canvas"
    pattern = None        # the zip names: FileNameCollectorPlugin's named_regexp (None: no zip)
    described = ""        # those names in one line, for "Layouts understood"
    gradebook = None      # the lms.gradebooks._Gradebook subclass export fills
    stamp_source = ""     # submitted_at_source of a time read from a file name
    late_note = ""        # the note of a submission whose file name says it is late
    late_source = ""      # submitted_at_source when the LMS said late and gave no time

    def read(self, rel: str, found: dict):
        """The plugin's groups ``found`` for the file ``rel`` as an LmsFile, or None for a part
        that holds no file (a receipt, an online-text part). The base reads the groups
        ``student_id`` and ``file_id``."""
        return LmsFile(rel, found["student_id"], found["file_id"])

    def settle(self, files: list, found: dict, read) -> list:
        """``files`` once the whole export is known: ``found`` maps every path of the export to
        the plugin's groups (None: the name does not fit), ``read(rel)`` returns a small file's
        text or None (or is None itself). The base returns ``files`` as they are."""
        return files


UNCLAIMED = " (owner not certain)"


def unclaimed_id(rel: str) -> str:
    """The row id of a file of an LMS export whose owner is not certain: its own name, ending so
    that no LMS user id can be read from it (never ``_<digits>`` at the end)."""
    return f"{rel}{UNCLAIMED}"


def unclaimed_rel(student_id: str):
    """The file an :func:`unclaimed_id` names, or None for any other id."""
    return student_id[:-len(UNCLAIMED)] if student_id.endswith(UNCLAIMED) else None


LMSS = {}     # name -> Lms, in the order the modules register (collect prefers the first on a tie)


def register(lms: Lms) -> Lms:
    """Add ``lms`` to :data:`LMSS` under its name; returns it."""
    if not lms.name or not lms.title:
        raise ValueError(f"{type(lms).__name__}: an LMS needs a name and a title")
    LMSS[lms.name] = lms
    return lms


def by_layout(layout: str):
    """The registered LMS whose zip layout is ``layout`` (its title, as collect records it), or
    None (a class folder, or a layout no LMS registers)."""
    return next((lms for lms in LMSS.values() if lms.title == layout), None)
