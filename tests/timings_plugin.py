"""Records how long each test took, for the suite's time budget (scripts/test_times.py reads it).

Loaded by tests/conftest.py. At the end of a run it writes ``build/test-times/last.json`` (or
``$MLEXP_TEST_TIMES``): one entry per test with its seconds (setup + call + teardown, as pytest
measures them), whether it is marked ``slow`` (so outside ``make test-fast``), its outcome, and
the run's wall seconds, date, worker count and the marker expression it was selected with. Under
pytest-xdist the reports reach the controller, so one file holds the whole run.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


class TimingRecorder:
    def __init__(self, config):
        self.config = config
        self.tests: dict = {}
        self.start = time.monotonic()
        self.started_at = _dt.datetime.now(_dt.timezone.utc)

    def pytest_runtest_logreport(self, report):
        nodeid = re.sub(r"@[\w.-]+$", "", report.nodeid)    # xdist's loadgroup adds "@<group>"
        entry = self.tests.setdefault(nodeid, {"seconds": 0.0, "slow": "slow" in report.keywords,
                                                      "outcome": "passed"})
        entry["seconds"] += report.duration
        if report.failed:
            entry["outcome"] = "failed" if report.when == "call" else "error"
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"

    def pytest_sessionfinish(self, session, exitstatus):
        if hasattr(self.config, "workerinput"):        # an xdist worker: the controller writes
            return
        path = Path(os.environ.get("MLEXP_TEST_TIMES") or _REPO / "build" / "test-times" / "last.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        numprocesses = getattr(self.config.option, "numprocesses", None)
        data = {
            "date": self.started_at.strftime("%Y-%m-%d"),
            "started_at": self.started_at.isoformat(timespec="seconds"),
            "wall_seconds": round(time.monotonic() - self.start, 1),
            "markexpr": self.config.option.markexpr or "",
            "args": [a for a in self.config.invocation_params.args],
            "workers": numprocesses or 0,
            "cpus": os.cpu_count(),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "machine": f"{platform.machine()} {platform.system()}, python {platform.python_version()}",
            "exitstatus": int(exitstatus),
            "tests": {k: {**v, "seconds": round(v["seconds"], 3)} for k, v in sorted(self.tests.items())},
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)
