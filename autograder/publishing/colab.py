"""`build --colab`: the course library as one file a student uploads to Colab next to a lesson.

Before the course is on GitHub, a lesson opened in Colab cannot install ``mlexp`` from there.
``python -m autograder build --colab`` writes a wheel of the ``mlexp`` package
(``dist/mlexp-<version>-py3-none-any.whl``); a student uploads it (Files panel > Upload, into
/content, or into their Google Drive) and the lesson's setup cell finds it and installs it with
``pip install --no-deps``, keeping Colab's own torch, numpy and matplotlib.

The wheel is written directly (a zip with the package, METADATA, WHEEL and RECORD, as PEP 427
describes), not through a build backend: no network, no build isolation, and the same bytes for
the same sources (fixed timestamps, sorted entries).
"""
from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from pathlib import Path

# Where the wheel carries each lesson's seeds.md; mlexp.seeds.find_table reads it (the same name
# as mlexp.seeds.TABLES_IN_PACKAGE, checked by tests/test_course.py; not imported: building the
# course file needs no torch).
TABLES_IN_PACKAGE = "seed_tables"

__all__ = ["PACKAGE", "wheel_name", "build_wheel", "STUDENT_STEPS"]

PACKAGE = "mlexp"
TAG = "py3-none-any"
_EPOCH = (1980, 1, 1, 0, 0, 0)     # the earliest time a zip can hold: the same bytes on every build
STUDENT_STEPS = (
    "Give this file to your students with the lessons. In Colab each student: 1. opens the Files "
    "panel (folder icon, left); 2. uploads the file (it lands in /content), or puts it in their "
    "Google Drive and clicks Mount Drive; 3. runs the lesson's Setup cell, which finds the file "
    "and installs it. Once the course is on GitHub, `python -m autograder build --repo "
    "OWNER/NAME` makes the Colab links install from there instead.")


def _version(root: Path) -> str:
    text = (Path(root) / PACKAGE / "__init__.py").read_text()
    m = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if m is None:
        raise ValueError(f"{root / PACKAGE / '__init__.py'} has no __version__ = \"...\" line.")
    return m.group(1)


def _project(root: Path) -> tuple:
    """(summary, requires-python, [dependencies]) from ``root/pyproject.toml`` (plain regexes:
    Python 3.10 has no tomllib)."""
    text = (Path(root) / "pyproject.toml").read_text()
    summary = re.search(r'^description = "([^"]*)"', text, re.M)
    python = re.search(r'^requires-python = "([^"]*)"', text, re.M)
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S)
    return (summary.group(1) if summary else "", python.group(1) if python else "",
            re.findall(r'"([^"]+)"', deps.group(1)) if deps else [])


def wheel_name(root: Path) -> str:
    """``mlexp-<version>-py3-none-any.whl`` for the package in ``root``."""
    return f"{PACKAGE}-{_version(root)}-{TAG}.whl"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(root: Path, out_dir: Path) -> Path:
    """Write the wheel of ``root/mlexp`` into ``out_dir``; returns its path.

    Holds every file of the package except caches and compiled bytecode, and each lesson's
    committed seed table (lessons/<id>/seeds.md as mlexp/seed_tables/<id>.md: on Colab the
    lessons find them there through mlexp.seeds.find_table). Raises
    FileNotFoundError when ``root`` has no mlexp/ package, ValueError when its version or
    pyproject.toml cannot be read.
    """
    root, out_dir = Path(root), Path(out_dir)
    package = root / PACKAGE
    if not (package / "__init__.py").is_file():
        raise FileNotFoundError(f"{package} is not a Python package: run this in the course checkout.")
    version = _version(root)
    summary, python, deps = _project(root)
    dist_info = f"{PACKAGE}-{version}.dist-info"
    files = {}
    for path in sorted(package.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and "__pycache__" not in rel.parts and path.suffix not in (".pyc", ".pyo") \
                and not any(part.startswith(".") for part in rel.parts):
            files[rel.as_posix()] = path.read_bytes()
    for table in sorted((root / "lessons").glob("*/seeds.md")):   # read by mlexp.seeds.find_table
        files[f"{PACKAGE}/{TABLES_IN_PACKAGE}/{table.parent.name}.md"] = table.read_bytes()
    metadata = ["Metadata-Version: 2.1", f"Name: {PACKAGE}", f"Version: {version}"]
    metadata += [f"Summary: {summary}"] * bool(summary) + [f"Requires-Python: {python}"] * bool(python)
    metadata += [f"Requires-Dist: {d}" for d in deps]
    files[f"{dist_info}/METADATA"] = ("\n".join(metadata) + "\n").encode()
    files[f"{dist_info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: autograder.publishing.colab\n"
                                   f"Root-Is-Purelib: true\nTag: {TAG}\n").encode()
    files[f"{dist_info}/top_level.txt"] = f"{PACKAGE}\n".encode()
    record = [f"{name},{_record_hash(data)},{len(data)}" for name, data in files.items()]
    files[f"{dist_info}/RECORD"] = ("\n".join(record + [f"{dist_info}/RECORD,,"]) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / wheel_name(root)
    tmp = target.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    tmp.replace(target)
    return target
