"""The trusted harness and the sandboxed kernel, run for real on small notebooks.

Issue 25, item 1: a function that changes its tensor arguments in place used to have the change
copied back into the test's own tensors, so a test that computes its expected value after the
call could be forged (lesson 02's write with the factor-two slip that also doubles k). The
arguments the kernel gets are its copies: a change fails the call with a hint naming the
parameter, and never reaches the test's tensors.

Item 2: the harness's job folder (the restored notebook with every hidden test, job.json) was
mounted into the sandbox because the harness's working folder is on its sys.path; under the
default TMPDIR the sandbox's own /tmp happened to cover it, elsewhere it did not.
"""
import tempfile
from pathlib import Path

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


PROBE = """import os
found = []
for line in open('/proc/self/mountinfo'):   # every folder mounted, even one it may not list
    point = line.split()[4]
    for name in ('job.json', 'in.ipynb', 'harness.log'):
        try:
            with open(os.path.join(point, name)) as f:
                found.append((os.path.join(point, name), 'hidden_probe_9' in f.read()))
        except OSError:
            pass
print('FOUND' if found else 'NOTHING', found[:5])
"""


@pytest.mark.slow
@pytest.mark.parametrize("tmpdir", ["/tmp", "/var/tmp"])
def test_the_job_folder_is_never_in_the_sandbox(tmp_path, tmpdir, monkeypatch):
    base = Path(tempfile.mkdtemp(prefix="autograder-tmpdir-", dir=tmpdir))
    base.chmod(0o1777)      # as a TMPDIR is
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    cells = [nbformat.v4.new_code_cell(PROBE),
             _test("test_secret", 1, "### BEGIN HIDDEN TESTS\nassert 'hidden_probe_9'\n### END HIDDEN TESTS")]
    nb = nbformat.v4.new_notebook(cells=cells)
    try:
        executed, report = run_submission(nb, tmp_path, GradingOptions(cell_timeout=60))
        assert not report["kernel"], report
        [out] = [o for o in executed.cells[0].outputs if o.get("output_type") == "stream"]
        assert out["text"].startswith("NOTHING"), out["text"]
    finally:
        import shutil
        shutil.rmtree(base, ignore_errors=True)


# Item 5: the tamper report cannot be silenced by replacing the kernel side of the channel.
PATCH = "import math\nmath.sqrt = lambda x: 1.0\n"
SILENCE_BY_NAME = ("import sys\n"
                   "sys.modules['_autograder_wire']._tamper_report = lambda req: {'value': []}\n")
SILENCE_HIDDEN = ("import sys\n"      # found without naming it, and wrapped: only its report lies
                  "m = next(v for k, v in sys.modules.items() if k.startswith('_autograder' + '_wire'))\n"
                  "real = m.kernel_request\n"
                  "def fake(text, real=real, m=m):\n"
                  "    if 'tamper' in text:\n"
                  "        return m._publish({'value': []})\n"
                  "    return real(text)\n"
                  "m.kernel_request = fake\n")
RULES_PATCH = ("import mlexp.rules\n"     # the watcher made to under-report what a call built
               "real = mlexp.rules.watching\n"
               "def quiet(*a, real=real, **k):\n"
               "    return real(*a, **k)\n"
               "mlexp.rules.watching = quiet\n")
RULES_PATCH_CM = ("import contextlib, mlexp.rules\n"   # the same through a library's wrapper
                  "real = mlexp.rules.watching\n"
                  "@contextlib.contextmanager\n"
                  "def quiet(forbid=()):\n"
                  "    with real(forbid) as trace:\n"
                  "        yield trace\n"
                  "    trace.largest = min(trace.largest, 1000)\n"
                  "mlexp.rules.watching = quiet\n")
HONEST = ("import torch\nimport matplotlib.pyplot as plt\n"
          "plt.plot(torch.arange(3.).tolist())\nplt.show()\n")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["patch", "patch+silence by name", "patch+silence hidden", "honest"])
def test_tampering_is_flagged_even_with_the_report_silenced(tmp_path, kind):
    source = {"patch": PATCH, "patch+silence by name": PATCH + SILENCE_BY_NAME,
              "patch+silence hidden": PATCH + SILENCE_HIDDEN, "honest": HONEST}[kind]
    cells = [nbformat.v4.new_code_cell(source),
             _test("test_sqrt", 1, "import math\nassert math.sqrt(4) == 2")]
    executed, report = run_submission(nbformat.v4.new_notebook(cells=cells), tmp_path,
                                      GradingOptions(cell_timeout=60))
    assert not report["kernel"], report
    assert [o for o in executed.cells[1].outputs if o.get("output_type") == "error"] == []
    if kind == "honest":
        assert report["tampered"] == [], report
        # item 10: plt.show() sends the figure, so feedback shows the notebook as it ran
        assert any("image/png" in o.get("data", {}) for o in executed.cells[0].outputs), executed.cells[0].outputs
    else:
        assert "math.sqrt" in report["tampered"], report


# Item 4: updating a display (by its id) passes the same output caps as any output.
DISPLAYS = ("from IPython.display import display\n"
            "handles = [display({'text/plain': 'x'}, raw=True, display_id=True) for _ in range(8)]\n")
UPDATES = ("for h in handles:\n"
           "    h.update({'text/plain': 'y' * 200_000}, raw=True)\n")


@pytest.mark.slow
def test_display_updates_pass_the_output_caps(tmp_path):
    cells = [nbformat.v4.new_code_cell(DISPLAYS), nbformat.v4.new_code_cell(UPDATES),
             nbformat.v4.new_code_cell("display({'text/plain': 'z'}, raw=True, display_id='late')\n"
                                       "update_display({'text/plain': 'w' * 1000}, raw=True, display_id='late')")]
    cells[2].source = "from IPython.display import display, update_display\n" + cells[2].source
    executed, report = run_submission(nbformat.v4.new_notebook(cells=cells), tmp_path,
                                      GradingOptions(cell_timeout=60, cell_output_kb=64,
                                                     notebook_output_kb=256))
    assert not report["kernel"], report
    size = len(nbformat.writes(executed))
    assert size < 300_000, size                       # 8 x 200 kB of updates would be 1.6 MB
    assert "output capped" in str(executed.cells[1].outputs), executed.cells[1].outputs
    assert executed.cells[2].outputs[0]["data"]["text/plain"] == "w" * 1000   # small ones still apply


# Items 3 and 8: only the size-capped tmpfs are writable, and no nested user namespace.
WRITES = """import ctypes, os
result = {}
for path in ('/etc/x', '/var/tmp/x', '/dev/x', '/x', '/tmp/x', '/dev/shm/x'):
    try:
        with open(path, 'w') as f:
            f.write('x')
        result[path] = 'written'
    except OSError as exc:
        result[path] = type(exc).__name__
libc = ctypes.CDLL(None, use_errno=True)
result['userns'] = 'created' if libc.unshare(0x10000000) == 0 else 'refused'
print(result)
"""


@pytest.mark.slow
def test_only_capped_places_are_writable_and_no_nested_user_namespace(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(WRITES)])
    executed, report = run_submission(nb, tmp_path, GradingOptions(cell_timeout=60))
    assert not report["kernel"], report
    import ast
    [out] = [o for o in executed.cells[0].outputs if o.get("output_type") == "stream"]
    result = ast.literal_eval(out["text"].strip())
    assert result["/tmp/x"] == result["/dev/shm/x"] == "written", result
    for path in ("/etc/x", "/var/tmp/x", "/dev/x", "/x"):
        assert result[path] != "written", result
    assert result["userns"] == "refused", result


@pytest.mark.slow
@pytest.mark.parametrize("patch", [RULES_PATCH, RULES_PATCH_CM], ids=["function", "contextmanager"])
def test_a_replaced_rules_watcher_is_flagged(tmp_path, patch):
    """mlexp.rules measures a student's call inside the student's kernel (ops, largest tensor,
    watched functions): replacing its functions from the notebook is reported as tampering."""
    cells = [nbformat.v4.new_code_cell(patch),
             _test("test_rules", 1, "import mlexp.rules\nassert callable(mlexp.rules.watching)")]
    executed, report = run_submission(nbformat.v4.new_notebook(cells=cells), tmp_path,
                                      GradingOptions(cell_timeout=60))
    assert not report["kernel"], report
    assert "mlexp.rules.watching" in report["tampered"], report
