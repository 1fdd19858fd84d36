"""Causal linear attention three ways: a recurrent loop, a masked T x T product, and chunkwise."""
import torch
import torch.nn.functional as F

from ._common import (autocast_off, check_chunk_size, check_qkv, check_state, compute_dtype, empty_output,
                      finite_guard, fresh_state, matmul_add, resolve_impl, scan_states)

__all__ = ["linear_attention"]


def linear_attention(q, k, v, *, normalize=False, initial_state=None, impl=None, chunk_size=64,
                     eps=1e-6, scale=None):
    """Causal linear attention: S_t = S_{t-1} + k_t v_t^T, o_t = q_t^T S_t (Katharopoulos et al., 2020).

    The feature map phi (e.g. elu + 1) is applied by the caller; this op sees the features.
    With ``normalize=True`` a normaliser z_t = z_{t-1} + k_t is kept too and
    o_t = q_t^T S_t / (q_t . z_t + eps). Token t attends to itself and to every earlier token.

    Args:
        q, k: (B, H, T, Dk) queries and keys; v: (B, H, T, Dv) values. One floating dtype and
            one device for all three. float16/bfloat16 inputs accumulate in float32 (the PyTorch
            paths compute in float32; the Triton kernels multiply 16-bit operands as such).
        normalize: divide by q . z as above (z accumulated in float32, or float64 for float64).
        initial_state: the state before token 0, same form as the returned state: S of shape
            (B, H, Dk, Dv), or the tuple (S, z) with z (B, H, Dk) when ``normalize``. None = zeros.
        impl: "recurrent" (loop over t, the reference), "parallel" (masked T x T matrix,
            O(T^2 D) time and O(T^2) memory), "chunk" (blocks of ``chunk_size`` tokens,
            O(T C D + T D^2), the CPU default) or "triton" (GPU kernels, the CUDA default).
        chunk_size: C, the block length of the chunkwise and Triton paths (any T works; the last
            block is padded internally).
        eps: added to q . z before dividing (only with ``normalize``); it keeps a query whose
            features are all zero from dividing by zero. With positive features q . z > 0 anyway.
        scale: optional multiplier applied to q (e.g. Dk ** -0.5); None means 1.

    Returns:
        (o, final_state): o of shape (B, H, T, Dv) in the input dtype; final_state S (B, H, Dk, Dv),
        or (S, z) when ``normalize``, in float32 (float64 for float64 inputs); always new tensors
        (at T = 0 a copy of ``initial_state``), so writing into them never changes the caller's.

    Raises:
        ValueError: wrong shapes, dtypes or devices (messages say which argument), a bad
            ``impl`` or ``chunk_size``, or "triton" requested where it cannot run (no triton,
            a CPU tensor without TRITON_INTERPRET=1, float64 inputs).

    Non-finite inputs: a NaN or +-inf in q spoils only that token's output; one in k, v
        spoils that token's output, every later output of its batch and head, and the final
        state (all NaN), and nothing before it, on every path (see _common.finite_guard).

    Example (keys (1, 0) and (0, 1): each query reads the value written under its key):

        >>> import torch
        >>> q = k = torch.eye(2).view(1, 1, 2, 2)
        >>> v = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
        >>> o, S = linear_attention(q, k, v)
        >>> o[0, 0].tolist(), S[0, 0].tolist()
        ([[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], [3.0, 4.0]])
    """
    B, H, T, Dk, Dv = check_qkv(q, k, v)
    with autocast_off(q.device):                                # the dtype rule holds under autocast too
        return _linear_attention(q, k, v, normalize, initial_state, impl, chunk_size, eps, scale)


def _linear_attention(q, k, v, normalize, initial_state, impl, chunk_size, eps, scale):
    """linear_attention after the q, k, v check, with autocast off."""
    B, H, T, Dk, Dv = *q.shape, v.shape[-1]
    check_chunk_size(chunk_size)
    impl = resolve_impl(impl, q.device, q.dtype)
    acc = compute_dtype(q.dtype)
    S0, z0 = _initial_state(initial_state, normalize, (B, H, Dk, Dv), q, acc)
    if B * H * T == 0:                                          # empty in, empty out; a copy of the state
        S0, z0 = fresh_state(S0), fresh_state(z0)
        return empty_output(v, q, k), ((S0, z0) if normalize else S0)
    if scale is not None:
        q = q * scale
    if impl == "triton":
        from .triton_linear import triton_linear_attention
        o, S, z = triton_linear_attention(q, k, v, S0, z0, normalize=normalize, eps=eps, chunk_size=chunk_size)
    elif impl == "recurrent":
        o, S, z = _recurrent(q.to(acc), k.to(acc), v.to(acc), S0, z0, eps)
    else:
        path = (lambda q, k, v, *_: _parallel(q, k, v, S0, z0, eps)) if impl == "parallel" else \
               (lambda q, k, v, *_: _chunk(q, k, v, S0, z0, eps, chunk_size))
        o, S, z = finite_guard(path, q.to(acc), k.to(acc), v.to(acc))
    return o.to(v.dtype), ((S, z) if normalize else S)


def _initial_state(initial_state, normalize, shape, q, acc):
    """Return (S0, z0) in the accumulation dtype: zeros when None, z0 None unless normalising."""
    B, H, Dk, Dv = shape
    if initial_state is None:
        S0 = q.new_zeros(shape, dtype=acc)
        return S0, (q.new_zeros((B, H, Dk), dtype=acc) if normalize else None)
    if normalize:
        if not (isinstance(initial_state, (tuple, list)) and len(initial_state) == 2):
            raise ValueError("with normalize=True, initial_state must be the tuple (S, z) returned as final_state")
        S0, z0 = initial_state
        check_state(S0, shape, q.device, "initial_state[0] (S)")
        check_state(z0, (B, H, Dk), q.device, "initial_state[1] (z)")
        return S0.to(acc), z0.to(acc)
    if isinstance(initial_state, (tuple, list)):
        raise ValueError("with normalize=False, initial_state is the tensor S (B, H, Dk, Dv), not a tuple")
    check_state(initial_state, shape, q.device)
    return initial_state.to(acc), None


def _recurrent(q, k, v, S, z, eps):
    """The reference: one token at a time, exactly the equations in the docstring."""
    outs = []
    for t in range(q.shape[2]):
        S = S + k[:, :, t, :, None] * v[:, :, t, None, :]   # (B, H, Dk, 1) * (B, H, 1, Dv) -> (B, H, Dk, Dv)
        o = torch.einsum("bhk,bhkv->bhv", q[:, :, t], S)     # q_t^T S_t: (B, H, Dv)
        if z is not None:
            z = z + k[:, :, t]                                 # (B, H, Dk)
            o = o / ((q[:, :, t] * z).sum(-1, keepdim=True) + eps)
        outs.append(o)
    return torch.stack(outs, dim=2), S, z                      # (B, H, T, Dv)


def _parallel(q, k, v, S0, z0, eps):
    """All T outputs at once through the masked T x T score matrix (quadratic in T)."""
    A = (q @ k.transpose(-1, -2)).tril_()                      # (B, H, T, Dk) x (B, H, Dk, T) -> (B, H, T, T)
    o = A @ v + q @ S0                                          # (B, H, T, Dv)
    S = S0 + k.transpose(-1, -2) @ v                            # (B, H, Dk, Dv)
    z = None
    if z0 is not None:
        den = A.sum(-1) + (q @ z0[..., None])[..., 0]         # q_t . z_t: (B, H, T)
        o = o / (den[..., None] + eps)                          # (B, H, T, Dv) / (B, H, T, 1)
        z = z0 + k.sum(2)
    return o, S, z


def _chunk(q, k, v, S0, z0, eps, C):
    """Chunkwise form: inside a block of C tokens a masked C x C product, across blocks the state.

    Every block reads the state left by the blocks before it, S_prev, so
    O_c = Q_c S_prev + tril(Q_c K_c^T) V_c. Only the sum of the blocks' writes K_c^T V_c into the
    states is sequential (T / C cheap additions); every matmul runs batched over all blocks.
    Cost O(T C D + T D^2).
    """
    B, H, T, Dk = q.shape
    N = -(-T // C)                                              # number of blocks, ceil(T / C)
    pad = N * C - T                                             # zero tokens add nothing to S or z
    q, k, v = (F.pad(x, (0, 0, 0, pad)) if pad else x for x in (q, k, v))
    q, k, v = (x.reshape(B, H, N, C, x.shape[-1]) for x in (q, k, v))
    A = (q @ k.transpose(-1, -2)).tril_()                      # (B, H, N, C, Dk) x (.., Dk, C) -> (B, H, N, C, C)
    kv = k.transpose(-1, -2) @ v                                # each block's write: (B, H, N, Dk, Dv)
    S_prev, S = scan_states(S0, kv)                             # state entering each block: (B, H, N, Dk, Dv)
    o = matmul_add(q @ S_prev, A, v)                            # (B, H, N, C, Dv)
    z = None
    if z0 is not None:
        z_after = z0[:, :, None] + k.sum(3).cumsum(dim=2)      # normaliser after each block: (B, H, N, Dk)
        z_prev = torch.cat([z0[:, :, None], z_after[:, :, :-1]], dim=2)
        den = A.sum(-1) + (q @ z_prev[..., None])[..., 0]       # q_t . z_t: (B, H, N, C)
        o = o / (den[..., None] + eps)
        z = z_after[:, :, -1]
    o = o.reshape(B, H, N * C, -1)[:, :, :T]                    # drop the padding: (B, H, T, Dv)
    return o, S, z
