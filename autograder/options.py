"""The grading options, in one place: their defaults, units and help text.

The command line builds its flags from :class:`GradingOptions` (``grade`` and ``check``), the
nbgrader preprocessor that runs a notebook receives them as its traits, and the harness reads them
from its job file; no other copy of a default exists.
"""
import argparse
from dataclasses import asdict, dataclass, field, fields

__all__ = ["GradingOptions", "add_arguments", "from_arguments", "UNSANDBOXED_FLAG"]

# The flag an instructor must pass to grade where no OS sandbox can run: it names the risk.
UNSANDBOXED_FLAG = "--unsafe-run-student-code-unsandboxed"


def _opt(default, help, metavar=None, flag=None, repr=True):
    return field(default=default, repr=repr,
                 metadata={"help": help, "metavar": metavar, "flag": flag})


@dataclass(frozen=True)
class GradingOptions:
    """Limits for running one submission (all per notebook unless said otherwise).

    The grader's own fixed limits, which are no instructor's choice, each live in one place
    beside the code that applies them: ``sandbox.HARNESS_MEMORY_MB`` and ``HARNESS_ATTEMPTS``,
    ``ipcfs.IPC_MB`` and ``IPC_INODES`` (the connection folder), ``notebook_client.RECOVER_S``
    and ``REQUEST_STDOUT_CHARS``, ``wire.MAX_BYTES`` (data per crossing), ``config.KERNEL_ARGS``,
    ``check.MAX_BYTES`` (the student's self-check, more lenient than grading), and the
    collection limits of ``collect`` (``ZIP_RATIO``, ``ZIP_FLOOR``, ``DATA_FILE_BYTES``).
    """
    cell_timeout: int = _opt(60, "seconds of CPU time a single cell (or test) may use, as the operating system counts "
                                    "it (a cell that hangs is stopped on the wall clock)", "S", "--timeout")
    notebook_timeout: int = _opt(600, "seconds of CPU time a whole notebook may use", "S")
    memory_mb: int = _opt(4096, "address-space limit of the student's kernel in MiB", "MIB",
                          "--memory")
    cpu_seconds: int = _opt(900, "CPU seconds the student's kernel may use", "S", "--cpu-time")
    max_processes: int = _opt(128, "processes and threads the student's code may run at once",
                              "N")
    max_file_mb: int = _opt(64, "largest file the student's code may write, in MiB", "MIB")
    scratch_mb: int = _opt(256, "size of the private writable folders together (working folder "
                                "1/2, /tmp 1/4, /dev/shm 1/4) in MiB", "MIB")
    cell_output_kb: int = _opt(2048, "output kept per cell in KiB (the rest is dropped, with a "
                                     "note)", "KIB")
    notebook_output_kb: int = _opt(16384, "output kept per notebook in KiB", "KIB")
    max_size_mb: float = _opt(20, "largest notebook accepted, in MiB; a larger one is rejected "
                                  "(a lesson with its outputs is well under 5 MiB)", "MIB",
                              "--max-size", repr=False)
    # (not in the repr: the size is checked when a submission is read, before it runs, so it
    # is no setting of a run and a changed limit does not make grade re-run graded notebooks)
    kernel_threads: int = _opt(0, "torch and OpenMP threads of each student's kernel (0: this "
                                  "machine's cores shared among the submissions graded at once)",
                               "N", repr=False)
    # (not in the repr, like max_size_mb above: the threads change how fast a notebook runs, not
    # what it computes within the tests' tolerances, so a changed count re-runs nothing)
    unsandboxed: bool = _opt(False, "run student code without the OS sandbox where bubblewrap "
                                    "cannot run: students' code can then read and change "
                                    "anything this user can", None, UNSANDBOXED_FLAG)

    def as_dict(self) -> dict:
        return asdict(self)


def add_arguments(parser: argparse.ArgumentParser, only=None) -> None:
    """Add one flag per option (``only``: the option names to add, default all)."""
    for f in fields(GradingOptions):
        if only is not None and f.name not in only:
            continue
        meta = f.metadata
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        if f.type in (bool, "bool"):
            parser.add_argument(flag, dest=f.name, action="store_true", help=meta["help"])
        else:
            parser.add_argument(flag, dest=f.name, type=float if f.type in (float, "float") else int,
                                default=f.default,
                                metavar=meta["metavar"],
                                help=f"{meta['help']} (default {f.default})")


def from_arguments(args: argparse.Namespace) -> GradingOptions:
    """The options parsed by a parser built with :func:`add_arguments` (missing ones: defaults)."""
    return GradingOptions(**{f.name: getattr(args, f.name) for f in fields(GradingOptions)
                             if hasattr(args, f.name)})
