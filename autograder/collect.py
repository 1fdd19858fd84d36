"""Find the submissions in a class folder or an LMS zip: <student>/<assignment>/*.ipynb.

LMS exports are untidy, so this also accepts: the class wrapped in up to three single folders;
notebooks nested deeper inside ``<student>/<assignment>/`` (e.g. ``attempt_2/``); an
``<assignment>/`` folder inside one extra folder; notebooks loose in the student folder named
after an assignment's notebook; and one student id under two spellings of case (merged). A
student folder with no notebook at all is reported, not dropped.
"""
import os
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from .repair import normalise_name

__all__ = ["Submission", "collect", "choose_notebook", "IGNORED_NAMES", "MAX_ZIP_BYTES"]

IGNORED_NAMES = {"__MACOSX", ".ipynb_checkpoints", "__pycache__"}
MAX_ZIP_BYTES = 4 * 2**30     # refuse zips that unpack to more than this (zip bombs)


@dataclass
class Submission:
    """One student's files for one assignment, as found on disk."""
    student: str
    assignment: str
    notebooks: list            # paths of the candidate .ipynb files
    problem: str = ""          # why it cannot be graded; empty when it can
    notes: list = field(default_factory=list)
    other_files: list = field(default_factory=list)   # non-notebook files, by name


def _dirs(folder: Path) -> list:
    return sorted(p for p in folder.iterdir()
                  if p.is_dir() and p.name not in IGNORED_NAMES and not p.name.startswith("."))


def _files(folder: Path, recursive: bool) -> list:
    found = folder.rglob("*") if recursive else folder.iterdir()
    return sorted(p for p in found if p.is_file() and not any(
        part in IGNORED_NAMES or part.startswith(".") for part in p.relative_to(folder).parts))


def _looks_like_class(folder: Path, assignments) -> bool:
    return any((s / a).is_dir() or any(f.suffix == ".ipynb" for f in _files(s, False))
               for s in _dirs(folder) for a in assignments)


def _class_root(base: Path, assignments) -> Path:
    """``base`` itself, or the folder inside up to three single wrapping folders."""
    folder = base
    for _ in range(4):
        if _looks_like_class(folder, assignments) and any(
                (s / a).is_dir() for s in _dirs(folder) for a in assignments):
            return folder
        subdirs = _dirs(folder)
        if len(subdirs) != 1:
            break
        folder = subdirs[0]
    if _looks_like_class(base, assignments):
        return base
    raise ValueError(
        f"No submissions found in {base}: expected folders <student>/<assignment>/ with an "
        f"assignment among {sorted(assignments)} (at the top or inside wrapping folders).")


def _unzip(source: Path, dest: Path) -> Path:
    with zipfile.ZipFile(source) as zf:
        total = sum(i.file_size for i in zf.infolist())
        if total > MAX_ZIP_BYTES:
            raise ValueError(f"{source} unpacks to {total / 2**30:.1f} GiB, over the "
                             f"{MAX_ZIP_BYTES / 2**30:.0f} GiB limit; is it the right file?")
        for info in zf.infolist():
            path = Path(zf.extract(info, dest))   # extract drops absolute paths and '..'
            stamp = time.mktime(info.date_time + (0, 0, -1))
            os.utime(path, (stamp, stamp))   # keep the upload times: they pick the latest file
    return dest


def collect(source, assignments, unpack_dir: Path, notebook_names=None) -> list:
    """Return the Submissions in ``source`` (a folder or a .zip) for the known ``assignments``.

    ``notebook_names`` maps assignment -> its notebook file names (for loose notebooks). A zip
    is unpacked into ``unpack_dir`` first. Folders of unknown assignments and students without
    notebooks are returned with ``problem`` set so that they show up in the report. Raises
    FileNotFoundError for a missing source and ValueError when it has no class layout or is not
    a readable zip.
    """
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"Submissions not found: {source}. Pass a folder of "
                                "<student>/<assignment>/*.ipynb or a .zip of one.")
    if source.is_file():
        if not zipfile.is_zipfile(source):
            raise ValueError(f"{source} is neither a folder nor a zip file.")
        source = _unzip(source, Path(unpack_dir))
    root = _class_root(source, assignments)
    by_name = {normalise_name(n): a for a, names in (notebook_names or {}).items() for n in names}
    found = {}
    for student_dir in _dirs(root):
        student = student_dir.name.strip()
        key = student.lower()
        folders = []
        for d in _dirs(student_dir):
            inner = [dd for dd in _dirs(d) if dd.name in assignments]
            if d.name in assignments or not inner:
                folders.append((d, d.name, ""))
            else:   # <student>/<wrapper>/<assignment>/
                folders += [(dd, dd.name, f"notebook found inside '{d.name}/'") for dd in inner]
        for f in _files(student_dir, False):
            a = by_name.get(normalise_name(f.name)) if f.suffix.lower() == ".ipynb" else None
            if a:
                folders.append((f, a, "notebook was not in an <assignment>/ folder"))
        for path, a, where in folders:
            files = _files(path, True) if path.is_dir() else [path]
            notebooks = [f for f in files if f.suffix.lower() == ".ipynb"]
            sub = found.get((key, a))
            if sub is None:
                sub = found[(key, a)] = Submission(student, a, [])
            elif sub.student != student and notebooks:
                sub.notes.append(f"student '{student}' and '{sub.student}' merged (same id)")
            sub.notebooks += notebooks
            sub.other_files += [f.name for f in files if f.suffix.lower() != ".ipynb"]
            if where and notebooks:
                sub.notes.append(where)
        if not folders:
            others = [f.name for f in _files(student_dir, True)]
            found[(key, "?")] = Submission(student, "?", [], problem=(
                "no <assignment>/ folder inside the student folder"
                + (f" (found: {', '.join(others[:3])})" if others else "")))
    for sub in found.values():
        if sub.problem:
            continue
        if sub.assignment not in assignments:
            sub.problem = f"unknown assignment '{sub.assignment}'"
        elif not sub.notebooks:
            sub.problem = "no .ipynb file in the submission folder" + (
                f" (found: {', '.join(sorted(set(sub.other_files))[:3])})" if sub.other_files else "")
    return list(found.values())


def choose_notebook(sub: Submission, expected: str, only_one: bool, notes: list):
    """The file to grade as ``expected``, or None; appends what was chosen to ``notes``.

    Candidates are the notebooks whose name normalises to ``expected`` ("Copy of x (1).ipynb"
    is x.ipynb), or every notebook when the assignment has only one. Of several, the latest by
    modification time wins (then the name with the higher copy number).
    """
    named = [p for p in sub.notebooks if normalise_name(p.name) == normalise_name(expected)]
    candidates = named or (list(sub.notebooks) if only_one else [])
    if not candidates:
        return None
    chosen = max(candidates, key=lambda p: (p.stat().st_mtime, len(p.name), p.name))
    if len(candidates) > 1:
        others = ", ".join(f"'{p.name}'" for p in candidates if p != chosen)
        notes.append(f"{len(candidates)} submissions: graded the latest, '{chosen.name}'; "
                         f"ignored {others}")
    elif chosen.name != expected:
        notes.append(f"renamed '{chosen.name}' to '{expected}'")
    return chosen
