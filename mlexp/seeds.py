"""Seed tables: the RESULT lines lessons print, their mean +- sd over seeds, and the markdown table.

This module is the library side that lessons import (``parse_markdown`` reads a committed
``seeds.md``). The tool that re-runs lesson notebooks with shifted seeds lives on the command-line
side, in ``autograder.publishing.seeds``; from the course checkout::

    python -m autograder seeds 00_token_mixing --seeds 0 1 2 --out solutions/00_token_mixing/seeds.md

``python -m mlexp.seeds`` only says so: the library never imports the grader.

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

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ResultLine", "parse_result_line", "result_lines", "set_seed", "find_seed_line",
           "aggregate", "format_markdown", "parse_markdown", "find_table", "TABLES_IN_PACKAGE", "main"]

SEED_LINE = re.compile(r"^SEED\s*=\s*-?\d+\b", re.MULTILINE)   # the one line a seed run rewrites
_FIELD = re.compile(r"([A-Za-z_][\w.\-/]*)=(.*?)(?=\s+[A-Za-z_][\w.\-/]*=|\s*$)")
_NUMBER = re.compile(r"^([-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)(.*)$")
SKIP_KEYS = {"seed"}                                  # echoes of the seed itself are not results
# Inside the course file (the wheel of `python -m autograder build --colab`), each lesson's
# seeds.md travels as mlexp/<TABLES_IN_PACKAGE>/<lesson>.md.
TABLES_IN_PACKAGE = "seed_tables"


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
           "from `python -m autograder seeds`.", ""]
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


def find_table(lesson: str, name: str = "seeds.md"):
    """Where a lesson's committed seed table is, or None when there is none to read.

    Looks, in order: next to the running notebook (the current folder: a course checkout, the
    grader's copy of the lesson folder, or a file uploaded next to the notebook); in the course
    file installed on Colab (``mlexp/seed_tables/<lesson>.md``); in ``lessons/<lesson>/`` of the
    course folder this ``mlexp`` was imported from. Returns a ``pathlib.Path``. The course file
    carries only seeds.md, so another ``name`` (lesson 06's ``lr_sweep.json``) is never answered
    with the packaged seed table: only the current folder and the course folder are searched.
    """
    here = Path(__file__).resolve().parent
    packaged = [here / TABLES_IN_PACKAGE / f"{lesson}.md"] if name == "seeds.md" else []
    for path in (Path.cwd() / name, *packaged, here.parent / "lessons" / lesson / name):
        if path.is_file():
            return path
    return None


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


def main(argv=None) -> int:
    """``python -m mlexp.seeds ...``: a pointer to the seed runner, ``python -m autograder seeds``.

    The runner re-executes the instructor's solution notebooks, so it lives with the grader (the
    package mlexp-autograder) in the course's instructor repository; the student library only
    reads the tables it writes, and never imports the grader. Returns 2 after saying so.
    """
    args = " ".join(sys.argv[1:] if argv is None else argv)
    print("The seed runner is part of the grader: from the course's instructor repository run\n"
          f"    python -m autograder seeds {args}".rstrip() + "\n"
          "(same arguments). This library only reads the seed tables it writes "
          "(mlexp.seeds.find_table).", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
