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


# Head and chunk sizes: the three head sizes, uneven ones, and the two smaller chunk sizes.
SHAPES = {"64": (64, 64, 64), "128": (128, 128, 64), "256": (256, 256, 64), "uneven": (200, 96, 64),
          "256_C16": (256, 256, 16), "128_C32": (128, 128, 32)}
# Which shapes each architecture and dtype compiles in `make test` (cold, 30-60 s per shape here). Every
# pair compiles every kernel at head_dim 256, where the tiles come closest to its shared memory (sm_75 has
# the least, fp32 the widest elements); every shape (uneven head sizes, the smaller chunks) is compiled on
# sm_80 in bf16, the pair whose spills are checked, and the spill check also runs on sm_90 at 128, the
# largest head size it applies to. Left out for the suite's time budget (issue 37), as each repeats a
# fault caught above: sm_90 bf16 at 64 (spills: sm_80 at 64 and sm_90 at 128), fp32 at the uneven shape
# on sm_80/sm_90 (masking: sm_80 bf16 uneven; shared memory: fp32 at 256 is the larger tile) and sm_75
# at chunk 32 (smaller tiles than its chunk-64 case at 256). `python -m mlexp.ops.triton_check --arch 90
# --head-dim 64` and the like compile any pair left out.
MATRIX = {(80, "bf16"): list(SHAPES), (90, "bf16"): ["128", "256"],
          (80, "fp32"): ["256"], (90, "fp32"): ["256"],
          (75, "fp16"): ["256"], (75, "fp32"): ["256"]}   # sm_75: a T4, Colab's free GPU


@pytest.mark.slow
@pytest.mark.parametrize("arch,dtype,shape", [(a, d, s) for (a, d), shapes in MATRIX.items() for s in shapes],
                         ids=lambda x: str(x))
def test_every_kernel_compiles_at_every_head_size(arch, dtype, shape):
    """Every kernel of every op, forward and backward, at one (head_dim, d_v, chunk) shape of
    :data:`MATRIX` (head_dim up to 256, the largest the tile chooser accepts for the delta rule),
    over batch*head counts from 1 to 1024 (so every state tile the chooser picks)."""
    from mlexp.ops.triton_check import OPS, compile_op
    Dk, Dv, C = SHAPES[shape]
    for op in OPS:
        results = _check(compile_op(op, arch, Dk, DTYPES[dtype], C=C, Dv=Dv))
        if dtype != "fp32" and Dk <= 128 and arch >= 80:   # sm_75: compiles and fits; spills reported
            assert all(r["spill"] <= SPILL_16BIT for r in results), [r for r in results if r["spill"]]
