"""benchmarks/ops_cuda.py without a GPU: its plan, its launch grids and its correctness check run here."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, "benchmarks", "ops_cuda.py")

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


def _module():
    spec = importlib.util.spec_from_file_location("ops_cuda", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_prints_the_plan_and_grids_against_the_sm_count(capsys):
    bench = _module()
    assert bench.SHAPES == [(1, 4, 8192, 64), (8, 16, 2048, 64), (4, 16, 4096, 128)]
    assert bench.main(["--dry-run", "--ops", "linear", "gated_delta"]) == 0
    out = capsys.readouterr().out
    assert "Correctness" in out and "would check" in out
    for shape in bench.SHAPES:
        assert f"(B, H, T, D) = {shape}" in out
    assert out.count("grids:") == 2 * len(bench.SHAPES) and "/SM)" in out


def test_grids_use_the_gpu_at_small_batch():
    """At B*H = 4 the sequential state kernels get narrower tiles (more programs) than at B*H = 128,
    and the chunk-parallel kernels have one program per chunk, V tile and head."""
    bench = _module()
    small = dict((k, n) for k, n, _ in bench.grid_report("linear", (1, 4, 8192, 64), torch.bfloat16, 132))
    large = dict((k, n) for k, n, _ in bench.grid_report("linear", (8, 16, 2048, 64), torch.bfloat16, 132))
    assert small["output_kernel"] == (8192 // 64) * 4 and large["output_kernel"] == (2048 // 64) * 128
    assert small["state_fwd_kernel"] >= 16 * 4 > 4                # 64 x 64 tiles would give 4 programs
    assert large["state_fwd_kernel"] >= 128
    delta = dict((k, n) for k, n, _ in bench.grid_report("gated_delta", (1, 4, 8192, 64), torch.bfloat16, 132))
    assert delta["delta_state_fwd_kernel"] == 4 * 4                # V tiles of 16 at B*H = 4


def test_inputs_and_fla_adapter():
    bench = _module()
    x = bench.make_inputs(2, 3, 10, 8, torch.bfloat16, torch.device("cpu"))
    assert x["q"].shape == (2, 3, 10, 8) and x["g_ch"].shape == (2, 3, 10, 8) and x["beta"].shape == (2, 3, 10)
    assert all(t.dtype == torch.bfloat16 and t.requires_grad for t in x.values())
    torch.testing.assert_close(x["k_unit"].float().norm(dim=-1), torch.ones(2, 3, 10), atol=1e-2, rtol=0)
    assert bool((x["g"] <= 0).all()) and set(bench.USES) == set(bench.OPS)
    assert bench.to_fla(x)["q"].shape == (2, 10, 3, 8)
    fla, why = bench.fla_ops()
    if importlib.util.find_spec("fla") is None:
        assert fla is None and "fla" in why


_CHECK = """
import json, sys, torch
sys.path.insert(0, "benchmarks")
from mlexp.ops.triton_check import emulate_gpu_dots
emulate_gpu_dots()
import ops_cuda
print(json.dumps({op: ops_cuda.check(op, (1, 2, 40, 16), torch.float32, torch.device("cpu"), None)
                  for op in ops_cuda.OPS}))
"""


@pytest.mark.slow   # one of the slowest fast tests: left out of make test-fast (under 3 min); make test runs it
def test_correctness_check_runs_in_the_interpreter():
    """The benchmark's correctness step (Triton vs the float32 chunk path, o, S and every gradient)
    on CPU tensors under TRITON_INTERPRET=1: it runs, and the errors are within its fp32 bound."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    run = subprocess.run([sys.executable, "-c", _CHECK], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    errs = json.loads(run.stdout.strip().splitlines()[-1])
    bench = _module()
    assert sorted(errs) == sorted(bench.OPS)
    for op, e in errs.items():
        assert {"o", "S", "dq", "dv"} <= set(e), e
        assert max(e.values()) <= bench.BOUND[torch.float32], (op, e)
