"""mlexp.rules: an exercise's stated rules, watched by behaviour where the student's function runs."""
import re
import sys
from pathlib import Path

import pytest
import torch

from autograder.engine.kernel import wire
from autograder.engine.kernel.kernel_server import KernelServer
from mlexp import rules
from mlexp.ops import linear_attention as renamed


def inputs(T):
    g = torch.Generator().manual_seed(T)
    return tuple(torch.rand(1, 2, T, 4, generator=g) + 0.1 for _ in range(3))


def own(q, k, v):
    A = (q @ k.transpose(-1, -2)).tril()
    return (A @ v) / A.sum(-1, keepdim=True)


def library(q, k, v):
    return renamed(q, k, v, impl="chunk")[0]


def loop(q, k, v):
    return torch.cat([own(q[:, :, :t + 1], k[:, :, :t + 1], v[:, :, :t + 1])[:, :, -1:] for t in range(q.shape[2])], 2)


def test_own_code_passes_and_the_profile_hook_is_restored():
    before = sys.getprofile()
    out = rules.write_it_yourself(own, *inputs(6), forbid=("mlexp.ops",))
    assert torch.allclose(out, own(*inputs(6))) and sys.getprofile() is before
    assert len(rules.no_loop(own, inputs, forbid=("mlexp.ops",))) == 2


def test_a_library_entry_point_is_named_with_its_impl_whatever_it_is_imported_as():
    _, trace = rules.call(library, *inputs(5), forbid=("mlexp.ops",))
    assert trace.used == ["mlexp.ops.linear_attention(impl='chunk')"]     # its helpers are not listed
    with pytest.raises(AssertionError, match=r"^Hint: this exercise asks you to write it yourself: library called"):
        rules.write_it_yourself(library, *inputs(5), forbid=("mlexp.ops",), instead="Write it")


def test_a_loop_over_t_is_seen_from_the_count_of_torch_operations():
    with pytest.raises(AssertionError, match="without a Python loop over t"):
        rules.no_loop(loop, inputs)
    _, short = rules.call(loop, *inputs(8))
    _, long = rules.call(loop, *inputs(32))
    assert long.ops > short.ops > 0


def test_the_kernel_side_of_the_wire_watches_a_call_and_sends_the_trace_as_data():
    """What the harness gets back from a watched call (autograder.engine.harness StudentFunction._watched_call)."""
    for fn, used in ((own, []), (library, ["mlexp.ops.linear_attention(impl='chunk')"])):
        server = KernelServer(namespace=dict)
        server.refs.append(fn)
        req = {"op": "call", "ref": 0, "args": wire.encode(inputs(4)),
               "kwargs": wire.encode({}), "grad": False, "watch": ["mlexp.ops"]}
        reply = server.call(req)
        assert rules.Trace.from_dict(reply["watch"]).used == used
        assert torch.allclose(wire.decode(reply["value"]), fn(*inputs(4)), atol=1e-5)
        del req["watch"]
        assert "watch" not in server.call(req)                 # an ordinary call is not watched


def test_a_proxy_that_sends_no_trace_fails_with_a_hint():
    class Proxy:
        __name__ = "f"

        def _watched_call(self, args, kwargs, forbid):
            return None, None
    with pytest.raises(AssertionError, match="^Hint: the grader could not watch f run"):
        rules.call(Proxy(), forbid=("mlexp.ops",))


class WatchedHere:
    """A grader's proxy of a student function as mlexp.rules sees it (it has ``_watched_call``), watched in
    this process: what a kernel would send back."""

    def __init__(self, fn):
        self.fn, self.__name__ = fn, fn.__name__

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def _watched_call(self, args, kwargs, forbid, limit=None):
        with rules.watching(forbid) as trace:
            result = self.fn(*args, **kwargs)
        return result, trace.as_dict()


def test_in_grading_the_watch_decides_no_point_and_its_hint_names_a_later_failure(monkeypatch):
    """With WATCH_DECIDES off (issue 51, item 7), for a grader's proxy a finding of the watch (a loop, a size, an
    argument ignored, work out of its sight) does not fail the test: it is kept (watch_as_hints) for the message
    of a later failure. A call into a forbidden module still fails (in grading it runs where that module does not
    exist). A plain function, the student's own check, fails at the finding as before."""
    monkeypatch.setattr(rules, "WATCH_DECIDES", False)
    ignores = lambda q, k, v, C: own(q, k, v)      # noqa: E731 (chunk size ignored)
    ignores.__name__ = "ignores"
    with rules.watch_as_hints() as said:
        assert len(rules.no_loop(WatchedHere(loop), inputs)) == 2
        rules.bounded(WatchedHere(whole_square), *inputs(256), 8, limit=100, bound="100 numbers")
        rules.uses_argument(WatchedHere(ignores), (*inputs(8), 2), (*inputs(8), 4), name="C", instead="Use C")
        rules.uses_argument(WatchedHere(in_chunks), (*inputs(16), 2), (*inputs(16), 8), name="C", instead="never")
        with pytest.raises(AssertionError, match="called mlexp.ops.linear_attention"):
            rules.write_it_yourself(WatchedHere(library), *inputs(4), forbid=("mlexp.ops",))
    assert [h.split(":")[1].strip()[:30] for h in said] == ["this exercise asks you to writ"] * 2 + ["C is not used"]
    assert "loop over t" in said[0] and "100 numbers" in said[1]
    rules.no_loop(WatchedHere(loop), inputs)       # outside a graded test cell: nothing kept, nothing raised
    with pytest.raises(AssertionError, match="without a Python loop over t"):
        rules.no_loop(loop, inputs)
    with pytest.raises(AssertionError, match="^Hint: C is not used: ignores ran the same .* Use C.$"):
        rules.uses_argument(ignores, (*inputs(8), 2), (*inputs(8), 4), name="C", instead="Use C")


def test_while_the_watch_decides_a_proxys_finding_fails_the_test():
    """WATCH_DECIDES (on until item 7's cost is met): a grader's proxy fails at the watch's finding, as the student's
    own check does."""
    assert rules.WATCH_DECIDES
    with rules.watch_as_hints() as said, pytest.raises(AssertionError, match="without a Python loop over t"):
        rules.no_loop(WatchedHere(loop), inputs)
    assert said == []


def test_a_failed_graded_test_cell_gives_the_watchs_hint(monkeypatch):
    """autograder.engine.testcell: a test that fails after the watch named a slip shows that hint (the student's
    own check gives the same); one that passes is not failed by the watch (with WATCH_DECIDES off)."""
    monkeypatch.setattr(rules, "WATCH_DECIDES", False)
    from types import SimpleNamespace
    import nbformat
    from autograder.engine.dryrun import LocalLink
    from autograder.engine.testcell import run_test
    link = LocalLink({"f": loop, "__name__": "__main__"})
    options = SimpleNamespace(cell_output_kb=64, timeout=60)
    for tail, passes in (("", True), ("assert False, 'Hint: measured too slow'", False)):
        cell = nbformat.v4.new_code_cell("from mlexp import rules\nimport torch\n"
                                         "def make(T):\n    return tuple(torch.rand(1, 2, T, 4) + 0.1 for _ in range(3))\n"
                                         "rules.no_loop(f, make)\n" + tail,
                                         metadata={"nbgrader": {"grade_id": "t", "grade": True, "points": 1}})
        run_test(cell, link, options, 60)
        errors = [o for o in cell.outputs if o.get("output_type") == "error"]
        assert (not errors) if passes else "without a Python loop over t" in errors[0]["evalue"], cell.outputs


def test_a_library_dataclass_built_on_the_way_is_not_named_only_the_function():
    from mlexp.capstone import Design, memory_bytes

    def mine(context):
        return memory_bytes(Design("d", ("attention",), None), context, 64, 4, "bf16", conv_kernel=1)["total_bytes"]
    _, trace = rules.call(mine, 8, forbid=("mlexp.capstone",))
    assert trace.used == ["mlexp.capstone.memory_bytes"]


def whole_square(q, k, v, chunk_size):
    """Exact, but chunk_size is never used: a (B, H, T, T) score matrix."""
    return (q @ k.transpose(-1, -2)).tril() @ v


def in_chunks(q, k, v, chunk_size):
    S = q.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1])
    out = []
    for start in range(0, q.shape[2], chunk_size):
        Qc, Kc, Vc = (x[:, :, start:start + chunk_size] for x in (q, k, v))
        out.append(Qc @ S + (Qc @ Kc.transpose(-1, -2)).tril() @ Vc)
        S = S + Kc.transpose(-1, -2) @ Vc
    return torch.cat(out, 2)


def test_the_largest_tensor_an_operation_returns_is_noted_factories_and_tuples_too():
    _, trace = rules.call(lambda n: torch.ones(n, n).tril(), 30)
    assert trace.largest == 900
    _, trace = rules.call(lambda n: torch.split(torch.zeros(1, 2, n, 4), 1, dim=2), 6)
    assert trace.largest == 48                        # the zeros it split; each piece holds 8
    _, trace = rules.call(lambda x: torch.split(x, 1, dim=2)[0] * 2, torch.zeros(1, 2, 6, 4))
    assert trace.largest == 48                        # an argument counts once an operation takes it
    assert rules.Trace.from_dict(trace.as_dict()).largest == 48
    assert rules.Trace.from_dict({"used": [], "ops": 3}).largest == 0     # an older trace: nothing noted


def test_bounded_tells_a_chunked_form_from_the_whole_square():
    q, k, v = inputs(256)
    limit = 8 * 2 * 256 * 8                           # 8 x H x T x max(C, D), B = 1, C = 8
    out = rules.bounded(in_chunks, q, k, v, 8, limit=limit, bound="8 x H x T x max(C, D) numbers")
    assert torch.allclose(out, whole_square(q, k, v, 8), atol=1e-4)
    with pytest.raises(AssertionError, match=r"^Hint: this exercise asks you to write it yourself with no "
                                             r"tensor larger than 8 x H x T x max\(C, D\) numbers: whole_square "
                                             r"made one of 131,072 numbers, more than the 32,768 that allows. Chunk it\.$"):
        rules.bounded(whole_square, q, k, v, 8, limit=limit, bound="8 x H x T x max(C, D) numbers", instead="Chunk it")


def test_the_kernel_side_sends_the_largest_tensor_with_the_trace():
    server = KernelServer(namespace=dict)
    server.refs.append(whole_square)
    req = {"op": "call", "ref": 0, "args": wire.encode((*inputs(16), 4)),
           "kwargs": wire.encode({}), "grad": False, "watch": ["mlexp.ops"]}
    assert rules.Trace.from_dict(server.call(req)["watch"]).largest == 2 * 16 * 16


# --- What would take the work out of the watch's sight (issue 28: the rules' evidence is measured in the
# student's process, so each way around the watch is a case here). Each passes the old count-only watch.
def _numpy_loop(q, k, v):
    """A token loop over numpy arrays that were numpy before the call: no torch operation runs."""
    import numpy as np
    S, out = np.zeros((q.shape[-1], v.shape[-1])), []
    for t in range(q.shape[2]):
        S = S + np.outer(k[0, 0, t], v[0, 0, t])
        out.append(q[0, 0, t] @ S)
    return np.stack(out)


def numpy_inputs(T):
    return [x.numpy() for x in inputs(T)]


def _to_numpy_square(q, k, v):
    import numpy as np
    return torch.from_numpy(np.tril(q.numpy() @ np.swapaxes(k.numpy(), -1, -2)) @ v.numpy())


def _to_lists_loop(q, k, v):
    import numpy as np
    return torch.tensor(np.cumsum(np.array(k.tolist())[..., None] * np.array(v.tolist())[..., None, :], axis=2))


def _disabled_loop(q, k, v):
    with torch._C.DisableTorchFunction():
        return torch.cat([own(q[:, :, :t + 1], k[:, :, :t + 1], v[:, :, :t + 1])[:, :, -1:] for t in range(q.shape[2])], 2)


def test_a_python_loop_is_seen_from_its_lines_even_without_torch_operations():
    _, short = rules.call(_numpy_loop, *numpy_inputs(8))
    _, long = rules.call(_numpy_loop, *numpy_inputs(32))
    assert long.lines - short.lines >= 24 * 2 and not long.escaped
    _, short = rules.call(own, *inputs(8))
    _, long = rules.call(own, *inputs(32))
    assert long.lines == short.lines > 0                         # vectorised: the same lines at any length
    with pytest.raises(AssertionError, match="without a Python loop over t"):
        rules.no_loop(_numpy_loop, numpy_inputs)


def test_a_tensor_taken_out_of_torch_is_seen():
    """Work on a tensor's numbers in numpy (or in Python lists) is not measured by the watch: the
    size and count rules cannot hold there, so moving the numbers out is recorded (issue 28's
    second attack: a per-token scan and a token loop in numpy passed the chunkwise test)."""
    for fn, how in ((_to_numpy_square, "Tensor.numpy"), (_to_lists_loop, "Tensor.tolist")):
        _, trace = rules.call(fn, *inputs(8))
        assert trace.exported == [how] and not trace.escaped, (fn, trace)
        assert rules.Trace.from_dict(trace.as_dict()) == trace                 # it crosses the wire from the kernel
    with pytest.raises(AssertionError, match=r"could not measure the work of _to_numpy_square: it took a tensor's "
                                             r"numbers out of torch \(Tensor.numpy\)"):
        rules.bounded(_to_numpy_square, *inputs(8), limit=10 ** 9, bound="any size")
    with pytest.raises(AssertionError, match="could not measure the work of _to_lists_loop"):
        rules.no_loop(_to_lists_loop, inputs)
    # Where only the library's use is checked, numbers in a list are fine (lesson 04's layer indices).
    assert rules.write_it_yourself(lambda n: torch.arange(n)[::2].tolist(), 6, forbid=("mlexp.ops",)) == [0, 2, 4]


def _prints_while_working(q, k, v):
    S = k.transpose(-1, -2) @ v
    print(S[0, 0], repr(q.sum()), f"{S}", S.shape)       # a tensor's printout builds a namedtuple in torch
    return q @ S


def test_printing_a_tensor_is_not_an_escape():
    """Printing a tensor runs code compiled from a string (a namedtuple's __new__) inside the mode's
    own handler, where torch pops the mode: the honest-student review found it flagged as torch's
    function handling switched off."""
    _, trace = rules.call(_prints_while_working, *inputs(8))
    assert not trace.escaped and not trace.exported, trace
    rules.no_loop(_prints_while_working, inputs)
    rules.bounded(_prints_while_working, *inputs(8), limit=10 ** 6, bound="any size")


def test_switching_off_torch_function_handling_is_seen():
    _, trace = rules.call(_disabled_loop, *inputs(8))
    assert trace.escaped[0] == "switched off torch's function handling" and trace.ops == 0
    with pytest.raises(AssertionError, match=r"^Hint: the test could not watch _disabled_loop run: it switched off "
                                             r"torch's function handling"):
        rules.no_loop(_disabled_loop, inputs)
    with pytest.raises(AssertionError, match="could not watch"):
        rules.bounded(_disabled_loop, *inputs(8), limit=10 ** 9, bound="any size")


def _one_line_disabled(q, k, v):
    import itertools
    import operator
    with torch._C.DisableTorchFunction(): o = torch.stack(list(itertools.accumulate(v.unbind(2), operator.add)), 2)  # noqa: E701
    return o + 0


def test_function_handling_switched_off_inside_one_line_is_seen():
    """A region with no line event of its own (a one-line ``with``) is still seen at the C calls
    the notebook's code makes inside it (the second attack's token loop with one visible op)."""
    _, trace = rules.call(_one_line_disabled, *inputs(8))
    assert "switched off torch's function handling" in trace.escaped


def test_the_library_loaded_again_under_another_name_is_still_the_library():
    """mlexp.ops' own files, executed as a module called something else, are known by their file."""
    import importlib.util
    import os
    import mlexp.ops
    folder = os.path.dirname(mlexp.ops.__file__)
    spec = importlib.util.spec_from_file_location("my_linear_ops", os.path.join(folder, "__init__.py"),
                                                  submodule_search_locations=[folder])
    mine = importlib.util.module_from_spec(spec)
    sys.modules["my_linear_ops"] = mine
    try:
        spec.loader.exec_module(mine)

        def via_copy(q, k, v):
            return mine.linear_attention(q, k, v, impl="chunk")[0]
        _, trace = rules.call(via_copy, *inputs(8), forbid=("mlexp.ops",))
        assert trace.used == ["mlexp.ops.linear_attention(impl='chunk')"], trace.used
    finally:
        for name in [n for n in sys.modules if n == "my_linear_ops" or n.startswith("my_linear_ops.")]:
            del sys.modules[name]


def test_work_in_another_thread_or_process_is_seen():
    import concurrent.futures
    import threading

    def in_a_thread(q, k, v):
        box = []
        worker = threading.Thread(target=lambda: box.append(own(q, k, v)))
        worker.start()
        worker.join()
        return box[0]
    _, trace = rules.call(in_a_thread, *inputs(8))
    assert "started a thread" in trace.escaped
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(int).result()                                 # started before the call
        for job in (lambda q, k, v: pool.submit(own, q, k, v).result(),
                    lambda q, k, v: pool.submit(torch.matmul, q, k.mT).result(),
                    lambda q, k, v: list(pool.map(own, [q], [k], [v]))[0]):
            _, trace = rules.call(job, *inputs(8))
            assert "handed work to another thread or process" in trace.escaped, trace
        with pytest.raises(AssertionError, match="could not watch .* handed work to another thread"):
            rules.write_it_yourself(lambda q, k, v: pool.submit(library, q, k, v).result(), *inputs(8),
                                    forbid=("mlexp.ops",))


def test_replacing_the_trace_hook_is_seen_and_the_hooks_are_put_back():
    def quiet(q, k, v):
        saved = sys.gettrace()
        sys.settrace(None)
        out = loop(q, k, v)
        sys.settrace(saved)
        return out
    before = (sys.gettrace(), sys.getprofile())
    _, trace = rules.call(quiet, *inputs(8))
    assert trace.escaped == ["replaced the interpreter's trace hook"]
    assert (sys.gettrace(), sys.getprofile()) == before


def test_plain_code_escapes_nothing_printing_importing_and_library_helpers_included():
    def chatty(q, k, v):
        import json                                              # imports take import locks: the library's
        import torch.nn.functional as F
        print(json.dumps({"T": q.shape[2]}))
        return F.softmax(own(q, k, v), dim=-1)
    _, trace = rules.call(chatty, *inputs(8))
    assert trace.escaped == [] and trace.ops > 0
    assert rules.Trace.from_dict(trace.as_dict()) == trace


def test_code_that_only_calls_itself_a_library_or_frozen_is_the_notebooks():
    """A helper exec'd with made-up globals (``__name__ = "mlexp.ops._helper"``, a dunder name) is
    still the notebook's, and its call of the library is seen; code compiled under a made-up
    ``<frozen ...>`` name has its lines counted."""
    helper = {"__name__": "mlexp.ops._helper", "_la": renamed}
    exec("def __run__(q, k, v):\n    return _la(q, k, v, impl='chunk')[0]\n", helper)
    _, trace = rules.call(lambda q, k, v: helper["__run__"](q, k, v), *inputs(8), forbid=("mlexp.ops",))
    assert trace.used == ["mlexp.ops.linear_attention(impl='chunk')"]
    frozen = {"torch": torch}
    exec(compile("def rec(q):\n    out = []\n    for t in range(q.shape[2]):\n        out.append(q[:, :, t] * 2)\n"
                 "    return torch.stack(out, 2)\n", "<frozen helpers>", "exec"), frozen)
    _, short = rules.call(frozen["rec"], inputs(8)[0])
    _, long = rules.call(frozen["rec"], inputs(32)[0])
    assert long.lines - short.lines >= 24


def test_a_result_made_with_no_torch_operation_seen_is_an_escape():
    script = torch.jit.CompilationUnit("def twice(q: Tensor) -> Tensor:\n    return q * 2\n")
    _, trace = rules.call(lambda q: script.twice(q), inputs(8)[0])
    assert trace.escaped == ["made its result with no torch operation the test could see"]
    _, trace = rules.call(lambda q: q, inputs(8)[0])                 # an argument handed back: not an escape
    assert trace.escaped == []


def test_a_progress_bar_is_not_work_in_another_thread(monkeypatch):
    tqdm = pytest.importorskip("tqdm")

    def chunks(q, k, v):
        out = [own(q[:, :, s:s + 4], k[:, :, s:s + 4], v[:, :, s:s + 4]) for s in tqdm.tqdm(range(0, q.shape[2], 4), leave=False)]
        return torch.cat(out, 2)
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 10)          # its monitor thread starts on first use
    _, trace = rules.call(chunks, *inputs(16))
    assert trace.escaped == [], trace


def test_packages_on_any_site_folder_of_sys_path_are_library_code(tmp_path, monkeypatch):
    """torch seen through a .pth line (a venv over another one's site-packages, Debian's and Colab's
    dist-packages) is library code: its lines are not the notebook's (the student edition's own test
    found its handler lines flagged as the notebook's code running with torch's mode off)."""
    site = tmp_path / "dist-packages"
    (site / "pkg").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    sources = rules._Sources()
    assert not sources.own(str(site / "pkg" / "mod.py")) and sources.own(str(tmp_path / "cell.py"))
    assert not sources.own(torch.__file__)


def test_in_time_passes_a_fast_form_and_fails_a_slow_one_with_its_hint():
    """rules.in_time in the student's own check: its CPU time read here, failed afterwards with the
    hint; a wait is no work (issue 52: no verdict on the wall clock)."""
    import time as _time

    def slow(q, k, v):
        end = _time.process_time() + 0.3
        while _time.process_time() < end:
            pass
        return own(q, k, v)

    def waits(q, k, v):
        _time.sleep(0.3)
        return own(q, k, v)

    out = rules.in_time(own, *inputs(8), seconds=5, too_slow="Chunks of C tokens.", forbid=("mlexp.ops",))
    assert torch.allclose(out, own(*inputs(8)))
    with pytest.raises(AssertionError, match=r"slow took \d\.\d s, more than the 0.05 s of CPU time\. Chunks of C tokens\."):
        rules.in_time(slow, *inputs(8), seconds=0.05, too_slow="Chunks of C tokens.", forbid=("mlexp.ops",))
    rules.in_time(waits, *inputs(8), seconds=0.05, too_slow="Chunks of C tokens.", forbid=("mlexp.ops",))
    with pytest.raises(AssertionError, match="write it yourself"):   # the library op is still refused
        rules.in_time(library, *inputs(8), seconds=5, too_slow="x", forbid=("mlexp.ops",))


def test_in_time_hands_its_limit_to_a_graders_proxy():
    """A grader's proxy gets (seconds, hint) and keeps the time itself (autograder.engine.calls)."""
    seen = {}

    class Proxy:
        __name__ = "chunked"

        def _watched_call(self, args, kwargs, forbid, limit=None):
            seen["limit"] = limit
            with rules.watching(forbid) as trace:
                result = own(*args)
            return result, trace.as_dict()

    rules.in_time(Proxy(), *inputs(8), seconds=7, too_slow="Pieces.", forbid=("mlexp.ops",))
    seconds, hint = seen["limit"]
    assert seconds == 7 and hint.startswith("Hint: ") and "within 7 s of CPU time. Pieces." in hint


# work_grows: a slow spell of the machine (a neighbour on the same core, which makes the same work take
# more CPU time) falls on both lengths alike, and each length keeps its least time. The spell here lasts
# three calls in a row: measured as three short calls and then three long ones (medians), it made a
# linear function's long calls x5 and its growth x20 (the honest answer failed in CI that way).
def _burn(seconds):
    import time
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def _spelled(per_token, spell=range(3, 6), slow=5.0):
    calls = []

    def fn(x):
        T = x.shape[-1]
        _burn(per_token(T) * (slow if len(calls) in spell else 1.0))
        calls.append(T)
        return x * 2
    return fn, calls


@pytest.mark.parametrize("spell", [range(3, 6), range(0, 3), range(6, 9)])
def test_work_grows_keeps_a_linear_answer_through_a_slow_spell(spell):
    fn, calls = _spelled(lambda T: 2e-6 * T, spell)
    rules.work_grows(fn, lambda T: (torch.ones(T),), lengths=(1000, 4000), at_most=8, too_fast="quadratic",
                     reference=lambda x: x * 2)
    assert calls[:4] == [1000, 4000, 1000, 4000], "the lengths are measured in turns"


@pytest.mark.parametrize("spell", [range(3, 6), range(0, 10, 2)])
def test_work_grows_fails_a_quadratic_answer_through_a_slow_spell(spell):
    fn, _ = _spelled(lambda T: 2e-6 * T * T / 1000, spell, slow=1.5)
    with pytest.raises(AssertionError, match="quadratic"):
        rules.work_grows(fn, lambda T: (torch.ones(T),), lengths=(1000, 4000), at_most=8, too_fast="quadratic",
                         reference=lambda x: x * 2)


def test_work_grows_gives_no_result_that_an_earlier_call_could_be_rescaled_to():
    """Each call's inputs are the test's inputs times fresh random numbers element by element: a
    function that keeps its first result at each length and rescales it when the next inputs are a
    multiple of the first (a whole tensor times one factor would be) finds no multiple, so does
    its real work at every call and still fails."""
    kept = {}

    def rescaling(x):
        T = x.shape[-1]
        if T in kept:
            ratio = x / kept[T][0]
            if torch.allclose(ratio, ratio[0]):
                return kept[T][1] * ratio[0]
        _burn(2e-6 * T * T / 1000)
        kept[T] = (x.clone(), x * 2)
        return x * 2
    with pytest.raises(AssertionError, match="quadratic"):
        rules.work_grows(rescaling, lambda T: (torch.linspace(1, 2, T),), lengths=(1000, 4000), at_most=8,
                         too_fast="quadratic", reference=lambda x: x * 2)


def test_work_grows_fails_a_fixed_cost_added_to_every_call_by_the_time_the_reference_takes():
    """A ratio alone is met by a quadratic answer that adds a fixed cost to every call (issue 51: its
    growth reads x2); ``slowest`` compares the longer call with the reference timed on the same
    inputs, which the padded answer cannot meet, while a linear answer a little slower than the
    reference keeps its verdict."""
    def reference(x):
        _burn(2e-6 * x.shape[-1])
        return x * 2

    def padded(x):                          # quadratic, plus 40 ms on every call
        _burn(2e-6 * x.shape[-1] ** 2 / 1000 + 0.04)
        return x * 2

    def linear(x):                          # twice the reference's work
        _burn(4e-6 * x.shape[-1])
        return x * 2
    kwargs = dict(lengths=(1000, 4000), at_most=8, too_fast="quadratic", reference=reference)
    rules.work_grows(padded, lambda T: (torch.ones(T),), **kwargs)              # the hole without a ceiling
    with pytest.raises(AssertionError, match=r"at T = 4000 padded took x[\d.]+ the CPU time of the course's own form, "
                                             r"more than the x4 this form allows.*quadratic"):
        rules.work_grows(padded, lambda T: (torch.ones(T),), slowest=4, **kwargs)
    rules.work_grows(linear, lambda T: (torch.ones(T),), slowest=4, **kwargs)


def test_work_grows_takes_the_checksum_off_by_its_least_reading_not_call_by_call():
    """A grader's proxy reports each call's CPU time and, apart, the kernel's checksum of the result as
    the grader timed it. One slow reading of the checksum (the grader's own neighbour) taken off its
    own call made an honest short call read as too little work: a growth of x9 in CI for a form that
    grows x4. Each is noise that only adds, so each keeps its least, and the least checksum comes off
    the least call."""
    readings = {1000: iter([(0.020, 0.002), (0.021, 0.016), (0.020, 0.002), (0.022, 0.002), (0.020, 0.002)]),
                4000: iter([(0.062, 0.004)] * 5)}

    class Proxy:
        __name__ = "honest"

        def _measured_call(self, args, kwargs, expected):
            seconds, off = next(readings[args[0].shape[-1]])
            return seconds, None, off
    rules.work_grows(Proxy(), lambda T: (torch.ones(T),), lengths=(1000, 4000), at_most=8, too_fast="quadratic",
                     reference=lambda x: x * 2)         # (0.062 - 0.004) / (0.020 - 0.002): x3.2
    for rest in readings.values():
        assert next(rest, None) is None                 # every reading was used


PEAK = r"""
import torch
from mlexp import rules


def square(x):
    full = torch.ones(x.shape[-1], x.shape[-1])             # T x T, touched
    return x * 2 + full[0, 0] - 1


kwargs = dict(lengths=(1000, 4000), at_most=50, too_fast="quadratic", reference=lambda x: x * 2,
              memory=32 * 2**20, too_big="A T x T matrix.")
rules.work_grows(lambda x: x * 2, lambda T: (torch.ones(T),), **kwargs)
try:
    rules.work_grows(square, lambda T: (torch.ones(T),), **kwargs)
except AssertionError as exc:
    print(exc)
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="the peak memory is read from /proc")
def test_work_grows_fails_a_call_whose_peak_memory_passes_the_bound():
    """``memory``: a call that holds a T x T matrix at the longer length (64 MB at T = 4000, float32)
    fails with the memory hint, whatever it returns; the same work without it passes (issue 51: a
    state kept for every token, a T x T matrix, seen by the operating system's count). In a fresh
    process, as a kernel is: in a long-lived one, memory freed earlier and reused reads as nothing
    new (a reading is a lower bound, never more than the call took)."""
    import subprocess
    out = subprocess.run([sys.executable, "-c", PEAK], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.search(r"at T = 4000 square's call took (\d+) MB more memory at its peak, more than the 32 MB "
                     r"this form needs .*A T x T matrix\.", out.stdout), out.stdout
    assert 60 <= int(re.search(r"took (\d+) MB", out.stdout).group(1)) < 80, out.stdout
