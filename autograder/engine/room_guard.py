"""The room's guard: the forbidden modules' code refused however the notebook carries it in.

A room (autograder.engine.room) holds no file of the modules an exercise forbids, but a notebook can
carry their code itself: as text (pasted, compressed, encoded; or a function's body without its
``def`` line, wrapped in a syntax tree built in code), or as byte code (``marshal`` data, a code
object built with ``types.CodeType``). Every one of those reaches the interpreter through an event
of its audit hooks (PEP 578): ``compile`` (text or a syntax tree), ``marshal.loads``,
``code.__new__``, ``import`` (a compiled extension's file). Before the student's statements are sent
into a room, the grader sends :func:`guard_program`, which adds such a hook (an audit hook cannot be
removed once added), and the hook judges the code, not its spelling:

- **text and syntax trees**: the module's statements and every function's, in the shape the grader
  reads a notebook with (:func:`_make`'s ``flat``: names, strings and padding aside; the measure of
  :func:`autograder.engine.copies.copy_of`: COPY_SHARE of a forbidden function's statements in its
  order) against the forbidden functions of COPY_MIN_STATEMENTS statements or more, which cross as
  hashes (the room cannot read the library, and a hash tells nothing of its code);
- **byte code**: only the interpreter's own imports may load it, of a file the room cannot write
  (a read-only mount of the sandbox), its bytes equal to that file's; a code object built by hand,
  and a compiled extension from a place the room can write, are refused outright;
- **the guard itself**: what would let the student's code reach the guard's state or run inside it
  is refused too: ``gc``'s object lists, other threads' frames, a new thread, ``ctypes``, the
  process's own memory (``/proc/self/mem``); a signal handler added after the guard, or a class of
  the syntax tree changed, stops the room at the next judgement. The hook reads nothing the
  student's code can rebind (every builtin, class and function it calls is taken before any student
  code runs, :func:`_kit`; its own names are closures, never globals) and never raises: an
  exception's traceback would hand its frame to the student's code.

A refusal stops the room: the reason is written to a file the grader reads (``stop_path``) and the
process exits, so the exercise's tests fail with the rule's hint (autograder.engine.room). What this
does not decide: code that is the student's own by this measure (a function under
COPY_MIN_STATEMENTS statements, or one rewritten beyond COPY_SHARE), and a race won by another of
the room's threads between the hook's last check and the compiler's read of a syntax tree.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
from functools import lru_cache
from pathlib import Path

from autograder.engine import copies

__all__ = ["guard_program", "STOP_FILE", "STOP_EXIT"]

STOP_FILE = "guard-stop"      # in the room's ipc folder: why the guard stopped the room
STOP_EXIT = 86                # the room's exit status when its guard stopped it


def _kit(strict: bool) -> dict:
    """Every builtin, C function and class the guard calls, taken now (before any student code runs
    in the room): a student's later ``builtins.len = ...`` or ``ast.parse = ...`` changes nothing
    the guard holds. ``strict``: the room is sandboxed (its read-only folders are the library's)."""
    import _ast
    import _bisect
    import _signal
    import _thread
    import gc
    import importlib._bootstrap_external as boot
    import posix
    import sys
    try:
        from _hashlib import openssl_sha1 as sha1
    except ImportError:
        from _sha1 import sha1
    classes, stack = [], [_ast.AST]
    while stack:
        cls = stack.pop()
        if cls not in classes:
            classes.append(cls)
            stack.extend(type.__subclasses__(cls))
    classes.sort(key=id)
    class_dict = type.__dict__["__dict__"].__get__
    here = posix.getcwd()
    roots = []
    for d in [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path]:
        if not isinstance(d, str) or not d.startswith("/") or d == here or d.startswith(here + "/"):
            continue
        if strict and posix.access(d, posix.W_OK):
            continue       # sandboxed, only a read-only folder holds files the room cannot write
        roots.append(d.rstrip("/") + "/")
    signals = tuple(s for s in range(1, _signal.NSIG) if s not in (_signal.SIGKILL, _signal.SIGSTOP))
    return {
        "type": type, "len": len, "repr": repr, "range": range, "min": min, "id": id, "bytes": bytes,
        "str": str, "list": list, "tuple": tuple, "frozenset": frozenset, "sorted": sorted,
        "leaves": (str, bytes, int, float, complex, bool, type(None), type(Ellipsis)),
        "BaseException": BaseException, "LookupError": LookupError, "unparsable": (SyntaxError, ValueError, TypeError, MemoryError, RecursionError),
        "barry": __import__("__future__").CO_FUTURE_BARRY_AS_BDFL, "sleep": __import__("time").sleep,
        "setswitchinterval": sys.setswitchinterval, "interval": sys.getswitchinterval(),
        "compile": compile, "only_ast": _ast.PyCF_ONLY_AST | _ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
        "sha1": sha1, "getframe": sys._getframe, "bisect": _bisect.bisect_left,
        "ids": tuple(id(c) for c in classes), "classes": tuple(classes),
        "fields": tuple((c.__name__, tuple(getattr(c, "_fields", ()))) for c in classes),
        "snapshot": tuple((c, tuple(class_dict(c).items())) for c in classes), "class_dict": class_dict,
        "node_dict": _ast.AST.__dict__["__dict__"].__get__,
        "Module": _ast.Module, "Interactive": _ast.Interactive, "FunctionDef": _ast.FunctionDef,
        "AsyncFunctionDef": _ast.AsyncFunctionDef, "ClassDef": _ast.ClassDef, "Name": _ast.Name,
        "arg": _ast.arg, "AnnAssign": _ast.AnnAssign, "Constant": _ast.Constant, "Pass": _ast.Pass,
        "Expr": _ast.Expr, "ExceptHandler": _ast.ExceptHandler, "match_case": _ast.match_case,
        "open": posix.open, "read": posix.read, "write": posix.write, "close": posix.close,
        "fstat": posix.fstat, "exit": posix._exit, "O_RDONLY": posix.O_RDONLY,
        "O_NEW": posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC,
        "gc": (gc.isenabled, gc.disable, gc.enable), "getsignal": _signal.getsignal,
        "handlers": tuple((s, _signal.getsignal(s)) for s in signals),
        "int_handlers": (_signal.getsignal(_signal.SIGINT), _signal.default_int_handler,
                         _signal.SIG_DFL, _signal.SIG_IGN, None),
        "SIGINT": _signal.SIGINT, "bytecode_loader": boot._compile_bytecode.__code__,
        "roots": tuple(roots), "name": f"<room guard {_thread.get_ident():x}-{id(classes):x}>",
    }


def _make(kit: dict, library: tuple, share: float, stop_path: str):
    """(flat, hook): the statement shapes of a body, and the audit hook. Every name the two use is
    one of this function's locals (a closure, never a global the student's code could rebind)."""
    _type, _len, _repr, _range, _min, _id = kit["type"], kit["len"], kit["repr"], kit["range"], kit["min"], kit["id"]
    _bytes, _str, _list, _tuple, _frozenset = kit["bytes"], kit["str"], kit["list"], kit["tuple"], kit["frozenset"]
    _sorted, _leaves, _compile, _only_ast, _sha1 = kit["sorted"], kit["leaves"], kit["compile"], kit["only_ast"], kit["sha1"]
    _getframe, _bisect, _ids, _fields = kit["getframe"], kit["bisect"], kit["ids"], kit["fields"]
    _snapshot, _class_dict, _node_dict = kit["snapshot"], kit["class_dict"], kit["node_dict"]
    Module, Interactive, FunctionDef, AsyncFunctionDef = kit["Module"], kit["Interactive"], kit["FunctionDef"], kit["AsyncFunctionDef"]
    ClassDef, Name, arg, AnnAssign, Constant = kit["ClassDef"], kit["Name"], kit["arg"], kit["AnnAssign"], kit["Constant"]
    Pass, Expr, ExceptHandler, match_case = kit["Pass"], kit["Expr"], kit["ExceptHandler"], kit["match_case"]
    _open, _read, _write, _close, _fstat, _exit = kit["open"], kit["read"], kit["write"], kit["close"], kit["fstat"], kit["exit"]
    O_RDONLY, O_NEW, (_gc_on, _gc_off, _gc_enable) = kit["O_RDONLY"], kit["O_NEW"], kit["gc"]
    _getsignal, _handlers, _int_handlers, SIGINT = kit["getsignal"], kit["handlers"], kit["int_handlers"], kit["SIGINT"]
    _loader, _roots, NAME = kit["bytecode_loader"], kit["roots"], kit["name"]
    _BaseException, _unparsable, Strange = kit["BaseException"], kit["unparsable"], kit["LookupError"]
    BARRY, _switch, _interval, _sleep = kit["barry"], kit["setswitchinterval"], kit["interval"], kit["sleep"]
    HOLD = 1000.0
    BODIES = ("body", "orelse", "finalbody", "handlers", "cases")
    WATCHED = frozenset(("compile", "exec", "marshal.loads", "marshal.load", "code.__new__", "import", "open",
                         "os.symlink", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
                         "sys._current_frames", "_thread.start_new_thread"))
    MISSING = object()

    def is_def(t):
        return t is FunctionDef or t is AsyncFunctionDef

    def fields_of(t):
        i = _bisect(_ids, _id(t))
        if i < _len(_ids) and _ids[i] == _id(t):
            return _fields[i]
        raise Strange(t)

    def leaf(t):     # by identity: `t in (...)` would call a metaclass's __eq__
        for each in _leaves:
            if t is each:
                return True
        return False

    def value(node, field):
        d = _node_dict(node)
        for key in d:        # exact str keys only: a lookup would call a str subclass's __eq__
            if _type(key) is not _str:
                raise Strange(key)
        return d.get(field)

    def dump(node, head):
        t = _type(node)
        if t is _list:
            return "[" + ",".join([dump(x, False) for x in node]) + "]"
        if t is _tuple or t is _frozenset:
            inner = [dump(x, False) for x in node]
            return ("tuple(" + ",".join(inner) if t is _tuple else "frozenset(" + ",".join(_sorted(inner))) + ")"
        if leaf(t):
            return _repr(node)
        name, fields = fields_of(t)
        parts = []
        for f in fields:
            v = value(node, f)
            if head and f in BODIES and _type(v) is _list:
                parts.append("[]")
            elif (t is Name and f == "id") or (t is arg and f == "arg") or (is_def(t) or t is ClassDef) and f == "name":
                parts.append("_")
            elif (t is arg and f == "annotation") or (is_def(t) and f == "returns"):
                parts.append("None")
            elif t is AnnAssign and f == "annotation":
                parts.append("Constant('',None)")
            elif t is Constant and f == "value" and (_type(v) is _str or _type(v) is _bytes):
                parts.append("''")
            else:
                parts.append(dump(v, False))
        return name + "(" + ",".join(parts) + ")"

    def flat(statements):
        """Each statement's shape in order, a compound statement's header then its blocks (as
        autograder.engine.copies._flat reads them): names, argument names, strings and
        annotations blanked; ``pass`` and bare constants left out."""
        out = []
        if _type(statements) is not _list:
            raise Strange(statements)
        for stmt in statements:
            t = _type(stmt)
            if t is Pass or (t is Expr and _type(value(stmt, "value")) is Constant):
                continue
            out.append(dump(stmt, True))
            for b in BODIES:
                block = value(stmt, b)
                if _type(block) is not _list:
                    continue
                for item in block:
                    ti = _type(item)
                    out += flat(value(item, "body")) if ti is ExceptHandler or ti is match_case else flat([item])
        return out

    def common(a, b):
        row = [0] * (_len(b) + 1)
        for x in a:
            prev = 0
            for j in _range(1, _len(b) + 1):
                y = b[j - 1]
                if x == y:
                    prev, row[j] = row[j], prev + 1
                else:
                    prev, row[j] = row[j], row[j] if row[j] >= row[j - 1] else row[j - 1]
        return row[-1]

    def copy_of(mine):
        have = {}
        for s in mine:
            have[s] = have.get(s, 0) + 1
        for shapes, counts, name in library:
            need = share * _len(shapes)
            got = 0
            for s, c in counts:
                got += _min(c, have.get(s, 0))
            if got >= need and common(shapes, mine) >= need:
                return name
        return None

    def bodies(tree):
        """The module's statements and every function's, checking each node's type on the way."""
        found, stack = [], [tree]
        t = _type(tree)
        if t is Module or t is Interactive:
            found.append(value(tree, "body"))
        while stack:
            node = stack.pop()
            t = _type(node)
            if t is _list:
                stack.extend(node)
                continue
            if leaf(t) or t is _tuple or t is _frozenset:
                continue
            _name, fields = fields_of(t)
            if is_def(t):
                found.append(value(node, "body"))
            for f in fields:
                stack.append(value(node, f))
        return found

    def tampered():
        for s, h in _handlers:
            now = _getsignal(s)
            if now is h:
                continue
            if s == SIGINT:
                ok = False
                for each in _int_handlers:
                    ok = ok or now is each
                if ok:
                    continue
            return "a signal handler was added after the room's guard"
        for cls, items in _snapshot:
            d = _class_dict(cls)
            if _len(d) != _len(items):
                return "a class of Python's syntax tree was changed"
            for k in d:
                if _type(k) is not _str:
                    return "a class of Python's syntax tree was changed"
            for k, v in items:
                if d.get(k, MISSING) is not v:
                    return "a class of Python's syntax tree was changed"
        return None

    def judge_tree(tree):
        why = tampered()
        if why:
            return why
        was = _gc_on()
        _gc_off()
        try:
            for body in bodies(tree):
                mine = [_sha1(s.encode()).hexdigest()[:16] for s in flat(body)]
                name = copy_of(mine)
                if name:
                    return "the room was given the code of " + name + ", which this exercise forbids"
        finally:
            if was:
                _gc_enable()
        return tampered()

    def parses(source):
        """Every way the compile it was given for may read ``source``: the event carries a str's
        UTF-8 bytes, whose compile ignored a coding line that a compile of the bytes obeys; a
        future flag (``barry_as_FLUFL``) the compile may have been given, or inherited, widens
        the grammar."""
        texts = [source]
        if _type(source) is _bytes and b"coding" in b"\n".join(source.split(b"\n", 2)[:2]):
            texts.append(source.decode("utf-8", "replace"))
        trees = []
        for text in texts:
            for flags in (_only_ast, _only_ast | BARRY):
                try:
                    trees.append(_compile(text, NAME, "exec", flags, True))
                    break
                except _unparsable:
                    continue
        if not trees and _type(source) is _bytes and _len(texts) == 1:
            try:
                trees.append(_compile(source.decode("utf-8", "replace"), NAME, "exec", _only_ast | BARRY, True))
            except _unparsable:
                pass
        return trees

    def judge_text(source):
        why = tampered()     # first: nothing of the student's may run inside the parse below
        if why:
            return why
        was = _gc_on()
        _gc_off()
        try:
            trees = parses(source)
        finally:
            if was:
                _gc_enable()
        if not trees:        # unreadable here: the compile fails too, or reads it otherwise
            return "the room was given code its guard could not read" if _len(source) >= 80 else None
        for tree in trees:
            why = judge_tree(tree)
            if why:
                return why
        return None

    judging = judge_text.__code__

    def own_reading(args):
        """Is this compile the guard's own parse (its name, from judge_text, on this thread's stack)?"""
        if _len(args) < 2 or args[1] is not NAME:
            return False
        frame = _getframe(0)
        while frame is not None:
            if frame.f_code is judging:
                return True
            frame = frame.f_back
        return False

    def readable_only(path):
        if _type(path) is not _str or not path.startswith("/") or "/../" in path or "/./" in path or "//" in path:
            return False
        for root in _roots:
            if path.startswith(root):
                return True
        return False

    def genuine(data):
        """Byte code the interpreter's import loads from a file of a read-only folder, as that file holds it."""
        frame = _getframe(0)
        while frame is not None and frame.f_code is not _loader:
            frame = frame.f_back
        if frame is None:
            return False
        path = frame.f_locals.get("bytecode_path")
        if not readable_only(path):
            return False
        fd = _open(path, O_RDONLY)
        try:
            size, chunks, got = _fstat(fd).st_size, [], 0
            while got < size:
                chunk = _read(fd, size - got)
                if not chunk:
                    break
                chunks.append(chunk)
                got += _len(chunk)
        finally:
            _close(fd)
        return _type(data) is _bytes and b"".join(chunks)[16:] == data   # the event's copy of marshal.loads's data

    def last_part(path):
        if _type(path) is _bytes:
            path = path.decode("utf-8", "replace")
        if _type(path) is not _str:
            return ""
        return path.rstrip("/").rsplit("/", 1)[-1]

    def judge(event, args):
        if event == "compile":
            if own_reading(args):
                return None       # the guard's own parse of what it judges
            t = _type(args[0])
            if t is _str or t is _bytes:
                return judge_text(args[0])
            _i = _bisect(_ids, _id(t))
            if _i < _len(_ids) and _ids[_i] == _id(t):
                # A tree is the student's objects, which another thread could change between this
                # reading and the compiler's: no other thread runs until the compiled code is run
                # (the "exec" event below); one already waiting for its turn runs first, now.
                _switch(HOLD)
                _sleep(0)
                return judge_tree(args[0])
            return judge_text(args[0])
        if event == "exec":
            _switch(_interval)
            return None
        if event == "marshal.loads":
            return None if genuine(args[0]) else "the room was given byte code to load (marshal)"
        if event == "marshal.load":
            return "the room was given byte code to load (marshal)"
        if event == "code.__new__":
            return "the room was given a code object built by hand (types.CodeType)"
        if event == "import":
            path = args[1] if _len(args) > 1 else None
            if path is None or readable_only(path):
                return None
            return "the room was given a compiled module from a place it can write"
        if event == "open":
            return "the room opened its own memory" if last_part(args[0]) == "mem" else None
        if event == "os.symlink":
            return "the room linked to its own memory" if last_part(args[0]) == "mem" else None
        return "the room's code reached for the grader's guard (" + event + ")"

    def stop(why):
        try:
            fd = _open(stop_path, O_NEW, 0o644)
            _write(fd, why.encode("utf-8", "replace")[:500])
            _close(fd)
        finally:
            _exit(86)

    def hook(event, args):
        if event not in WATCHED and not event.startswith("ctypes."):
            return
        try:
            why = judge(event, args)
        except _BaseException as exc:      # never raised: its traceback would hold the guard's frame
            why = "the room's guard could not read what it was given (" + _type(exc).__name__ + ")"
        if why:
            name = args[1] if event == "compile" and _len(args) > 1 else None
            if _type(name) is _str and name.startswith("<cell ") and _len(name) < 60:
                why = why + "\n" + name      # a statement of the room's definitions: left out next time
            stop(why)

    return flat, hook


def _hash(shape: str) -> str:
    return hashlib.sha1(shape.encode()).hexdigest()[:16]


@lru_cache(maxsize=None)
def _library(forbid: tuple) -> tuple:
    """(hashed shapes, shape counts, dotted name) of every function of the forbidden modules of
    COPY_MIN_STATEMENTS statements or more, read from the library's source files."""
    flat, _hook = _make(_kit(strict=False), (), copies.COPY_SHARE, "")
    spec = importlib.util.find_spec("mlexp")
    if spec is None or not spec.submodule_search_locations:
        return ()
    root = Path(list(spec.submodule_search_locations)[0])
    found = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(("mlexp", *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        if not any(module == m or module.startswith(m + ".") for m in forbid):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                shapes = tuple(_hash(s) for s in flat(node.body))
                if len(shapes) >= copies.COPY_MIN_STATEMENTS:
                    counts = {}
                    for s in shapes:
                        counts[s] = counts.get(s, 0) + 1
                    found.append((shapes, tuple(counts.items()), f"{module}.{node.name}"))
    return tuple(found)


def guard_program(forbid, stop_path: str = "/dev/null", strict: bool = True) -> str:
    """The Python that adds the guard to a room whose rules forbid the modules ``forbid``, run in a
    namespace of its own. ``stop_path``: the file that says why, when the guard stops the room;
    ``strict``: the room is sandboxed (byte code only from its read-only folders)."""
    source = (inspect.getsource(_kit) + "\n\n" + inspect.getsource(_make)
              + f"\n\n__import__('sys').addaudithook(_make(_kit({strict!r}), {_library(tuple(forbid))!r}, "
              f"{copies.COPY_SHARE!r}, {str(stop_path)!r})[1])\n")
    return f"exec(compile({source!r}, '<room guard>', 'exec'), {{'__name__': '_room_guard'}})"
