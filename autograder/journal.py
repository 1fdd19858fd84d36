"""The results journal: one JSON file per student and assignment, each written atomically.

``DIR/results/<assignment>/<student>.json`` is written only after the student's grade is in
the gradebook and the feedback is copied, by writing a temporary file, flushing it to disk and
renaming it over the old one (``os.replace`` is atomic), so a batch killed at any moment leaves
every file either complete or absent. A re-run reuses a result whose ``digest`` (the submitted
bytes, the lesson and the grader settings) is unchanged, and grades everything else.
"""
import hashlib
import json
import os
from pathlib import Path

from autograder.ids import folder_name

__all__ = ["journal_path", "load_result", "save_result", "digest", "atomic_write"]


def journal_path(out: Path, assignment: str, student: str) -> Path:
    """Where the result of ``student`` for ``assignment`` is kept under ``out`` (the id made
    safe as a file name by ids.folder_name: unchanged for plain ids)."""
    return Path(out) / "results" / assignment / f"{folder_name(student)}.json"


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old or the new file, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_result(out: Path, result: dict) -> Path:
    """Commit one result (a dict with at least student and assignment); returns its path."""
    path = journal_path(out, result["assignment"], result["student"])
    atomic_write(path, json.dumps(result, indent=1, sort_keys=True))
    return path


def load_result(out: Path, assignment: str, student: str):
    """The committed result dict, or None when there is none (or it cannot be read)."""
    path = journal_path(out, assignment, student)
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) and result.get("student") == student else None


def digest(*parts) -> str:
    """SHA-256 over bytes and strings, in order: the identity of one grading job."""
    h = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()
