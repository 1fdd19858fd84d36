"""The room's guard: the forbidden modules' code refused even when the notebook carries it as text.

A room (autograder.engine.room) holds no file of the modules an exercise forbids, but a notebook can
carry their source itself: pasted as a string, compressed and encoded, and run with ``exec`` by a
helper the ruled function reads. Before the student's statements are sent into a room, the grader
sends :func:`guard_program`: an audit hook (PEP 578, which code cannot remove once added) that reads
every source text the room compiles and refuses one holding a function of a forbidden module, by
the same measure the grader reads the notebook with (:func:`autograder.engine.copies.copy_of`:
COPY_SHARE of a library function's statements in their order, names, strings and padding aside).
The compile fails, so the code never runs and the ruled function fails its rule.

The shapes of the library's functions cross as hashes (the room cannot read the library, and a
hash tells nothing of its code). Not refused: byte code loaded with ``marshal`` (the interpreter's
own imports use it too), and a function under COPY_MIN_STATEMENTS statements (what anyone would
write).
"""
from __future__ import annotations

import hashlib
import inspect

from autograder.engine import copies

__all__ = ["guard_program"]


def _hash(shape: str) -> str:
    return hashlib.sha1(shape.encode()).hexdigest()[:16]


_GUARD = '''
import ast, hashlib, sys, threading
BODIES = {bodies!r}
COPY_SHARE = {share!r}
_LIBRARY = tuple((tuple(s), n) for s, n in {library!r})
{flat}
{common}
{copy_of}
_busy = threading.local()


def _room_guard(event, args):
    if event != "compile" or getattr(_busy, "on", False):
        return
    source = args[0] if args else None
    if isinstance(source, bytes):
        source = source.decode("utf-8", "replace")
    if not isinstance(source, str) or "def " not in source:
        return
    _busy.on = True
    try:
        try:
            tree = ast.parse(source)
        except Exception:
            return
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                mine = [hashlib.sha1(s.encode()).hexdigest()[:16] for s in _flat(node.body)]
                name = copy_of(mine, _LIBRARY)
                if name:
                    raise RuntimeError(f"{{node.name}} is the code of {{name}}, which this exercise forbids")
    finally:
        _busy.on = False


sys.addaudithook(_room_guard)
'''


def guard_program(forbid) -> str:
    """The Python that adds the guard to a room whose rules forbid the modules ``forbid`` (their
    functions of COPY_MIN_STATEMENTS statements or more, as hashes of their shapes), run in a
    namespace of its own so that no name the student's statements bind reaches the guard's."""
    library = [([_hash(s) for s in shapes], name) for shapes, name in copies._library_shapes()
               if any(name == m or name.startswith(m + ".") for m in forbid)]
    source = _GUARD.format(bodies=copies.BODIES, share=copies.COPY_SHARE, library=library,
                           flat=inspect.getsource(copies._flat), common=inspect.getsource(copies._common),
                           copy_of=inspect.getsource(copies.copy_of))
    return f"exec(compile({source!r}, '<room guard>', 'exec'), {{'__name__': '_room_guard'}})"
