"""The suite's time budget (issue 37): the fast tier's limits against the last recorded measurement,
the counts and minutes written from it (docs/contributors.md's block, the README's test command),
the timing summary's verdicts, and the xdist groups that keep each module's expensive fixture on
one worker.

tests/times.json is written by `scripts/test_times.py record` from a `make test` run and a `make
test-fast` run (see its docstring); record it again when a test is added or made slower.
"""
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import test_times  # noqa: E402

STORED = json.loads((REPO / "tests" / "times.json").read_text())


def test_readme_counts_and_minutes_are_the_recorded_measurement():
    assert test_times.GUIDE == REPO / "docs" / "contributors.md"
    assert test_times.readme_problems((REPO / "README.md").read_text(), STORED,
                                      (REPO / "docs" / "contributors.md").read_text()) == []


def test_fast_tier_was_within_its_limits_when_measured():
    assert STORED["fast"]["markexpr"] == "not slow"
    assert test_times.fast_tier_problems(test_times.expand(STORED["fast"])) == []
    assert STORED["fast"]["wall_seconds"] <= test_times.FAST_TIER_LIMIT_S


def test_no_fast_test_was_slow_in_the_last_full_run(request):
    """A test collected now outside the slow mark that took more than twice the per-test limit in
    the recorded full run (two workers sharing two cores, hence the factor) must be marked slow."""
    full = STORED["full"]["tests"]
    slow_now = [f"{item.nodeid}: {full[item.nodeid][0]:.0f} s in the full run of {STORED['full']['date']}"
                for item in request.session.items
                if item.get_closest_marker("slow") is None and item.nodeid.split("@")[0] in full
                and full[item.nodeid.split("@")[0]][0] > 2 * test_times.FAST_TEST_LIMIT_S]
    assert slow_now == []


def _run(tests, markexpr):
    return {"date": "2026-12-02", "started_at": "2026-12-02T00:00:00", "wall_seconds": 1.0, "workers": 1,
            "cpus": 2, "markexpr": markexpr, "tests": tests}


def test_summary_fails_a_fast_run_over_budget_and_names_the_test():
    lines = []
    tests = {"tests/test_a.py::test_quick": {"seconds": 0.5, "slow": False, "outcome": "passed"},
             "tests/test_a.py::test_sluggish": {"seconds": 25.0, "slow": False, "outcome": "passed"},
             "tests/test_b.py::test_notebook": {"seconds": 300.0, "slow": True, "outcome": "passed"}}
    assert test_times.summary(_run(tests, "not slow"), out=lines.append) == 1
    assert any(l.startswith("BUDGET:") and "test_sluggish" in l for l in lines)
    assert not any("test_notebook" in l for l in lines if l.startswith("BUDGET:"))
    assert lines[-1] == "tests: 3 passed, 0 failed, 0 skipped"
    # the same times in a full run (cores shared with the slow tests) are reported, not failed
    assert test_times.summary(_run(tests, ""), out=lines.append) == 0


def test_summary_fails_a_fast_tier_whose_tests_add_up_past_three_minutes():
    tests = {f"tests/test_a.py::test_{i}": {"seconds": 19.0, "slow": False, "outcome": "passed"} for i in range(10)}
    lines = []
    assert test_times.summary(_run(tests, "not slow"), out=lines.append) == 1
    assert any("together" in l for l in lines)
    tests = {k: {**v, "seconds": 1.0} for k, v in tests.items()}
    assert test_times.summary(_run(tests, "not slow"), out=lines.append) == 0


def test_record_refuses_a_failing_run(tmp_path):
    bad = _run({"tests/test_a.py::test_x": {"seconds": 1.0, "slow": False, "outcome": "failed"}}, "not slow")
    (tmp_path / "full.json").write_text(json.dumps(bad))
    (tmp_path / "fast.json").write_text(json.dumps(bad))
    with pytest.raises(SystemExit, match="did not pass"):
        test_times.record(tmp_path / "full.json", tmp_path / "fast.json")


GROUPS_PLUGIN = """
import json, os
def pytest_collection_finish(session):
    marks = {i.nodeid: (i.get_closest_marker("xdist_group").args[0] if i.get_closest_marker("xdist_group") else None)
             for i in session.items}
    with open(os.environ["GROUPS_OUT"], "w") as f:
        json.dump(marks, f)
"""


@pytest.mark.slow     # runs pytest twice in a subprocess (about 9 s)
def test_module_fixtures_keep_their_tests_on_one_xdist_worker(tmp_path):
    """Collected as `make test` collects them: each test reading graded_lessons is grouped by its
    lesson, each test of the JupyterLab server and of the book by its module, and the full-size
    lesson runs (no shared fixture) may go to any worker."""
    import os
    import subprocess
    (tmp_path / "groups_plugin.py").write_text(GROUPS_PLUGIN)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "GROUPS_OUT": str(tmp_path / "groups.json"), "MLEXP_TEST_TIMES": str(tmp_path / "times.json")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "groups_plugin",
                           "-p", "no:cacheprovider", "tests/test_lessons.py", "tests/test_book.py",
                           "tests/test_browser.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    groups = json.loads((tmp_path / "groups.json").read_text())
    assert groups
    for nodeid, group in groups.items():
        if "test_solution_scores_full_marks" in nodeid or "test_demo_student_gets" in nodeid:
            assert group == "test_lessons-" + nodeid.split("[")[1].split("-")[0].rstrip("]"), nodeid
        elif "test_solution_runs_top_to_bottom_in_full_mode" in nodeid:
            assert group is None, nodeid
        elif "test_book.py::test_lesson_page" in nodeid or "test_browser.py::test_lesson_runs" in nodeid:
            assert group == Path(nodeid.split("::")[0]).stem, nodeid


FIXTURE_MODULE = '''
import os, pytest
LOG = os.environ["FIXTURE_LOG"]

@pytest.fixture(scope="module")
def graded():
    with open(LOG, "a") as f:
        f.write(f"built {os.getpid()}\\n")

@pytest.mark.parametrize("i", range(6))
def test_reads_the_fixture(graded, i):
    with open(LOG, "a") as f:
        f.write(f"ran {os.getpid()}\\n")

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
'''


@pytest.mark.slow     # runs pytest in a subprocess (about 6 s)
def test_xdist_runs_a_module_fixtures_tests_on_one_worker_and_builds_it_once(tmp_path):
    """Run, not just collected: two workers with --dist loadgroup, this suite's conftest, and a
    module-scoped fixture read by six tests. It must be built once, in one worker. It was built on
    both when conftest's marker came after xdist's own hook had read the markers into the node ids,
    and with pytest 9.2, where xdist 3.8's renaming of a test's node id no longer takes effect
    (the test extra keeps pytest below 9.2)."""
    import os
    import shutil
    import subprocess
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("conftest.py", "timings_plugin.py"):
        shutil.copy(REPO / "tests" / name, tests / name)
    (tests / "test_fixture_once.py").write_text(FIXTURE_MODULE)
    log = tmp_path / "log"
    env = {**os.environ, "FIXTURE_LOG": str(log), "MLEXP_TEST_TIMES": str(tmp_path / "times.json")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tests)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = log.read_text().split()
    built = [pid for word, pid in zip(lines[::2], lines[1::2]) if word == "built"]
    ran = {pid for word, pid in zip(lines[::2], lines[1::2]) if word == "ran"}
    assert len(built) == 1 and ran == set(built), (
        f"the module fixture was built {len(built)} times, its tests ran in {len(ran)} workers")
