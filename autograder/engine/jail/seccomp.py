"""The seccomp filter of the student's kernel: a classic-BPF program for ``bwrap --seccomp FD``.

The sandbox already has no capabilities and no nested user namespace (``--disable-userns``),
but the kernel surface that a process without them can still reach is where sandbox escapes
come from; Flatpak, Chrome and Docker close it with a seccomp filter. This one denies:

- user namespaces: ``unshare`` and ``setns`` (EPERM), ``clone`` with CLONE_NEWUSER (EPERM) and
  ``clone3`` (ENOSYS: its flags are in memory, which a filter cannot read, so glibc falls back
  to ``clone``, as under Flatpak);
- ``io_uring_setup``/``_enter``/``_register``; the keyrings (``add_key``, ``request_key``,
  ``keyctl``); ``bpf``; ``perf_event_open``; ``userfaultfd``;
- kernels and modules (``kexec_load``, ``kexec_file_load``, ``init_module``, ``finit_module``,
  ``delete_module``); mounts (``mount``, ``umount2``, ``pivot_root``, ``chroot``, ``move_mount``,
  ``open_tree``, ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``, ``mount_setattr``);
  ``open_by_handle_at``; ``ptrace``, ``process_vm_readv``/``writev``; ``syslog``, ``acct``,
  ``quotactl``, ``swapon``/``swapoff``, ``reboot``;
- ``personality`` with anything but PER_LINUX, PER_LINUX32 or a query (no
  ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, ...), and the ``ioctl`` requests TIOCSTI and TIOCLINUX
  (typing into a terminal);
- any system call of another architecture than the machine's own (i386 through ``int 0x80``, and
  x32 on x86_64): the process is killed, since the numbers above would not match there.

Everything else is allowed. The program is written here (a few lines of assembler below, one
comment per instruction) rather than through libseccomp, so that the grader needs no package
beyond bubblewrap. Sources for the lists: Flatpak's ``flatpak-run.c`` (``setup_seccomp``),
bubblewrap's ``demos/flatpak-run.sh``, Docker's default profile (moby ``profiles/seccomp``);
numbers from Linux's ``arch/x86/entry/syscalls/syscall_64.tbl`` and
``include/uapi/asm-generic/unistd.h``; layout from ``include/uapi/linux/seccomp.h`` and
``filter.h``.
"""
import errno
import os
import platform
import struct

__all__ = ["ARCHES", "DENIED", "supported", "program", "program_fd"]

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little endian)
NR, ARCH, ARG0_LO, ARG1_LO = 0, 4, 16, 24

# Classic BPF opcodes (linux/filter.h, linux/bpf_common.h)
LD_W_ABS = 0x00 | 0x00 | 0x20      # BPF_LD | BPF_W | BPF_ABS: A = seccomp_data[k] (32 bits)
JEQ_K = 0x05 | 0x10 | 0x00         # BPF_JMP | BPF_JEQ | BPF_K: pc += (A == k) ? jt : jf
JGE_K = 0x05 | 0x30 | 0x00         # BPF_JMP | BPF_JGE | BPF_K
JSET_K = 0x05 | 0x40 | 0x00        # BPF_JMP | BPF_JSET | BPF_K: pc += (A & k) ? jt : jf
RET_K = 0x06 | 0x00                # BPF_RET | BPF_K: return k

# Return values (linux/seccomp.h)
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000             # | errno in the low 16 bits
RET_ALLOW = 0x7FFF0000

X32_SYSCALL_BIT = 0x40000000
CLONE_NEWUSER = 0x10000000
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
PER_LINUX, PER_LINUX32, PERSONALITY_QUERY = 0x0000, 0x0008, 0xFFFFFFFF

# Constant tables (built at import, never written after):
# name -> (x86_64 number, aarch64 number), from the kernel's tables named above.
_NUMBERS = {"unshare": (272, 97), "setns": (308, 268), "clone": (56, 220), "clone3": (435, 435),
            "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
            "io_uring_register": (427, 427), "add_key": (248, 217), "request_key": (249, 218),
            "keyctl": (250, 219), "bpf": (321, 280), "perf_event_open": (298, 241),
            "userfaultfd": (323, 282), "kexec_load": (246, 104), "kexec_file_load": (320, 294),
            "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
            "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
            "chroot": (161, 51), "move_mount": (429, 429), "open_tree": (428, 428),
            "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432),
            "fspick": (433, 433), "mount_setattr": (442, 442), "open_by_handle_at": (304, 265),
            "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
            "syslog": (103, 116), "acct": (163, 89), "quotactl": (179, 60), "swapon": (167, 224),
            "swapoff": (168, 225), "reboot": (169, 142), "personality": (135, 92),
            "ioctl": (16, 29)}
# machine -> (AUDIT_ARCH_*, {name: number})
ARCHES = {"x86_64": (0xC000003E, {n: x for n, (x, _) in _NUMBERS.items()}),
          "aarch64": (0xC00000B7, {n: a for n, (_, a) in _NUMBERS.items()})}

# Denied whatever their arguments: name -> errno the caller sees.
DENIED = {name: errno.EPERM for name in _NUMBERS
          if name not in ("clone", "clone3", "personality", "ioctl")}
DENIED["clone3"] = errno.ENOSYS


def supported(machine=None) -> bool:
    """Whether a filter exists for ``machine`` (default: this one, ``platform.machine()``)."""
    return (machine or platform.machine()) in ARCHES


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    """One ``struct sock_filter`` {u16 code; u8 jt; u8 jf; u32 k}, native byte order."""
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


def program(machine=None) -> bytes:
    """The filter for ``machine`` (default: this one) as bytes of ``struct sock_filter``
    (8 bytes each), the form ``bwrap --seccomp FD`` reads. Raises ValueError for a machine
    without a table (see :data:`ARCHES`)."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise ValueError(f"no seccomp filter for {machine!r} (known: {', '.join(ARCHES)})")
    audit_arch, nr = ARCHES[machine]
    deny = lambda e: _insn(RET_K, RET_ERRNO | e)          # noqa: E731
    code = [_insn(LD_W_ABS, ARCH),                        # A = arch
            _insn(JEQ_K, audit_arch, 1, 0),               # native: skip the kill
            _insn(RET_K, RET_KILL_PROCESS),               # i386 (int 0x80) or any other ABI
            _insn(LD_W_ABS, NR)]                          # A = syscall number
    if machine == "x86_64":
        code += [_insn(JGE_K, X32_SYSCALL_BIT, 0, 1),     # x32 numbers have bit 30 set
                 _insn(RET_K, RET_KILL_PROCESS)]
    for name, err in DENIED.items():
        code += [_insn(JEQ_K, nr[name], 0, 1),            # this call? else skip its return
                 deny(err)]
    code += [_insn(JEQ_K, nr["clone"], 0, 4),             # clone: look at its flags
             _insn(LD_W_ABS, ARG0_LO),                    # A = flags (low word; CLONE_NEWUSER in it)
             _insn(JSET_K, CLONE_NEWUSER, 0, 1),          # a new user namespace?
             deny(errno.EPERM),
             _insn(RET_K, RET_ALLOW)]
    code += [_insn(JEQ_K, nr["personality"], 0, 6),       # personality: the kernel reads 32 bits
             _insn(LD_W_ABS, ARG0_LO),
             _insn(JEQ_K, PER_LINUX, 3, 0),
             _insn(JEQ_K, PER_LINUX32, 2, 0),
             _insn(JEQ_K, PERSONALITY_QUERY, 1, 0),
             deny(errno.EPERM),                           # ADDR_NO_RANDOMIZE and the like
             _insn(RET_K, RET_ALLOW)]
    code += [_insn(JEQ_K, nr["ioctl"], 0, 5),             # ioctl: the request is 32 bits
             _insn(LD_W_ABS, ARG1_LO),
             _insn(JEQ_K, TIOCSTI, 2, 0),
             _insn(JEQ_K, TIOCLINUX, 1, 0),
             _insn(RET_K, RET_ALLOW),
             deny(errno.EPERM)]
    code += [_insn(RET_K, RET_ALLOW)]                     # everything else
    return b"".join(code)


def program_fd(machine=None) -> int:
    """A file descriptor (inheritable, at offset 0) holding :func:`program`, for bubblewrap's
    ``--seccomp FD``, which reads it to the end. An anonymous memory file (memfd) where Linux has
    one, else an unlinked temporary file. Raises ValueError as :func:`program` does."""
    data = program(machine)
    try:
        fd = os.memfd_create("mlexp-seccomp", 0)
    except (AttributeError, OSError):
        import tempfile
        fd = os.dup(tempfile.TemporaryFile().fileno())
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd
