"""Student ids as an LMS writes them, and the forms nbgrader, file systems and spreadsheets need.

An LMS id can hold anything a person's name or a login can: brackets, ``*`` and ``?``, commas,
quotes, accents, newlines, hundreds of characters. nbgrader reads its folder names as globs and
matches them with ``.*`` (which stops at a newline), so such an id is given to nbgrader as an
*internal id*: the id itself when it is plain (letters, digits, ``_ . @ + -``, at most 64
characters), else a readable ASCII slug plus a hash of the original (``li[1]`` ->
``li-1-3b1f0c2a``). The mapping is a pure function of the id, so it is the same on every run
and the gradebook keeps one student per id. Everything an instructor reads (grades.csv, the
printed table) shows the original id; the feedback folder uses :func:`folder_name`, the id with
only what a file system refuses replaced.
"""
import hashlib
import re
import unicodedata

__all__ = ["internal_id", "internal_ids", "folder_name", "printable", "spreadsheet_safe",
           "FORMULA_PREFIXES"]

PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,63}")
SLUG_CHARS = 40
# Characters no common file system accepts in a name (Windows is the strictest), control
# characters, and the separators.
UNSAFE_IN_NAME = re.compile(r'[\x00-\x1f\x7f/\\:*?"<>|]')
RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)),
            *(f"lpt{i}" for i in range(10))}
FOLDER_CHARS = 100
# A spreadsheet evaluates a cell that starts with one of these (also the full-width forms some
# spreadsheets accept): CSV injection. Such cells are written with a leading apostrophe.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def _hash(original: str, n: int = 8) -> str:
    return hashlib.sha256(original.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def _is_plain(original: str) -> bool:
    return (bool(PLAIN.fullmatch(original)) and not original.endswith(".")
            and original.split(".")[0].lower() not in RESERVED)


def internal_id(original: str, n: int = 8) -> str:
    """The id nbgrader sees for ``original``: itself when plain, else slug + ``n``-hex hash.

    Plain means ``[A-Za-z0-9_][A-Za-z0-9_.@+-]*``, at most 64 characters, not ending in a dot:
    no glob or regular-expression character, nothing a file system refuses. The slug keeps the
    ASCII letters of the id (accents dropped, ``José`` -> ``Jose``), so a person reading the
    gradebook still sees whose it is; the hash of the whole original keeps ids apart.
    """
    if _is_plain(original):
        return original
    ascii_ = unicodedata.normalize("NFKD", original).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", ascii_).strip("-._")[:SLUG_CHARS].strip("-._")
    return f"{slug or 'student'}-{_hash(original, n)}"


def internal_ids(originals) -> dict:
    """original -> internal id for a whole batch, unique even ignoring case.

    Two originals can only meet on one internal id when one is plain and looks exactly like
    another's slug and hash; the later of them then gets a longer hash.
    """
    taken, out = set(), {}
    for original in sorted(set(originals), key=lambda s: (not _is_plain(s), s)):
        n, iid = 8, internal_id(original)
        while iid.lower() in taken:
            n += 4
            iid = f"{internal_id(original)}-{_hash(original, n)}"
        taken.add(iid.lower())
        out[original] = iid
    return out


def folder_name(original: str) -> str:
    """``original`` as a file or folder name: unchanged when every file system accepts it.

    Control characters (newline, tab), ``/ \\ : * ? " < > |`` become ``_``; leading and trailing
    spaces and dots are dropped; a name longer than 100 characters is cut. Whenever anything was
    changed (or the name is reserved on Windows, such as ``CON``), ``_`` and a hash of the
    original are appended, so two ids never share a folder. Brackets, commas, apostrophes,
    spaces and accents are kept: ``Smith, J [12345]`` stays as it is.
    """
    name = unicodedata.normalize("NFC", original)
    name = UNSAFE_IN_NAME.sub("_", name).strip(" .")[:FOLDER_CHARS].rstrip(" .")
    if name != original or not name or name.split(".")[0].lower() in RESERVED:
        name = f"{name}_{_hash(original)}" if name else f"student_{_hash(original)}"
    return name


def printable(text: str) -> str:
    """``text`` on one line: control characters shown as escapes (``\\n``), accents kept
    (:func:`mlexp.check.terminal_safe`, which the students' own check uses too)."""
    from mlexp.check import terminal_safe
    return terminal_safe(text)


def spreadsheet_safe(value):
    """``value`` for a CSV cell that a spreadsheet shows as text, never evaluates.

    A string starting with ``= + - @``, a tab or a carriage return (or the full-width
    ``＝ ＋ － ＠``) gets a leading apostrophe, the escape spreadsheets understand (OWASP's
    advice against CSV injection); strip one leading ``'`` to read the original back. Numbers
    and other strings are returned unchanged.
    """
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value
