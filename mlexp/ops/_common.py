"""Shared pieces of mlexp.ops: input checks, dtype policy and the choice of implementation."""
import importlib.util
import os

import torch

__all__ = [
    "IMPLS",
    "check_qkv",
    "check_state",
    "check_log_decay",
    "check_chunk_size",
    "compute_dtype",
    "resolve_impl",
    "triton_available",
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
    if bool((g > 0).any()):
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


def triton_available():
    """True when the triton package can be imported (it is not imported here)."""
    return importlib.util.find_spec("triton") is not None


def resolve_impl(impl, device, choices=IMPLS):
    """Pick an implementation: ``impl`` if given, else "triton" on CUDA with triton, else "chunk".

    Raises ValueError for a name outside ``choices`` and for "triton" on a CPU tensor unless the
    Triton interpreter is switched on (TRITON_INTERPRET=1, used by the tests).
    """
    if impl is None:
        return "triton" if device.type == "cuda" and triton_available() and "triton" in choices else "chunk"
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
    return impl
