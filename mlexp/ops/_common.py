"""Shared pieces of mlexp.ops: input checks, the dtype rule, dispatch, log-decay sums and the non-finite guard."""
import contextlib
import importlib.util
import math
import os

import torch

__all__ = [
    "IMPLS",
    "check_qkv",
    "check_state",
    "check_log_decay",
    "check_values",
    "check_chunk_size",
    "compute_dtype",
    "autocast_off",
    "resolve_impl",
    "triton_available",
    "decay_into",
    "decay_after",
    "decay_pairs",
    "finite_guard",
    "empty_output",
    "fresh_state",
    "SPAN",
    "mild_decay",
    "scan_states",
    "matmul_add",
]

# The implementations every op offers (an op may add or drop one; it passes its own list).
IMPLS = ("recurrent", "parallel", "chunk", "triton")

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_qkv(q, k, v):
    """Check q, k: (B, H, T, Dk) and v: (B, H, T, Dv); return (B, H, T, Dk, Dv).

    Raises ValueError when an argument is not a 4-D floating tensor, when the batch, head or
    time sizes differ, when q and k disagree on Dk, or when dtypes or devices differ.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(
                f"{name} must have shape (B, H, T, D) (4 dims), got {tuple(x.shape)}; "
                "split heads first, e.g. x.view(B, T, H, D).transpose(1, 2)"
            )
        if x.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape (B, H, T, Dk), got {tuple(q.shape)} and {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must share (B, H, T) with q, got {tuple(v.shape)} vs {tuple(q.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}; cast them first")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, H, T, Dk = q.shape
    return B, H, T, Dk, v.shape[-1]


def check_state(state, shape, device, name="initial_state"):
    """Check that ``state`` is a tensor of ``shape`` on ``device``; raise ValueError otherwise."""
    if not isinstance(state, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {tuple(shape)}, got {type(state).__name__}")
    if tuple(state.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(state.shape)}")
    if state.device != device:
        raise ValueError(f"{name} is on {state.device} but q is on {device}; move it with .to(q.device)")
    if state.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be a floating tensor, got {state.dtype}")


def check_values(t) -> bool:
    """Whether to run the argument checks that read tensor values (g <= 0, beta in [0, 2], unit
    keys): always for CPU tensors; on a GPU only when the environment variable MLEXP_CHECK_VALUES
    is "1", since reading a value back waits for the GPU (a host sync) and blocks CUDA graphs and
    torch.compile on the hot path. Shape, dtype and device checks always run."""
    return t.device.type == "cpu" or os.environ.get("MLEXP_CHECK_VALUES") == "1"


def check_log_decay(g, q):
    """Check a log-decay g of shape (B, H, T) or (B, H, T, Dk) against q; return True if per channel.

    g holds log(alpha) <= 0 (alpha in (0, 1]); a positive entry would make the state grow, so it
    raises ValueError, as it does for a wrong shape, device or a non-floating dtype.
    """
    if not isinstance(g, torch.Tensor):
        raise ValueError(f"g must be a torch.Tensor, got {type(g).__name__}")
    B, H, T, Dk = q.shape
    if tuple(g.shape) == (B, H, T):
        per_channel = False
    elif tuple(g.shape) == (B, H, T, Dk):
        per_channel = True
    else:
        raise ValueError(
            f"g must have shape (B, H, T) = {(B, H, T)} (one decay per head and token) or "
            f"(B, H, T, Dk) = {(B, H, T, Dk)} (one per key channel), got {tuple(g.shape)}"
        )
    if g.device != q.device:
        raise ValueError(f"g is on {g.device} but q is on {q.device}; move it with .to(q.device)")
    if g.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"g must be a floating tensor, got {g.dtype}")
    if check_values(g) and bool((g > 0).any()):
        raise ValueError(
            "g is a log-decay and must be <= 0 (decay alpha = exp(g) in (0, 1]); "
            "build it as e.g. g = -softplus(x) or g = logsigmoid(x)"
        )
    return per_channel


def check_chunk_size(chunk_size):
    """Raise ValueError unless chunk_size is a positive int."""
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def compute_dtype(dtype):
    """The dtype the ops accumulate in: float64 stays float64, everything else uses float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def autocast_off(device):
    """A context in which autocast is off on ``device`` (a torch.device); every op runs inside it.

    The ops keep their own dtype rule (compute_dtype: 16-bit inputs accumulate in float32) and
    return the output in the inputs' dtype. Under ``torch.autocast`` the matmuls would otherwise
    come back in bfloat16/float16, where the rule needs float32: the in-place accumulation of
    matmul_add refuses that ("Bad in-place call"), and the triangular solve of the delta rule has
    no bfloat16 kernel on CPU. With autocast off inside, a model run under autocast gets the same
    op results as without it (its bf16 q, k, v give a bf16 output). Devices autocast does not
    know get a context that does nothing.
    """
    if device.type not in ("cpu", "cuda"):
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False)


def triton_available():
    """True when the triton package can be imported (it is not imported here)."""
    return importlib.util.find_spec("triton") is not None


def resolve_impl(impl, device, dtype, choices=IMPLS):
    """Pick an implementation for inputs of ``dtype`` on ``device``; the one dtype rule of all four ops.

    The default (``impl=None``) never loses precision the caller asked for: "triton" for CUDA
    tensors when triton imports and the op offers it, except float64 inputs, which the Triton
    kernels (float32 inside) cannot honour and which therefore go to "chunk"; "chunk" everywhere
    else. An explicit request is honoured or refused, never silently downgraded.

    Raises ValueError for a name outside ``choices``; for "triton" without the triton package,
    on a CPU tensor unless the interpreter is on (TRITON_INTERPRET=1, used by the tests), or
    with float64 inputs.
    """
    if impl is None:
        gpu = device.type == "cuda" and "triton" in choices and triton_available()
        return "triton" if gpu and dtype != torch.float64 else "chunk"
    if impl not in choices:
        raise ValueError(f"impl must be one of {', '.join(map(repr, choices))} or None, got {impl!r}")
    if impl == "triton":
        if not triton_available():
            raise ValueError("impl='triton' needs the triton package; install it or use impl='chunk'")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                f"impl='triton' needs CUDA tensors (got {device}); use impl='chunk' on CPU, "
                "or set TRITON_INTERPRET=1 before importing triton to run the kernels in its interpreter"
            )
        if dtype == torch.float64:
            raise ValueError(
                "impl='triton' computes in float32 and cannot honour float64 inputs; use impl='chunk' "
                "(what impl=None picks for float64) or cast the inputs to float32"
            )
    return impl


def empty_output(v, *others):
    """The output of an op on B = 0, H = 0 or T = 0: an empty (B, H, T, Dv) tensor in v's dtype.

    Every op returns it before dispatch (so the Triton path never sees an empty launch), with a
    copy of the initial state as the final state (see fresh_state). It is v * 0 plus 0 * the sum of the other inputs, so
    autograd gives every input a (zero, empty) gradient, as it would for any other shape.
    """
    o = v * 0
    for x in others:
        if x is not None:
            o = o + 0 * x.sum()
    return o


def fresh_state(state):
    """A new tensor equal to ``state`` (any shape and dtype), or None for None: the final state of an
    op on an empty input. The op never hands back the caller's ``initial_state`` object itself,
    so writing into the returned state (``S += ...``, ``S.zero_()``) leaves the caller's tensor
    as it was, on every T, as for T > 0. The copy is differentiable (``clone``)."""
    return None if state is None else state.clone()


# ----------------------------------------------------------------------------- log-decay sums
# A pair written at token j and read at token i >= j decays by exp(g_{j+1} + ... + g_i). Formed as
# a difference b_i - b_j of one running sum b = cumsum(g), it breaks at a hard reset: g = -inf
# gives -inf - (-inf) = nan, and a large finite gate (-1e9) makes b so large that float32 can no
# longer hold the small gates after it (b_i - b_j rounds to 0). So the PyTorch paths form each
# exponent they need as a direct sum of the gates it spans: a sum of numbers <= 0, exact to a few
# ulps of itself for any g in [-inf, 0], never a difference (the one exception, the product form
# of mild chunks below, is used only where |b| <= 30, so no reset and no lost gate can occur).
# Three sums cover every use:


def decay_into(g, skip_first=False):
    """Log-decay from a block's start through token i, g_0 + ... + g_i: (..., L, d) -> (..., L, d).

    ``skip_first=True`` leaves out the first gate: g_1 + ... + g_i (0 at token 0), the decay
    from token 0 to token i.
    """
    if skip_first:
        g = torch.cat([torch.zeros_like(g[..., :1, :]), g[..., 1:, :]], dim=-2)
    return g.cumsum(-2)


def decay_after(g):
    """Log-decay after token j to the block's end, g_{j+1} + ... + g_{L-1} (0 at the last token).

    (..., L, d) -> (..., L, d); a reversed running sum of the shifted gates, not total - into.
    """
    rest = torch.cat([g[..., 1:, :], torch.zeros_like(g[..., :1, :])], dim=-2)
    return rest.flip(-2).cumsum(-2).flip(-2)


def decay_pairs(g):
    """Log-decay between every pair, D_ij = g_{j+1} + ... + g_i for j <= i (0 on the diagonal), -inf above.

    (..., L, d) -> (..., L, L, d): for each column j a running sum down the rows of the gates
    below it, so exp(D) is the causal decay matrix (0 above the diagonal) for any g in [-inf, 0].
    """
    L = g.shape[-2]
    idx = torch.arange(L, device=g.device)
    below = (idx[:, None] > idx[None, :])[:, :, None]                 # (L, L, 1): row t > column j
    D = torch.where(below, g[..., :, None, :], 0.0).cumsum(-3)          # (..., L, L, d)
    return D.masked_fill((idx[:, None] < idx[None, :])[:, :, None], float("-inf"))


# The chunkwise forms need exp(D_ij) for every pair of a chunk. For most chunks a cheaper form is
# exact enough: exp(b_i - b_j) = exp(b_i) * exp(-b_j) with b = decay_into(g), which turns the
# decayed scores into one matmul of pre-scaled operands, (Q * e^b)(K * e^-b)^T. It holds to
# float32's relative accuracy while e^-b stays within e^SPAN (~1e13); a chunk that decays more (a
# hard reset, a strong gate, NaN) is "strong" and takes the exact form from decay_pairs instead.
SPAN = 30.0


def mild_decay(g, span=SPAN):
    """Factors of the one-matmul form for blocks of gates g (..., C, d), and the blocks that cannot use it.

    Returns (b, e_in, e_out, strong): b = decay_into(g); e_in = exp(b), in [0, 1]; e_out =
    1 / max(e_in, e^-span), in [1, e^span]; strong (...,) bool, True for a block whose decay passes
    e^-span in some channel (or is NaN). For the other blocks e_in_i * e_out_j = exp(b_i - b_j)
    and e_in_last * e_out_j = exp(b_last - b_j); for strong blocks e_out is clamped only to stay
    finite, and the caller replaces what it computes from them.
    """
    b = decay_into(g)
    e_in = b.exp()
    strong = ~(b[..., -1, :] >= -span).all(-1)                           # NaN compares False: strong
    e_out = e_in.clamp(min=math.exp(-span)).reciprocal() if bool(strong.any()) else e_in.reciprocal()
    return b, e_in, e_out, strong


def scan_states(S0, writes, decays=None):
    """The state entering each block, and the final one: S_{n+1} = decays_n * S_n + writes_n.

    S0 (B, H, Dk, Dv); writes (B, H, N, Dk, Dv); decays None or (B, H, N, Dk or 1, 1).
    Returns (B, H, N, Dk, Dv) and (B, H, Dk, Dv). A loop of N cheap additions (faster on CPU than
    a cumulative sum over the block axis, and exact for any decay in [0, 1]).
    """
    S, before = S0, []
    decays = [None] * writes.shape[2] if decays is None else decays.unbind(2)
    for write, decay in zip(writes.unbind(2), decays):     # unbind: one stack in the backward, not
        before.append(S)                                    # a zero-filled full-size gradient per slice
        S = S + write if decay is None else torch.addcmul(write, decay, S)
    return torch.stack(before, dim=2), S


def matmul_add(c, a, b):
    """c + a @ b over any leading dims, as one fused batched matmul that accumulates into c.

    ``c`` must be a temporary of the caller's (it is overwritten and returned), contiguous, and
    not needed by autograd (e.g. the output of a matmul: its backward reads the factors, not the
    product). In place, torch.baddbmm_ skips the copy of c that the out-of-place form makes
    (measured: the scalar-gated chunkwise forward takes about 6% less time on a CPU).
    """
    out = c.view(-1, *c.shape[-2:])
    out.baddbmm_(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]))
    return c


# ----------------------------------------------------------------------------- non-finite inputs


def finite_guard(path, q, k, v, g=None, beta=None):
    """Run ``path(q, k, v, g, beta) -> (o, *states)`` so that a non-finite input spoils no earlier output.

    The masked products of the parallel and chunkwise forms multiply zeros (weights of future
    tokens) by the future values; 0 * nan = nan, so one NaN at token t would turn every output
    of its block (its whole head, for "parallel") into NaN, where the loop keeps outputs before t.
    The common case costs one sum: if o and the states are finite, no input was non-finite and
    the result stands. Otherwise the inputs are checked per token; if one is NaN or +-inf (g:
    NaN; -inf is a hard reset, not an error), the path runs again on inputs with those entries
    set to 0, and then, per batch and head:
      - a token whose query is non-finite gets a NaN output (the query is read only there);
      - from the first token whose k, v, g or beta is non-finite on, every output and the final
        states are NaN (that write reaches the state, so every later read).
    Outputs before the first bad token are the loop's (to rounding), and finite. (The loop can leave some
    later entries finite, e.g. other value columns; here the whole rest of that head is NaN.)
    Autograd flows through the finite entries.
    """
    out = path(q, k, v, g, beta)
    if bool(torch.isfinite(sum(x.sum() for x in out if x is not None))):
        return out
    def bad_rows(x, nan_only=False):                                    # (B, H, T, ...) -> (B, H, T)
        bad = x.isnan() if nan_only else ~x.isfinite()
        return bad if bad.dim() == 3 else bad.any(-1)
    bad_q = bad_rows(q)
    bad_w = bad_rows(k) | bad_rows(v)
    if g is not None:
        bad_w |= bad_rows(g, nan_only=True)
    if beta is not None:
        bad_w |= bad_rows(beta)
    if not (bool(bad_q.any()) or bool(bad_w.any())):
        return out                                                      # finite inputs that overflowed
    clean = [None if x is None else torch.where(x.isnan() if x is g else ~x.isfinite(), 0.0, x)
             for x in (q, k, v, g, beta)]
    o, *states = path(*clean)
    after = bad_w.cumsum(dim=2) > 0                                     # at or after the first bad write
    o = o.masked_fill((after | bad_q)[..., None], float("nan"))
    spoilt = after[:, :, -1]                                            # (B, H)
    states = [None if s is None else s.masked_fill(spoilt.view(*spoilt.shape, *[1] * (s.dim() - 2)), float("nan"))
              for s in states]
    return (o, *states)
