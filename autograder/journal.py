"""The results journal: one JSON file per student and assignment, each written atomically.

``DIR/results/<assignment>/<student>.json`` is written only after the student's grade is in
the gradebook and the feedback is copied, by writing a temporary file, flushing it to disk and
renaming it over the old one (``os.replace`` is atomic), so a batch killed at any moment leaves
every file either complete or absent. A re-run reuses a result whose ``digest`` (the submitted
bytes, the lesson and the grader settings) is unchanged, and grades everything else.
"""
import datetime
import fcntl
import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path

from autograder.ids import folder_name

__all__ = ["FOLDER_LOCK", "FolderInUse", "folder_in_use", "journal_path", "load_result", "save_result", "digest", "atomic_write", "MANIFEST",
           "write_manifest", "read_manifest", "load_results"]

MANIFEST = "class.json"     # the class of a grading folder: its students, lessons and columns
FOLDER_LOCK = ".in-use"     # held (flock) by the grade or report writing into a folder
_HELD = {}                  # folders this process holds: {resolved path: depth}


class FolderInUse(ValueError):
    """Another grade or report is writing into the folder; the message names it."""


@contextmanager
def folder_in_use(out: Path, command: str, create: bool = True):
    """Hold ``out`` for ``command`` ("grade", "report", "export", "canvas push") while the block runs: a second run into
    the same folder (another process) stops at once with FolderInUse naming the first one,
    instead of undoing its work when it finishes. Re-entrant within one process; the lock is
    the OS's (flock), so a run killed outright leaves nothing held. Without ``create`` a
    folder that does not exist is not made (nothing to hold)."""
    out = Path(out).resolve()
    if out in _HELD:
        _HELD[out] += 1
        try:
            yield
        finally:
            _HELD[out] -= 1
        return
    if not create and not out.is_dir():
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    f = open(out / FOLDER_LOCK, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        who = f.read().strip() or "another run"
        f.close()
        raise FolderInUse(f"{out} is in use: {who} is writing into it. Wait for it to end, "
                          f"then run `{command}` again, or give another folder") from None
    try:
        f.truncate(0)
        f.write(f"`{command}` (process {os.getpid()}, since "
                f"{datetime.datetime.now().astimezone().isoformat(' ', 'seconds')})\n")
        f.flush()
        _HELD[out] = 1
        yield
    finally:
        _HELD.pop(out, None)
        f.close()


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


# ------------------------------------------------- the class a grading folder holds (class.json)

def write_manifest(out: Path, entries, columns: dict) -> None:
    """Record the class of this run: [(student, assignment, internal id)] and each lesson's
    exercise columns of grades.csv, so ``report DIR`` rebuilds exactly what ``grade`` wrote."""
    data = {"students": [list(e) for e in entries], "columns": columns}
    atomic_write(Path(out) / MANIFEST, json.dumps(data, indent=1))


def read_manifest(out: Path):
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: grade the class into {out} first "
                                "(python -m autograder grade ... --out DIR).")
    data = json.loads(path.read_text())
    return [tuple(e) for e in data["students"]], dict(data["columns"])


def load_results(out: Path) -> list:
    """The journal dicts of the class graded into ``out``, in grades.csv order (class.json);
    raises FileNotFoundError when ``out`` holds no graded class."""
    entries, _ = read_manifest(out)
    found = (load_result(out, assignment, student) for student, assignment, _ in entries)
    return [r for r in found if r is not None]
