"""mlexp.rules: an exercise's stated rules, watched by behaviour where the student's function runs."""
import sys

import pytest
import torch

from autograder import wire
from autograder.kernel_server import KernelServer
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
    """What the harness gets back from a watched call (autograder.harness StudentFunction._watched_call)."""
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


def test_a_library_dataclass_built_on_the_way_is_not_named_only_the_function():
    from mlexp.capstone import Design, memory_bytes

    def mine(context):
        return memory_bytes(Design("d", ("attention",), None), context, 64, 4, "bf16", conv_kernel=1)["total_bytes"]
    _, trace = rules.call(mine, 8, forbid=("mlexp.capstone",))
    assert trace.used == ["mlexp.capstone.memory_bytes"]
