"""Find the submissions in a class folder or an LMS zip, without following anything a student aims.

Layouts read (the first that holds a notebook wins, looked for at the top and inside up to
three single wrapping folders):

- a folder per student, ``<student>/<assignment>/*.ipynb``, tolerating what exports do:
  notebooks nested deeper (``attempt_2/``), an ``<assignment>/`` folder inside one extra
  folder, notebooks loose in the student folder named after an assignment's notebook, one
  student id under two spellings of case or of Unicode form (NFC, NFD: merged, the forms named
  in its notes);
- the "download all submissions" zips of Canvas, Moodle and Blackboard, whose file names say
  whose each file is (autograder.lms.layouts reads them with nbgrader's FileNameCollectorPlugin).

What a student (or a broken upload) can put in an archive costs only that student, and only
what is wrong: a symbolic link is never followed and rejects the submission that holds it; a
zip is unpacked entry by entry, and an entry that is corrupt (bad CRC), encrypted, larger than
its limit (a notebook: the ``max_bytes`` size limit; another file: nbgrader's file limit) or
past the whole zip's limit (zip bombs) is not written (or deleted at once) and named in that
student's status. Files beside a notebook are carried to the grader up to nbgrader's limits
(``CourseDirectory.max_file_size``, ``max_dir_size``); larger ones are dropped with a note.
A student folder with no notebook at all is reported, not dropped.
"""
import datetime as _dt
import unicodedata
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from autograder.lms import layouts as lms
from autograder.lms.base import by_layout, unclaimed_id
from autograder.options import GradingOptions
from mlexp.restore import normalise_name  # the one rule, shared with mlexp.check and check
from autograder.intake.unpack import (DATA_DIR_BYTES, DATA_FILE_BYTES, IGNORED_NAMES, LINK, ZIP_FLOOR,
                                      ZIP_RATIO, Tree, unzip)

__all__ = ["Submission", "collect", "choose_notebook", "IGNORED_NAMES", "DATA_FILE_BYTES",
           "DATA_DIR_BYTES", "ZIP_RATIO", "ZIP_FLOOR", "LINK"]

DEFAULT_MAX_BYTES = int(GradingOptions().max_size_mb * 2**20)   # --max-size


@dataclass
class Submission:
    """One student's files for one assignment, as found on disk."""
    student: str
    assignment: str
    notebooks: list            # paths of the candidate .ipynb files
    problem: str = ""          # why it cannot be graded; empty when it can
    notes: list = field(default_factory=list)
    other_files: list = field(default_factory=list)   # non-notebook files, by name
    data_files: list = field(default_factory=list)    # (name beside the notebook, path) to carry
    names: dict = field(default_factory=dict)  # path -> file name as submitted (LMS, long names)
    times: dict = field(default_factory=dict)  # path -> upload time read from an LMS file name
    stamps: dict = field(default_factory=dict)  # path -> that time as the LMS wrote it (ISO)
    home: Path = None          # the student's own folder, when the layout has one
    layout: str = "folder"     # "folder", or the LMS whose export it came from (its Lms.title, lms/base.py)


def _is_notebook(name: str) -> bool:
    return name.lower().endswith(".ipynb")


def _looks_like_class(tree, folder: Path, assignments, by_name: dict, strict: bool) -> bool:
    """Student folders holding an <assignment>/ folder (strict), or a lesson's notebook loose."""
    for s in tree.dirs(folder):
        if any(tree.name(d) in assignments for d in tree.dirs(s)):
            return True
        if not strict and any(normalise_name(tree.name(f)) in by_name
                              for f in tree.files(s, False) if _is_notebook(tree.name(f))):
            return True
    return False


def _small_text(tree, path: Path, limit: int = 8192):
    """The first ``limit`` bytes of a file of the export as text (an LMS's receipt), or None
    for a refused entry, a link or an unreadable file."""
    if path in tree.refused or path.is_symlink():
        return None
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _find_root(tree, assignments, by_name: dict) -> tuple:
    """(folder, layout, LMS files or None): the class inside up to three wrapping folders."""
    for strict in (True, False):
        folder = tree.base
        for _ in range(4):
            if strict:
                layout, files, unmatched = lms.match_layout(
                    [tree.rel(p, folder) for p in tree.files(folder, True)],
                    read=lambda rel, folder=folder: _small_text(tree, folder / rel))
                if layout:
                    return folder, layout, files, unmatched
            if _looks_like_class(tree, folder, assignments, by_name, strict):
                return folder, "folder", None, []
            subdirs = tree.dirs(folder)
            if len(subdirs) != 1:
                break
            folder = subdirs[0]
    return None, None, None, []


def _nameless(tree, root: Path, unmatched: list, layout: str, assignments, by_name) -> list:
    """A rejected row for each file of an LMS export whose name fits none of that LMS's names:
    whose it is cannot be read, so it is no one's, and it is never dropped unseen."""
    subs = []
    for rel in unmatched:
        name = rel.rsplit("/", 1)[-1]
        if name.startswith(".") or any(part in IGNORED_NAMES for part in rel.split("/")):
            continue
        a = (by_name.get(normalise_name(name)) if _is_notebook(name) else None) or (
            assignments[0] if len(assignments) == 1 else "?")
        lms_of = by_layout(layout)
        shape = f" ({lms_of.described})" if lms_of is not None and lms_of.described else ""
        subs.append(Submission(unclaimed_id(rel), a, [], other_files=[name], problem=(
            f"owner not certain: '{rel}' fits no {layout} file name{shape}; it is no one's "
            "until you decide: rename it as the LMS names its owner's files and grade again")))
    return subs


def _unknown_layout(tree, shown: str, assignments) -> str:
    folder, inside = tree.base, []
    while len(tree.dirs(folder)) == 1 and not tree.files(folder, False) and len(inside) < 3:
        folder = tree.dirs(folder)[0]
        inside.append(tree.name(folder))
    files = [tree.name(p) for p in tree.files(folder, False)]
    dirs = [tree.name(p) + "/" for p in tree.dirs(folder)]
    where = f" (inside '{'/'.join(inside)}/')" if inside else ""

    def some(names):
        return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    found = " and ".join(filter(None, [files and f"{len(files)} file(s): {some(files)}",
                                       dirs and f"{len(dirs)} folder(s): {some(dirs)}"]))
    found = found or "nothing"
    return (f"No submissions found in {shown}: found {found}{where}, and no notebook of the "
            f"assignments {sorted(assignments)} in a layout this grader reads. Layouts "
            f"understood:\n{lms.describe_layouts()}")


def _from_folders(tree, root: Path, assignments, by_name: dict) -> list:
    found, spellings = {}, {}
    for student_dir in tree.dirs(root):
        student = tree.name(student_dir).strip()
        key = same_id(student).lower()
        spellings.setdefault(key, set()).add(student)
        student = same_id(student)
        folders = []     # (path, assignment, note, is a folder)
        for d in tree.dirs(student_dir):
            inner = [dd for dd in tree.dirs(d) if tree.name(dd) in assignments]
            if tree.name(d) in assignments or not inner:
                folders.append((d, tree.name(d), "", True))
            else:   # <student>/<wrapper>/<assignment>/
                folders += [(dd, tree.name(dd), f"notebook found inside '{tree.name(d)}/'", True)
                            for dd in inner]
        for f in tree.files(student_dir, False):
            a = by_name.get(normalise_name(tree.name(f))) if _is_notebook(tree.name(f)) else None
            if a:
                folders.append((f, a, "notebook was not in an <assignment>/ folder", False))
        for path, a, where, is_dir in folders:
            files = tree.files(path, True) if is_dir else [path]
            notebooks = [f for f in files if _is_notebook(tree.name(f))]
            sub = found.get((key, a))
            if sub is None:
                sub = found[(key, a)] = Submission(student, a, [], home=student_dir)
            elif sub.student != student and notebooks:
                sub.notes.append(f"student '{student}' and '{sub.student}' merged (same id)")
            sub.notebooks += notebooks
            sub.names.update({f: tree.name(f) for f in notebooks})
            for f in files:
                if f not in notebooks:
                    sub.other_files.append(tree.name(f))
                    sub.data_files.append((tree.rel(f, path), f))
            if where and notebooks:
                sub.notes.append(where)
        if not folders:
            others = [tree.name(f) for f in tree.files(student_dir, True)]
            found[(key, "?")] = Submission(student, "?", [], home=student_dir, problem=(
                "no <assignment>/ folder inside the student folder"
                + (f" (found: {', '.join(others[:3])})" if others else "")))
    for (key, _), sub in found.items():
        _look_alike(sub, spellings.get(key, ()))
    return list(found.values())


def same_id(student: str) -> str:
    """A student id as one id whatever Unicode form it was written in: NFC (a Mac writes
    'José' decomposed, NFD; a browser or Windows composed: two ids that print the same)."""
    return unicodedata.normalize("NFC", student)


def _look_alike(sub: Submission, spellings) -> None:
    """Name, in ``sub``'s notes, the spellings of its id that print the same but differ in
    their bytes (NFC and NFD), read as one student."""
    forms = sorted({s for s in spellings if same_id(s) == sub.student})
    if len(forms) > 1:
        sub.notes.append(f"'{sub.student}' came written {len(forms)} ways that print the same "
                         f"(Unicode {', '.join(_form(s) for s in forms)}: "
                         f"{', '.join(ascii(s) for s in forms)}); read as one student")


def _form(text: str) -> str:
    return ("NFC" if unicodedata.is_normalized("NFC", text) else
            "NFD" if unicodedata.is_normalized("NFD", text) else "mixed")


def _from_lms(tree, root: Path, files: list, assignments, by_name: dict) -> list:
    """Submissions from an LMS export: the student from each file name, the assignment from
    the notebook's name (or the one assignment the export's other notebooks belong to)."""
    paths = {tree.rel(p, root): p for p in tree.files(root, True)}

    def base(f):
        return f.file_id.rsplit("/", 1)[-1]
    known = Counter(by_name.get(normalise_name(base(f))) for f in files if _is_notebook(base(f)))
    known.pop(None, None)
    default = (next(iter(known)) if len(known) == 1
               else assignments[0] if len(assignments) == 1 and not known else None)
    found, by_student, spellings = {}, {}, {}
    for f in files:
        spellings.setdefault(same_id(f.student), set()).add(f.student)
        f.student = same_id(f.student)
        by_student.setdefault(f.student, []).append(f)
    for student, mine in by_student.items():
        ours = {by_name.get(normalise_name(base(f))) or default
                for f in mine if _is_notebook(base(f))} - {None}
        for f in sorted(mine, key=lambda f: f.rel):
            path = paths.get(f.rel)
            if path is None:
                continue
            if _is_notebook(base(f)):
                a = by_name.get(normalise_name(base(f))) or default or "?"
            else:
                a = next(iter(ours)) if len(ours) == 1 else default or "?"
            inside = path.relative_to(root).parts
            home = root / inside[0] if len(inside) > 1 else None
            sub = found.get((student, a))
            if sub is None:
                sub = found[(student, a)] = Submission(student, a, [], home=home)
            if _is_notebook(base(f)):
                sub.notebooks.append(path)
                sub.names[path] = base(f)
                if a == "?":
                    sub.problem = (f"notebook '{base(f)}' is none of the lessons' notebooks "
                                   f"({', '.join(sorted(by_name))})")
            else:
                sub.other_files.append(base(f))
                sub.data_files.append((f.file_id, path))
            if f.time is not None:
                sub.times[path] = f.time
            if f.stamp:
                sub.stamps[path] = f.stamp
            if f.problem and not sub.problem:
                sub.problem = f.problem
            if f.note and f.note not in sub.notes:    # Canvas: "marked late by Canvas"
                sub.notes.append(f.note)
    for (student, _), sub in found.items():
        _look_alike(sub, spellings.get(student, ()))
    return list(found.values())


def _settle(tree, subs: list, root: Path) -> list:
    """Apply what was refused (links, bad zip entries) and nbgrader's limits for data files."""
    held = {p for s in subs for p in s.notebooks + [p for _, p in s.data_files]}
    extra = {}
    for p in tree.refused:   # refused, yet in no submission: a link or entry in a student folder
        if p in held or root not in p.parents:
            continue
        parts = p.relative_to(root).parts
        if len(parts) == 1 and p not in tree.links:   # a loose file at the top: no one's
            continue
        owners = [s for s in subs if s.home is not None and (s.home == p or s.home in p.parents)]
        if not owners:
            student = tree.name(root / parts[0]).strip()
            owners = [extra.setdefault(student, Submission(student, "?", []))]
        for s in owners:
            s.other_files.append(tree.name(p))
            s.data_files.append((tree.name(p), p))
    subs = subs + list(extra.values())
    for sub in subs:
        links = [p for p in sub.notebooks + [p for _, p in sub.data_files] if p in tree.refused
                 and tree.refused[p] == LINK]
        if links:
            sub.problem = "; ".join(f"'{tree.rel(p)}' {LINK}" for p in links[:3])
            sub.notebooks = [p for p in sub.notebooks if p not in tree.refused]
            sub.data_files = [(n, p) for n, p in sub.data_files if p not in tree.refused]
            continue
        bad = [p for p in sub.notebooks if p in tree.refused]
        if bad:
            sub.notebooks = [p for p in sub.notebooks if p not in tree.refused]
            why = [f"zip entry '{tree.rel(p)}' {tree.refused[p]}" for p in bad]
            if sub.notebooks:
                sub.notes += why
            elif not sub.problem:
                sub.problem = "; ".join(why)
        kept, total = [], 0
        for name, p in sub.data_files:
            if p in tree.refused:
                sub.notes.append(f"dropped '{tree.rel(p)}': {tree.refused[p]}")
                continue
            size = p.lstat().st_size
            if size > DATA_FILE_BYTES:
                sub.notes.append(f"dropped '{name}' ({size / 1e6:.0f} MB): over nbgrader's "
                                 f"{DATA_FILE_BYTES / 1e6:.0f} MB limit for a file beside the "
                                 "notebook")
            elif total + size > DATA_DIR_BYTES:
                sub.notes.append(f"dropped '{name}' ({size / 1e6:.0f} MB): the files beside the "
                                 f"notebook pass nbgrader's {DATA_DIR_BYTES / 1e6:.0f} MB limit")
            else:
                total += size
                kept.append((name, p))
        sub.data_files = kept
    return subs


def collect(source, assignments, unpack_dir: Path, notebook_names=None,
            max_bytes: int = DEFAULT_MAX_BYTES) -> list:
    """Return the Submissions in ``source`` (a folder or a .zip) for the known ``assignments``.

    ``notebook_names`` maps assignment -> its notebook file names (for loose notebooks and LMS
    exports). A zip is unpacked into ``unpack_dir`` first, each entry within its limits
    (``max_bytes`` is the notebook size limit). Folders of unknown assignments, students
    without notebooks and refused files are returned with ``problem`` set so that they show up
    in the report. Raises FileNotFoundError for a missing source and ValueError when it is not
    a readable zip or holds no layout this module reads (the message names ``source``, what
    was found in it and the layouts understood).
    """
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"Submissions not found: {source}. Pass a folder of "
                                "<student>/<assignment>/*.ipynb or a .zip of one.")
    if source.is_file():
        if not zipfile.is_zipfile(source):
            raise ValueError(f"{source} is neither a folder nor a zip file.")
        try:
            tree = unzip(source, Path(unpack_dir), max_bytes)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError) as exc:
            raise ValueError(f"{source} is not a readable zip ({exc}).") from None
    else:
        tree = Tree(source)
    by_name = {normalise_name(n): a for a, names in (notebook_names or {}).items() for n in names}
    root, layout, files, unmatched = _find_root(tree, assignments, by_name)
    if root is None:
        raise ValueError(_unknown_layout(tree, str(source), assignments))
    if layout == "folder":
        subs = _from_folders(tree, root, assignments, by_name)
    else:
        subs = (_from_lms(tree, root, files, assignments, by_name)
                + _nameless(tree, root, unmatched, layout, list(assignments), by_name))
    subs = _settle(tree, subs, root)
    for sub in subs:
        sub.layout = layout
        if sub.problem:
            continue
        if sub.assignment not in assignments:
            sub.problem = f"unknown assignment '{sub.assignment}'"
        elif not sub.notebooks:
            sub.problem = "no .ipynb file in the submission folder" + (
                f" (found: {', '.join(sorted(set(sub.other_files))[:3])})" if sub.other_files else "")
    return subs


def choose_notebook(sub: Submission, expected: str, only_one: bool, notes: list):
    """The file to grade as ``expected``, or None; appends what was chosen to ``notes``.

    Candidates are the notebooks whose name normalises to ``expected`` ("Copy of x (1).ipynb"
    is x.ipynb), or every notebook when the assignment has only one. Of several, the latest by
    upload time (from an LMS file name, else the modification time) wins, then the name with
    the higher copy number.
    """
    def name(p):
        return sub.names.get(p, p.name)
    named = [p for p in sub.notebooks if normalise_name(name(p)) == normalise_name(expected)]
    candidates = named or (list(sub.notebooks) if only_one else [])
    if not candidates:
        return None
    chosen = max(candidates, key=lambda p: (sub.times.get(p) or p.stat().st_mtime,
                                            len(name(p)), name(p)))
    if len(candidates) > 1:
        def which(p):   # two attempts often carry the same file name: their times tell them apart
            if sub.stamps.get(p) or sub.times.get(p):
                stamp = sub.stamps.get(p) or _dt.datetime.fromtimestamp(sub.times[p]).isoformat(" ")
                return f"'{name(p)}' (uploaded {stamp})"
            return f"'{name(p)}' (file time {_dt.datetime.fromtimestamp(p.stat().st_mtime):%Y-%m-%d %H:%M:%S})"
        others = ", ".join(which(p) for p in candidates if p != chosen)
        notes.append(f"{len(candidates)} submissions: graded the latest, {which(chosen)}; "
                     f"ignored {others}")
    elif name(chosen) != expected:
        notes.append(f"renamed '{name(chosen)}' to '{expected}'")
    return chosen
