"""Tests for mlexp.seeds: RESULT-line parsing, mean +- sd, the markdown round trip, seed injection."""
import math
import statistics
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from mlexp import seeds
from mlexp.seeds import aggregate, format_markdown, parse_markdown, parse_result_line, result_lines, set_seed


def test_parse_numbers_units_and_labels():
    r = parse_result_line("RESULT lm model=conv val_loss=1.712 params=204,992 ratio=781x share=12.5% seed=3")
    assert r.label == "lm model=conv"
    assert r.numbers == {"val_loss": 1.712, "params": 204992.0, "ratio": 781.0, "share": 12.5}
    assert r.decimals == {"val_loss": 3, "params": 0, "ratio": 0, "share": 1}
    assert r.units["ratio"] == "x" and r.units["share"] == "%"
    assert "seed" not in r.numbers                              # the echoed seed is not a result


def test_parse_words_lists_and_non_results():
    r = parse_result_line("RESULT mqar linear d=16 acc=0.81")
    assert r.label == "mqar linear" and r.numbers == {"d": 16.0, "acc": 0.81}
    r = parse_result_line("RESULT attention_layers jamba=[4, 12, 20, 28] count=12")
    assert r.label == "attention_layers jamba=[4, 12, 20, 28]" and r.numbers == {"count": 12.0}
    r = parse_result_line("RESULT tiny err=1.5e-07")
    assert r.numbers["err"] == pytest.approx(1.5e-07)
    assert parse_result_line("RESULTS are in") is None
    assert parse_result_line("the RESULT x=1") is None
    assert [x.label for x in result_lines("noise\nRESULT a x=1\n  RESULT b y=2\nmore")] == ["a", "b"]


def test_aggregate_mean_and_sample_sd():
    runs = {s: result_lines(f"RESULT lm model=conv val_loss={v}\nRESULT lm model=lstm val_loss={w}")
            for s, v, w in [(0, "1.700", "1.80"), (1, "1.730", "1.81"), (2, "1.715", "1.79")]}
    rows = aggregate(runs)
    assert [(r["result"], r["number"]) for r in rows] == [("lm model=conv", "val_loss"), ("lm model=lstm", "val_loss")]
    conv = rows[0]
    assert conv["values"] == [1.7, 1.73, 1.715] and conv["n"] == 3
    assert conv["mean"] == pytest.approx(statistics.mean([1.7, 1.73, 1.715]))
    assert conv["sd"] == pytest.approx(statistics.stdev([1.7, 1.73, 1.715]))   # n - 1 in the denominator
    assert conv["sd"] != pytest.approx(statistics.pstdev([1.7, 1.73, 1.715]))


def test_aggregate_keeps_repeated_lines_apart_and_handles_one_run():
    text = "RESULT mqar linear d=16 acc={}\nRESULT mqar linear d=32 acc={}"
    rows = aggregate({0: result_lines(text.format(0.5, 0.9)), 1: result_lines(text.format(0.7, 1.0))})
    acc = {(r["result"], r["number"]): r for r in rows}
    assert acc[("mqar linear #1", "acc")]["values"] == [0.5, 0.7]
    assert acc[("mqar linear #2", "acc")]["values"] == [0.9, 1.0]
    single = aggregate({None: result_lines("RESULT x a=2")})
    assert single[0]["sd"] is None and single[0]["mean"] == 2


def test_markdown_round_trip():
    runs = {s: result_lines(f"RESULT lm model=conv val_loss={v} params=204,992")
            for s, v in [(0, "1.708"), (1, "1.722"), (2, "1.736")]}
    text = format_markdown({"00_token_mixing": aggregate(runs)}, [0, 1, 2])
    assert "| lm model=conv | val_loss | 1.708 | 1.7220 | 0.0140 | 3 | 1.708, 1.722, 1.736 |" in text
    back = parse_markdown(text)["00_token_mixing"]
    row = {(r["result"], r["number"]): r for r in back}
    loss = row[("lm model=conv", "val_loss")]
    assert loss["seed0"] == 1.708 and loss["mean"] == pytest.approx(1.722) and loss["sd"] == pytest.approx(0.014)
    assert loss["values"] == [1.708, 1.722, 1.736]
    assert row[("lm model=conv", "params")]["values"] == [204992.0] * 3


def test_set_seed_rewrites_only_the_seed_line():
    nb = new_notebook(cells=[new_markdown_cell("SEED = 0 in prose is not code"),
                             new_code_cell("import torch\nSEED = 0   # comment kept\nSEEDS = 5\nx = SEED")])
    assert set_seed(nb, 7)
    assert nb.cells[0].source == "SEED = 0 in prose is not code"
    assert nb.cells[1].source == "import torch\nSEED = 7   # comment kept\nSEEDS = 5\nx = SEED"
    assert not set_seed(new_notebook(cells=[new_code_cell("seed = 0")]), 1)


@pytest.mark.slow
def test_run_notebook_shifts_the_seed_and_collects_results(tmp_path):
    """A tiny fake lesson, run twice by the command: the seed really reaches the kernel."""
    lesson = tmp_path / "solutions" / "99_fake"
    lesson.mkdir(parents=True)
    (lesson / "data.txt").write_text("3")                      # files next to the notebook are copied
    nb = new_notebook(cells=[new_code_cell("SEED = 0\nimport mlexp"),
                             new_code_cell("k = int(open('data.txt').read())\n"
                                           "print(f'RESULT fake value={SEED * k + 1} grading={int(mlexp.is_grading())}')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, lesson / "99_fake.ipynb")
    out = tmp_path / "table.md"
    from autograder.publishing import seeds as runner
    code = runner.main(["99", "--seeds", "0", "2", "--course", str(tmp_path), "--out", str(out), "--no-progress"])
    assert code == 0
    row = {(r["result"], r["number"]): r for r in parse_markdown(out.read_text())["99_fake"]}
    assert row[("fake", "value")]["values"] == [1, 7]
    assert row[("fake", "value")]["sd"] == pytest.approx(math.sqrt(18), abs=0.05)   # printed with 1 decimal
    assert row[("fake", "grading")]["values"] == [0, 0]       # full size unless --grading


def test_parse_keys_with_a_slash():
    """Ratios printed as ``a/b=21.4x`` (lesson 01) are results too, not dropped."""
    r = parse_result_line("RESULT forms_time_ms T=2048 chunk=8.67 recurrent/chunk=21.4x")
    assert r.numbers == {"T": 2048.0, "chunk": 8.67, "recurrent/chunk": 21.4}
    assert r.units["recurrent/chunk"] == "x"


def test_the_old_command_points_at_the_runner_and_the_library_never_imports_the_grader(capsys):
    """`python -m mlexp.seeds` says where the runner is (autograder.publishing.seeds) and runs nothing; no
    module of mlexp imports autograder (the student edition has no grader)."""
    import ast
    from autograder.publishing import seeds as runner
    assert seeds.main(["06_recall_per_byte", "--seeds", "0", "1"]) == 2
    err = capsys.readouterr().err
    assert "python -m autograder seeds 06_recall_per_byte --seeds 0 1" in err
    assert not hasattr(seeds, "run_notebook") and callable(runner.run_notebook)
    for path in sorted(Path(seeds.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "autograder" or n.startswith("autograder.") for n in names), \
                f"{path} imports {names}"

# ------------------------------------------------- the student's seed table holds no answers
REPO = Path(__file__).resolve().parent.parent


def _solution_cell(source):
    cell = new_code_cell(source)
    cell.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "ex", "locked": False}
    return cell


def test_answer_results_are_printed_by_a_solution_cell_or_from_an_answer():
    from autograder.publishing.seeds import answer_results
    nb = new_notebook(cells=[
        new_code_cell("SEED = 0\nT = 8\nprint(f'RESULT setup T={T}')"),
        _solution_cell("def reach(L, k):\n    return 1 + L * (k - 1)\nT = 8\nans = reach(2, 4)\n"
                       "print(f'RESULT own ans={ans}')"),
        new_code_cell("print(f'RESULT from_answer r={reach(4, 4)}')\nprint(f'RESULT same_cell x={T}')"),
        new_code_cell("print(f'RESULT uses_shared_name t={T}')"),   # T is defined outside too
        new_markdown_cell("RESULT in prose is not a line"),
    ])
    assert answer_results(nb) == ["own", "from_answer", "same_cell"]


def test_student_table_drops_answer_rows_and_says_so():
    from autograder.publishing.seeds import student_table
    table = format_markdown({"L": aggregate({0: result_lines("RESULT kept a=1\nRESULT ans b=2")})}, [0])
    out = student_table(table, ["ans"])
    assert "| kept | a |" in out and "| ans |" not in out and "left out of this copy" in out and "(ans)" in out
    assert parse_markdown(out)["L"] == [r for r in parse_markdown(table)["L"] if r["result"] != "ans"]
    assert student_table(table, ["absent"]) == table


@pytest.mark.parametrize("lesson", sorted(p.parent.name for p in (REPO / "solutions").glob("*/seeds.md")))
def test_released_seed_table_holds_no_answer_rows(lesson):
    """lessons/<id>/seeds.md (the student's, also inside the course file) is the instructor's table
    without the rows computed from exercise answers, and with every other row."""
    from autograder.publishing.seeds import answer_results
    hidden = {n for nb in (REPO / "solutions" / lesson).glob("*.ipynb") for n in answer_results(nbformat.read(nb, 4))}
    full = parse_markdown((REPO / "solutions" / lesson / "seeds.md").read_text())
    student = parse_markdown((REPO / "lessons" / lesson / "seeds.md").read_text())
    name = lambda r: r["result"].split()[0]
    assert all(name(r) not in hidden for rows in student.values() for r in rows)
    assert student == {k: [r for r in rows if name(r) not in hidden] for k, rows in full.items()}
    known = {"00_token_mixing": {"kv_per_token_exercise", "conv_reach"}, "05_inattention": {"attention_pairs"},
             "03_gates_and_delta_rule": {"retnet_decay"}}   # the leaks an instructor found
    assert known.get(lesson, set()) <= hidden
