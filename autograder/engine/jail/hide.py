"""What a room does not hold (autograder.engine.room): the modules of mlexp an exercise rule forbids,
each replaced in the sandbox's view by an empty read-only folder or file, its byte code too."""
from pathlib import Path

__all__ = ["hidden_paths", "hide_args"]


def hidden_paths(modules, roots) -> list:
    """The files and folders that hold each of ``modules`` (dotted names inside ``mlexp``, such as
    ``mlexp.ops``) under each of ``roots`` (folders holding the ``mlexp`` package as the sandbox
    mounts it), and the byte-code caches beside them: what a room hides (:func:`sandbox_command`'s
    ``hide``). Raises ValueError for a module outside ``mlexp`` or one that is not there: a rule
    that forbids what the room cannot take away is the lesson's error, never a rule left unkept."""
    found = []
    for module in modules:
        parts = module.split(".")
        if parts[0] != "mlexp" or len(parts) < 2 or not all(p.isidentifier() for p in parts):
            raise ValueError(f"a room can only take away a module of mlexp, not {module!r}")
        for root in roots:
            base = Path(root).joinpath(*parts)
            if base.is_dir():
                found.append(base)
            elif base.with_suffix(".py").is_file():
                found.append(base.with_suffix(".py"))
                found += sorted(base.parent.joinpath("__pycache__").glob(f"{parts[-1]}.*.pyc"))
            else:
                raise ValueError(f"{module} is not in the library at {root}")
    return found


def hide_args(hide, job_dir: Path, mounted: list, real: Path, course_mount: str) -> list:
    """bubblewrap words that mount an empty read-only folder (or file) over every place of the
    sandbox's view that holds a module of ``hide``: the copy at ``course_mount`` (the mlexp package
    in ``real`` is mounted there) and, when ``real`` lies inside a ``mounted`` Python folder (an
    installed, not editable, mlexp), that one too."""
    if not hide:
        return []
    empty_dir, empty_file = Path(job_dir) / "room-empty", Path(job_dir) / "room-empty.py"
    empty_dir.mkdir(mode=0o755, exist_ok=True)
    empty_file.touch(mode=0o644)
    args = []
    views = [(real, Path(course_mount))] + [(real, real)] * any(real == d or d in real.parents for d in mounted)
    for source_root, view_root in views:
        for path in hidden_paths(hide, [source_root]):
            empty = empty_dir if path.is_dir() else empty_file
            args += ["--ro-bind", f"SRC:{empty}", str(view_root / path.relative_to(source_root))]
    return args
