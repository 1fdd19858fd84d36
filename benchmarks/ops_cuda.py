"""The Triton kernels on a CUDA GPU: correctness first, then time against the chunkwise PyTorch path and fla.

    python benchmarks/ops_cuda.py                       # every op, the three shapes below, bf16, 15-minute budget
    python benchmarks/ops_cuda.py --budget 300 --ops gated_delta --dtype bf16
    python benchmarks/ops_cuda.py --dry-run             # no GPU needed: the plan and the launch grids

1. Correctness, at small and ragged shapes: Triton against the chunkwise PyTorch path computed in
   float32 on the same inputs (output, final state, every gradient), and fla's output where fla
   imports. The run stops with exit status 1 if any case fails; nothing is timed then.
2. Speed at (B, H, T, D) = (1, 4, 8192, 64), (8, 16, 2048, 64), (4, 16, 4096, 128): forward and
   forward + backward, the median of repeats (CUDA events) with the spread, Triton vs chunk and
   fla vs Triton, and the issue's verdict Triton <= 1.5x fla (goal 1.2x) for forward + backward.
   Each shape also prints the grid of every Triton kernel against the GPU's SM count.
A time budget (--budget seconds) covers the whole run; shapes and ops not reached are listed.
fla (flash-linear-attention) is optional: install it with ``pip install --no-deps
flash-linear-attention`` to compare; it is never a dependency of the course.
"""
import argparse
import math
import sys
import time

import torch
import triton

from mlexp.ops.registry import OPS, make_inputs   # the ops, and their inputs: (B, H, T, D) leaves, seed 0

SHAPES = [(1, 4, 8192, 64), (8, 16, 2048, 64), (4, 16, 4096, 128)]
CHECK_SHAPES = [(2, 3, 300, 64), (1, 2, 1000, 128), (1, 1, 77, 100)]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# RMS-relative error bound of Triton against the float32 chunk path, per input dtype (the interpreter
# tests in tests/test_triton_interpreter.py bound the emulated GPU arithmetic the same way).
BOUND = {torch.bfloat16: 2e-2, torch.float16: 3e-3, torch.float32: 5e-5}
# OPS (mlexp/ops/registry.py): name -> Op; OPS[name](x, impl) runs it on a make_inputs dict, and
# OPS[name].inputs names the leaves it takes (USES: the same, by name, as of the ops at import).
USES = {name: op.inputs for name, op in OPS.items()}


def fla_ops():
    """fla's chunk kernels as callables on our inputs dict, by op name (an op of OPS that fla lacks is
    not compared), or (None, why) when fla does not import. fla takes (B, T, H, D); the transposed
    copies are made once, outside the timed region."""
    try:
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.gla import chunk_gla
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as e:                                                        # noqa: BLE001 - any failure: skip fla
        return None, f"{type(e).__name__}: {e}"
    kw = dict(scale=1.0, output_final_state=True)
    return {
        "linear": lambda x: chunk_simple_gla(x["q"], x["k"], x["v"], **kw),
        "gated_scalar": lambda x: chunk_simple_gla(x["q"], x["k"], x["v"], g=x["g"], **kw),
        "gated_channel": lambda x: chunk_gla(x["q"], x["k"], x["v"], g=x["g_ch"], **kw),
        "delta": lambda x: chunk_delta_rule(x["q"], x["k_unit"], x["v"], x["beta"], **kw),
        "gated_delta": lambda x: chunk_gated_delta_rule(x["q"], x["k_unit"], x["v"], x["g"], x["beta"], **kw),
    }, None


def to_fla(x):
    """Our (B, H, T, ...) leaves as contiguous (B, T, H, ...) leaves for fla."""
    return {n: t.detach().transpose(1, 2).contiguous().requires_grad_() for n, t in x.items()}


def rel(a, b):
    """RMS-relative error of a against b, in float64."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def grads(out, leaves, seed=1):
    """Gradients of <o, W_o> + <S, W_S> (random W) with respect to leaves."""
    o, S = out
    gen = torch.Generator(device="cpu").manual_seed(seed)
    wo = torch.randn(o.shape, generator=gen).to(o.device)
    wS = torch.randn(S.shape, generator=gen).to(S.device)
    return torch.autograd.grad((o.float() * wo).sum() + (S.float() * wS).sum(), leaves)


def check(op, shape, dtype, device, fla):
    """Errors of one correctness case: Triton vs the float32 chunk path (o, S, gradients) and fla's o."""
    B, H, T, D = shape
    x = make_inputs(B, H, T, D, dtype, device)
    ref_in = {n: t.detach().float().requires_grad_() for n, t in x.items()}
    names = OPS[op].inputs
    out, ref = OPS[op](x, "triton"), OPS[op](ref_in, "chunk")
    errs = {"o": rel(out[0], ref[0]), "S": rel(out[1], ref[1])}
    for n, a, b in zip(names, grads(out, [x[n] for n in names]), grads(ref, [ref_in[n] for n in names])):
        errs["d" + n] = rel(a, b)
    if fla is not None and op in fla:
        errs["fla o"] = rel(fla[op](to_fla(x))[0].transpose(1, 2), ref[0])
    return errs


def cuda_time(fn, repeats, warmup=2):
    """(median, min, max) milliseconds of fn() over repeats, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2], times[0], times[-1]


def forward_backward(fn, x, names):
    """A callable running fn forward and backward through o (a fixed random dO) into the leaves."""
    def run():
        o = fn(x)[0]
        torch.autograd.backward(o, torch.ones_like(o))
        for n in names:
            x[n].grad = None
    return run


def time_op(op, shape, dtype, device, fla, repeats):
    """{mode: {impl: [median, min, max] ms}} of op at shape, forward ("fwd") and forward+backward
    ("fwd+bwd"), for Triton, the chunk path and fla (when fla is not None); an impl that raises
    gives "<impl>_error": its message instead."""
    x = make_inputs(*shape, dtype, device)
    xf = to_fla(x) if fla else None
    names = OPS[op].inputs
    out = {}
    for mode in ("fwd", "fwd+bwd"):
        row = {}
        for impl in ("triton", "chunk", "fla"):
            if impl == "fla" and (not fla or op not in fla):
                continue
            fn = fla[op] if impl == "fla" else (lambda x, impl=impl: OPS[op](x, impl))
            inp = xf if impl == "fla" else x
            call = forward_backward(fn, inp, names) if mode == "fwd+bwd" else (lambda fn=fn, inp=inp: fn(inp))
            try:
                with torch.no_grad() if mode == "fwd" else torch.enable_grad():
                    row[impl] = list(cuda_time(call, repeats))
            except Exception as e:                                               # noqa: BLE001 - report, go on
                row[impl + "_error"] = f"{type(e).__name__}: {e}"[:300]
        out[mode] = row
    del x, xf
    torch.cuda.empty_cache()
    return out


def grid_report(op, shape, dtype, sm_count, arch=90):
    """[(kernel name, programs, programs per SM)] of op's Triton launches, forward and backward, as
    made on a GPU of compute capability arch with sm_count SMs, recorded on meta tensors (no GPU needed)."""
    from mlexp.ops import triton_common
    from mlexp.ops.triton_check import op_launches
    B, H, T, D = shape
    rows = []
    assumed, triton_common.SMS_ELSEWHERE = triton_common.SMS_ELSEWHERE, sm_count
    try:
        launches = op_launches(op, B=B, H=H, T=T, Dk=D, Dv=D, dtype=dtype, arch=arch)
    finally:
        triton_common.SMS_ELSEWHERE = assumed
    for launch in launches:
        n = math.prod(launch["grid"])
        rows.append((launch["kernel"].__name__, n, n / sm_count))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    p.add_argument("--shapes", nargs="+", default=[",".join(map(str, s)) for s in SHAPES],
                   help="B,H,T,D for each timed shape")
    p.add_argument("--budget", type=float, default=900.0, help="seconds for the whole run")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--dry-run", action="store_true", help="print the plan and launch grids; time nothing")
    a = p.parse_args(argv)
    t_end = time.monotonic() + a.budget
    dtype = DTYPES[a.dtype]
    shapes = [tuple(int(s) for s in spec.split(",")) for spec in a.shapes]
    cuda = torch.cuda.is_available() and not a.dry_run
    sm = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    major, minor = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else (9, 0)
    print(f"# mlexp Triton kernels on {torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'} "
          f"({sm} SMs{'' if torch.cuda.is_available() else ', assumed'}), {a.dtype} inputs, torch "
          f"{torch.__version__}, triton {triton.__version__}")
    fla, why = fla_ops()
    print("fla: " + ("imported; its chunk kernels are compared" if fla else f"not importable ({why}); skipped"))
    if not cuda:
        print("No CUDA device (or --dry-run): nothing is run; the plan and the Triton launch grids follow.")
    device = torch.device("cuda")
    failed = 0
    print("\n## 1. Correctness: Triton vs the float32 chunk path (RMS-relative error; bound "
          f"{BOUND[dtype]:g})")
    for op in a.ops:
        for shape in CHECK_SHAPES:
            if not cuda:
                print(f"{op:>14} {shape}: would check o, S and every gradient")
                continue
            errs = check(op, shape, dtype, device, fla)
            # fla's error is shown, not judged: its fp32 path multiplies in TF32 (about 1e-3).
            bad = {n: e for n, e in errs.items() if n != "fla o" and not e <= BOUND[dtype]}
            failed += bool(bad)
            print(f"{op:>14} {shape}: {'PASS' if not bad else 'FAIL'}  "
                  + " ".join(f"{n} {e:.1e}" for n, e in errs.items()))
    if failed:
        print(f"\n{failed} correctness case(s) failed: not timing.")
        return 1
    print("\n## 2. Speed: median ms (min-max) of forward and forward+backward; ratios from this run")
    skipped = []
    for shape in shapes:
        print(f"\n### (B, H, T, D) = {shape}")
        for op in a.ops:
            grid = grid_report(op, shape, dtype, sm, 10 * major + minor)
            print(f"{op:>14} grids: " + ", ".join(f"{k} {n} ({r:.1f}/SM)" for k, n, r in grid))
            if not cuda:
                continue
            if time.monotonic() > t_end:
                skipped.append(f"{op} {shape}")
                continue
            for mode, row in time_op(op, shape, dtype, device, fla, a.repeats).items():
                for impl in [k for k in row if k.endswith("_error")]:
                    print(f"{op:>14} {mode:>7} {impl[:-len('_error')]} failed: {row.pop(impl)}")
                line = f"{op:>14} {mode:>7} " + " ".join(
                    f"{impl} {m:.3f} ({lo:.3f}-{hi:.3f})" for impl, (m, lo, hi) in row.items())
                if "triton" in row and "chunk" in row:
                    line += f" | chunk/triton {row['chunk'][0] / row['triton'][0]:.2f}"
                if "triton" in row and "fla" in row:
                    ratio = row["triton"][0] / row["fla"][0]
                    line += f" | triton/fla {ratio:.2f}"
                    if mode == "fwd+bwd" and shape[3] in (64, 128):
                        line += f" ({'<= 1.5x: yes' if ratio <= 1.5 else '<= 1.5x: NO'}, goal 1.2x)"
                print(line, flush=True)
    if skipped:
        print(f"\nTime budget ({a.budget:.0f} s) spent; not timed: " + ", ".join(skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
