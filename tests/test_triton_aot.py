"""Ahead-of-time compilation of the Triton kernels for sm_80 (A100) and sm_90a (H100) on this CPU.

mlexp.ops.triton_check records the launches the wrappers make (forward and backward, on meta
tensors), compiles each with triton.compile for a GPUTarget and the ptxas in the triton wheel,
and reads registers and spilled bytes from the cubin. A kernel that fails here (ptxas error,
shared memory over the architecture's limit) would fail at its first call on that GPU. Run with
-s to see the table; ``python -m mlexp.ops.triton_check`` prints all of it.
"""
import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# 16-bit kernels are sized not to spill; ptxas may still trade a few registers for occupancy on its
# own (it chose 128 registers and 8 bytes of spill for a scores kernel with no cap in the PTX).
SPILL_16BIT = 64


def _check(results):
    assert results, "no kernel compiled"
    for r in results:
        print(f"sm_{r['arch']} {r['name']:<26} warps {r['num_warps']} stages {r['num_stages']} "
              f"regs {r['registers']:>3} spill {r['spill']:>5} B  smem {r['shared'] / 1024:6.1f} KiB  "
              f"{r['constexprs']}")
        assert r["shared"] <= r["shared_limit"], f"{r['name']} needs {r['shared']} B of shared memory"
        assert 0 < r["registers"] <= 255
    return results


# The kernels closest to a limit: the WY backward's (C, C) tiles, the delta state backward's
# fp32 slices, and the dqk kernel that spilled most on sm_80 before its tiles were halved.
FAST = [("gated_delta", 128, 90, "bf16", "wy_bwd_dx_kernel"),
        ("gated_delta", 256, 80, "fp32", "delta_state_bwd_kernel"),
        ("gated_delta", 64, 80, "bf16", "dqk_kernel")]


@pytest.mark.parametrize("op,head_dim,arch,dtype,kernel", FAST, ids=lambda x: str(x))
def test_representative_kernels_compile_and_fit(op, head_dim, arch, dtype, kernel):
    from mlexp.ops.triton_check import compile_op
    results = _check(compile_op(op, arch, head_dim, DTYPES[dtype], only={kernel}))
    if dtype != "fp32":
        assert all(r["spill"] <= SPILL_16BIT for r in results), "16-bit kernels are sized not to spill"


@pytest.mark.slow
@pytest.mark.parametrize("arch,dtype", [(80, "bf16"), (80, "fp32"), (90, "bf16"), (90, "fp32"),
                                        (75, "fp16"), (75, "fp32")])   # sm_75: a T4, Colab's free GPU
def test_every_kernel_compiles_at_every_head_size(arch, dtype):
    """Every kernel of every op, forward and backward, at head_dim 64, 128, 256 (the largest the
    tile chooser accepts for the delta rule), at uneven sizes and every chunk size, over batch*head
    counts from 1 to 1024 (so every state tile the chooser picks); 10-45 s per kernel here."""
    from mlexp.ops.triton_check import OPS, compile_op
    for op in OPS:
        for Dk, Dv, C in ((64, 64, 64), (128, 128, 64), (256, 256, 64), (200, 96, 64), (256, 256, 16), (128, 128, 32)):
            results = _check(compile_op(op, arch, Dk, DTYPES[dtype], C=C, Dv=Dv))
            if dtype != "fp32" and Dk <= 128 and arch >= 80:   # sm_75: compiles and fits; spills reported
                assert all(r["spill"] <= SPILL_16BIT for r in results), [r for r in results if r["spill"]]
