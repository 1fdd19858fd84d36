"""A student function called from a test, through the real harness and a sandboxed kernel.

Issue 25, item 1: a function that changes its tensor arguments in place used to have the change
copied back into the test's own tensors, so a test that computes its expected value after the
call could be forged (lesson 02's write with the factor-two slip that also doubles k). The
arguments the kernel gets are its copies: a change fails the call with a hint naming the
parameter, and never reaches the test's tensors.
"""
import nbformat
import pytest

from autograder.options import GradingOptions
from autograder.sandbox import run_submission
from toy_course import _solution, _test

STUDENT = '''import torch

def write_ok(S, k, v):
    return S + torch.outer(k, v)

def write_forged(S, k, v):      # the factor-two slip, hidden by doubling the test's k
    k.mul_(2)
    return S + torch.outer(k, v)

def write_through_view(S, k, v):  # the same through a view of k
    k.view(-1)[:] = 2 * k
    return S + torch.outer(k, v)

def write_in_place(S, k, v):    # correct value, but S changed
    S += torch.outer(k, v)
    return S.clone()
'''

TEST = '''import torch
S, k, v = torch.ones(3, 3), torch.tensor([1., 2., 3.]), torch.tensor([1., 0., -1.])
got = {name}(S, k, v)
assert torch.allclose(got, S + torch.outer(k, v)), "Hint: the state gains k v^T once"
'''


@pytest.mark.slow
def test_arguments_changed_in_place_fail_and_never_reach_the_test(tmp_path):
    names = ["write_ok", "write_forged", "write_through_view", "write_in_place"]
    cells = [_solution("answer", STUDENT)] + [_test(f"test_{n}", 1, TEST.format(name=n)) for n in names]
    nb = nbformat.v4.new_notebook(cells=cells)
    executed, report = run_submission(nb, tmp_path, GradingOptions(cell_timeout=60))
    errors = {c.metadata["nbgrader"]["grade_id"]: [o for o in c.outputs if o.get("output_type") == "error"]
              for c in executed.cells[1:]}
    assert errors["test_write_ok"] == [], errors
    for name, param in (("write_forged", "k"), ("write_through_view", "k"), ("write_in_place", "S")):
        [err] = errors[f"test_{name}"]
        assert err["ename"] == "AssertionError", err
        assert f"{name} changed {param} in place" in err["evalue"], err
    assert report["tampered"] == [] and not report["kernel"], report
