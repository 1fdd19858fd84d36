"""Gated (decaying) linear attention: a scalar decay per head and token, or one per key channel."""
import torch
import torch.nn.functional as F

from ._common import (SPAN, autocast_off, check_chunk_size, check_log_decay, check_qkv, check_state,
                      compute_dtype, decay_after, decay_into, decay_pairs, empty_output, finite_guard,
                      fresh_state, matmul_add, mild_decay, resolve_impl, scan_states)

__all__ = ["gated_linear_attention"]

SUB = 16  # sub-block length inside a strongly decaying chunk for per-channel decay (see _exact_scores)


def gated_linear_attention(q, k, v, g, *, initial_state=None, impl=None, chunk_size=64, scale=None):
    """Linear attention with a decaying state: S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = q_t^T S_t.

    The decay is given in log space, g = log(alpha) <= 0; g = -inf is a hard reset (alpha = 0,
    e.g. at a document boundary). A pair written at token j is read at token i with weight
    exp(g_{j+1} + ... + g_i). Every path forms that exponent as a direct sum of the gates it
    spans (_common.decay_pairs, decay_into, decay_after), never as a difference of two running
    sums, which gives NaN after a -inf gate and loses the small gates after a large one; so any
    g in [-inf, 0] gives the loop's answer to float32 accuracy. Chunks that decay by at most
    e^-30 form their decayed scores as one matmul, (Q e^b)(K e^-b)^T (_common.mild_decay).
    Sources: RetNet (Sun et al., 2023) and Mamba-2 (Dao and Gu, 2024) for a scalar decay per
    head (and token); GLA (Yang et al., 2023) for a decay per key channel and the sub-block
    chunkwise form used for chunks that decay strongly.

    Args:
        q, k: (B, H, T, Dk); v: (B, H, T, Dv). One floating dtype and one device; float16 and
            bfloat16 are computed in float32.
        g: log-decay <= 0, shape (B, H, T) (one scalar per head and token) or (B, H, T, Dk)
            (one per key channel, which decays row d of S).
        initial_state: S before token 0, (B, H, Dk, Dv); None means zeros.
        impl: "recurrent" (loop over t, the reference), "parallel" (T x T decay-masked scores;
            with a per-channel g it builds a (T, T, Dk) tensor, small T only), "chunk" (the CPU
            default) or "triton" (the CUDA default).
        chunk_size: C, block length of the chunkwise and Triton paths (any T works; Triton takes
            16, 32 or 64, and works on 16 x 16 sub-chunk tiles with a per-channel g).
        scale: optional multiplier on q; None means 1.

    Returns:
        (o, S): o (B, H, T, Dv) in the input dtype; S (B, H, Dk, Dv) in float32 (float64 for
        float64 inputs), a new tensor (at T = 0 a copy of ``initial_state``).

    Raises:
        ValueError: wrong shapes, dtypes or devices, a positive g, a bad ``impl`` or ``chunk_size``,
            or "triton" requested where it cannot run (see :func:`linear_attention`).

    Non-finite inputs: a NaN or +-inf in q spoils only that token's output; one in k, v or g (NaN;
        -inf is a reset)
        spoils that token's output, every later output of its batch and head, and the final
        state (all NaN), and nothing before it, on every path (see _common.finite_guard).

    Example (decay 1/2 per token: the state is 1, 1.5, 1.75):

        >>> import torch
        >>> q = k = v = torch.ones(1, 1, 3, 1)
        >>> g = torch.full((1, 1, 3), 0.5).log()
        >>> o, S = gated_linear_attention(q, k, v, g)
        >>> [round(x, 4) for x in o.flatten().tolist()]
        [1.0, 1.5, 1.75]
    """
    check_qkv(q, k, v)
    with autocast_off(q.device):                           # the dtype rule holds under autocast too
        return _gated_linear_attention(q, k, v, g, initial_state, impl, chunk_size, scale)


def _gated_linear_attention(q, k, v, g, initial_state, impl, chunk_size, scale):
    """gated_linear_attention after the q, k, v check, with autocast off."""
    B, H, T, Dk, Dv = *q.shape, v.shape[-1]
    per_channel = check_log_decay(g, q)
    check_chunk_size(chunk_size)
    impl = resolve_impl(impl, q.device, q.dtype)
    out_dtype, acc = v.dtype, compute_dtype(q.dtype)
    if initial_state is None:
        S0 = q.new_zeros((B, H, Dk, Dv), dtype=acc)
    else:
        check_state(initial_state, (B, H, Dk, Dv), q.device)
        S0 = initial_state.to(acc)
    if B * H * T == 0:                                     # empty in, empty out; a copy of the state
        return empty_output(v, q, k, g), fresh_state(S0)
    if scale is not None:
        q = q * scale
    if impl == "triton":
        from .triton_linear import triton_gated_linear_attention
        o, S = triton_gated_linear_attention(q, k, v, g, S0, chunk_size=chunk_size)
        return o.to(out_dtype), S
    q, k, v, g = (x.to(acc) for x in (q, k, v, g))
    if not per_channel:
        g = g[..., None]                                   # (B, H, T, 1): broadcasts over channels
    if impl == "recurrent":
        o, S = _recurrent(q, k, v, g, S0)
    elif impl == "parallel":
        o, S = finite_guard(lambda q, k, v, g, _: _parallel(q, k, v, g, S0, per_channel), q, k, v, g)
    else:
        o, S = finite_guard(lambda q, k, v, g, _: _chunk(q, k, v, g, S0, per_channel, chunk_size), q, k, v, g)
    return o.to(out_dtype), S


def _recurrent(q, k, v, g, S):
    """The reference: decay the state, write k_t v_t^T, read with q_t; g is (B, H, T, 1 or Dk)."""
    outs = []
    for t in range(q.shape[2]):
        S = g[:, :, t, :, None].exp() * S                      # decay row d by exp(g_t[d]): (B, H, Dk, Dv)
        S = S + k[:, :, t, :, None] * v[:, :, t, None, :]      # write k_t v_t^T
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    return torch.stack(outs, dim=2), S


def _decay_scores(q, k, D):
    """sum_d q_id k_jd exp(D_ijd): q, k (..., L, Dk) and pair log-decays D (..., L, L, Dk) -> (..., L, L)."""
    return torch.einsum("...id,...jd,...ijd->...ij", q, k, D.exp())


def _parallel(q, k, v, g, S0, per_channel):
    """All outputs at once, the whole sequence as one block: O = (QK^T * Gamma) V + (Q * e^b) S_0."""
    if per_channel:
        A = _decay_scores(q, k, decay_pairs(g))                 # (B, H, T, T) via a (T, T, Dk) tensor
    else:
        A = (q @ k.transpose(-1, -2)) * decay_pairs(g)[..., 0].exp()   # (B, H, T, T)
    into = decay_into(g)                                        # (B, H, T, 1 or Dk)
    o = A @ v + (q * into.exp()) @ S0                           # the initial state decays by exp(b_t)
    total = into[:, :, -1:].transpose(-1, -2)                   # (B, H, 1 or Dk, 1): decays rows of S
    S = total.exp() * S0 + (k * decay_after(g).exp()).transpose(-1, -2) @ v
    return o, S


def _exact_scores(q, k, g, sub=SUB):
    """Decayed causal scores of blocks that decay strongly: (M, C, Dk) x2, g (M, C, 1 or Dk) -> (M, C, C).

    A scalar gate takes the (C, C) decay matrix exp(decay_pairs). A per-channel gate takes
    sub-blocks of ``sub`` queries: on the diagonal the exact (sub, sub, Dk) form; left of it the
    decay from j to i is split at the sub-block's first token p as
    exp(g_{p+1} + .. + g_i) * exp(g_{j+1} + .. + g_p), two true decays in [0, 1], so a plain
    matmul is exact and cannot overflow (the secondary chunking of GLA, Yang et al., 2023).
    """
    if g.shape[-1] == 1:
        return (q @ k.transpose(-1, -2)) * decay_pairs(g)[..., 0].exp()
    C = q.shape[-2]
    rows = []
    for p in range(0, C, sub):
        e = min(p + sub, C)
        gi = g[..., p:e, :]
        parts = []
        if p > 0:
            q_p = q[..., p:e, :] * decay_into(gi, skip_first=True).exp()    # decay p -> i: (..., c, Dk)
            k_p = k[..., :p, :] * decay_after(g[..., :p + 1, :])[..., :p, :].exp()  # j -> p: (..., p, Dk)
            parts.append(q_p @ k_p.transpose(-1, -2))           # (..., c, p)
        parts.append(_decay_scores(q[..., p:e, :], k[..., p:e, :], decay_pairs(gi)))   # (..., c, c)
        if e < C:
            parts.append(q.new_zeros(*q.shape[:-2], e - p, C - e))
        rows.append(torch.cat(parts, dim=-1))
    return torch.cat(rows, dim=-2)


def _chunk(q, k, v, g, S0, per_channel, C):
    """Chunkwise form: decayed masked scores inside each block of C tokens, the state across blocks.

    Inside a block, O = (Q K^T * Gamma) V + (Q * e^b) S_prev with b = decay_into(g). Most blocks
    form Q K^T * Gamma as one matmul (Q * e^b)(K * e^-b)^T (see _common.mild_decay); blocks
    that decay by more than e^-30 (a hard reset, a strong gate) get the exact scores instead.
    """
    B, H, T, Dk = q.shape
    N = -(-T // C)
    pad = N * C - T                                             # padded tokens: k = v = 0, g = 0
    if pad:
        q, k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g))
    q, k, v, g = (x.reshape(B, H, N, C, x.shape[-1]) for x in (q, k, v, g))
    b, e_in, e_out, strong = mild_decay(g)                      # (B, H, N, C, 1 or Dk) x3, (B, H, N)
    q_in, k_out = q * e_in, k * e_out                           # decayed from / back to the block start
    A = (q_in @ k_out.transpose(-1, -2)).tril_()                # (B, H, N, C, C)
    k_end = k_out * e_in[..., -1:, :]                           # keys decayed to the block's end
    if bool(strong.any()):                                      # exact scores and decays for those blocks
        A = A.index_put((strong,), _exact_scores(q[strong], k[strong], g[strong]))
        k_end = k_end.index_put((strong,), k[strong] * decay_after(g[strong]).exp())
    kv = k_end.transpose(-1, -2) @ v                            # each block's decayed write: (B, H, N, Dk, Dv)
    block_decay = b[..., -1:, :].transpose(-1, -2).exp()        # (B, H, N, 1 or Dk, 1): decays rows of S
    S_prev, S = scan_states(S0, kv, block_decay)                # state entering each block: (B, H, N, Dk, Dv)
    o = matmul_add(q_in @ S_prev, A, v)                         # (B, H, N, C, Dv)
    return o.reshape(B, H, N * C, -1)[:, :, :T], S
