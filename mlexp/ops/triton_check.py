"""Checks of the Triton kernels that need no GPU: compile them for one, and make the interpreter multiply like one.

* :func:`compile_op` records the launches the wrappers of mlexp.ops make for one op (forward and
  backward, on ``meta`` tensors: no data, no device), compiles each kernel ahead of time for a
  CUDA architecture with the ptxas that ships in the triton wheel (``triton.compile`` with a
  ``GPUTarget``), and reports registers, spilled bytes and shared memory per kernel.
* :func:`emulate_gpu_dots` patches Triton's CPU interpreter (TRITON_INTERPRET=1) so that tl.dot
  computes what a GPU computes: bf16 operands decoded (the interpreter keeps bf16 as raw 16-bit
  words and would multiply the bits), fp32 operands rounded to TF32 as ``input_precision``
  asks ("tf32": one product of rounded operands; "tf32x3": the three-product split), fp32
  accumulation. The interpreter alone ignores ``input_precision`` and computes in fp32.

The ops, their inputs and their Triton wrappers are those of :mod:`mlexp.ops.registry`.
Run ``python -m mlexp.ops.triton_check [--arch 80 90] [--head-dim 64 128 256]`` for the table.
"""
import argparse
import os
import re
import subprocess
import tempfile

import numpy as np
import torch

from . import registry

__all__ = ["SHARED_LIMIT", "OPS", "compile_op", "emulate_gpu_dots", "op_launches", "tf32_round"]

# Largest dynamic shared memory one block may use (bytes), per compute capability major*10+minor.
SHARED_LIMIT = {75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
OPS = registry.OPS   # name -> registry.Op: the ops whose kernels are recorded and compiled
_PTR = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int32: "i32",
        torch.int64: "i64"}


# ----------------------------------------------------------------------------- recording launches


def op_launches(op, B=1, H=1, T=256, Dk=64, Dv=64, dtype=torch.bfloat16, C=64, backward=True, arch=90):
    """The kernel launches (dicts from triton_common.launch) of one op's forward and backward, as the
    wrappers make them on a GPU of compute capability arch (e.g. 80 for 8.0).

    Runs the Triton wrappers on meta tensors under triton_common.recording(), so nothing executes
    and no device is needed. op is a name of OPS (mlexp.ops.registry); another raises ValueError.
    """
    from . import triton_common
    assumed = triton_common.CAPABILITY_ELSEWHERE
    triton_common.CAPABILITY_ELSEWHERE = divmod(arch, 10)
    try:
        return _record(op, B, H, T, Dk, Dv, dtype, C, backward)
    finally:
        triton_common.CAPABILITY_ELSEWHERE = assumed


def _record(op, B, H, T, Dk, Dv, dtype, C, backward):
    from . import triton_common
    if op not in OPS:
        raise ValueError(f"op must be one of {tuple(OPS)}, got {op!r}")
    shapes = registry.input_shapes(B, H, T, Dk, Dv)
    leaves = [torch.empty(*shapes[n], dtype=torch.float32 if n in ("g", "g_ch") else dtype, device="meta",
                          requires_grad=True) for n in OPS[op].inputs]
    S0 = torch.empty(B, H, Dk, Dv, dtype=torch.float32, device="meta", requires_grad=True)
    with triton_common.recording() as rec:
        o, S = OPS[op].triton(*leaves, S0, C)
        if backward:
            torch.autograd.backward((o, S), (torch.empty_like(o), torch.empty_like(S)))
    return rec


# ----------------------------------------------------------------------------- compiling


def _source(launch):
    """triton.compiler.ASTSource for a recorded launch: pointer and integer types from its arguments."""
    from triton.compiler import ASTSource
    kernel, args, constexprs = launch["kernel"], launch["args"], launch["constexprs"]
    names = [n for n in kernel.arg_names if n not in constexprs]
    if len(names) != len(args):
        raise ValueError(f"{kernel.__name__}: {len(args)} positional arguments for {names}")
    signature, attrs = {}, {}
    for i, (name, a) in enumerate(zip(names, args)):
        if isinstance(a, torch.Tensor):
            signature[name] = "*" + _PTR[a.dtype]
            attrs[(kernel.arg_names.index(name),)] = [["tt.divisibility", 16]]   # torch allocations are aligned
        elif isinstance(a, int):
            signature[name] = "i32" if -2**31 <= a < 2**31 else "i64"
        else:
            signature[name] = "fp32"
    for name in constexprs:
        signature[name] = "constexpr"
    signature = {n: signature[n] for n in kernel.arg_names}
    return ASTSource(kernel, signature, constexprs=dict(constexprs), attrs=attrs)


def _resources(cubin):
    """(registers, stack bytes per thread) of a cubin, from the cuobjdump bundled with triton.
    Triton kernels keep no local arrays, so the stack frame is spilled registers."""
    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    regs = re.search(r"REG:(\d+)", out)
    stack = re.search(r"STACK:(\d+)", out)
    return int(regs.group(1)), int(stack.group(1))


def compile_launch(launch, arch):
    """Compile one recorded launch for sm_<arch> (90 means sm_90a); return a result dict:
    name, arch, num_warps, num_stages, registers, spill (stack bytes per thread), shared (bytes),
    shared_limit, and the constexprs."""
    import triton
    from triton.backends.compiler import GPUTarget
    kern = triton.compile(_source(launch), target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=launch["num_warps"], num_stages=launch["num_stages"]))
    regs, stack = _resources(kern.asm["cubin"])
    return dict(name=launch["kernel"].__name__, arch=arch, num_warps=launch["num_warps"],
                num_stages=launch["num_stages"], registers=regs, spill=stack, shared=kern.metadata.shared,
                shared_limit=SHARED_LIMIT[arch], grid=launch["grid"],
                constexprs={k: v for k, v in launch["constexprs"].items()})


HEADS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)   # B*H: the state tiles narrow when the grid is small


def compile_op(op, arch, head_dim, dtype=torch.bfloat16, C=64, Dv=None, only=None, heads=HEADS):
    """Compile every distinct kernel launch of op (forward and backward) at head_dim for sm_<arch>,
    over batch*head counts ``heads`` so that every state tile the chooser can pick is compiled
    (only: a collection of kernel names to restrict to).

    Returns a list of compile_launch results. Raises whatever triton.compile raises (ptxas
    failures, out of resources), which is what a GPU would refuse at the first call.
    """
    seen, results = set(), []
    launches = [l for H in heads
                for l in op_launches(op, H=H, Dk=head_dim, Dv=head_dim if Dv is None else Dv, dtype=dtype, C=C,
                                     arch=arch)]
    for launch in launches:
        key = (launch["kernel"].__name__, tuple(sorted(launch["constexprs"].items())),
               tuple(str(a.dtype) if isinstance(a, torch.Tensor) else type(a).__name__ for a in launch["args"]))
        if key not in seen and (only is None or key[0] in only):
            seen.add(key)
            results.append(compile_launch(launch, arch))
    return results


# ----------------------------------------------------------------------------- interpreter emulation


def tf32_round(x):
    """Round a float32 numpy array to TF32 (10 mantissa bits), to nearest with ties away from zero,
    as the GPU's cvt.rna.tf32.f32 does before a TF32 tensor-core product."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def _as_float32(handle):
    """The float32 values of an interpreter tensor (bf16 is stored as raw uint16 words)."""
    import triton.language as tl
    if handle.dtype.scalar == tl.bfloat16:
        return (handle.data.astype(np.uint32) << 16).view(np.float32)
    return handle.data.astype(np.float32)


def emulate_gpu_dots():
    """Patch the Triton interpreter (in this process) so tl.dot and fp32 -> bf16 casts act as on a GPU.

    Call before the first kernel runs, with TRITON_INTERPRET=1 set before triton is imported.
    Returns the previous create_dot and cast_impl so a caller can restore them.
    """
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    old_dot, old_cast = builder.create_dot, builder.cast_impl

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        x, y = _as_float32(a), _as_float32(b)
        if a.dtype.scalar == tl.float32 and input_precision == ir.INPUT_PRECISION.TF32:
            out = tf32_round(x) @ tf32_round(y)
        elif a.dtype.scalar == tl.float32 and input_precision == ir.INPUT_PRECISION.TF32x3:
            xh, yh = tf32_round(x), tf32_round(y)
            xl, yl = tf32_round(x - xh), tf32_round(y - yh)
            out = xh @ yl + xl @ yh + xh @ yh                      # small products first, as Triton does
        else:
            out = x @ y                                            # ieee, or 16-bit operands: exact products
        return interp.TensorHandle((out.astype(np.float32) + d.data).astype(d.data.dtype), d.dtype.scalar)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:   # round to nearest even
            rounded = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16)
            return interp.TensorHandle(rounded.view(torch.int16).numpy().view(np.uint16), dst_type.scalar)
        return old_cast(self, src, dst_type)

    builder.create_dot, builder.cast_impl = create_dot, cast_impl
    return old_dot, old_cast


# ----------------------------------------------------------------------------- command line


def parser():
    """The command line of :func:`main`; its ``--ops`` are the names of the registry's OPS."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--arch", type=int, nargs="+", default=[80, 90])
    p.add_argument("--head-dim", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    p.add_argument("--heads", type=int, nargs="+", default=list(HEADS),
                   help="batch*head counts to record launches at (the state tiles narrow at small counts)")
    return p


def main(argv=None):
    """Print registers, spills and shared memory of every kernel of every op (compiles for minutes)."""
    a = parser().parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    print(f"{'op':<13} {'D':>4} {'sm':>3} {'kernel':<26} {'warps':>5} {'stages':>6} {'regs':>4} {'spill':>6} "
          f"{'smem KiB':>8}  tiles")
    for op in a.ops:
        for D in a.head_dim:
            for arch in a.arch:
                for r in compile_op(op, arch, D, dtype, heads=a.heads):
                    print(f"{op:<13} {D:>4} {arch:>3} {r['name']:<26} {r['num_warps']:>5} {r['num_stages']:>6} "
                          f"{r['registers']:>4} {r['spill']:>6} {r['shared'] / 1024:>8.1f}  "
                          f"{r['constexprs'].get('BK', '')}x{r['constexprs'].get('BV', '')}", flush=True)


if __name__ == "__main__":
    main()
