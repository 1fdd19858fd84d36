"""Earlier versions of a lesson notebook, read from the course's git history.

A notebook handed in against an earlier release still holds that release's own code cells; the
audit (:mod:`autograder.engine.audit`) must know them to tell the lesson's code from the student's,
and :mod:`autograder.publishing.releases` rebuilds those releases.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import nbformat

__all__ = ["git_versions"]


def git_versions(root: Path, rel: str, limit: int = 30) -> list:
    """The notebook at ``rel`` (a path in the course) as each of its last ``limit`` commits held
    it, oldest first, as nbformat notebooks. [] when the course is not a git checkout (or git
    is missing); a commit where the file was deleted or is not a notebook is skipped."""

    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=60,
                              check=True).stdout
    try:
        revs = git("log", f"-{limit}", "--format=%H", "--", rel).decode().split()
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for rev in reversed(revs):
        try:
            found.append(nbformat.reads(git("show", f"{rev}:{rel}").decode(), as_version=4))
        except Exception:   # noqa: BLE001 (a commit where the file was deleted or not JSON)
            continue
    return found
