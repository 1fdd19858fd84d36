"""`seeds`: re-run lesson notebooks with SEED shifted, collect their RESULT lines, tabulate mean +- sd.

From the course checkout (``python -m mlexp.seeds`` only points here)::

    python -m autograder seeds 00_token_mixing --seeds 0 1 2 --out solutions/00_token_mixing/seeds.md
    python -m autograder seeds --all --seeds 0 1 2 --jobs 2

How the seed travels: each lesson sets its seed in one line of a code cell, ``SEED = 0``, and
seeds every experiment from that name. For seed s this tool rewrites that line to ``SEED = s`` in
a copy of the solution notebook and executes the copy (nbclient) in a copy of the lesson folder;
nothing in the library is patched. A lesson without a ``SEED = <int>`` line has nothing to shift:
it is run once and its numbers are tabulated without a spread. What is collected and how it is
tabulated (RESULT lines, mean and sample sd, the markdown table lessons read) is ``mlexp.seeds``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from mlexp.check import output_widgets_read_only

from mlexp.seeds import aggregate, find_seed_line, format_markdown, result_lines, set_seed

from autograder.config import KERNEL_ARGS
from autograder.course import find_course_root, lesson_notebook
from autograder.cells import defined_names, is_solution, read_names

__all__ = ["run_notebook", "run_lessons", "add_arguments", "run", "main"]


def run_notebook(path, seed: int | None, grading: bool = False, timeout: int = 1800) -> str:
    """Execute a copy of notebook ``path`` (in a copy of its folder) with SEED = ``seed``.

    seed None runs it as it is. grading=True sets NBGRADER_EXECUTION=validate (token-sized
    experiments, for a quick check); otherwise the variable is removed (full size). Returns all
    text the notebook printed (stdout streams), joined. Raises nbclient's CellExecutionError when
    a cell fails, ValueError when a seed is given for a notebook without a SEED line.
    """
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    if seed is not None and not set_seed(nb, seed):
        raise ValueError(f"{path} has no `SEED = <int>` line in a code cell, so its seed cannot be "
                         "shifted; add one and seed every experiment from SEED.")
    env = {k: v for k, v in os.environ.items() if k != "NBGRADER_EXECUTION"}
    if grading:
        env["NBGRADER_EXECUTION"] = "validate"
    with tempfile.TemporaryDirectory(prefix="mlexp-seeds-") as tmp:
        folder = Path(shutil.copytree(path.parent, Path(tmp) / path.parent.name))
        client = output_widgets_read_only(NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                                         extra_arguments=list(KERNEL_ARGS),
                                                         resources={"metadata": {"path": str(folder)}}))
        client.execute(env=env)
    return "\n".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                     for out in cell.get("outputs", []) if out.get("output_type") == "stream"
                     and out.get("name") == "stdout")


def _job(path, seed, grading, timeout):
    try:
        return seed, run_notebook(path, seed, grading, timeout), None
    except Exception as exc:                     # reported, and the other runs go on
        return seed, "", f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"


def run_lessons(root, lessons, seeds, jobs=1, grading=False, timeout=1800, progress=True):
    """Run every lesson at every seed; returns ({lesson: rows}, [error messages]).

    Lessons without a SEED line run once (the first seed's row then has n = 1).
    """
    from tqdm.auto import tqdm

    root = Path(root)
    plan = []
    for lesson in lessons:
        path = lesson_notebook(root, lesson)
        seeded = any(c.cell_type == "code" and find_seed_line(c.source)
                     for c in nbformat.read(path, as_version=4).cells)
        plan += [(path, s if seeded else None) for s in (seeds if seeded else seeds[:1])]
    outputs, errors = {}, []
    bar = tqdm(total=len(plan), desc="seed runs", disable=not progress)
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(_job, p, s, grading, timeout): p for p, s in plan}
        for fut in as_completed(futures):
            path = futures[fut]
            seed, text, error = fut.result()
            if error:
                errors.append(f"{path.parent.name} seed {seed}: {error}")
            else:
                outputs.setdefault(path.parent.name, {})[seed] = result_lines(text)
            bar.update(1)
    bar.close()
    tables = {}
    for path, _ in plan:
        lesson = path.parent.name
        if lesson in outputs and lesson not in tables:
            ordered = {s: outputs[lesson][s] for s in [*seeds, None] if s in outputs[lesson]}
            tables[lesson] = aggregate(ordered)
    return tables, errors


def add_arguments(p: argparse.ArgumentParser, course: bool = True) -> None:
    """The seed runner's arguments (``python -m autograder seeds`` and ``python -m autograder seeds``);
    ``course=False`` leaves out ``--course`` (``python -m autograder --course PATH seeds`` has it)."""
    p.add_argument("lessons", nargs="*", help="lesson ids or unique prefixes, e.g. 00_token_mixing or 00")
    p.add_argument("--all", action="store_true", help="every lesson whose solution prints RESULT lines")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds to run (default 0 1 2)")
    p.add_argument("--out", metavar="FILE", help="also write the markdown table to FILE")
    p.add_argument("--jobs", type=int, default=1, help="notebooks run at the same time (default 1)")
    p.add_argument("--grading", action="store_true",
                   help="run experiments at grading size (NBGRADER_EXECUTION=validate): a quick check")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per cell (default 1800)")
    if course:
        p.add_argument("--course", metavar="PATH", help="course checkout (default: here)")
    p.add_argument("--no-progress", action="store_true")


def run(args, error=None) -> int:
    """Run the seed runs that parsed arguments ``args`` ask for; print (and write) the table.

    Returns 1 when a run failed (each failure printed on stderr), else 0. ``error(message)``
    reports a usage error (argparse's ``parser.error``).
    """
    root = find_course_root(args.course)
    lessons = list(args.lessons)
    if args.all:
        lessons += [d.name for d in sorted((root / "solutions").iterdir())
                    if d.is_dir() and any("RESULT" in nb.read_text() for nb in d.glob("*.ipynb"))
                    and d.name not in lessons]
    if not lessons:
        (error or _usage_error)("name at least one lesson, or pass --all")
    tables, errors = run_lessons(root, lessons, args.seeds, args.jobs, args.grading, args.timeout,
                                 progress=not args.no_progress)
    text = format_markdown(tables, args.seeds)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    for e in errors:
        print(f"FAILED {e}", file=sys.stderr)
    return 1 if errors else 0


def _usage_error(message):
    raise SystemExit(f"error: {message}")


def main(argv=None, prog="python -m autograder seeds") -> int:
    """The command line: parse ``argv`` and run; returns the exit code."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv), p.error)


# ----------------------------------------------------------------------- the student's copy
STUDENT_NOTE = ("Rows whose numbers are computed from the lesson's exercise answers ({names}) are left out "
                "of this copy: your own run of the lesson prints them.")


def answer_results(nb) -> list:
    """The RESULT names (``RESULT <name> ...``) of solution notebook ``nb`` whose numbers come
    from an exercise's answer, in notebook order: those printed by a solution cell (nbgrader
    ``solution: true``), and those printed by a cell that reads a name only a solution cell
    defines (the student's function or value, e.g. ``conv_reach``), or that cannot be parsed
    (autograder.cells.read_names, as the book judges its pages). A seed table shows the
    reference run, so these rows would show the answers; :func:`student_table` leaves them out.
    """
    import re
    code = [c for c in nb.cells if c.cell_type == "code"]
    answers = set().union(*(defined_names(c.source) for c in code if is_solution(c))) - \
        set().union(*(defined_names(c.source) for c in code if not is_solution(c)))
    found = []
    for cell in code:
        names = re.findall(r"RESULT (\w+)", cell.source)
        read = read_names(cell.source)
        if names and (is_solution(cell) or read is None or read & answers):
            found += [n for n in names if n not in found]
    return found


def student_table(text: str, hidden) -> str:
    """Seed table ``text`` (``format_markdown``'s markdown) without the rows of the RESULT names
    in ``hidden``, with a line that says which were left out; unchanged when none are in it."""
    hidden = set(hidden)
    kept, dropped = [], []
    for line in text.splitlines(keepends=True):
        cells = line.split("|")
        name = cells[1].split()[0] if line.startswith("| ") and len(cells) > 2 and cells[1].split() else None
        if name in hidden:
            dropped += [name] if name not in dropped else []
            continue
        kept.append(line)
    if not dropped:
        return text
    first_table = next((i for i, line in enumerate(kept) if line.startswith("## ")), len(kept))
    kept.insert(first_table, STUDENT_NOTE.format(names=", ".join(dropped)) + "\n\n")
    return "".join(kept)
