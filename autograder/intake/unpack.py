"""Unpack an upload without trusting it: a class zip entry by entry, a folder without following links.

What a student (or a broken upload) put in an archive costs only that student: a symbolic link
is never followed; an entry that is corrupt (bad CRC), encrypted, larger than its limit (a
notebook: the ``max_bytes`` size limit; another file: nbgrader's file limit) or past the whole
zip's limit (zip bombs) is not written, or deleted at once, and :class:`Tree` lists it with why
(``refused``), so that :mod:`autograder.intake.collect` names it in that student's status.
"""
import hashlib
import os
import stat
import time
import zipfile
import zlib
from pathlib import Path

from nbgrader.coursedir import CourseDirectory

__all__ = ["Tree", "unzip", "IGNORED_NAMES", "DATA_FILE_BYTES", "DATA_DIR_BYTES", "ZIP_RATIO", "ZIP_FLOOR", "LINK",
           "NAME_MAX"]

IGNORED_NAMES = {"__MACOSX", ".ipynb_checkpoints", "__pycache__"}
# nbgrader's own limits for files copied beside a notebook (kilobytes in its config).
DATA_FILE_BYTES = CourseDirectory.class_traits()["max_file_size"].default_value * 1000
DATA_DIR_BYTES = CourseDirectory.class_traits()["max_dir_size"].default_value * 1000
# A zip may expand to ZIP_RATIO times its own size in all, and always to ZIP_FLOOR notebooks
# of the size limit: a class of notebooks compresses 2-10 times, a zip bomb a thousand times.
ZIP_RATIO = 50
ZIP_FLOOR = 4
LINK = "is a symbolic link; links are never followed (submit the file itself)"
NAME_MAX = 255       # bytes in one file name on common file systems


def _mib(n: float) -> str:
    return f"{n / 2**20:.3g} MiB"


class Tree:
    """A folder of submissions listed without following links.

    Entries refused while unpacking (not on disk) and links (on disk, never followed) are
    listed as files so that each layout attributes them to a student; ``refused`` says why.
    """

    def __init__(self, base: Path, refused=None, aliases=None):
        self.base = Path(base)
        self.refused = dict(refused or {})    # path -> reason
        self.aliases = dict(aliases or {})    # path -> its name in the zip (too long for disk)
        self.links = set()
        self._absent = {}
        for p in self.refused:
            self._absent.setdefault(p.parent, []).append(p)

    def name(self, p: Path) -> str:
        return self.aliases.get(p, p.name)

    def rel(self, p: Path, start: Path = None) -> str:
        """``p`` as named in the export, '/'-separated, from ``start`` (default: the top)."""
        start = start or self.base
        names, q = [], p
        while q != start and q != q.parent:
            names.append(self.name(q))
            q = q.parent
        return "/".join(reversed(names))

    def _entries(self, folder: Path) -> list:
        out = []
        try:
            scan = list(os.scandir(folder))
        except OSError:
            scan = []
        for e in scan:
            if e.name in IGNORED_NAMES or e.name.startswith("."):
                continue
            p = Path(e.path)
            if e.is_symlink():
                self.refused[p] = LINK
                self.links.add(p)
                out.append((p, False))
            elif e.is_dir(follow_symlinks=False):
                out.append((p, True))
            elif e.is_file(follow_symlinks=False):
                out.append((p, False))
            else:   # a FIFO or a device would block or lie when read
                self.refused[p] = "is not a regular file"
                out.append((p, False))
        out += [(p, False) for p in self._absent.get(folder, [])
                if not os.path.lexists(p) and not p.name.startswith(".")
                and p.name not in IGNORED_NAMES]
        return sorted(out)

    def dirs(self, folder: Path) -> list:
        return [p for p, is_dir in self._entries(folder) if is_dir]

    def files(self, folder: Path, recursive: bool) -> list:
        out = []
        for p, is_dir in self._entries(folder):
            if not is_dir:
                out.append(p)
            elif recursive:
                out += self.files(p, True)
        return out


class _TooLarge(Exception):
    pass


def _fit(part: str) -> str:
    """A zip path component as a name this file system accepts (NUL, over 255 bytes)."""
    clean = part.replace("\x00", "_")
    if len(os.fsencode(clean)) <= NAME_MAX:
        return clean
    short = os.fsencode(clean)[:180].decode("utf-8", "ignore")
    return f"{short}~{hashlib.sha256(part.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


def _copy(zf, info, target: Path, cap: int) -> int:
    """Stream one entry to ``target``; raises _TooLarge past ``cap`` bytes (whatever the header
    says), or zipfile's errors for a corrupt entry. Returns the bytes written."""
    written = 0
    with zf.open(info) as src, open(target, "wb") as dst:
        while True:
            chunk = src.read(2**20)
            if not chunk:
                return written
            written += len(chunk)
            if written > cap:
                raise _TooLarge(written)
            dst.write(chunk)


def unzip(source: Path, dest: Path, max_bytes: int) -> Tree:
    """Unpack ``source`` into ``dest`` entry by entry; refused entries are named in the tree.

    Per entry: a link, an encrypted or corrupt entry, or one larger than its cap (a notebook:
    ``max_bytes``; any other file: DATA_FILE_BYTES) is not kept. In all: at most
    max(ZIP_RATIO x the zip's size, ZIP_FLOOR x max_bytes); later entries are refused.
    """
    refused, aliases, total = {}, {}, 0
    limit = max(ZIP_RATIO * source.stat().st_size, ZIP_FLOOR * max_bytes)
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(source) as zf:
        for info in zf.infolist():
            parts = [p for p in info.filename.replace("\\", "/").split("/")
                     if p not in ("", ".", "..")]
            if not parts:
                continue
            target = dest
            for part in parts:
                target = target / _fit(part)
                if target.name != part:
                    aliases[target] = part
            if info.is_dir():
                try:
                    target.mkdir(parents=True, exist_ok=True)
                except OSError:
                    pass
                continue
            notebook = parts[-1].lower().endswith(".ipynb")
            cap = max_bytes if notebook else DATA_FILE_BYTES
            what = "a notebook (--max-size)" if notebook else "a file beside a notebook"
            reason = ""
            if stat.S_ISLNK(info.external_attr >> 16):
                reason = LINK
            elif info.flag_bits & 0x1:
                reason = "is encrypted (password-protected); not unpacked"
            elif info.file_size > cap:
                reason = f"expands to {_mib(info.file_size)}, over the {_mib(cap)} limit for {what}"
            elif total + info.file_size > limit:
                reason = (f"not unpacked: the zip would expand past {_mib(limit)} in all "
                          f"({ZIP_RATIO} times its size, at least {ZIP_FLOOR} x --max-size); "
                          "is it a zip bomb?")
            else:
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    total += _copy(zf, info, target, min(cap, limit - total))
                except _TooLarge as exc:
                    reason = (f"expands past {_mib(exc.args[0] - 1)}, over its limit ({_mib(cap)} "
                              f"for {what}, {_mib(limit)} for the whole zip); is it a zip bomb?")
                except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError,
                        RuntimeError) as exc:
                    reason = f"is corrupt in the zip ({str(exc)[:100]}); not unpacked"
                except (OSError, ValueError) as exc:
                    reason = f"cannot be unpacked ({getattr(exc, 'strerror', None) or exc})"
                else:
                    try:   # keep the upload times: they pick the latest of several files
                        stamp = time.mktime(info.date_time + (0, 0, -1))
                        os.utime(target, (stamp, stamp))
                    except (OverflowError, ValueError, OSError):
                        pass
            if reason:
                if target.is_file() and not target.is_symlink():
                    target.unlink()     # nothing of a refused entry stays on disk
                refused[target] = reason
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)   # its student still shows
                except OSError:
                    pass
    tree = Tree(dest, refused, aliases)
    tree.links = {p for p, r in refused.items() if r == LINK}
    return tree
