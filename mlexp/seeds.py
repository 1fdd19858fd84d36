"""Seed runs: re-run lesson notebooks with SEED shifted, collect their RESULT lines, tabulate mean +- sd.

Command line (from the course checkout)::

    python -m mlexp.seeds 00_token_mixing --seeds 0 1 2 --out solutions/00_token_mixing/seeds.md
    python -m mlexp.seeds --all --seeds 0 1 2 --jobs 2

How the seed travels: each lesson sets its seed in one line of a code cell, ``SEED = 0``, and
seeds every experiment from that name. For seed s the tool rewrites that line to ``SEED = s`` in
a copy of the solution notebook and executes the copy (nbclient) in a copy of the lesson folder;
nothing in the library is patched. A lesson without a ``SEED = <int>`` line has nothing to shift:
it is run once and its numbers are tabulated without a spread.

What is collected: every printed line that starts with ``RESULT``, in the form
``RESULT name [words] key=value key=value ...``. Values that start with a number (``1.712``,
``204,992``, ``781x``, ``12.5%``) are numbers; the others (``model=conv``, lists, tuples) label
the line. A line is matched across seeds by its name, words, text values and its rank among the
lines sharing those (a loop printing the same line for several sizes keeps its order).
"""
from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ResultLine", "parse_result_line", "result_lines", "set_seed", "find_seed_line",
           "aggregate", "format_markdown", "parse_markdown", "run_notebook", "run_lessons", "main"]

SEED_LINE = re.compile(r"^SEED\s*=\s*-?\d+\b", re.MULTILINE)   # the one line a seed run rewrites
_FIELD = re.compile(r"([A-Za-z_][\w.\-/]*)=(.*?)(?=\s+[A-Za-z_][\w.\-/]*=|\s*$)")
_NUMBER = re.compile(r"^([-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)(.*)$")
SKIP_KEYS = {"seed"}                                  # echoes of the seed itself are not results


@dataclass
class ResultLine:
    """One parsed RESULT line: ``label`` (name, words, text fields), numbers and their printed form.

    numbers: {key: float}; decimals: {key: digits after the point as printed}; units: {key:
    what followed the number, e.g. "x" or "%"}; sci: keys printed in e-notation (1.5e-07).
    """
    label: str
    numbers: dict = field(default_factory=dict)
    decimals: dict = field(default_factory=dict)
    units: dict = field(default_factory=dict)
    sci: set = field(default_factory=set)


def parse_result_line(line: str) -> ResultLine | None:
    """Parse ``RESULT name [words] key=value ...``; returns None for a line that is not one.

    ``key=1,234.5x`` gives the number 1234.5 with unit "x" and 1 decimal; a value that does not
    start with a number (``model=conv``, ``[4, 12]``) becomes part of the label as ``key=value``.
    Keys named ``seed`` are dropped (they only echo the seed).
    """
    line = line.strip()
    if not line.startswith("RESULT "):
        return None
    body = line[len("RESULT "):].strip()
    first = _FIELD.search(body)
    head = (body if first is None else body[:first.start()]).split()
    labels, out = list(head), ResultLine("")
    for key, value in ([] if first is None else _FIELD.findall(body[first.start():])):
        value = value.strip()
        if key in SKIP_KEYS:
            continue
        m = _NUMBER.match(value)
        if m is None:
            labels.append(f"{key}={value}")
            continue
        text = m.group(1).replace(",", "")
        mantissa = re.split(r"[eE]", text)[0]
        out.numbers[key] = float(text)
        out.decimals[key] = len(mantissa.split(".")[1]) if "." in mantissa else 0
        if mantissa != text:
            out.sci.add(key)
        out.units[key] = m.group(2).strip() if len(m.group(2).strip()) <= 3 else ""
    out.label = " ".join(labels) if labels else "(unnamed)"
    return out


def result_lines(text: str) -> list:
    """Every RESULT line of ``text`` (a notebook's printed output), parsed, in order."""
    return [r for r in map(parse_result_line, text.splitlines()) if r is not None]


def _keyed(lines: list) -> dict:
    """{(label, rank among lines with that label): ResultLine}, preserving order."""
    seen, out = {}, {}
    for r in lines:
        rank = seen.get(r.label, 0)
        seen[r.label] = rank + 1
        out[(r.label, rank)] = r
    return out


def aggregate(runs: dict) -> list:
    """Mean and sample standard deviation (n - 1) per number over seed runs.

    runs: {seed: [ResultLine, ...]} for one lesson (seeds in the order given). Returns a list of
    rows {"result", "number", "values" (list, one per seed that printed it), "mean", "sd" (None
    for fewer than two values), "n", "decimals", "unit"}, in the order the lines were printed.
    A line printed by only some seeds is kept with the values it has (n says how many).
    """
    keyed = {seed: _keyed(lines) for seed, lines in runs.items()}
    order = []
    for table in keyed.values():
        order += [k for k in table if k not in order]
    rows = []
    for label, rank in order:
        numbers = []
        for table in keyed.values():
            numbers += [key for key in table.get((label, rank), ResultLine("")).numbers if key not in numbers]
        many = sum(1 for (lab, _) in order if lab == label) > 1
        for key in numbers:
            have = [table[(label, rank)] for table in keyed.values()
                    if (label, rank) in table and key in table[(label, rank)].numbers]
            values = [r.numbers[key] for r in have]
            n = len(values)
            mean = sum(values) / n
            sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
            rows.append({"result": label + (f" #{rank + 1}" if many else ""), "number": key,
                         "values": values, "mean": mean, "sd": sd, "n": n,
                         "decimals": max(r.decimals[key] for r in have), "unit": have[0].units[key],
                         "sci": any(key in r.sci for r in have)})
    return rows


def _fmt(x, decimals, unit="", sci=False):
    return f"{x:.{decimals}e}{unit}" if sci else f"{x:,.{decimals}f}{unit}"


def format_markdown(tables: dict, seeds) -> str:
    """A markdown table per lesson: {lesson: rows from ``aggregate``} -> text.

    Columns: result, number, the first seed's value, mean, sd, n and every seed's value. Means and
    sds carry one digit more than the lesson printed.
    """
    seeds = list(seeds)
    out = [f"Seed runs: mean and sample standard deviation (n - 1) over seeds {', '.join(map(str, seeds))}, "
           "from `python -m mlexp.seeds`.", ""]
    for lesson, rows in tables.items():
        out += [f"## {lesson}", "",
                f"| result | number | seed {seeds[0]} | mean | sd | n | values |",
                "|---|---|---|---|---|---|---|"]
        for r in rows:
            d, e = r["decimals"], r.get("sci", False)
            out.append("| " + " | ".join([
                r["result"], r["number"], _fmt(r["values"][0], d, r["unit"], e),
                _fmt(r["mean"], d + 1, r["unit"], e), "-" if r["sd"] is None else _fmt(r["sd"], d + 1, "", e),
                str(r["n"]), ", ".join(_fmt(v, d, "", e) for v in r["values"])]) + " |")
        out.append("")
    return "\n".join(out)


def parse_markdown(text: str) -> dict:
    """Read a table written by ``format_markdown`` back: {lesson: [{"result", "number", "seed0",
    "mean", "sd", "n", "values"}, ...]} with floats (sd None when there was a single run)."""
    def num(s):
        m = _NUMBER.match(s.strip())
        return float(m.group(1).replace(",", "")) if m else None

    tables, lesson = {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            lesson = line[3:].strip()
            tables[lesson] = []
        elif lesson and line.startswith("| ") and not line.startswith("| result") and "---" not in line:
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            result, number, first, mean, sd, n, values = cells
            tables[lesson].append({"result": result, "number": number, "seed0": num(first),
                                   "mean": num(mean), "sd": num(sd), "n": int(n),
                                   "values": [num(v) for v in re.split(r",\s(?=[-+\d.])", values)]})
    return tables


def find_seed_line(source: str):
    """The ``SEED = <int>`` line of ``source`` (a regex match), or None."""
    return SEED_LINE.search(source)


def set_seed(nb, seed: int) -> bool:
    """Rewrite the first ``SEED = <int>`` line of notebook ``nb`` (nbformat) to ``SEED = seed``.

    Returns True when a line was rewritten, False when the notebook has none (nothing to shift).
    """
    for cell in nb.cells:
        if cell.cell_type == "code" and find_seed_line(cell.source):
            cell.source = SEED_LINE.sub(f"SEED = {int(seed)}", cell.source, count=1)
            return True
    return False


def run_notebook(path, seed: int | None, grading: bool = False, timeout: int = 1800) -> str:
    """Execute a copy of notebook ``path`` (in a copy of its folder) with SEED = ``seed``.

    seed None runs it as it is. grading=True sets NBGRADER_EXECUTION=validate (token-sized
    experiments, for a quick check); otherwise the variable is removed (full size). Returns all
    text the notebook printed (stdout streams), joined. Raises nbclient's CellExecutionError when
    a cell fails, ValueError when a seed is given for a notebook without a SEED line.
    """
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError as exc:
        raise ImportError(f"seed runs execute notebooks with nbclient and nbformat ({exc.name} is missing): "
                          "install them with `pip install -e '.[grade]'`.") from exc

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
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                extra_arguments=["--IPKernelApp.log_level=ERROR"],
                                resources={"metadata": {"path": str(folder)}})
        client.execute(env=env)
    return "\n".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                     for out in cell.get("outputs", []) if out.get("output_type") == "stream"
                     and out.get("name") == "stdout")


def _job(path, seed, grading, timeout):
    try:
        return seed, run_notebook(path, seed, grading, timeout), None
    except Exception as exc:                     # reported, and the other runs go on
        return seed, "", f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"


def lesson_notebook(root: Path, lesson: str) -> Path:
    """``solutions/<id>/<id>.ipynb`` for a lesson id or a unique prefix of one ("00")."""
    ids = sorted(p.name for p in (root / "solutions").iterdir() if p.is_dir() and p.name.startswith(lesson))
    if len(ids) != 1:
        raise ValueError(f"lesson {lesson!r} matches {ids or 'nothing'} in {root / 'solutions'}; give one lesson id.")
    nbs = sorted((root / "solutions" / ids[0]).glob("*.ipynb"))
    if not nbs:
        raise FileNotFoundError(f"{root / 'solutions' / ids[0]} holds no notebook.")
    return nbs[0]


def run_lessons(root, lessons, seeds, jobs=1, grading=False, timeout=1800, progress=True):
    """Run every lesson at every seed; returns ({lesson: rows}, [error messages]).

    Lessons without a SEED line run once (the first seed's row then has n = 1).
    """
    import nbformat
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


def _course_root(course):
    for root in ([Path(course)] if course else [Path.cwd(), Path(__file__).resolve().parent.parent]):
        if (root / "solutions").is_dir():
            return root
    raise FileNotFoundError("No solutions/ folder found: run from the course checkout or pass --course PATH.")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mlexp.seeds", description=__doc__.splitlines()[0])
    p.add_argument("lessons", nargs="*", help="lesson ids or unique prefixes, e.g. 00_token_mixing or 00")
    p.add_argument("--all", action="store_true", help="every lesson whose solution prints RESULT lines")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds to run (default 0 1 2)")
    p.add_argument("--out", metavar="FILE", help="also write the markdown table to FILE")
    p.add_argument("--jobs", type=int, default=1, help="notebooks run at the same time (default 1)")
    p.add_argument("--grading", action="store_true",
                   help="run experiments at grading size (NBGRADER_EXECUTION=validate): a quick check")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per cell (default 1800)")
    p.add_argument("--course", metavar="PATH", help="course checkout (default: here)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    root = _course_root(args.course)
    lessons = list(args.lessons)
    if args.all:
        lessons += [d.name for d in sorted((root / "solutions").iterdir())
                    if d.is_dir() and any("RESULT" in nb.read_text() for nb in d.glob("*.ipynb"))
                    and d.name not in lessons]
    if not lessons:
        p.error("name at least one lesson, or pass --all")
    tables, errors = run_lessons(root, lessons, args.seeds, args.jobs, args.grading, args.timeout,
                                 progress=not args.no_progress)
    text = format_markdown(tables, args.seeds)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    for e in errors:
        print(f"FAILED {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
