"""Every writable place of the sandbox is a capped tmpfs, and a harness failure is retried.

Issue 25, item 3: the kernel's connection folder was a writable folder of the grader's disk; one
submission filled it and the honest student graded beside it at -j 2 got 0/10 "the grading
harness failed", recorded with ``retry: false``. Now the working folder, /tmp and /dev/shm share
``--scratch-mb`` and the connection folder is a 1 MiB tmpfs of the harness
(:mod:`autograder.engine.jail.ipcfs`); a harness that fails is run again, and marked to be graded again
next run when it fails twice. Each runs with TMPDIR under /tmp and outside it.
"""
import ast
import json
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from autograder.engine import sandbox
from autograder.engine.jail import ipcfs
from autograder.engine.jail import jail
from autograder.options import GradingOptions

sys.path.insert(0, str(Path(__file__).resolve().parent / "corpus"))
import build_corpus as corpus  # noqa: E402
from toy_course import ASSIGNMENT, NOTEBOOK, _test  # noqa: E402

_REAL_COMMAND = sandbox.harness_command
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not jail.probe()["ok"], reason="needs the bubblewrap sandbox")]


@pytest.fixture(params=["/tmp", "/var/tmp"])
def tmpdir_at(request, monkeypatch):
    """TMPDIR (for the job folders) under ``/tmp`` and outside it."""
    base = Path(tempfile.mkdtemp(prefix="autograder-tmpdir-", dir=request.param))
    base.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _flaky_harness(monkeypatch, fails):
    """Make the harness fail (exit 1, as a full disk would) for each job ``fails(job_spec)``
    says; returns the list of jobs that failed."""
    real, failed = sandbox.harness_command, []

    def command(job_file):
        spec = json.loads(Path(job_file).read_text())
        if fails(spec):
            failed.append(spec["input"])
            return [sys.executable, "-c", "import sys; sys.exit('OSError: [Errno 28] No space "
                                          "left on device (simulated)')"]
        return real(job_file)
    monkeypatch.setattr(sandbox, "harness_command", command)
    return failed


def test_every_writable_place_ends_at_its_cap(tmp_path, tmpdir_at, monkeypatch):
    """Each place fills to its cap and no further; the notebook is still graded. (Its first
    harness fails, as a full disk of the grader's would: the run is made again, once.)"""
    cells = [nbformat.v4.new_code_cell(corpus.FILL_SPACE + "print(FILLED)"),
             _test("test_still_graded", 1, "assert 1 + 1 == 2")]
    options = GradingOptions(cell_timeout=60, scratch_mb=16)
    first = iter([True])    # the first harness fails, the second does not
    failed = _flaky_harness(monkeypatch, lambda spec: next(first, False))
    executed, report = sandbox.run_submission(nbformat.v4.new_notebook(cells=cells), tmp_path, options)
    assert len(failed) == 1 and executed is not None, report
    assert not report.get("retry") and "run again (2 runs)" in report["notes"][0], report
    assert not report["kernel"], report
    [out] = [o for o in executed.cells[0].outputs if o.get("output_type") == "stream"]
    filled = ast.literal_eval(out["text"].strip().splitlines()[-1])
    caps = {**jail.scratch_caps(options), "ipc": ipcfs.IPC_MB * 2**20}
    assert set(filled) == set(caps), filled
    for place, (written, err, size) in filled.items():
        assert err in (28, 27), (place, err)               # ENOSPC (EFBIG: a file at its limit)
        assert size <= caps[place] and written <= caps[place], (place, written, size, caps[place])
    assert sum(w for w, _, _ in filled.values()) <= options.scratch_mb * 2**20 + caps["ipc"]
    assert filled["ipc"][0] < 2 * 2**20 and filled["/tmp"][0] > 2 * 2**20   # it wrote, and stopped
    assert [o for o in executed.cells[1].outputs if o.get("output_type") == "error"] == []
    assert not list(tmpdir_at.rglob(f"{corpus.MARKER}*")), "a write reached the grader's disk"


@pytest.mark.parametrize("tmpdir_at", ["/var/tmp"], indirect=True)
def test_at_j2_a_student_who_fills_its_space_breaks_no_neighbour(tmp_path, tmpdir_at, monkeypatch):
    """The filler and an honest student at -j 2: both keep their honest 6/6. Then a failure of
    the grader's own (the harness dies twice for the honest one's new submission) is retry: true,
    and the next run grades it again, while the other result is kept."""
    from autograder.publishing.build import build
    from autograder.grading.grade import grade_class
    from toy_course import make_toy_course
    course = make_toy_course(tmp_path / "course")
    build(course)
    toy = nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    cases = corpus.toy_cases(toy)
    cls = tmp_path / "cls"
    for student in ("fills_its_space", "ok_correct"):
        for rel, nb in cases[student].items():
            (cls / student / rel).parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, cls / student / rel)
    options = GradingOptions(cell_timeout=60, scratch_mb=32)
    out = tmp_path / "out"
    first = {r.student: r for r in grade_class(course, cls, out, options=options, progress=False, jobs=2)}
    for student in ("fills_its_space", "ok_correct"):
        assert (first[student].status, first[student].score) == ("graded", 6), first[student]
    # ok_correct hands in again (one more cell), and the grader fails (twice) for it
    nb = nbformat.read(cls / "ok_correct" / ASSIGNMENT / NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("Resubmitted."))
    nbformat.write(nb, cls / "ok_correct" / ASSIGNMENT / NOTEBOOK)
    failed = _flaky_harness(monkeypatch, lambda spec: "_fill(" not in Path(spec["input"]).read_text())
    second = {r.student: r for r in grade_class(course, cls, out, options=options, progress=False, jobs=2)}
    assert len(failed) == sandbox.HARNESS_ATTEMPTS
    assert second["ok_correct"].status.startswith("needs manual review: the grading harness failed")
    assert second["ok_correct"].retry and second["fills_its_space"].reused
    monkeypatch.setattr(sandbox, "harness_command", _REAL_COMMAND)
    third = {r.student: r for r in grade_class(course, cls, out, options=options, progress=False, jobs=2)}
    assert third["fills_its_space"].reused and not third["ok_correct"].reused
    assert (third["ok_correct"].status, third["ok_correct"].score) == ("graded", 6)



@pytest.mark.parametrize("base", ["/tmp", "/var/tmp"])
def test_a_python_reached_through_a_linked_venv_runs_in_the_sandbox(base):
    """A checkout whose ``.venv`` is a link to another's (the folders are mounted at their resolved
    paths, the kernel started as ``sys.executable`` says): the sandbox shows the link too."""
    import subprocess
    where = Path(tempfile.mkdtemp(prefix="autograder-linked-", dir=base))
    try:
        (where / ".venv").symlink_to(Path(sys.prefix).resolve())
        python = where / ".venv" / "bin" / Path(sys.executable).name
        out = subprocess.run([str(python), "-c", "from autograder.engine.jail import jail; import json; "
                                                 "print(json.dumps(jail.probe()))"],
                             capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent)
        assert out.returncode == 0, out.stderr[-2000:]
        found = json.loads(out.stdout.strip().splitlines()[-1])
        assert found["ok"], found["why"]
    finally:
        shutil.rmtree(where, ignore_errors=True)
