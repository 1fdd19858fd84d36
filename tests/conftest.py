"""Shared pytest fixtures: the repository root and the test copy of TinyShakespeare."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Tests read TinyShakespeare from the shared test copy next to the checkout (never committed).
_shared_data = REPO.parent / "shared" / "data"
if "MLEXP_DATA_DIR" not in os.environ and _shared_data.is_dir():
    os.environ["MLEXP_DATA_DIR"] = str(_shared_data)


# Under pytest-xdist each worker (and what it starts: graders, kernels, JupyterLab) gets its share
# of the cores for torch and OpenMP, set before anything imports torch: two workers each starting
# one spinning OpenMP thread per core ran the grading tests about 1.4x slower on 2 cores.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
if _workers > 1:
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, str(max(1, (os.cpu_count() or 1) // _workers)))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The checkout: the folder holding solutions/, lessons/ and autograder/."""
    return REPO


def pytest_configure(config):
    """Record every test's time for scripts/test_times.py (tests/timings_plugin.py)."""
    from timings_plugin import TimingRecorder

    if not config.pluginmanager.has_plugin("mlexp-timings"):
        config.pluginmanager.register(TimingRecorder(config), "mlexp-timings")


# Under pytest-xdist (`make test` runs `-n 2 --dist loadgroup`), a test that reads a fixture its
# module computes once (scope module or class: a graded class, a JupyterLab server, a built book)
# runs on the same worker as every other test of that module, so the fixture is computed once per
# run, not once per worker; every other test goes to whichever worker is free. A fixture that
# caches its work per parameter is split by it instead: graded_lessons grades one lesson's class on
# first use, so each lesson's tests share a worker and two lessons can be graded at once.
SPLIT_BY_PARAM = {"graded_lessons": "assignment"}


def xdist_group_of(item) -> str | None:
    """The xdist group of a collected test (None: it may run on any worker)."""
    module = item.path.stem
    for name, defs in item._fixtureinfo.name2fixturedefs.items():
        if name in SPLIT_BY_PARAM and hasattr(item, "callspec"):
            return f"{module}-{item.callspec.params[SPLIT_BY_PARAM[name]]}"
    for name, defs in item._fixtureinfo.name2fixturedefs.items():
        if defs and defs[-1].scope in ("module", "class", "package") and defs[-1].baseid:
            return module
    return None


# tryfirst: xdist's worker hook renames each grouped test's node id to "<id>@<group>" in this same
# hook, and a marker added after it is never seen (the groups then do nothing and each worker
# builds the module's fixtures for itself). tests/test_suite_budget.py runs two workers to check.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = xdist_group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
