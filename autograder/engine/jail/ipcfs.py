"""The kernel's connection folder as a small tmpfs of the harness's own, never the grader's disk.

The harness and the sandboxed kernel talk over Unix sockets that the kernel creates in one
folder both can see (the connection file is there too). A folder of the job on the grader's disk
would let a student fill that disk (issue 25, item 3: one submission wrote 449 MiB there and the
submission beside it failed). :func:`confine` mounts a tmpfs of :data:`IPC_MB` MiB and
:data:`IPC_INODES` inodes over the folder, in a mount namespace of the harness process alone
(the jail and bubblewrap, its children, inherit it), so a write there ends at ENOSPC after 1 MiB
and nothing outside the harness sees the mount. As root, a mount namespace of its own; as
another user, a user namespace of its own too, that maps the harness's uid and gid to themselves
(bubblewrap nests its own inside it). It must run while the harness has one thread only.
"""
import ctypes
import os
from pathlib import Path

__all__ = ["IPC_MB", "IPC_INODES", "confine"]

IPC_MB = 1            # bytes of the folder (sockets take none, the connection file < 1 KiB)
IPC_INODES = 64       # files and sockets in it (the kernel makes 5 sockets)
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def confine(folder: Path) -> None:
    """Mount a tmpfs of IPC_MB MiB and IPC_INODES inodes, mode 0755, owned by this process's
    uid, at ``folder`` (which must exist), visible to this process and its children only.

    Raises OSError when the kernel refuses a new mount namespace (a container without user
    namespaces for a user other than root), or when called with more than one thread as
    another user than root (``unshare(CLONE_NEWUSER)`` then fails with EINVAL). Linux only.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    else:
        _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare(CLONE_NEWUSER|CLONE_NEWNS)")
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    # Nothing this process mounts from here on reaches the host, and the other way round.
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    data = f"size={IPC_MB}m,nr_inodes={IPC_INODES},mode=0755,uid={uid},gid={gid}".encode()
    _check(libc.mount(b"tmpfs", str(folder).encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                      data), f"mount a tmpfs at {folder}")
