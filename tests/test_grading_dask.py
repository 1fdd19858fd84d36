"""Grading on a Dask cluster (issue 18), with a real `dask scheduler` and `dask worker` processes
on 127.0.0.1 (the command line that distributed installs) and the toy course.

One machine and the cluster give the same grades.csv; a worker killed in the middle of a batch
loses no submission and grades none twice; a submission that kills its worker every time is
marked for review after two deaths and is not retried; losing the scheduler stops the batch with
a message and the next run resumes. The first tests are fast: the grader without Dask, an
unreachable scheduler, the files sent to a worker, and a worker that differs.
"""
import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from autograder.publishing.build import build
from autograder.engine.distributed import (ClusterError, DaskExecutor, _pack, _write_files, check_worker,
                                    environment)
from autograder.options import GradingOptions
from dask_preload import KILL_MARK
from toy_course import ASSIGNMENT, NOTEBOOK, make_toy_course

sys.path.insert(0, str(Path(__file__).resolve().parent / "corpus"))
import build_corpus as corpus  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DASK = Path(sys.executable).parent / "dask"
PRELOAD = Path(__file__).resolve().parent / "dask_preload.py"
try:
    import distributed  # noqa: F401
    HAVE_DASK = True
except ImportError:
    HAVE_DASK = False
needs_dask = pytest.mark.skipif(not HAVE_DASK, reason="dask.distributed is not installed "
                                "(pip install -e './autograder[dask]')")

# A student whose notebook reads files handed in beside it (one in a folder): 6 points only
# when the files reach the worker.
READS_FILES = ("from pathlib import Path\n"
               "OFFSET = int(Path('offset.txt').read_text())\n"
               "OFFSET += int(Path('data/zero.txt').read_text())\n"
               "def add(a, b):\n    return a + b + OFFSET")


def test_without_dask_the_grader_imports_and_says_what_to_install():
    code = ("import sys; sys.modules['distributed'] = None\n"
            "import autograder, autograder.cli, autograder.grading.grade, autograder.engine.distributed as d\n"
            "from autograder.options import GradingOptions\n"
            "try:\n    d.DaskExecutor('tcp://127.0.0.1:1', GradingOptions())\n"
            "except d.ClusterError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'mlexp-autograder[dask]'" in proc.stdout


@needs_dask
def test_an_unreachable_scheduler_is_named():
    with pytest.raises(ClusterError, match=r"cannot reach the Dask scheduler at tcp://127\."):
        DaskExecutor(f"tcp://127.0.0.1:{free_port()}", GradingOptions(), timeout=2)


def test_files_beside_a_notebook_travel_as_bytes(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "data" / "deep").mkdir(parents=True)
    (src / "offset.txt").write_text("1")
    (src / "data" / "deep" / "x.bin").write_bytes(b"\0\1")
    (src / "toy.ipynb").write_text("{}")                  # notebooks stay behind
    (src / "link.txt").symlink_to(src / "offset.txt")     # links are never followed
    (src / ".hidden").write_text("x")
    files = _pack(src)
    assert sorted(rel for rel, _ in files) == ["data/deep/x.bin", "offset.txt"]
    dst.mkdir()
    _write_files(dst, files)
    assert (dst / "data" / "deep" / "x.bin").read_bytes() == b"\0\1"
    with pytest.raises(ValueError, match="outside its folder"):
        _write_files(dst, [("../escaped.txt", b"x")])
    assert not (tmp_path / "escaped.txt").exists()


def test_a_worker_that_differs_is_unfit_and_says_how():
    expected = {**environment(), "torch": "0.0.1"}
    check = check_worker(expected, GradingOptions())
    assert "environment differs" in check["unfit"] and "torch" in check["unfit"]
    assert "0.0.1 on the grading machine" in check["unfit"]
    from autograder.engine.jail import jail
    if jail.probe()["ok"]:
        assert check_worker(environment(), GradingOptions())["unfit"] == ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A scheduler and ``n`` workers (one thread each, with a nanny) started as docs/instructors.md says."""

    def __init__(self, folder: Path, n: int = 2, preload: bool = False):
        self.folder, self.preload, self.procs = folder, preload, []
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.scheduler = self._start("scheduler", ["scheduler", "--host", "127.0.0.1", "--port",
                                                   self.address.rsplit(":", 1)[1],
                                                   "--dashboard-address", "127.0.0.1:0"])
        self.workers = [self.add_worker() for _ in range(n)]
        self.wait_for_workers(n)

    def _start(self, name, args):
        log = open(self.folder / f"{name}.log", "ab")
        proc = subprocess.Popen([str(DASK), *args], cwd=self.folder, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def add_worker(self):
        name = f"w{len(self.procs)}"
        args = ["worker", self.address, "--nthreads", "1", "--no-dashboard", "--name", name]
        proc = self._start(name, args + (["--preload", str(PRELOAD)] if self.preload else []))
        proc.worker_name = name
        return proc

    def client(self):
        from distributed import Client
        return Client(self.address, timeout=60, set_as_default=False)

    def wait_for_workers(self, n):
        with self.client() as c:
            c.wait_for_workers(n, timeout=180)

    def kill(self, proc):
        """SIGKILL a whole `dask` command: nanny and worker (or the scheduler)."""
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def close(self):
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)

    def logs(self, tail: int = 2000) -> str:
        """The logs of the scheduler and workers, the last ``tail`` characters of each (0: all)."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-tail:] if tail else p.read_text()}"
                         for p in self.folder.glob("*.log"))


@pytest.fixture
def make_cluster(tmp_path):
    clusters = []

    def make(**kw):
        folder = tmp_path / f"cluster{len(clusters)}"
        folder.mkdir()
        clusters.append(Cluster(folder, **kw))
        return clusters[-1]
    yield make
    for c in clusters:
        c.close()


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = make_toy_course(tmp_path_factory.mktemp("course"))
    build(root)
    return root


def write_class(course, dest: Path, students, extra=None) -> dict:
    """Toy students from the corpus (plus ``extra``: student -> {path: notebook or text});
    returns student -> expected score."""
    toy = nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    cases = corpus.toy_cases(toy)
    files = {s: cases[s] for s in students}
    files.update(extra or {})
    for student, entries in files.items():
        for rel, content in entries.items():
            path = dest / student / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, str):
                path.write_text(content)
            else:
                nbformat.write(content, path)
    return {s: corpus.CASES[s][1] for s in students}


def answered(course, add_source):
    toy = nbformat.read(course / "lessons" / ASSIGNMENT / NOTEBOOK, as_version=4)
    return corpus._answer(toy, {"add": add_source, "mul": corpus.MUL_SOLUTION,
                                "mean": corpus.MEAN_SOLUTION})


def cli(course, cls, out, *extra):
    args = ["--course", course, "grade", cls, "--out", out, "--timeout", "20", *extra]
    return [sys.executable, "-m", "autograder", *map(str, args)]


def run(cmd, timeout=900):
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout)


def rows(out: Path) -> dict:
    with open(out / "grades.csv") as f:
        return {r["student_id"]: r for r in csv.DictReader(f)}


def gradebook_students(out: Path) -> list:
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'work' / 'gradebook.db'}") as gb:
        return sorted(s.student.id for s in gb.find_assignment(ASSIGNMENT).submissions)


def reports(out: Path) -> dict:
    return {p.stem: json.loads(p.read_text())
            for p in (out / "work" / "reports" / ASSIGNMENT).glob("*.json")}


@pytest.mark.slow
@needs_dask
def test_cluster_grades_exactly_as_one_machine(course, tmp_path, make_cluster):
    """The same class, graded at -j 2 here and through two workers: the same grades.csv."""
    cls = tmp_path / "cls"
    write_class(course, cls, ["ok_correct", "ok_blank", "deleted_test_cell", "kernel_killed"],
                extra={"reads_files": {f"{ASSIGNMENT}/{NOTEBOOK}": answered(course, READS_FILES),
                                       f"{ASSIGNMENT}/offset.txt": "0",
                                       f"{ASSIGNMENT}/data/zero.txt": "0"}})
    local = run(cli(course, cls, tmp_path / "local", "-j", "2", "--no-progress"))
    assert local.returncode == 0, local.stderr[-3000:]
    cluster = make_cluster()
    remote = run(cli(course, cls, tmp_path / "dask", "--scheduler", cluster.address))
    assert remote.returncode == 0, remote.stderr[-3000:] + cluster.logs()
    assert (tmp_path / "dask" / "grades.csv").read_text() == \
        (tmp_path / "local" / "grades.csv").read_text()
    got = rows(tmp_path / "dask")
    assert float(got["reads_files"]["score"]) == 6, "the files beside the notebook reached it"
    assert got["kernel_killed"]["status"].startswith("needs manual review")
    # the progress line names the cluster and its dashboard; isolation.txt each worker
    assert "dask: 2 worker(s)" in remote.stderr and "dashboard: http://127.0.0.1:" in remote.stderr
    lines = (tmp_path / "dask" / "isolation.txt").read_text().splitlines()
    assert len(lines) == 2 and all(ln.startswith("worker tcp://127.0.0.1:") for ln in lines)
    if os.geteuid() == 0:
        assert all(ln.endswith("fully isolated") for ln in lines)
    assert {r["worker"] for r in reports(tmp_path / "dask").values()} <= \
        {ln.split()[1] for ln in lines}


@pytest.mark.slow
@needs_dask
def test_killed_worker_loses_nothing_and_grades_nothing_twice(course, tmp_path, make_cluster):
    cls, out = tmp_path / "cls", tmp_path / "out"
    expected = write_class(course, cls, ["ok_correct", "ok_blank", "deleted_test_cell",
                                         "edited_test_cell", "deleted_solution_cell",
                                         "metadata_lost_same_ids"])
    cluster = make_cluster()
    proc = subprocess.Popen(cli(course, cls, out, "--scheduler", cluster.address, "--no-progress"),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = cluster.client()
    try:   # once a result is committed, kill a worker that is running a submission
        victim, deadline = None, time.time() + 600
        while victim is None and time.time() < deadline:
            assert proc.poll() is None, "the batch ended before a worker could be killed"
            busy = [w for w, keys in client.processing().items() if keys]
            if list((out / "results").glob(f"{ASSIGNMENT}/*.json")) and busy:
                victim = busy[0]
            time.sleep(0.2)
        names = {w: info["name"] for w, info in client.scheduler_info()["workers"].items()}
    finally:
        client.close()
    committed = len(list((out / "results" / ASSIGNMENT).glob("*.json")))
    assert committed < len(expected), "the batch finished before a worker could be killed"
    cluster.kill(next(p for p in cluster.workers if p.worker_name == names[victim]))
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:] + cluster.logs()
    got = rows(out)
    assert {s: float(r["score"]) for s, r in got.items()} == expected
    assert all(r["status"] == "graded" for r in got.values()), got
    assert gradebook_students(out) == sorted(expected), "one gradebook entry per student"
    rerun = [s for s, r in reports(out).items() if r.get("worker_deaths") == 1]
    assert rerun, "a submission of the killed worker ran again on the other one"
    assert all(reports(out)[s]["worker"] != victim for s in rerun)
    assert f"{len(expected)} submissions graded" in stdout


@pytest.mark.slow
@needs_dask
def test_a_submission_that_kills_its_worker_twice_needs_review(course, tmp_path, make_cluster):
    cls, out = tmp_path / "cls", tmp_path / "out"
    poison = answered(course, corpus.ADD_SOLUTION + f"\n# {KILL_MARK}")
    expected = write_class(course, cls, ["ok_correct", "ok_blank"],
                           extra={"kills_its_worker": {f"{ASSIGNMENT}/{NOTEBOOK}": poison}})
    cluster = make_cluster(preload=True)
    done = run(cli(course, cls, out, "--scheduler", cluster.address, "--no-progress"))
    assert done.returncode == 0, done.stderr[-3000:] + cluster.logs()
    got = rows(out)
    assert {s: float(got[s]["score"]) for s in expected} == expected
    bad = got["kills_its_worker"]
    assert bad["status"].startswith("needs manual review") and "workers died" in bad["status"]
    assert float(bad["score"]) == 0
    assert cluster.logs(tail=0).count("Restarting worker") >= 2   # each came back (its nanny)
    again = run(cli(course, cls, out, "--scheduler", cluster.address, "--no-progress"))
    assert again.returncode == 0 and "3 unchanged" in again.stdout, "it is not retried"


@pytest.mark.slow
@needs_dask
def test_lost_scheduler_stops_the_batch_and_the_next_run_resumes(course, tmp_path, make_cluster):
    cls, out = tmp_path / "cls", tmp_path / "out"
    expected = write_class(course, cls, ["ok_correct", "ok_blank", "deleted_test_cell",
                                         "edited_test_cell", "deleted_solution_cell"])
    cluster = make_cluster()
    proc = subprocess.Popen(cli(course, cls, out, "--scheduler", cluster.address, "--no-progress"),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while not list((out / "results").glob(f"{ASSIGNMENT}/*.json")) and time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    cluster.kill(cluster.scheduler)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert f"lost the Dask scheduler at {cluster.address}" in stderr and "Traceback" not in stderr
    first = {p.name: p.read_text() for p in (out / "results" / ASSIGNMENT).glob("*.json")}
    assert 1 <= len(first) < len(expected)
    assert len(rows(out)) == len(first), "grades.csv holds exactly the committed grades"
    cluster.close()
    again = make_cluster()
    done = run(cli(course, cls, out, "--scheduler", again.address, "--no-progress"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{len(first)} unchanged since the last run" in done.stdout
    assert {s: float(r["score"]) for s, r in rows(out).items()} == expected
    for name, text in first.items():
        assert (out / "results" / ASSIGNMENT / name).read_text() == text
    assert gradebook_students(out) == sorted(expected)
