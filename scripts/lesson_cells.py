"""Write the cells every lesson shares (Colab badge, measured time, setup cell) and the README's lesson table.

Usage (from the repository root, with the course's virtual environment):

    .venv/bin/python scripts/lesson_cells.py [write ID ...]   # rewrite the cells in solutions/ and the README table
    .venv/bin/python scripts/lesson_cells.py --check    # exit 1 when anything would change
    .venv/bin/python scripts/lesson_cells.py measure [ID ...]   # time each solution notebook (full size)

Then run ``python -m autograder build`` so that lessons/ follows solutions/.

What this script owns in ``solutions/<id>/<id>.ipynb``:
- the first cell (id ``intro``): its "Open in Colab" badge line (right under the title) and its
  ``**Time.**`` paragraph, built from LESSONS below and the timings in scripts/lesson_times.json.
  The rest of that cell (what you will be able to do, assumptions, conventions) belongs to the
  lesson's author; the script only checks that those paragraphs are there.
- the setup cell (id ``course-setup``, the second cell): SETUP_SOURCE, the same in every lesson.

The GitHub repository of the course is written in one place, COURSE_REPO below; every Colab link
(README and notebooks) and the setup cell's install command are generated from it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
TIMES = Path(__file__).resolve().with_name("lesson_times.json")

# The course's GitHub repository as "owner/name". PLACEHOLDER until the repository is published:
# set it here, run this script and `python -m autograder build`, and commit the result.
COURSE_REPO = "OWNER/REPO"
BRANCH = "main"

# id -> (title for the README, minutes of reading and exercises (the author's estimate),
#        what takes the time when every cell runs)
LESSONS = {
    "00_token_mixing": ("Token mixing: convolution, recurrence, attention", 60,
                        "the recall probe (section 5, four models of 1,000 steps) and the five "
                        "language models (section 6); section 7 lists what each run cost"),
    "01_running_sum": ("Attention as a running sum", 75, "the decode-cost measurements and timings"),
    "02_fixed_state_recall": ("What a fixed state cannot hold", 60, "the recall training in section 6"),
    "03_gates_and_delta_rule": ("Gates and the delta rule", 90, "the recall-with-overwrites training"),
    "04_hybrid_kv_cache": ("Hybrid models and their cache", 45, "nothing: no model is trained"),
    "05_inattention": ("InAttention: attend to the initial states", 60,
                       "the prefill memory sweep and the small language models"),
    "06_recall_per_byte": ("Recall per byte: the capstone", 75,
                           "training the eight designs of section 3"),
}

INTRO_ID, SETUP_ID = "intro", "course-setup"
BADGE_IMG = "https://colab.research.google.com/assets/colab-badge.svg"
BADGE_RE = re.compile(r"^\[!\[Open In Colab\]\(.*$", re.M)
TIME_RE = re.compile(r"^\*\*Time\.\*\*.*?(?=\n\n|\Z)", re.S | re.M)
SET_THREADS_RE = re.compile(r"torch\.set_num_threads\((\d+)\)")
REQUIRED_IN_INTRO = ("**What you will be able to do**", "**Assumptions.**")

# The setup cell's code before this script existed: it is removed from the lesson's own
# import cell when the shared setup cell is first inserted.
OLD_BOOTSTRAP = '''# Setup: find the course library `mlexp` (installed, or in the repository this notebook sits in).
import sys
from pathlib import Path

try:
    import mlexp
except ImportError:
    _root = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "mlexp" / "__init__.py").is_file()), None)
    if _root is None:
        raise ImportError(
            "This lesson needs the course library `mlexp`. In a clone of the course repository run "
            "`bash scripts/setup.sh` (or `pip install -e .`) and start Jupyter inside the clone."
        ) from None
    sys.path.insert(0, str(_root))
    import mlexp
'''

# Packages Colab already has: the setup cell must never install (and so replace) them.
COLAB_KEEPS = ("torch", "numpy", "matplotlib", "ipywidgets")
# Small dependencies of mlexp the setup cell adds on Colab when (and only when) they are missing:
# import name -> pip requirement.
SMALL_DEPS = {"tqdm": "tqdm>=4.65"}

SETUP_TEMPLATE = '''# Setup, the same in every lesson: make the course library `mlexp` importable.
# 1. mlexp is installed (the course's .venv, a conda env, pip install): use it.
# 2. this notebook sits in a checkout of the course: import mlexp from that checkout.
# 3. on Colab: install the course from GitHub with --no-deps, keeping Colab's own torch, numpy,
#    matplotlib and ipywidgets; only small dependencies that are missing (tqdm) are added.
import importlib.util
import subprocess
import sys
from pathlib import Path

COURSE_REPO = "{repo}"   # the course on GitHub (set in scripts/lesson_cells.py)
SMALL_DEPS = {small_deps!r}   # import name -> requirement, installed only when missing

try:
    import mlexp
except ImportError:
    _root = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "mlexp" / "__init__.py").is_file()), None)
    if _root is not None:
        sys.path.insert(0, str(_root))
    elif "google.colab" in sys.modules:
        if COURSE_REPO == "OWNER/REPO":
            raise RuntimeError("This copy of the lesson does not know the course's GitHub repository yet "
                               "(COURSE_REPO is a placeholder). Upload the course folder to Colab instead, "
                               "or ask your instructor for the published link.") from None
        _pip = [sys.executable, "-m", "pip", "install", "--quiet"]
        _missing = [req for name, req in SMALL_DEPS.items() if importlib.util.find_spec(name) is None]
        try:
            if _missing:
                subprocess.run(_pip + _missing, check=True)
            subprocess.run(_pip + ["--no-deps", f"mlexp @ git+https://github.com/{{COURSE_REPO}}@{branch}"], check=True)
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"Installing the course from github.com/{{COURSE_REPO}} failed ({{exc}}). "
                               "Check that the notebook has internet access (Colab: Runtime > "
                               "Disconnect and delete runtime, then run again).") from None
        importlib.invalidate_caches()
    else:
        raise ImportError(
            "This lesson needs the course library `mlexp`. In a clone of the course repository run "
            "`make test` or `bash scripts/setup.sh` (or `pip install -e .`) and start Jupyter inside "
            "the clone; on Colab, open the lesson from the README's 'Open in Colab' link."
        ) from None
    import mlexp'''


def setup_source(repo: str = COURSE_REPO) -> str:
    """The setup cell's code for the course repository ``repo`` ("owner/name")."""
    return SETUP_TEMPLATE.format(repo=repo, branch=BRANCH, small_deps=SMALL_DEPS)


SETUP_SOURCE = setup_source()


def colab_url(lesson_id: str, repo: str = COURSE_REPO) -> str:
    """Colab's address for the student notebook lessons/<id>/<id>.ipynb on GitHub."""
    return f"https://colab.research.google.com/github/{repo}/blob/{BRANCH}/lessons/{lesson_id}/{lesson_id}.ipynb"


def badge(lesson_id: str) -> str:
    """Markdown of the "Open In Colab" badge linking to ``colab_url(lesson_id)``."""
    return f"[![Open In Colab]({BADGE_IMG})]({colab_url(lesson_id)})"


def _span(cpu_seconds: float, wall_seconds: float) -> str:
    lo, hi = math.ceil(cpu_seconds / 60), math.ceil(wall_seconds / 60)
    if hi <= 1:
        return "under a minute"
    return f"about {hi} minutes" if lo >= hi else f"between about {lo} and {hi} minutes"


def time_paragraph(lesson_id: str, times: dict, sets_threads: bool = True) -> str:
    """The intro's **Time.** paragraph: the reading estimate plus the run time measured here.

    Two measured numbers bracket what an unloaded laptop-class CPU needs: the kernel's own CPU
    time (low: timing cells run for a fixed wall time whatever CPU share they get) and the wall
    time on the shared machine, which other jobs were loading (high). ``sets_threads``: the
    lesson calls torch.set_num_threads itself (else torch's default was used).
    """
    _, reading, heavy = LESSONS[lesson_id]
    text = f"**Time.** About {reading} minutes of reading and exercises."
    t = times.get(lesson_id)
    if t is None:
        return text + " The time to run every cell has not been measured yet."
    n = t["torch_threads"]
    threads = "" if n is None else (f"{n} torch thread{'s' if n != 1 else ''}, "
                                    + ("set by the lesson, " if sets_threads else "torch's default here, "))
    text += (f" Running every cell at full size takes {_span(t['cpu_seconds'], t['seconds'])} on a "
             f"laptop-class CPU: the kernel used {t['cpu_seconds']:.0f} s of CPU time, and the wall clock "
             f"showed {t['seconds']:.0f} s on a shared 2-core machine that other jobs were loading "
             f"(load average {t['load_before']:.0f}-{t['load_after']:.0f}; {threads}{t['date']})")
    text += "; no model is trained." if heavy.startswith("nothing") else f". Most of it is {heavy}."
    text += (" Under the auto-grader the experiments run at a token size, so a submission grades in "
             "seconds. No GPU time has been measured.")
    return text


def rewrite_intro(source: str, lesson_id: str, times: dict, sets_threads: bool = True) -> str:
    """Put the badge under the title and replace the **Time.** paragraph of an intro cell."""
    for needed in REQUIRED_IN_INTRO:
        if needed not in source:
            raise ValueError(f"{lesson_id}: the first cell lacks '{needed}'; the lesson's author writes it.")
    if not TIME_RE.search(source):
        raise ValueError(f"{lesson_id}: the first cell lacks a '**Time.**' paragraph to rewrite.")
    source = BADGE_RE.sub("", source).replace("\n\n\n", "\n\n")
    title, _, rest = source.partition("\n")
    if not title.startswith("# "):
        raise ValueError(f"{lesson_id}: the first cell must start with the lesson title ('# Lesson ...').")
    source = f"{title}\n\n{badge(lesson_id)}\n\n{rest.lstrip(chr(10))}"
    return TIME_RE.sub(lambda _: time_paragraph(lesson_id, times, sets_threads), source, count=1)


def apply(nb, lesson_id: str, times: dict):
    """Rewrite the intro and setup cells of one solution notebook in place; returns ``nb``."""
    intro = nb.cells[0]
    if intro.cell_type != "markdown":
        raise ValueError(f"{lesson_id}: the first cell must be the markdown introduction.")
    intro.id = INTRO_ID
    sets_threads = any(SET_THREADS_RE.search(c.source) for c in nb.cells if c.cell_type == "code")
    intro.source = rewrite_intro(intro.source, lesson_id, times, sets_threads)
    setup = [c for c in nb.cells if c.get("id") == SETUP_ID]
    if not setup:
        # First run: insert the shared cell and take the old bootstrap out of the lesson's imports.
        for cell in nb.cells:
            if cell.cell_type == "code" and cell.source.startswith(OLD_BOOTSTRAP):
                cell.source = cell.source[len(OLD_BOOTSTRAP):].lstrip("\n")
                cell.source = "# The lesson's imports and settings.\n" + cell.source
                break
        else:
            raise ValueError(f"{lesson_id}: no setup cell found (neither id '{SETUP_ID}' nor the old one).")
        cell = nbformat.v4.new_code_cell(SETUP_SOURCE)
        cell.id = SETUP_ID
        nb.cells.insert(1, cell)
    elif nb.cells.index(setup[0]) != 1:
        raise ValueError(f"{lesson_id}: the cell '{SETUP_ID}' must be the second cell.")
    cell = nb.cells[1]
    cell.source = SETUP_SOURCE
    cell.metadata = {k: v for k, v in cell.metadata.items() if k != "nbgrader"}
    cell.outputs, cell.execution_count = [], None
    return nb


def readme_table() -> str:
    """The README's lesson table (between <!-- lessons --> markers): one Colab link per lesson."""
    rows = ["| Lesson | Open locally | Open in Colab |", "|---|---|---|"]
    for lesson_id, (title, _, _) in LESSONS.items():
        path = f"lessons/{lesson_id}/{lesson_id}.ipynb"
        rows.append(f"| {lesson_id[:2]} {title} | [`{path}`]({path}) | {badge(lesson_id)} |")
    return "\n".join(rows)


def rewrite_readme(text: str) -> str:
    start, end = "<!-- lessons -->", "<!-- /lessons -->"
    if start not in text or end not in text:
        raise ValueError(f"README.md has no '{start}' ... '{end}' block for the lesson table.")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{readme_table()}\n{end}{tail}"


def load_times() -> dict:
    return json.loads(TIMES.read_text()) if TIMES.is_file() else {}


def run(check: bool, ids=()) -> int:
    """Rewrite (or with ``check`` only compare) the solution notebooks (``ids``, default all)
    and the README table; returns 1 when ``check`` finds a difference, else 0."""
    times, changed = load_times(), []
    unknown = set(ids) - set(LESSONS)
    if unknown:
        raise SystemExit(f"unknown lesson ids {sorted(unknown)}; known: {list(LESSONS)}")
    for lesson_id in ids or LESSONS:
        path = ROOT / "solutions" / lesson_id / f"{lesson_id}.ipynb"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing; LESSONS in {__file__} lists it.")
        old = path.read_text()
        nb = apply(nbformat.read(path, as_version=4), lesson_id, times)
        new = nbformat.writes(nb) + "\n"
        if new != old:
            changed.append(path)
            if not check:
                path.write_text(new)
    readme = ROOT / "README.md"
    old = readme.read_text()
    new = rewrite_readme(old)
    if new != old:
        changed.append(readme)
        if not check:
            readme.write_text(new)
    for path in changed:
        print(("differs: " if check else "rewrote: ") + str(path.relative_to(ROOT)))
    if changed and not check:
        print("Now run `python -m autograder build` (and `demo`) so that lessons/ follows.")
    return 1 if check and changed else 0


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` and its reaped children (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")   # utime stime cutime cstime


def measure(ids) -> int:
    """Execute each solution notebook once at full size with nbclient; record wall and CPU time.

    The wall time depends on what else the machine runs, so the load average is recorded with
    it, and the kernel's CPU time beside it (see ``time_paragraph``). Unset NBGRADER_EXECUTION:
    full size. Results are merged into scripts/lesson_times.json after each lesson.
    """
    from nbclient import NotebookClient

    env_keep = os.environ.pop("NBGRADER_EXECUTION", None)
    try:
        for lesson_id in ids or LESSONS:
            path = ROOT / "solutions" / lesson_id / f"{lesson_id}.ipynb"
            nb = nbformat.read(path, as_version=4)
            client = NotebookClient(nb, timeout=3600, kernel_name="python3",
                                    resources={"metadata": {"path": str(path.parent)}})
            load_before = os.getloadavg()[0]
            t0 = time.perf_counter()
            with client.setup_kernel():
                pid = client.km.provisioner.pid
                for index, cell in enumerate(nb.cells):
                    client.execute_cell(cell, index)
                cpu = _cpu_seconds(pid)
            seconds = time.perf_counter() - t0
            entry = {"seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
                     "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
                     "torch_threads": _torch_threads(nb), "cpus": os.cpu_count(),
                     "date": time.strftime("%Y-%m-%d")}
            print(f"{lesson_id}: {json.dumps(entry)}", flush=True)
            times = load_times()          # re-read: other measure runs may have written meanwhile
            times[lesson_id] = entry
            TIMES.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")
    finally:
        if env_keep is not None:
            os.environ["NBGRADER_EXECUTION"] = env_keep
    return 0


def _torch_threads(nb):
    """Torch threads the lesson ran with: its own set_num_threads, else torch's default here;
    None for a lesson that does not use torch."""
    if not any(re.search(r"^\s*(import torch|from torch)", c.source, re.M) for c in nb.cells):
        return None
    for cell in nb.cells:
        m = SET_THREADS_RE.search(cell.source)
        if m:
            return int(m.group(1))
    import torch

    return torch.get_num_threads()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", nargs="?", default="write", choices=["write", "measure"])
    p.add_argument("ids", nargs="*", help="lesson ids to rewrite or measure (default: all)")
    p.add_argument("--check", action="store_true", help="exit 1 when a notebook or the README would change")
    args = p.parse_args(argv)
    if args.command == "measure":
        return measure(args.ids)
    return run(args.check, args.ids)


if __name__ == "__main__":
    sys.exit(main())
