"""Find the submissions in a class folder or an LMS zip: <student>/<assignment>/*.ipynb."""
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Submission", "collect", "IGNORED_NAMES"]

IGNORED_NAMES = {"__MACOSX", ".ipynb_checkpoints", "__pycache__"}


@dataclass
class Submission:
    """One student's files for one assignment, as found on disk."""
    student: str
    assignment: str
    notebooks: list            # paths of the .ipynb files in <student>/<assignment>/
    problem: str = ""          # why it cannot be graded; empty when it can
    notes: list = field(default_factory=list)


def _dirs(folder: Path) -> list:
    return sorted(p for p in folder.iterdir()
                  if p.is_dir() and p.name not in IGNORED_NAMES and not p.name.startswith("."))


def _looks_like_class(folder: Path, assignments) -> bool:
    return any((s / a).is_dir() for s in _dirs(folder) for a in assignments)


def _class_root(base: Path, assignments) -> Path:
    """``base`` itself, or its only subfolder (a zip often wraps everything in one folder)."""
    if _looks_like_class(base, assignments):
        return base
    subdirs = _dirs(base)
    if len(subdirs) == 1 and _looks_like_class(subdirs[0], assignments):
        return subdirs[0]
    raise ValueError(
        f"No submissions found in {base}: expected folders <student>/<assignment>/ with an "
        f"assignment among {sorted(assignments)} (at the top or inside one wrapping folder).")


def collect(source, assignments, unpack_dir: Path) -> list:
    """Return the Submissions in ``source`` (a folder or a .zip) for the known ``assignments``.

    A zip is unpacked into ``unpack_dir`` first. Folders of unknown assignments are returned with
    ``problem`` set so that they show up in the report instead of vanishing. Raises
    FileNotFoundError for a missing source and ValueError when it has no class layout or is a
    broken zip.
    """
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"Submissions not found: {source}. Pass a folder of "
                                "<student>/<assignment>/*.ipynb or a .zip of one.")
    if source.is_file():
        if not zipfile.is_zipfile(source):
            raise ValueError(f"{source} is neither a folder nor a zip file.")
        with zipfile.ZipFile(source) as zf:
            zf.extractall(unpack_dir)   # extractall drops absolute paths and '..' parts
        source = Path(unpack_dir)
    root = _class_root(source, assignments)
    found = []
    for student_dir in _dirs(root):
        for a_dir in _dirs(student_dir):
            notebooks = sorted(p for p in a_dir.glob("*.ipynb") if p.is_file())
            sub = Submission(student_dir.name, a_dir.name, notebooks)
            if a_dir.name not in assignments:
                sub.problem = f"unknown assignment '{a_dir.name}'"
            elif not notebooks:
                sub.problem = "no .ipynb file in the submission folder"
            found.append(sub)
        if not _dirs(student_dir):
            found.append(Submission(student_dir.name, "?", [],
                                    problem="no <assignment>/ folder inside the student folder"))
    return found
