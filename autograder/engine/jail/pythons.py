"""The folders of the grader's Python that the sandbox mounts (read-only), and the links that lead to them."""
from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

__all__ = ["python_dirs", "python_links"]


def python_dirs(course_root, job_dir=None) -> list:
    """Folders the kernel's Python needs, outermost first: installation, environment, extra
    import paths (never the course root itself, nor a folder inside it other than a venv, nor
    the grader's job folder (the restored notebook with its hidden tests, job.json), a folder
    inside it or one holding it, nor the working folder, which ``python -m`` puts on
    ``sys.path``), wherever TMPDIR puts them."""
    dirs = [Path(sys.base_prefix), Path(sys.prefix)]
    job = Path(job_dir).resolve() if job_dir else None
    for p in sys.path:
        if not p or not Path(p).is_dir():
            continue
        where = Path(p).resolve()
        if where == Path.cwd().resolve() or job is not None and (where == job or job in where.parents):
            continue   # the working folder (python -m puts it first) or the job folder: grader's
        dirs.append(Path(p))
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        dirs.append(Path(sysconfig.get_paths()[key]))
    keep = []
    for d in sorted({d.resolve() for d in dirs}, key=lambda d: len(d.parts)):
        if str(d).startswith("/usr/") or d == Path("/usr"):
            continue   # already mounted
        if any(d == k or k in d.parents for k in keep):
            continue   # inside a folder already mounted
        if course_root is not None and (d == course_root or d in course_root.parents):
            continue   # the course root or one of its parents: never mounted whole
        if course_root is not None and course_root in d.parents and d != Path(sys.prefix).resolve():
            continue   # inside the course (its own package folders): only mlexp, below
        if job is not None and (d == job or job in d.parents or d in job.parents):
            continue   # the grader's job folder, a folder inside it, or one holding it
        keep.append(d)
    return keep


def python_links(mounted) -> list:
    """``--symlink`` words for a Python reached through a link (a checkout whose ``.venv`` links to
    another's, a home folder linked elsewhere): the folders are mounted at their resolved paths,
    but the kernel is started as ``sys.executable`` says, so the link itself must be there too. The
    first linked part of each path is recreated, when it leads into a mounted folder."""
    args, made = [], set()
    for path in (Path(sys.prefix), Path(sys.exec_prefix), Path(sys.executable).parent):
        if not path.is_absolute() or path == path.resolve():
            continue
        for part in [*reversed(path.parents), path][1:]:
            if part.is_symlink():
                target = part.resolve()
                if part not in made and any(target == d or d in target.parents or target in d.parents
                                            for d in mounted):
                    args += ["--symlink", str(target), str(part)]
                    made.add(part)
                break
    return args
