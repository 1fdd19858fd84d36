"""Cell metadata is read in one place: autograder.cells (and, for mlexp, which never imports the
grader, mlexp.restore's one accessor, which mlexp.check uses)."""
import re
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell

from autograder import cells

REPO = Path(__file__).resolve().parent.parent
# A read of a cell's nbgrader metadata: metadata["nbgrader"] (not an assignment),
# metadata.get("nbgrader"), .get("metadata", {}).get("nbgrader"), metadata.nbgrader.
RAW_READ = re.compile(r"""metadata(?:\[\s*["']nbgrader["']\s*\](?!\s*=[^=])|\.get\(\s*["']nbgrader["']"""
                      r"""|\.nbgrader\b)|\.get\(\s*["']metadata["'][^)]*\)\s*\.get\(\s*["']nbgrader["']""")


def _raw_reads(path: Path) -> list:
    return [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
            for n, line in enumerate(path.read_text().splitlines(), 1) if RAW_READ.search(line)]


def test_the_grader_reads_nbgrader_metadata_only_through_cells_py():
    found = [hit for path in sorted((REPO / "autograder").glob("*.py")) if path.name != "cells.py"
             for hit in _raw_reads(path)]
    assert not found, "read it through autograder.cells:\n" + "\n".join(found)


def test_mlexp_reads_it_through_its_one_accessor():
    found = [hit for path in sorted((REPO / "mlexp").rglob("*.py")) for hit in _raw_reads(path)]
    assert len(found) == 1 and "mlexp/restore.py" in found[0], found


def test_the_pattern_finds_each_way_of_reading_it():
    for line in ('m = cell.metadata["nbgrader"]', "cell.metadata.get('nbgrader', {})",
                 'cell.get("metadata", {}).get("nbgrader", {})', "c.metadata.nbgrader.get('points')",
                 'if cell.metadata["nbgrader"] == x:'):
        assert RAW_READ.search(line), line
    for line in ('cell.metadata["nbgrader"] = meta', 'cell.metadata.pop("nbgrader", None)',
                 'info = resources.get("nbgrader", {})'):
        assert not RAW_READ.search(line), line


def test_the_predicates():
    test = new_code_cell("assert True", metadata={"nbgrader": {"grade": True, "solution": False,
                                                              "grade_id": "t", "points": 2}})
    answer = new_code_cell("x = 1", metadata={"nbgrader": {"grade": False, "solution": True,
                                                           "grade_id": "a"}})
    plain, text = new_code_cell("y = 2"), new_markdown_cell("hi")
    assert [cells.is_test_cell(c) for c in (test, answer, plain, text)] == [True, False, False, False]
    assert [cells.is_solution(c) for c in (test, answer, plain, text)] == [False, True, False, False]
    assert [cells.grade_id_of(c) for c in (test, answer, plain)] == ["t", "a", None]
    assert (cells.points_of(test), cells.points_of(plain)) == (2.0, 0.0)
    assert cells.nbgrader_meta(plain) == {}
