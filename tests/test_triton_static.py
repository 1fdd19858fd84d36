"""Checks of the Triton kernels' source and wrappers that run without executing a kernel."""
import ast
import importlib.util
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")

OPS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mlexp", "ops")
KERNEL_FILES = ("triton_common.py", "triton_chunk.py", "triton_linear.py", "triton_delta.py")
HOT_PATH_FILES = KERNEL_FILES   # triton_check.py is a tool, not the hot path


def _tree(name):
    with open(os.path.join(OPS_DIR, name)) as f:
        return ast.parse(f.read(), filename=name)


def _is_tl_attr(node, attr):
    return (isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name)
            and node.value.id == "tl")


def _jit_functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Attribute) and d.attr == "jit" for d in node.decorator_list):
            yield node


def test_program_ids_are_int64_everywhere():
    """Lint: tl.program_id appears only in _program_ids, each call converted with .to(tl.int64), and
    every kernel takes its ids from _program_ids(); so every pointer offset built from a program id
    is 64-bit (B*H*T*D past 2^31 cannot wrap)."""
    found = []
    kernels = 0
    for name in KERNEL_FILES:
        tree = _tree(name)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for fn in _jit_functions(tree):
            calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and _is_tl_attr(n.func, "program_id")]
            for call in calls:
                up = parents[call]
                ok = (fn.name == "_program_ids" and isinstance(up, ast.Attribute) and up.attr == "to"
                      and isinstance(parents[up], ast.Call) and _is_tl_attr(parents[up].args[0], "int64"))
                found.append((name, fn.name, call.lineno, ok))
            if fn.name.endswith("_kernel"):
                kernels += 1
                uses = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "_program_ids"
                           for n in ast.walk(fn))
                assert uses, f"{name}:{fn.name} does not take its program ids from _program_ids()"
    assert kernels >= 12
    assert [f for f in found if not f[3]] == [], "tl.program_id used outside _program_ids or not as int64"
    assert len(found) == 3


def test_no_host_sync_in_the_wrappers():
    """Forward and backward of every op run on meta tensors, which hold no values: no .item(),
    .any(), bool(tensor) or copy to the host can hide on the Triton hot path. Also a source scan
    for the usual culprits."""
    from mlexp.ops import triton_check
    for op in triton_check.OPS:
        launches = triton_check.op_launches(op, B=2, H=3, T=100, Dk=72, Dv=40, dtype=torch.bfloat16)
        assert len(launches) >= 6
    for name in HOT_PATH_FILES:
        with open(os.path.join(OPS_DIR, name)) as f:
            src = f.read()
        for culprit in (".item(", ".any(", ".all(", ".tolist(", ".cpu(", ".numpy(", "synchronize("):
            assert culprit not in src, f"{name} contains {culprit}"


def test_tile_chooser_refuses_what_does_not_fit():
    from mlexp.ops import triton_delta, triton_linear
    q = torch.zeros(1, 1, 32, 16)
    S0 = torch.zeros(1, 1, 16, 16)
    for C in (8, 48, 128):
        with pytest.raises(ValueError, match="chunk_size in"):
            triton_linear.triton_linear_attention(q, q, q, S0, None, normalize=False, eps=0.0, chunk_size=C)
    long = torch.zeros(1, 1, 16 * 65536, 16, device="meta")
    with pytest.raises(ValueError, match="65535"):
        triton_linear.triton_linear_attention(long, long, long, S0, None, normalize=False, eps=0.0, chunk_size=16)
    big = torch.zeros(1, 1, 32, 264)
    with pytest.raises(ValueError, match="Dk <= 256"):
        triton_delta.delta_rule_triton(big, big, q, q[..., 0], None, None, 64)
    with pytest.raises(ValueError, match="float64"):
        triton_linear.triton_gated_linear_attention(q.double(), q.double(), q.double(), q[..., 0].double(),
                                                    S0, chunk_size=64)


def test_gate_codes_are_named():
    """The kernels compare GATE with the named constants only (no bare 0/1/2), and the host-side
    enum agrees with them."""
    from mlexp.ops import triton_common
    assert [int(triton_common.Gate.NONE), int(triton_common.Gate.SCALAR), int(triton_common.Gate.CHANNEL)] == [
        triton_common.GATE_NONE.value, triton_common.GATE_SCALAR.value, triton_common.GATE_CHANNEL.value]
    for name in KERNEL_FILES:
        for node in ast.walk(_tree(name)):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "GATE":
                for c in node.comparators:
                    assert not isinstance(c, ast.Constant), f"{name}:{node.lineno} compares GATE with {c.value}"


def test_no_import_loop_between_delta_and_its_kernels():
    """triton_delta no longer borrows delta._chunk for its backward: it imports nothing from the
    op modules (delta.py, gated.py, linear.py), so the two can import each other's way freely."""
    for name in KERNEL_FILES:
        for node in ast.walk(_tree(name)):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ("delta", "gated", "linear"), f"{name} imports .{node.module}"


def test_empty_inputs_launch_nothing():
    """Any empty dimension: zeros of v's shape, the initial state back unchanged, and no kernel launch
    (a grid with no programs is an error on CUDA)."""
    from mlexp.ops import triton_common, triton_delta, triton_linear
    for B, H, T, Dk, Dv in ((0, 2, 5, 4, 3), (1, 0, 5, 4, 3), (1, 2, 0, 4, 3), (1, 2, 5, 0, 3), (1, 2, 5, 4, 0)):
        q, k, v = torch.randn(B, H, T, Dk), torch.randn(B, H, T, Dk), torch.randn(B, H, T, Dv)
        S0 = torch.randn(B, H, Dk, Dv)
        with triton_common.recording() as rec:
            outs = [triton_linear.triton_linear_attention(q, k, v, S0, None, normalize=False, eps=0.0,
                                                          chunk_size=64)[:2],
                    triton_linear.triton_gated_linear_attention(q, k, v, torch.zeros(B, H, T), S0, chunk_size=64),
                    triton_delta.delta_rule_triton(q, k, v, torch.zeros(B, H, T), None, S0, 64)]
        assert rec == []
        for o, S in outs:
            assert o.shape == v.shape and not o.any()
            torch.testing.assert_close(S, S0)
