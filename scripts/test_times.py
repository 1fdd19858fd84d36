"""The test suite's time budget: a summary of the last run, and the measurement the pages quote.

tests/timings_plugin.py writes ``build/test-times/last.json`` at the end of every pytest run (each
test's seconds, whether it is marked slow, its outcome; the run's wall time, date and workers).

``python scripts/test_times.py summary [FILE]``
    Prints the ten slowest tests, the seconds per test file (top ten), the sum of the tests' times
    and the run's wall time, then checks the fast tier's limits (see FAST_TEST_LIMIT_S and
    FAST_TIER_LIMIT_S): a test outside the ``slow`` mark that took longer than its limit, or a fast
    tier whose tests add up past the tier's, makes the exit status 1 with the tests named. `make
    test` and `make test-fast` run it after pytest, so CI prints it at the end of every run.

``python scripts/test_times.py record FULL.json FAST.json``
    Stores two measurements (a `make test` run and a `make test-fast` run on the same machine) in
    tests/times.json, compactly, and rewrites the block between ``<!-- test-times -->`` and
    ``<!-- /test-times -->`` of the contributor's guide (docs/contributors.md, "Tests") from it:
    the counts and minutes it gives, with their date. tests/test_suite_budget.py checks that the
    block matches tests/times.json and that no test of the fast tier took longer than its limit
    there.

    It also writes the measured minutes into the README's second set-up command (its comment).

``python scripts/test_times.py check-readme``
    Exit 1 if the guide's block or the README's test command is not what ``record`` writes from
    tests/times.json.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAST = REPO / "build" / "test-times" / "last.json"
STORED = REPO / "tests" / "times.json"
README = REPO / "README.md"
GUIDE = REPO / "docs" / "contributors.md"     # holds the test-times block
BEGIN, END = "<!-- test-times -->", "<!-- /test-times -->"

FAST_TEST_LIMIT_S = 20.0     # no test of `make test-fast` longer than this (mark it slow instead)
FAST_TIER_LIMIT_S = 180.0    # `make test-fast`'s tests together, on one worker of a quiet machine


def load(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SystemExit(f"test_times: no timings at {path} (run pytest first: make test-fast)")
    except json.JSONDecodeError as e:
        raise SystemExit(f"test_times: {path} is not a timings file ({e})")
    if not isinstance(data.get("tests"), dict):
        raise SystemExit(f"test_times: {path} holds no 'tests' table")
    return data


def fast_tier_problems(tests: dict) -> list:
    """Messages for each limit of the fast tier that the given tests break (empty: within budget).
    Only tests that ran count (skipped ones took no time worth judging)."""
    fast = {k: v for k, v in tests.items() if not v["slow"] and v["outcome"] != "skipped"}
    problems = [f"{k} took {v['seconds']:.1f} s, over the fast tier's {FAST_TEST_LIMIT_S:.0f} s per test "
                f"(speed it up or mark it slow)" for k, v in sorted(fast.items())
                if v["seconds"] > FAST_TEST_LIMIT_S]
    total = sum(v["seconds"] for v in fast.values())
    if total > FAST_TIER_LIMIT_S:
        problems.append(f"the fast tier's tests took {total:.0f} s together, over its {FAST_TIER_LIMIT_S:.0f} s")
    return problems


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def summary(data: dict, out=print) -> int:
    tests = data["tests"]
    outcomes = Counter(v["outcome"] for v in tests.values())
    total = sum(v["seconds"] for v in tests.values())
    out("")
    out(f"== test times ({data.get('started_at', data.get('date'))}, {data.get('workers') or 1} worker(s), "
        f"{data.get('cpus')} CPUs) ==")
    out("ten slowest tests (setup + call + teardown):")
    for k, v in sorted(tests.items(), key=lambda kv: -kv[1]["seconds"])[:10]:
        out(f"  {v['seconds']:7.1f} s  {k}{'' if v['slow'] else '  [fast tier]'}")
    per_file = Counter()
    for k, v in tests.items():
        per_file[k.split("::")[0]] += v["seconds"]
    out("slowest test files:")
    for f, s in per_file.most_common(10):
        out(f"  {s:7.1f} s  {f}")
    out(f"total: {len(tests)} tests, {total:.0f} s of test time ({_minutes(total)}), "
        f"{data['wall_seconds']:.0f} s wall ({_minutes(data['wall_seconds'])})")
    # The limits hold for the fast tier run on its own (`make test-fast`, one process); in a full
    # run the fast tests share the cores with the slow ones, so their times are only reported.
    problems = fast_tier_problems(tests)
    fast_run = data.get("markexpr") == "not slow"
    for p in problems:
        out(f"BUDGET: {p}" if fast_run else f"note (a full run, cores shared; limits apply to make test-fast): {p}")
    out(f"tests: {outcomes['passed']} passed, {outcomes['failed'] + outcomes['error']} failed, "
        f"{outcomes['skipped']} skipped")
    return 1 if problems and fast_run else 0


def compact(data: dict) -> dict:
    return {"date": data["date"], "wall_seconds": data["wall_seconds"], "workers": data.get("workers") or 1,
            "cpus": data.get("cpus"), "machine": data.get("machine"), "markexpr": data.get("markexpr", ""),
            "tests": {k: [round(v["seconds"], 2), int(v["slow"])] for k, v in sorted(data["tests"].items())
                      if v["outcome"] != "skipped"}}


def render(stored: dict) -> str:
    """The guide's test-times block, from tests/times.json."""
    full, fast = stored["full"], stored["fast"]
    n_full, n_fast = len(full["tests"]), len(fast["tests"])
    return "\n".join([
        BEGIN,
        f"Measured on {full['date']} ({full['cpus']} CPUs, {full['machine']}; written by "
        f"`scripts/test_times.py record`): `make test` ran {n_full} tests in "
        f"{full['wall_seconds'] / 60:.0f} minutes on {full['workers']} workers; `make test-fast` ran "
        f"{n_fast} of them in {fast['wall_seconds'] / 60:.1f} minutes, none over "
        f"{FAST_TEST_LIMIT_S:.0f} s. Both print the ten slowest tests and the total at the end.",
        END])


SETUP_PREFIX = "make test    # "


def render_setup_line(stored: dict) -> str:
    """The README's second set-up command, with the measured minutes of both tiers."""
    full, fast = stored["full"], stored["fast"]
    return (f"{SETUP_PREFIX}add the test tools to .venv, run every test ({full['wall_seconds'] / 60:.0f} min "
            f"on {full['date']}; make test-fast: {fast['wall_seconds'] / 60:.1f})")


def setup_line(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(SETUP_PREFIX):
            return line
    return None


def expand(compacted: dict) -> dict:
    """A stored measurement's tests in the shape of last.json's (outcome: passed)."""
    return {k: {"seconds": s, "slow": bool(slow), "outcome": "passed"} for k, (s, slow) in compacted["tests"].items()}


def readme_block(text: str) -> str | None:
    if BEGIN not in text or END not in text:
        return None
    return text[text.index(BEGIN):text.index(END) + len(END)]


def readme_problems(text: str, stored: dict, guide: str | None = None) -> list:
    """What in the README (``text``: its test command) and the contributor's guide (``guide``: its
    test-times block; default: the file GUIDE) differs from what `record` writes from tests/times.json."""
    guide = GUIDE.read_text() if guide is None else guide
    problems = []
    if readme_block(guide) != render(stored):
        problems.append(f"{GUIDE.relative_to(REPO)}'s test-times block is not what tests/times.json gives:\n"
                        f"{render(stored)}")
    if setup_line(text) != render_setup_line(stored):
        problems.append(f"README's test command line is not what tests/times.json gives:\n{render_setup_line(stored)}")
    return problems


def record(full_path: Path, fast_path: Path) -> None:
    full, fast = load(full_path), load(fast_path)
    for name, data in (("full", full), ("fast", fast)):
        bad = [k for k, v in data["tests"].items() if v["outcome"] in ("failed", "error")]
        if bad or data.get("exitstatus"):
            raise SystemExit(f"test_times: the {name} run did not pass ({len(bad)} failed); record a passing one")
    if fast.get("markexpr") != "not slow":
        raise SystemExit(f"test_times: {fast_path} is not a `make test-fast` run (marker {fast.get('markexpr')!r})")
    problems = fast_tier_problems(fast["tests"])
    if problems:
        raise SystemExit("test_times: the fast tier is over budget:\n  " + "\n  ".join(problems))
    stored = {"full": compact(full), "fast": compact(fast)}
    STORED.write_text(json.dumps(stored, indent=0, sort_keys=True) + "\n")
    guide = GUIDE.read_text()
    old = readme_block(guide)
    if old is None:
        raise SystemExit(f"test_times: {GUIDE.relative_to(REPO)} has no {BEGIN} ... {END} block to rewrite")
    text = README.read_text()
    line = setup_line(text)
    if line is None:
        raise SystemExit(f"test_times: README.md has no line starting {SETUP_PREFIX!r}")
    GUIDE.write_text(guide.replace(old, render(stored)))
    README.write_text(text.replace(line, render_setup_line(stored)))
    print(f"wrote {STORED.relative_to(REPO)}, {GUIDE.relative_to(REPO)}'s test-times block and the README's test command")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, args = argv[0], argv[1:]
    if cmd == "summary":
        return summary(load(Path(args[0]) if args else LAST))
    if cmd == "record" and len(args) == 2:
        record(Path(args[0]), Path(args[1]))
        return 0
    if cmd == "check-readme":
        problems = readme_problems(README.read_text(), json.loads(STORED.read_text()))
        for p in problems:
            print(p)
        return 1 if problems else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
