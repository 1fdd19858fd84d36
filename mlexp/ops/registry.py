"""The one list of the ops: each op's name, callable, inputs, label and Triton kernels.

Every tool that goes over the ops reads :data:`OPS`: :mod:`mlexp.ops.triton_check` (recording and
compiling the kernels), ``benchmarks/ops.py`` (the CPU tables), ``benchmarks/ops_cuda.py`` and
``benchmarks/gpu_run.py`` (the GPU runs). A new op is one :class:`Op` here; what the benchmarks
compare it with in flash-linear-attention (fla), when fla has it, stays in the benchmark, keyed by
the op's name.

An op runs on a dict of named input tensors, the ones :func:`make_inputs` makes (all in the
(B, H, T, D) layout of mlexp.ops)::

    >>> from mlexp.ops.registry import OPS, make_inputs
    >>> x = make_inputs(1, 2, 16, 8)
    >>> o, S = OPS["gated_delta"](x, "chunk", chunk_size=16)
    >>> tuple(o.shape), tuple(S.shape)
    ((1, 2, 16, 8), (1, 2, 8, 8))

The registry imports no Triton: :attr:`Op.triton` imports its wrapper when called.
"""
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .delta import delta_rule, gated_delta_rule
from .gated import gated_linear_attention
from .linear import linear_attention

__all__ = ["Op", "OPS", "INPUT_NAMES", "input_shapes", "make_inputs", "op_label"]

# Every input an op may take, in the order make_inputs draws them.
INPUT_NAMES = ("q", "k", "v", "k_unit", "beta", "g", "g_ch")


@dataclass(frozen=True)
class Op:
    """One op of the family.

    name: its key in OPS and on every command line ("gated_delta"). label: how tables name it
    ("gated delta rule"). fn: the public op of mlexp.ops. inputs: the names (of INPUT_NAMES) of
    the tensors fn takes first, in order. kernels: the names of the Triton kernels its forward and
    backward launch (tests/test_ops_registry.py records them). triton: fn's Triton wrapper as
    ``triton(*tensors, S0, C) -> (o, S)``, with the tensors of ``inputs``, the initial state
    (B, H, Dk, Dv) and the chunk size (mlexp.ops.triton_check runs it on meta tensors).
    """
    name: str
    label: str
    fn: Callable
    inputs: tuple
    kernels: tuple
    triton: Callable

    def __call__(self, x, impl=None, **kwargs):
        """``fn`` on the tensors of the inputs dict ``x`` named by ``inputs``, with ``impl`` and any
        keyword of fn (chunk_size, initial_state, ...); returns what fn returns, (o, S).
        Raises KeyError when x lacks one of the inputs."""
        return self.fn(*(x[n] for n in self.inputs), impl=impl, **kwargs)


def _linear_triton(q, k, v, S0, C):
    from .triton_linear import triton_linear_attention
    o, S, _ = triton_linear_attention(q, k, v, S0, None, normalize=False, eps=0.0, chunk_size=C)
    return o, S


def _gated_triton(q, k, v, g, S0, C):
    from .triton_linear import triton_gated_linear_attention
    return triton_gated_linear_attention(q, k, v, g, S0, chunk_size=C)


def _delta_triton(q, k, v, beta, S0, C):
    from .triton_delta import delta_rule_triton
    return delta_rule_triton(q, k, v, beta, None, S0, C)


def _gated_delta_triton(q, k, v, beta, g, S0, C):
    from .triton_delta import delta_rule_triton
    return delta_rule_triton(q, k, v, beta, g, S0, C)


_CHUNK = ("state_fwd_kernel", "output_kernel", "state_bwd_kernel", "dv_kernel", "dqk_kernel")
_DELTA = ("wy_fwd_kernel", "delta_state_fwd_kernel", "output_kernel", "dv_kernel", "delta_state_bwd_kernel",
          "dqk_kernel", "wy_bwd_dx_kernel", "wy_bwd_da_kernel")
_CUMSUM = ("_cumsum_kernel",)   # the cumulative log-decay of a gate

OPS = {op.name: op for op in (
    Op("linear", "linear", linear_attention, ("q", "k", "v"), _CHUNK, _linear_triton),
    Op("gated_scalar", "gated, scalar g", gated_linear_attention, ("q", "k", "v", "g"), _CUMSUM + _CHUNK,
       _gated_triton),
    Op("gated_channel", "gated, per-channel g", gated_linear_attention, ("q", "k", "v", "g_ch"),
       _CUMSUM + _CHUNK + ("scores_channel_kernel", "dqk_intra_channel_kernel"), _gated_triton),
    Op("delta", "delta rule", delta_rule, ("q", "k_unit", "v", "beta"), _DELTA, _delta_triton),
    Op("gated_delta", "gated delta rule", gated_delta_rule, ("q", "k_unit", "v", "beta", "g"), _CUMSUM + _DELTA,
       _gated_delta_triton),
)}


def op_label(name):
    """The table label of the op called ``name``; ``name`` itself for a name the registry does not
    hold (a results file written before an op was renamed or removed)."""
    op = OPS.get(name)
    return op.label if op is not None else name


def input_shapes(B, H, T, Dk, Dv=None):
    """{input name: shape} for every name of INPUT_NAMES: q, k and the unit keys k_unit
    (B, H, T, Dk); v (B, H, T, Dv) (Dv defaults to Dk); beta and the per-head log-decay g
    (B, H, T); the per-key-channel log-decay g_ch (B, H, T, Dk)."""
    Dv = Dk if Dv is None else Dv
    return {"q": (B, H, T, Dk), "k": (B, H, T, Dk), "v": (B, H, T, Dv), "k_unit": (B, H, T, Dk),
            "beta": (B, H, T), "g": (B, H, T), "g_ch": (B, H, T, Dk)}


def make_inputs(B, H, T, D, dtype=torch.float32, device="cpu", seed=0, grad=True, positive=False):
    """Random inputs for every op, drawn in float32 on the CPU, then moved to ``device`` and ``dtype``.

    Returns {name: tensor} for each of INPUT_NAMES (shapes: :func:`input_shapes` with Dk = Dv = D):
    q and k times D ** -0.5 (``positive``: elu + 1 features instead), plain v, unit-norm keys
    k_unit for the delta rules, beta in (0, 1), log-decays g and g_ch (< 0, mostly near 0).
    ``seed``: a generator seeded so (None: torch's global generator). ``grad``: the tensors are
    leaves that require grad.
    """
    gen = None if seed is None else torch.Generator(device="cpu").manual_seed(seed)
    shapes = input_shapes(B, H, T, D)
    x = {n: torch.randn(*shapes[n], generator=gen) for n in INPUT_NAMES}
    for n in ("q", "k"):
        x[n] = F.elu(x[n]) + 1 if positive else x[n] * D ** -0.5
    x["k_unit"] = F.normalize(x["k_unit"], dim=-1)
    x["beta"] = torch.sigmoid(x["beta"])
    x["g"], x["g_ch"] = F.logsigmoid(x["g"] + 3), F.logsigmoid(x["g_ch"] + 3)
    return {n: t.to(device=device, dtype=dtype).requires_grad_(grad) for n, t in x.items()}
