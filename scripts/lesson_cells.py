"""Write the cells every lesson shares (Colab badge, measured time, setup cell) and the README's lesson table.

Usage (from the repository root, with the course's virtual environment):

    .venv/bin/python scripts/lesson_cells.py [write ID ...]   # rewrite the cells in solutions/ and the README table
    .venv/bin/python scripts/lesson_cells.py --check    # exit 1 when anything would change
    .venv/bin/python scripts/lesson_cells.py measure [ID ...]   # time each solution notebook (full size)

Then run ``python -m autograder build`` so that lessons/ follows solutions/.

What this script owns in ``solutions/<id>/<id>.ipynb``:
- the first cell (id ``intro``): its "Open in Colab" badge line (right under the title) and its
  ``**Time.**`` paragraph, built from the lesson list in autograder/course.py (title, minutes)
  and the timings in scripts/lesson_times.json.
  The rest of that cell (what you will be able to do, assumptions, conventions) belongs to the
  lesson's author; the script only checks that those paragraphs are there.
- the setup cell (id ``course-setup``, the second cell): SETUP_SOURCE, the same in every lesson.

The lessons and the course's GitHub repository are written in one place, autograder/course.py
(COURSE_REPO, set with `python -m autograder build --repo OWNER/NAME`); every Colab link (README
and notebooks) and the setup cell's install command are generated from it. `make lessons` runs
this script, then `build` and `demo`.
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
sys.path.insert(0, str(ROOT))          # the course module of this checkout, also when not installed
from autograder.publishing.colab import wheel_name  # noqa: E402
from autograder.course import BRANCH, COURSE_REPO, LESSONS, PLACEHOLDER_REPO  # noqa: E402
from mlexp.runtime import temporary_environ  # noqa: E402

TIMES = Path(__file__).resolve().with_name("lesson_times.json")

INTRO_ID, SETUP_ID = "intro", "course-setup"
BADGE_IMG = "https://colab.research.google.com/assets/colab-badge.svg"
BADGE_RE = re.compile(r"^\[!\[Open In Colab\]\(.*$", re.M)
TIME_RE = re.compile(r"^\*\*Time\.\*\*.*?(?=\n\n|\Z)", re.S | re.M)
SET_THREADS_RE = re.compile(r"torch\.set_num_threads\((\d+)\)")
REQUIRED_IN_INTRO = ("**What you will be able to do**", "**Assumptions.**")

# Packages Colab already has: the setup cell must never install (and so replace) them.
COLAB_KEEPS = ("torch", "numpy", "matplotlib", "ipywidgets")
# Small dependencies of mlexp the setup cell adds on Colab when (and only when) they are missing:
# import name -> pip requirement.
SMALL_DEPS = {"tqdm": "tqdm>=4.65"}

# The course file a student uploads to Colab before the course is on GitHub: a wheel of mlexp,
# written by `python -m autograder build --colab` (autograder/publishing/colab.py); any version is found.
COURSE_FILE_GLOB = "mlexp-*.whl"

SETUP_TEMPLATE = """# Setup, the same in every lesson: make the course library `mlexp` importable.
# 1. mlexp is installed (the course's .venv, a conda env, pip install): use it.
# 2. a copy of the course is here: in this notebook's folder or above it, or uploaded next to it
#    (on Colab: /content/course, or a folder in your mounted Google Drive): import mlexp from it.
# 3. on Colab: install the course file from your instructor (mlexp-....whl, uploaded to /content
#    or your Drive), or else the course from GitHub; both with --no-deps, keeping Colab's own
#    torch, numpy, matplotlib and ipywidgets; only small dependencies that are missing are added.
#    A course file uploaded later (a corrected one) replaces an installed mlexp whose code differs
#    from it, unless the file's version is lower than the installed one's.
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

COURSE_REPO = "{repo}"   # the course on GitHub (set by `python -m autograder build --repo`)
COURSE_FILE = "{course_file}"   # made by `python -m autograder build --colab`
SMALL_DEPS = {small_deps!r}   # import name -> requirement, installed only when missing
COLAB = Path("/content")   # Colab's folder; a mounted Drive is COLAB / "drive" / "MyDrive"


def _version_key(version):
    return tuple(int(n) for n in re.findall(r"\\d+", version))


def _replaces_installed(course_file, package):
    \"\"\"Whether the course file should replace the installed mlexp (its folder ``package``): some
    module of the file differs from the installed copy, and the file's version is not lower.\"\"\"
    try:
        installed = importlib.metadata.version("mlexp")
    except importlib.metadata.PackageNotFoundError:
        return False   # mlexp comes from a folder on sys.path, not from an installation
    version = course_file.stem.split("-")[1] if course_file.stem.count("-") >= 2 else ""
    try:
        with zipfile.ZipFile(course_file) as whl:
            differs = any(not (package.parent / n).is_file() or (package.parent / n).read_bytes() != whl.read(n)
                          for n in whl.namelist() if n.startswith("mlexp/") and not n.endswith("/"))
    except (OSError, zipfile.BadZipFile):
        differs = True   # pip says what is wrong with the file
    if differs and _version_key(version) < _version_key(installed):
        print(f"Note: {{course_file}} holds mlexp {{version}}, older than the installed {{installed}}; "
              "it is not installed. Delete it, or upload the newer course file, and run this cell again.")
        return False
    return differs


try:
    import mlexp
except ImportError:
    mlexp = None
_colab = "google.colab" in sys.modules
_replace = False   # on Colab: an installed mlexp that a newer course file replaces
if mlexp is None or _colab:
    _places = [Path.cwd(), *Path.cwd().parents]
    for _base in [Path.cwd(), COLAB, COLAB / "drive" / "MyDrive", COLAB / "drive" / "MyDrive" / "Colab Notebooks"]:
        if _base.is_dir():   # the folder itself and the folders right inside it
            _places += [_base, *sorted(p for p in _base.iterdir() if p.is_dir() and not p.name.startswith("."))]
    _places = list(dict.fromkeys(_places))
    _root = next((p for p in _places if (p / "mlexp" / "__init__.py").is_file()), None)
    _files = sorted({{f for p in _places for f in p.glob(COURSE_FILE)}}, key=lambda f: f.stat().st_mtime)
    _replace = (mlexp is not None and _colab and _root is None and bool(_files)
                and _replaces_installed(_files[-1], Path(mlexp.__file__).parent))
if mlexp is None or _replace:
    if _root is not None:
        sys.path.insert(0, str(_root))
    elif _colab and (_files or COURSE_REPO != "{placeholder}"):
        if _files:   # the newest course file, under the name pip expects (an upload may add " (1)")
            _course = Path(tempfile.mkdtemp()) / (re.sub(r"\\s*\\(\\d+\\)", "", _files[-1].stem) + ".whl")
            _course.write_bytes(_files[-1].read_bytes())
            _from = str(_files[-1])
        else:
            _course, _from = f"mlexp @ git+https://github.com/{{COURSE_REPO}}@{branch}", f"github.com/{{COURSE_REPO}}"
        _pip = [sys.executable, "-m", "pip", "install", "--quiet"]
        _missing = [req for name, req in SMALL_DEPS.items() if importlib.util.find_spec(name) is None]
        try:
            if _missing:
                subprocess.run(_pip + _missing, check=True)
            if _replace:   # pip keeps an installed mlexp of the same version: take it out first
                subprocess.run([sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", "mlexp"], check=True)
            subprocess.run(_pip + ["--no-deps", str(_course)], check=True)
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"Installing the course from {{_from}} failed ({{exc}}). Check that the "
                               "notebook has internet access (Colab: Runtime > Disconnect and delete "
                               "runtime, then run again).") from None
        importlib.invalidate_caches()
        if _replace:   # forget the old modules, so that the import below reads the new ones
            for _name in [n for n in sys.modules if n == "mlexp" or n.startswith("mlexp.")]:
                del sys.modules[_name]
            print(f"Installed the course file {{_from}} over the older mlexp. If you ran cells of this "
                  "lesson before this one, run them again (or Runtime > Restart session, then Run all).")
    elif _colab:
        raise RuntimeError(
            "This lesson needs the course library `mlexp`, and Colab has no copy of it yet (the course is "
            "not on GitHub yet). Ask your instructor for the course file {wheel_name}"
            " (made with `python -m autograder build --colab`), then: 1. open the Files panel (the folder "
            "icon on the left); 2. click Upload and choose the file (it lands in /content), or put it in "
            "your Google Drive and click Mount Drive; 3. run this cell again. Uploading the whole course "
            "folder (the one holding mlexp/) to /content/course works too.") from None
    else:
        raise ImportError(
            "This lesson needs the course library `mlexp`. In a clone of the course repository run "
            "`make lab` (or `pip install -e .`) and start Jupyter inside the clone; on Colab, see the "
            "README's 'Open a lesson in Colab'."
            + (f" A course file is here: `pip install {{_files[-1]}}` installs it." if _files else "")) from None
    import mlexp"""


def setup_source(repo: str = COURSE_REPO) -> str:
    """The setup cell's code for the course repository ``repo`` ("owner/name")."""
    return SETUP_TEMPLATE.format(repo=repo, branch=BRANCH, small_deps=SMALL_DEPS,
                                 course_file=COURSE_FILE_GLOB, placeholder=PLACEHOLDER_REPO,
                                 wheel_name=wheel_name(ROOT))


SETUP_SOURCE = setup_source()


def colab_url(lesson_id: str, repo: str = COURSE_REPO) -> str:
    """Colab's address for the student notebook lessons/<id>/<id>.ipynb on GitHub."""
    return f"https://colab.research.google.com/github/{repo}/blob/{BRANCH}/lessons/{lesson_id}/{lesson_id}.ipynb"


def badge(lesson_id: str, repo: str = COURSE_REPO) -> str:
    """Markdown of the "Open In Colab" badge linking to ``colab_url(lesson_id, repo)``."""
    return f"[![Open In Colab]({BADGE_IMG})]({colab_url(lesson_id, repo)})"


def _span(cpu_seconds: float, wall_seconds: float) -> str:
    lo, hi = math.ceil(cpu_seconds / 60), math.ceil(wall_seconds / 60)
    if hi <= 1:
        return "under a minute"
    return f"about {hi} minutes" if lo >= hi else f"between about {lo} and {hi} minutes"


def _load_range(t: dict) -> str:
    """The load averages before and after a measurement, low to high: "4", or "3-4"."""
    low, high = sorted((round(t["load_before"]), round(t["load_after"])))
    return f"{low}" if low == high else f"{low}-{high}"


def time_paragraph(lesson_id: str, times: dict, sets_threads: bool = True) -> str:
    """The intro's **Time.** paragraph: the reading estimate plus the run time measured here.

    Two measured numbers bracket what an unloaded laptop-class CPU needs: the kernel's own CPU
    time (low: timing cells run for a fixed wall time whatever CPU share they get) and the wall
    time on the shared machine, which other jobs were loading (high). ``sets_threads``: the
    lesson calls torch.set_num_threads itself (else torch's default was used).
    """
    reading, heavy = LESSONS[lesson_id].minutes, LESSONS[lesson_id].heavy
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
             f"(load average {_load_range(t)}; {threads}{t['date']})")
    text += "; no model is trained." if heavy.startswith("nothing") else f". Most of it is {heavy}."
    text += (" Under the auto-grader the experiments run at a token size, so a submission grades in "
             "seconds. No GPU time has been measured.")
    return text


def rewrite_intro(source: str, lesson_id: str, times: dict, sets_threads: bool = True,
                  repo: str = COURSE_REPO) -> str:
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
    source = f"{title}\n\n{badge(lesson_id, repo)}\n\n{rest.lstrip(chr(10))}"
    return TIME_RE.sub(lambda _: time_paragraph(lesson_id, times, sets_threads), source, count=1)


def apply(nb, lesson_id: str, times: dict, repo: str = COURSE_REPO):
    """Rewrite the intro and setup cells of one solution notebook in place for the course
    repository ``repo``; returns ``nb``."""
    intro = nb.cells[0]
    if intro.cell_type != "markdown":
        raise ValueError(f"{lesson_id}: the first cell must be the markdown introduction.")
    intro.id = INTRO_ID
    sets_threads = any(SET_THREADS_RE.search(c.source) for c in nb.cells if c.cell_type == "code")
    intro.source = rewrite_intro(intro.source, lesson_id, times, sets_threads, repo)
    setup = [c for c in nb.cells if c.get("id") == SETUP_ID]
    if not setup:
        raise ValueError(f"{lesson_id}: no setup cell found (id '{SETUP_ID}').")
    if nb.cells.index(setup[0]) != 1:
        raise ValueError(f"{lesson_id}: the cell '{SETUP_ID}' must be the second cell.")
    cell = nb.cells[1]
    cell.source = setup_source(repo)
    cell.metadata = {k: v for k, v in cell.metadata.items() if k != "nbgrader"}
    cell.outputs, cell.execution_count = [], None
    return nb


def readme_table(repo: str = COURSE_REPO) -> str:
    """The README's lesson table (between <!-- lessons --> markers): one Colab link per lesson."""
    rows = ["| Lesson | Open locally | Open in Colab |", "|---|---|---|"]
    for lesson in LESSONS.values():
        path = f"lessons/{lesson.id}/{lesson.id}.ipynb"
        rows.append(f"| {lesson.id[:2]} {lesson.title} | [`{path}`]({path}) | {badge(lesson.id, repo)} |")
    return "\n".join(rows)


def rewrite_readme(text: str, repo: str = COURSE_REPO) -> str:
    start, end = "<!-- lessons -->", "<!-- /lessons -->"
    if start not in text or end not in text:
        raise ValueError(f"README.md has no '{start}' ... '{end}' block for the lesson table.")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{readme_table(repo)}\n{end}{tail}"


def load_times() -> dict:
    return json.loads(TIMES.read_text()) if TIMES.is_file() else {}


def run(check: bool, ids=(), repo: str = COURSE_REPO, root: Path = ROOT) -> int:
    """Rewrite (or with ``check`` only compare) the solution notebooks (``ids``, default all)
    and the README table of the course at ``root`` for the repository ``repo``; returns 1 when
    ``check`` finds a difference, else 0.

    Raises SystemExit for an unknown id, FileNotFoundError when a lesson of
    autograder/course.py has no solution notebook, ValueError when solutions/ holds a lesson
    that autograder/course.py does not list.
    """
    times, changed, root = load_times(), [], Path(root)
    unknown = set(ids) - set(LESSONS)
    if unknown:
        raise SystemExit(f"unknown lesson ids {sorted(unknown)}; known: {list(LESSONS)}")
    stray = sorted(p.name for p in (root / "solutions").iterdir()
                   if p.is_dir() and any(p.glob("*.ipynb")) and p.name not in LESSONS)
    if stray:
        raise ValueError(f"solutions/ holds {stray}, which autograder/course.py does not list: add a "
                         "Lesson there (id, title, minutes) so that badges, times and tools know it.")
    for lesson_id in ids or LESSONS:
        path = root / "solutions" / lesson_id / f"{lesson_id}.ipynb"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing; LESSONS in autograder/course.py lists it.")
        old = path.read_text()
        nb = apply(nbformat.read(path, as_version=4), lesson_id, times, repo)
        new = nbformat.writes(nb) + "\n"
        if new != old:
            changed.append(path)
            if not check:
                path.write_text(new)
    readme = root / "README.md"
    old = readme.read_text()
    new = rewrite_readme(old, repo)
    if new != old:
        changed.append(readme)
        if not check:
            readme.write_text(new)
    for path in changed:
        print(("differs: " if check else "rewrote: ") + str(path.relative_to(root)))
    if changed and check:
        print("scripts/lesson_cells.py would rewrite these: run `make lessons` (or the script, then "
              "`python -m autograder build` and `demo`).")
    if changed and not check:
        print("Now run `python -m autograder build` (and `demo`) so that lessons/ follows, or `make lessons`.")
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
    from mlexp.check import output_widgets_read_only

    with temporary_environ(NBGRADER_EXECUTION=None):
        for lesson_id in ids or LESSONS:
            path = ROOT / "solutions" / lesson_id / f"{lesson_id}.ipynb"
            nb = nbformat.read(path, as_version=4)
            client = output_widgets_read_only(NotebookClient(nb, timeout=3600, kernel_name="python3",
                                                             resources={"metadata": {"path": str(path.parent)}}))
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
