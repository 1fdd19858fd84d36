"""mlexp/ops/registry.py is the one list of the ops (issue 42): each entry is what it says it is,
and every tool that goes over the ops (triton_check, benchmarks/ops.py, ops_cuda.py, gpu_run.py)
finds an op added to it, under the registry's name and label, with nothing else to edit."""
import contextlib
import doctest
import importlib.util
import io
import os
import sys
from argparse import Namespace

import pytest
import torch

from mlexp.ops import linear_attention, registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
FAKE = registry.Op("fake", "fake op (a test's)", linear_attention, ("q", "k", "v"), registry.OPS["linear"].kernels,
                   registry.OPS["linear"].triton)


def _script(name):
    """benchmarks/<name>.py as a fresh module (benchmarks/ is not a package)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))      # gpu_run imports ops_cuda beside it
    try:
        spec = importlib.util.spec_from_file_location(f"registry_test_{name}", os.path.join(ROOT, "benchmarks",
                                                                                             f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))


@pytest.fixture
def add_fake(monkeypatch):
    """Call it to give the registry one more op (linear attention under another name and label) for
    this test only. Each reader is imported first, so that one copying the list at import fails."""
    return lambda: monkeypatch.setitem(registry.OPS, FAKE.name, FAKE)


def test_the_entries_are_consistent_and_the_example_runs():
    assert list(registry.OPS) == ["linear", "gated_scalar", "gated_channel", "delta", "gated_delta"]
    assert all(name == op.name for name, op in registry.OPS.items())
    assert len({op.label for op in registry.OPS.values()}) == len(registry.OPS)
    x = registry.make_inputs(1, 2, 20, 8, seed=3)
    assert set(x) == set(registry.INPUT_NAMES) == set(registry.input_shapes(1, 2, 20, 8))
    for op in registry.OPS.values():
        assert set(op.inputs) <= set(x) and op.inputs[:1] == ("q",) and op.kernels
        o, S = op(x, "chunk", chunk_size=16)
        ref = op.fn(*(x[n] for n in op.inputs), impl="recurrent")
        torch.testing.assert_close(o, ref[0], atol=1e-5, rtol=1e-4)
        assert S.shape == (1, 2, 8, 8)
    assert registry.op_label("gated_delta") == "gated delta rule" and registry.op_label("gone") == "gone"
    assert all(t.is_leaf and t.requires_grad and t.dtype == torch.float32 for t in x.values())
    same = registry.make_inputs(1, 2, 20, 8, seed=3)
    assert all(torch.equal(x[n], same[n]) for n in x)
    positive = registry.make_inputs(1, 2, 20, 8, grad=False, positive=True)
    assert bool((positive["q"] > 0).all()) and not positive["q"].requires_grad
    result = doctest.testmod(registry, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


@needs_triton
def test_each_op_lists_the_triton_kernels_it_launches():
    from mlexp.ops import triton_check
    for name, op in registry.OPS.items():
        for H in (1, 64):                                        # narrow and wide state tiles
            launched = {launch["kernel"].__name__ for launch in triton_check.op_launches(name, H=H, T=130)}
            assert launched == set(op.kernels), name
    with pytest.raises(ValueError, match="op must be one of"):
        triton_check.op_launches("no_such_op")


@needs_triton
def test_triton_check_finds_an_added_op(add_fake):
    from mlexp.ops import triton_check
    add_fake()
    assert "fake" in triton_check.OPS and triton_check.parser().parse_args([]).ops[-1] == "fake"
    assert triton_check.parser().parse_args(["--ops", "fake"]).ops == ["fake"]
    names = [launch["kernel"].__name__ for launch in triton_check.op_launches("fake")]
    assert names == [launch["kernel"].__name__ for launch in triton_check.op_launches("linear")]


@needs_triton
def test_ops_cuda_finds_an_added_op(add_fake, capsys):
    bench = _script("ops_cuda")
    add_fake()
    assert "fake" in bench.OPS
    assert bench.main(["--dry-run", "--ops", "fake"]) == 0
    out = capsys.readouterr().out
    assert sum(line.strip().startswith("fake (") and "would check" in line for line in out.splitlines()) == 3
    assert out.count("fake grids: ") == len(bench.SHAPES)
    x = bench.make_inputs(1, 1, 16, 8, torch.float32, torch.device("cpu"))
    torch.testing.assert_close(bench.OPS["fake"](x, "chunk")[0], bench.OPS["linear"](x, "chunk")[0])


@needs_triton
def test_gpu_run_finds_an_added_op_and_labels_it(add_fake, capsys):
    run = _script("gpu_run")
    add_fake()
    cases = run.plan()
    assert sum(c["op"] == "fake" and c["kind"] == "check" for c in cases) == 3
    assert sum(c["op"] == "fake" and c["kind"] == "time" for c in cases) == 3
    assert run.main(["--dry-run", "--ops", "fake"]) == 0
    assert "3 correctness, 3 timed (op, shape)" in capsys.readouterr().out
    res = {"meta": {}, "not_reached": [], "cases": [
        {"kind": "time", "op": "fake", "shape": [8, 16, 2048, 64], "fwd": {"triton": [1.0, 1.0, 1.0]}},
        {"kind": "time", "op": "linear", "shape": [8, 16, 2048, 64], "fwd": {"triton": [1.0, 1.0, 1.0]}}]}
    rows = [line for line in run.render(res).splitlines() if line.startswith("| (8, 16, 2048, 64)")]
    assert [r.split(" | ")[1] for r in rows] == ["linear", "fake op (a test's)"]      # the registry's order


def test_the_cpu_benchmark_finds_an_added_op(add_fake, monkeypatch):
    bench = _script("ops")
    assert set(bench.FLOP_GOAL) <= set(registry.OPS)
    add_fake()
    t = lambda x: x.transpose(1, 2)                                                   # noqa: E731
    refs = {"linear": (lambda x, C: t(linear_attention(x["q"], x["k"], x["v"], impl="recurrent")[0]), (None,),
                       "our loop, standing in for fla")}
    monkeypatch.setattr(bench, "_fla_references", lambda: (refs, None))
    a = Namespace(batch=1, heads=1, family_T=32, head_dim=8, chunk=16, repeats=1, loop_repeats=1, busy=0.1,
                  matmul_n=8)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench.warm_up(a, torch.device("cpu"))
        shares = bench.flop_table(a, torch.device("cpu"))
        vs_fla = bench.fla_table(a, torch.device("cpu"))
        bench.loop_table(a, torch.device("cpu"))
    assert list(shares) == list(registry.OPS) and list(vs_fla) == ["linear"]
    rows = [line.strip() for line in out.getvalue().splitlines() if line.strip().startswith("fake op (a test's)")]
    assert len(rows) == 3 and rows[0].endswith("-") and rows[1].endswith("no fla reference to compare with")
    assert "delta rule " in out.getvalue() and "delta_rule" not in out.getvalue()      # the registry's labels
