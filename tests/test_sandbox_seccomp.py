"""The seccomp filter of the student's kernel (issue 25, item 8), read and run.

The program is read by a small classic-BPF interpreter here (both architectures, every rule),
then loaded for real: inside the sandbox each denied family of system calls fails with its
errno, through ctypes as a student would call it, a foreign ABI (x32) kills the caller, and
what honest code does (threads, subprocesses, multiprocessing, torch) still works.
"""
import errno
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autograder.engine.jail import seccomp
from autograder.engine.jail import jail
from autograder.options import GradingOptions


def run_filter(prog: bytes, nr: int, arch: int, args=(0,) * 6) -> int:
    """What the filter ``prog`` returns for one system call (a classic-BPF interpreter of the
    instructions :mod:`autograder.engine.jail.seccomp` uses; anything else fails the test)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *[a & 2**64 - 1 for a in (list(args) + [0] * 6)[:6]])
    insns = [struct.unpack("=HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == seccomp.LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code in (seccomp.JEQ_K, seccomp.JGE_K, seccomp.JSET_K):
            hit = {seccomp.JEQ_K: acc == k, seccomp.JGE_K: acc >= k, seccomp.JSET_K: acc & k}[code]
            pc += 1 + (jt if hit else jf)
        elif code == seccomp.RET_K:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x} at {pc}")


@pytest.mark.parametrize("machine", sorted(seccomp.ARCHES))
def test_the_program_denies_each_family_and_allows_the_rest(machine):
    prog = seccomp.program(machine)
    arch, nr = seccomp.ARCHES[machine]
    assert len(prog) % 8 == 0 and len(prog) // 8 < 4096
    errno_of = lambda e: seccomp.RET_ERRNO | e   # noqa: E731
    for name, err in seccomp.DENIED.items():
        assert run_filter(prog, nr[name], arch) == errno_of(err), name
    assert run_filter(prog, nr["clone3"], arch) == errno_of(errno.ENOSYS)
    assert run_filter(prog, nr["clone"], arch, [0x10000000 | 17]) == errno_of(errno.EPERM)
    assert run_filter(prog, nr["clone"], arch, [0x003D0F00]) == seccomp.RET_ALLOW   # a thread
    assert run_filter(prog, nr["clone"], arch, [17]) == seccomp.RET_ALLOW            # a fork
    for persona, ret in ((0, seccomp.RET_ALLOW), (8, seccomp.RET_ALLOW),
                         (0xFFFFFFFF, seccomp.RET_ALLOW), (0x0040000, errno_of(errno.EPERM))):
        assert run_filter(prog, nr["personality"], arch, [persona]) == ret, persona
    for request, ret in ((0x5412, errno_of(errno.EPERM)), (0x1_0000_5412, errno_of(errno.EPERM)),
                         (0x541C, errno_of(errno.EPERM)), (0x541B, seccomp.RET_ALLOW)):
        assert run_filter(prog, nr["ioctl"], arch, [0, request]) == ret, hex(request)
    for allowed in (0, 1, 3, 9, 57, 59, 60, 231, 434, 500):   # read, write, close, mmap, ...
        if allowed not in nr.values():
            assert run_filter(prog, allowed, arch) == seccomp.RET_ALLOW, allowed
    other = {m: a for m, (a, _) in seccomp.ARCHES.items() if m != machine}
    for foreign in [0x40000003, *other.values()]:             # i386 (AUDIT_ARCH_I386) and the other
        assert run_filter(prog, 39, foreign) == seccomp.RET_KILL_PROCESS
    if machine == "x86_64":
        assert run_filter(prog, 0x40000000 | 39, arch) == seccomp.RET_KILL_PROCESS   # x32 getpid


def run_in_sandbox(code: str, timeout=120) -> subprocess.CompletedProcess:
    """Run ``python -c code`` in the sandbox the grader builds for a kernel (as jail.probe does)."""
    with tempfile.TemporaryDirectory(prefix="autograder-seccomp-") as tmp:
        os.chmod(tmp, 0o711)
        ipc = Path(tmp) / "ipc"
        ipc.mkdir()
        uid = jail.pick_uid()
        if uid is not None:
            os.chown(ipc, uid, uid)
        cmd = jail.sandbox_command(ipc_dir=ipc, job_dir=Path(tmp), data_files=[],
                                   options=GradingOptions(), uid=uid)
        return subprocess.run(cmd + [sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout)


# name -> arguments of a call that, unfiltered, would fail otherwise (EFAULT, EBADF, EINVAL)
# or succeed (ptrace(PTRACE_TRACEME), personality): the errno shows the filter answered.
CALLS = {"unshare": [0x10000000], "setns": [-1, 0], "clone3": [0, 0], "io_uring_setup": [1, 0],
         "io_uring_enter": [-1, 0, 0, 0, 0, 0], "io_uring_register": [-1, 0, 0, 0],
         "add_key": [0, 0, 0, 0, 0], "request_key": [0, 0, 0, 0], "keyctl": [0, 0, 0, 0, 0],
         "bpf": [0, 0, 0], "perf_event_open": [0, 0, -1, -1, 0], "userfaultfd": [0],
         "kexec_load": [0, 0, 0, 0], "kexec_file_load": [-1, -1, 0, 0, 0],
         "init_module": [0, 0, 0], "finit_module": [-1, 0, 0], "delete_module": [0, 0],
         "mount": [0, 0, 0, 0, 0], "umount2": [0, 0], "pivot_root": [0, 0], "chroot": [0],
         "move_mount": [-1, 0, -1, 0, 0], "open_tree": [-1, 0, 0], "fsopen": [0, 0],
         "fsconfig": [-1, 0, 0, 0, 0], "fsmount": [-1, 0, 0], "fspick": [-1, 0, 0],
         "mount_setattr": [-1, 0, 0, 0, 0], "open_by_handle_at": [-1, 0, 0], "ptrace": [0, 0, 0, 0],
         "process_vm_readv": [1, 0, 0, 0, 0, 0], "syslog": [3, 0, 0], "acct": [0],
         "quotactl": [0, 0, 0, 0], "swapon": [0, 0], "swapoff": [0], "reboot": [0, 0, 0, 0]}
PROBE = r"""
import ctypes, json, multiprocessing, os, subprocess, sys, threading
NR, CALLS = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if rc == 0 and nr == NR['clone']:
        os._exit(0)                      # a child that clone made (it must not)
    return 'ok' if rc >= 0 else ctypes.get_errno()
got = {name: call(NR[name], *args) for name, args in CALLS.items()}
got['clone'] = call(NR['clone'], 0x10000000 | 17, 0, 0, 0, 0)
got['personality+ADDR_NO_RANDOMIZE'] = call(NR['personality'], 0x0040000)
got['personality?'] = call(NR['personality'], 0xFFFFFFFF)
buf = ctypes.create_string_buffer(8)
got['TIOCSTI'] = call(NR['ioctl'], 0, 0x5412, ctypes.addressof(buf))
got['TIOCSTI high bits'] = call(NR['ioctl'], 0, 0x1_0000_5412, ctypes.addressof(buf))
got['x32'] = subprocess.run([sys.executable, '-c', 'import ctypes; ctypes.CDLL(None).syscall(0x40000027)']).returncode
# what honest code does
box = []
threads = [threading.Thread(target=box.append, args=(i,)) for i in range(4)]
[t.start() for t in threads]; [t.join() for t in threads]
got['threads'] = sorted(box)
got['subprocess'] = subprocess.run(['sh', '-c', 'echo hi'], capture_output=True, text=True).stdout
with multiprocessing.get_context('fork').Pool(2) as pool:
    got['multiprocessing'] = pool.map(abs, [-1, -2, -3])
with multiprocessing.get_context('spawn').Pool(1) as pool:
    got['spawn'] = pool.map(abs, [-4])
import torch
torch.set_num_threads(2)
got['torch'] = float((torch.ones(64, 64) @ torch.ones(64, 64)).sum())
print('RESULT', json.dumps(got))
"""


@pytest.mark.slow
@pytest.mark.skipif(not jail.probe()["ok"] or bool(jail.seccomp_missing()),
                    reason="needs bubblewrap with --seccomp")
def test_in_the_sandbox_each_family_is_denied_and_honest_code_runs():
    nr = seccomp.ARCHES[os.uname().machine][1]
    code = PROBE.replace("json.loads(sys.argv[1])", repr([nr, CALLS]))
    proc = run_in_sandbox(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.split("RESULT ", 1)[1])
    for name in CALLS:
        assert got[name] == seccomp.DENIED[name], (name, got[name])
    assert got["clone"] == errno.EPERM
    assert got["personality+ADDR_NO_RANDOMIZE"] == errno.EPERM and got["personality?"] == "ok"
    assert got["TIOCSTI"] == got["TIOCSTI high bits"] == errno.EPERM
    assert got["x32"] == -signal.SIGSYS
    assert got["threads"] == [0, 1, 2, 3] and got["subprocess"] == "hi\n"
    assert got["multiprocessing"] == [1, 2, 3] and got["spawn"] == [4]
    assert got["torch"] == 64.0 ** 3


def test_without_seccomp_in_bubblewrap_the_isolation_notes_say_so(monkeypatch):
    monkeypatch.setattr(jail, "_supports", lambda option: option != "--seccomp")
    assert "no --seccomp" in jail.seccomp_missing()
    monkeypatch.setattr(jail, "probe", lambda: {"ok": True, "as_root": True, "why": ""})
    from autograder.engine.sandbox import isolation_notes
    assert any("system calls are not filtered" in n for n in isolation_notes(GradingOptions()))
    monkeypatch.setattr(seccomp, "supported", lambda machine=None: False)
    assert "no seccomp filter is written for this machine" in jail.seccomp_missing()
