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
import re
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from autograder.options import GradingOptions
from autograder.engine.sandbox import run_submission
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


# Issue 39, item 3: the report is asked after each test (a change undone by a later cell still
# counts), covers the library's classes, and any change to what carries it out of the kernel.
UNDONE_LATER = ("import math\n_real = math.sqrt\nmath.sqrt = lambda x: 1.0\n")
CLASS_SWAP = ("import mlexp.rules\nclass _Quiet(mlexp.rules.Trace):\n    pass\nmlexp.rules.Trace = _Quiet\n")
PUBLISHER = ("ip = get_ipython()\n_publish = ip.display_pub.publish\n"
             "ip.display_pub.publish = lambda *a, **k: _publish(*a, **k)\n")


@pytest.mark.slow
def test_changes_undone_after_the_tests_and_to_the_channel_are_flagged(tmp_path):
    cells = [nbformat.v4.new_code_cell(UNDONE_LATER + CLASS_SWAP + PUBLISHER),
             _test("test_sqrt", 1, "import math\nassert math.sqrt(4) == 2"),
             nbformat.v4.new_code_cell("math.sqrt = _real\nmlexp.rules.Trace = _Quiet.__bases__[0]\n"
                                       "ip.display_pub.publish = _publish")]
    executed, report = run_submission(nbformat.v4.new_notebook(cells=cells), tmp_path,
                                      GradingOptions(cell_timeout=60))
    assert not report["kernel"], report
    for name in ("math.sqrt", "mlexp.rules.Trace", "IPython display publisher"):
        assert name in report["tampered"], report
    assert "proves a change, not its effect" in " ".join(__import__("autograder.engine.protocol", fromlist=["Report"])
                                                         .Report.from_dict(report).reasons())


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


# A display's metadata is kept in the notebook too, so the caps count it: 48 one-character displays
# with 1 MiB of metadata each (and an update that grows one display's metadata) stay within the caps.
METADATA_DISPLAYS = ("from IPython.display import display, update_display\n"
                     "for i in range(48):\n"
                     "    display({'text/plain': 'x'}, metadata={'m': 'm' * 2**20}, raw=True)\n")
METADATA_UPDATE = ("display({'text/plain': 'a'}, raw=True, display_id='d')\n"
                   "update_display({'text/plain': 'a'}, metadata={'m': 'u' * 2**20}, raw=True, display_id='d')\n")


@pytest.mark.slow
def test_display_metadata_counts_against_the_output_caps(tmp_path):
    from autograder.engine.harness import run_notebook
    cells = [nbformat.v4.new_code_cell(METADATA_DISPLAYS),
             nbformat.v4.new_code_cell("from IPython.display import display, update_display\n" + METADATA_UPDATE)]
    (tmp_path / "job").mkdir()
    executed, report = run_notebook(nbformat.v4.new_notebook(cells=cells), job_dir=tmp_path / "job",
                                    options=GradingOptions(cell_timeout=60, cell_output_kb=64, notebook_output_kb=256),
                                    sandbox=False, cwd=tmp_path)
    assert not report["kernel"], report
    size = len(nbformat.writes(executed))
    assert size < 300_000, size                       # uncapped: 48 MiB of metadata, then 1 MiB more
    assert "output capped" in str(executed.cells[0].outputs) and "output capped" in str(executed.cells[1].outputs)
    assert executed.cells[1].outputs[0]["data"]["text/plain"] == "a"   # the display stands, its update dropped


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


# Output still arriving after a cell's reply (a loop flushing thousands of small prints).
# 300 separate stream messages (each print is its own flush, 3 ms apart), then a last line
PRINTS = "import time\nfor i in range(300):\n    print(i, flush=True)\n    time.sleep(0.003)\nprint('done')"


@pytest.mark.slow
def test_output_still_arriving_when_the_wait_ends_is_said_lost(tmp_path, monkeypatch):
    """With the wait after a cell's reply cut to 1 s and the client taking 20 ms per output message
    (a grader on a busy machine), the cell's output is still arriving when the wait ends: the cell
    ends with an "[output lost" line and the report's notes name the cell. (The default wait,
    OUTPUT_WAIT_S, is what keeps the tail of such a loop, final print included.) The messages are
    few enough that no ZMQ queue on the way drops any, so what is lost is decided by the wait."""
    from autograder.engine import notebook_client
    from autograder.engine.harness import run_notebook
    monkeypatch.setattr(notebook_client, "OUTPUT_WAIT_S", 1)
    output = notebook_client.HarnessClient.output

    def slow_output(self, outs, msg, display_id, cell_index):
        time.sleep(0.02)
        return output(self, outs, msg, display_id, cell_index)
    monkeypatch.setattr(notebook_client.HarnessClient, "output", slow_output)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(PRINTS),
                                         nbformat.v4.new_code_cell("print('next cell')")])
    (tmp_path / "job").mkdir()
    executed, report = run_notebook(nb, options=GradingOptions(cell_timeout=60), job_dir=tmp_path / "job",
                                    sandbox=False, cwd=tmp_path)
    first = "".join(o.get("text", "") for o in executed.cells[0].outputs)
    assert not report["kernel"], report
    assert first.startswith("0\n1\n")
    assert "[output lost" in first and "done" not in first.split("[output lost")[0], first[-300:]
    [note] = report["notes"]
    assert re.fullmatch(r"output lost in cell\(s\) 1(, 2)?: still arriving 1 s after the cell finished", note), note
    second = "".join(o.get("text", "") for o in executed.cells[1].outputs)   # behind the first's tail
    assert ("[output lost" in second) if ", 2" in note else ("next cell" in second), second


@pytest.mark.slow
def test_a_progress_bar_shows_its_last_state(tmp_path):
    """tqdm's notebook bar is a widget; a feedback page runs no script and shows the view's text,
    which was the bar as first displayed ("0/5") until the harness wrote in the widget's last state."""
    pytest.importorskip("ipywidgets")
    from autograder.engine.harness import run_notebook
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from tqdm.auto import tqdm\nfor i in tqdm(range(5), desc='epochs'):\n    pass")])
    (tmp_path / "job").mkdir()
    executed, report = run_notebook(nb, options=GradingOptions(cell_timeout=60), job_dir=tmp_path / "job",
                                    sandbox=False, cwd=tmp_path)
    [view] = [o for o in executed.cells[0].outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    text = view["data"]["text/plain"]
    assert text.startswith("epochs: 100%|██████████| 5/5 [") and "0/5" not in text, text


def test_widget_text_draws_what_it_can_and_declines_the_rest():
    from autograder.engine.notebook_client import widget_text
    states = {"box": {"_model_name": "HBoxModel", "children": ["IPY_MODEL_l", "IPY_MODEL_p", "IPY_MODEL_r"]},
              "l": {"_model_name": "HTMLModel", "value": "<b>loss</b>&nbsp;"},
              "p": {"_model_name": "IntProgressModel", "value": 3, "min": 0, "max": 10},
              "r": {"_model_name": "LabelModel", "value": " 3/10"},
              "s": {"_model_name": "IntSliderModel", "value": 3},
              "odd": {"_model_name": "FloatProgressModel", "value": "x"},
              "zero": {"_model_name": "FloatProgressModel", "value": 1, "max": 0}}
    assert widget_text(states, "box") == "loss |███       | 3/10"
    assert widget_text(states, "s") is None and widget_text(states, "odd") is None
    assert widget_text(states, "missing") is None and widget_text(states, "zero") == "|          |"
    states["box"]["children"].append("IPY_MODEL_s")
    assert widget_text(states, "box") is None, "a box with a part it cannot draw keeps its text"
    states["loop"] = {"_model_name": "VBoxModel", "children": ["IPY_MODEL_loop"]}
    assert widget_text(states, "loop") is None


def test_a_widget_view_text_grows_no_longer_than_its_capped_text():
    """The text written in for a widget view is cut to the text it replaces (or 200 characters),
    so views whose widgets hold long labels cannot carry output past the caps."""
    from autograder.engine.notebook_client import WIDGET_VIEW, HarnessClient
    view = nbformat.v4.new_output("display_data", data={"text/plain": "0/5",
                                                         WIDGET_VIEW: {"model_id": "m"}})
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("", outputs=[view])])
    client = HarnessClient(nb, GradingOptions())
    client.widget_state = {"m": {"_model_name": "LabelModel", "value": "x" * 100_000}}
    client.settle_widget_text(nb)
    assert nb.cells[0].outputs[0]["data"]["text/plain"] == "x" * 200


def test_kernels_graded_side_by_side_share_the_cores():
    from autograder.engine.jail.jail import shared_threads
    assert [shared_threads(j, 16) for j in (1, 2, 3, 16, 40)] == [16, 8, 5, 1, 1]
    assert shared_threads(0, 2) == shared_threads(None, 2) == 2


@pytest.mark.slow
@pytest.mark.parametrize("sandboxed", [True, False])
def test_the_kernel_runs_torch_on_its_share_of_threads(tmp_path, sandboxed):
    """--kernel-threads (grade_class sets it from -j) reaches torch in the kernel, sandboxed or
    not (1 here: torch's default is the cores, and it never starts more threads than cores)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import os, torch\nprint(torch.get_num_threads(), os.environ['OMP_NUM_THREADS'])")])
    options = GradingOptions(cell_timeout=60, kernel_threads=1)
    if sandboxed:
        executed, report = run_submission(nb, tmp_path, options)
    else:
        from autograder.engine.harness import run_notebook
        (tmp_path / "job").mkdir()
        executed, report = run_notebook(nb, options=options, job_dir=tmp_path / "job",
                                        sandbox=False, cwd=tmp_path)
    assert not report["kernel"], report
    [out] = [o for o in executed.cells[0].outputs if o.get("output_type") == "stream"]
    assert out["text"].split() == ["1", "1"], out


SLOW_STUDENT = '''import time, torch

def settle(x):          # takes far longer than the test allows, and hides the time it takes
    try:
        time.sleep(60)
    except KeyboardInterrupt:
        pass
    return x * 2

def quick(x):
    return x * 2
'''

IN_TIME = '''import torch
from mlexp import rules
x = torch.ones(3)
got = rules.in_time({name}, x, seconds=2, too_slow="Chunks bound the work.", forbid=("mlexp.ops",))
assert torch.equal(got, x * 2), "Hint: twice x"
'''


@pytest.mark.slow
def test_a_call_past_the_time_a_test_sets_is_stopped_on_the_graders_clock(tmp_path):
    """rules.in_time (issue 39): the grader keeps the time of the call, so a student function that
    runs past it fails with the rule's hint whatever it does in its kernel (here it swallows the
    interrupt and returns the right value), and the kernel goes on to the next test."""
    cells = [_solution("answer", SLOW_STUDENT), _test("test_settle", 2, IN_TIME.format(name="settle")),
             _test("test_quick", 1, IN_TIME.format(name="quick"))]
    start = time.monotonic()
    executed, report = run_submission(nbformat.v4.new_notebook(cells=cells), tmp_path,
                                      GradingOptions(cell_timeout=60))
    assert time.monotonic() - start < 50
    errors = {c.metadata["nbgrader"]["grade_id"]: [o for o in c.outputs if o.get("output_type") == "error"]
              for c in executed.cells[1:]}
    [err] = errors["test_settle"]
    assert "settle did not finish within 2 s of CPU time. Chunks bound the work." in err["evalue"], err
    assert err["evalue"].startswith("Hint: "), err
    assert errors["test_quick"] == [], errors
    assert not report["kernel"], report



# Issue 51, item 5: a reply is bound to its request. The student's function, called by a test
# through the grader's channel, answers the grader's request itself: it publishes a reply of its
# own (a value it never returns) and then either ends the cell before the kernel side answers, or
# lets the kernel side answer too. Each counts as unanswered and is reported as the channel
# touched; the honest function beside them, which prints and displays, passes.
FORGER = '''import json, sys
from IPython.display import publish_display_data

MIME = 'application/vnd.mlexp.' + 'grading+json'     # spelled so no cell names the channel


def _the_request():
    """The grader's request, read from the frames of the running request cell."""
    frame = sys._getframe(1)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if isinstance(value, str) and value.startswith('{"op"'):
                return json.loads(value)
        frame = frame.f_back
    return {}


def _forge(value):
    publish_display_data({MIME: {'value': value, 'nonce': _the_request().get('nonce', '')}})


def mean_forged_then_interrupted(xs):   # the right value forged, and no reply of the kernel side's
    _forge(3.0)
    raise KeyboardInterrupt           # (sys.exit() is the call's error, answered by the kernel side)


def mean_forged_twice(xs):         # the same with the request's nonce, then the kernel side's own reply
    _forge(3.0)
    return 0.0


def mean_exits(xs):                # no forgery: the call's error, answered by the kernel side
    sys.exit(3)


def mean_honest(xs):
    print('summing', len(xs), 'numbers')
    publish_display_data({'text/plain': 'a display of its own'})
    return sum(xs) / len(xs)
'''

MEAN_TEST = '''got = {name}([1.0, 2.0, 3.0, 6.0])
assert got == 3.0, "Hint: the mean of 1, 2, 3 and 6 is 3"
'''


@pytest.mark.slow
def test_a_reply_forged_by_the_called_function_is_never_read(tmp_path):
    names = ["mean_forged_then_interrupted", "mean_forged_twice", "mean_exits", "mean_honest"]
    cells = [_solution("answer", FORGER)] + [_test(f"test_{n}", 1, MEAN_TEST.format(name=n)) for n in names]
    executed, report = run_submission(nbformat.v4.new_notebook(cells=cells), tmp_path,
                                      GradingOptions(cell_timeout=60))
    errors = {c.metadata["nbgrader"]["grade_id"]: [o for o in c.outputs if o.get("output_type") == "error"]
              for c in executed.cells[1:]}
    assert not report["kernel"], report
    assert errors["test_mean_honest"] == [], errors
    for name, why in (("mean_forged_then_interrupted", "did not end cleanly"), ("mean_forged_twice", "2 replies")):
        assert errors[f"test_{name}"], f"{name}: the reply it forged was read as the kernel side's"
        [err] = errors[f"test_{name}"]
        assert "not answered" in err["evalue"] and why in err["evalue"] and "Hint" not in err["evalue"], err
    [err] = errors["test_mean_exits"]
    assert (err["ename"], err["evalue"]) == ("RuntimeError", "SystemExit: 3"), err
    [touched] = [t for t in report["tampered"] if t.startswith("the grader's channel was touched")]
    assert "2 replies to one request" in touched and "did not end cleanly" in touched, report


def test_feedback_shows_what_an_output_widget_printed_and_notes_interactive_figures():
    """Issue 52, item 6: an ipywidgets.Output's captured text is written in place of its view (a
    feedback page runs no script), and a cell that switches to %matplotlib notebook gets a note."""
    import nbformat
    from autograder.engine.notebook_client import HarnessClient, widget_text
    from autograder.options import GradingOptions
    states = {"o": {"_model_name": "OutputModel", "outputs": [
        {"output_type": "stream", "name": "stdout", "text": "epoch 1\n"},
        {"output_type": "display_data", "data": {"text/plain": "<Figure>"}}]}}
    assert widget_text(states, "o") == "epoch 1\n<Figure>\n"
    client = HarnessClient(nbformat.v4.new_notebook(), GradingOptions())
    for source, noted in (("%matplotlib notebook\nplt.plot([1])", True), ("  %matplotlib widget", True),
                          ("%matplotlib inline", False), ("# %matplotlib notebook would not show", False)):
        cell = nbformat.v4.new_code_cell(source)
        client.note_interactive_figures(cell)
        assert bool(cell.outputs) == noted, source
