"""Gated (decaying) linear attention: a scalar decay per head and token, or one per key channel."""
import torch
import torch.nn.functional as F

from ._common import check_chunk_size, check_log_decay, check_qkv, check_state, compute_dtype, resolve_impl

__all__ = ["gated_linear_attention"]

SUB = 16  # sub-block length inside a chunk for per-channel decay (see _intra_channel)
SPAN = 30.0  # largest log-decay a chunk may span for its one-matmul form (see _intra_channel_matmul)


def gated_linear_attention(q, k, v, g, *, initial_state=None, impl=None, chunk_size=64, scale=None):
    """Linear attention with a decaying state: S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = q_t^T S_t.

    The decay is given in log space, g = log(alpha) <= 0. A pair written s steps before t is read
    with weight exp(g_{t-s+1} + ... + g_t) = exp(b_t - b_{t-s}) where b is the cumulative sum of
    g; every implementation forms such weights as a difference of cumulative logs, never as
    exp(b_t) * exp(-b_{t-s}), which overflows once b is large and negative.
    Sources: RetNet (Sun et al., 2023) and Mamba-2 (Dao and Gu, 2024) for a scalar decay per
    head (and token); GLA (Yang et al., 2023) for a decay per key channel and the sub-block
    chunkwise form used here when a chunk decays strongly (more than e^30; milder chunks take
    one matmul, see _intra_channel_matmul).

    Args:
        q, k: (B, H, T, Dk); v: (B, H, T, Dv). One floating dtype and one device; float16 and
            bfloat16 are computed in float32.
        g: log-decay <= 0, shape (B, H, T) (one scalar per head and token) or (B, H, T, Dk)
            (one per key channel, which decays row d of S).
        initial_state: S before token 0, (B, H, Dk, Dv); None means zeros.
        impl: "recurrent" (loop over t, the reference), "parallel" (T x T decay-masked scores;
            with a per-channel g it builds a (T, T, Dk) tensor, small T only), "chunk" (the CPU
            default) or "triton" (the CUDA default).
        chunk_size: C, block length of the chunkwise and Triton paths (any T works; Triton needs a
            power of two >= 16, and with a per-channel g its kernel always uses chunks of 16).
        scale: optional multiplier on q; None means 1.

    Returns:
        (o, S): o (B, H, T, Dv) in the input dtype; S (B, H, Dk, Dv) in float32 (float64 for
        float64 inputs).

    Raises:
        ValueError: wrong shapes, dtypes or devices, a positive g, a bad ``impl`` or ``chunk_size``.
    """
    B, H, T, Dk, Dv = check_qkv(q, k, v)
    per_channel = check_log_decay(g, q)
    check_chunk_size(chunk_size)
    impl = resolve_impl(impl, q.device)
    out_dtype, acc = v.dtype, compute_dtype(q.dtype)
    if initial_state is None:
        S0 = q.new_zeros((B, H, Dk, Dv), dtype=acc)
    else:
        check_state(initial_state, (B, H, Dk, Dv), q.device)
        S0 = initial_state.to(acc)
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
        o, S = _parallel(q, k, v, g, S0, per_channel)
    else:
        o, S = _chunk(q, k, v, g, S0, per_channel, chunk_size)
    return o.to(out_dtype), S


def _recurrent(q, k, v, g, S):
    """The reference: decay the state, write k_t v_t^T, read with q_t; g is (B, H, T, 1 or Dk)."""
    outs = []
    for t in range(q.shape[2]):
        S = g[:, :, t, :, None].exp() * S                      # decay row d by exp(g_t[d]): (B, H, Dk, Dv)
        S = S + k[:, :, t, :, None] * v[:, :, t, None, :]      # write k_t v_t^T
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    return torch.stack(outs, dim=2), S


def _decay_matrix(b):
    """exp(b_i - b_j) for j <= i and 0 above the diagonal; b (..., L, 1) -> (..., L, L)."""
    L = b.shape[-2]
    causal = torch.ones(L, L, dtype=torch.bool, device=b.device).tril()
    diff = b - b.transpose(-1, -2)                              # b_i - b_j: (..., L, L)
    return torch.where(causal, diff, float("-inf")).exp()      # masked before exp: no overflow


def _decay_scores(q, k, b):
    """sum_d q_id k_jd exp(b_id - b_jd) for j <= i, else 0: (..., L, Dk) x3 -> (..., L, L), exact."""
    L = q.shape[-2]
    causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()[..., None]
    diff = b[..., :, None, :] - b[..., None, :, :]             # (..., L, L, Dk)
    decay = torch.where(causal, diff, float("-inf")).exp()
    return torch.einsum("...id,...jd,...ijd->...ij", q, k, decay)


def _parallel(q, k, v, g, S0, per_channel):
    """All outputs at once from the global cumulative log-decay b_t = g_1 + ... + g_t."""
    b = g.cumsum(dim=2)                                         # (B, H, T, 1 or Dk)
    if per_channel:
        A = _decay_scores(q, k, b)                              # (B, H, T, T) via a (T, T, Dk) tensor
    else:
        A = (q @ k.transpose(-1, -2)) * _decay_matrix(b)        # (B, H, T, T)
    o = A @ v + (q * b.exp()) @ S0                              # the initial state decays by exp(b_t)
    b_T = b[:, :, -1:]                                          # (B, H, 1, 1 or Dk)
    S = b_T.transpose(-1, -2).exp() * S0 + (k * (b_T - b).exp()).transpose(-1, -2) @ v
    return o, S


def _intra_channel(q, k, b, sub=SUB):
    """Per-channel decayed scores inside one chunk, (..., C, Dk) x3 -> (..., C, C).

    Sub-blocks of ``sub`` queries: on the diagonal the exact (sub, sub, Dk) form; left of it the
    weight exp(b_i - b_j) is split at r, the sub-block's first token: exp(b_i - b_r) * exp(b_r - b_j),
    two true decays in (0, 1] (j < r <= i), so a plain matmul is exact and cannot overflow
    (the secondary chunking of GLA, Yang et al., 2023).
    """
    C = q.shape[-2]
    rows = []
    for p in range(0, C, sub):
        e = min(p + sub, C)
        qi, bi = q[..., p:e, :], b[..., p:e, :]
        parts = []
        if p > 0:
            r = b[..., p:p + 1, :]                              # b at the sub-block's first token
            q_r = qi * (bi - r).exp()                           # (..., c, Dk), exponents <= 0
            k_r = k[..., :p, :] * (r - b[..., :p, :]).exp()     # (..., p, Dk), exponents <= 0
            parts.append(q_r @ k_r.transpose(-1, -2))           # (..., c, p)
        parts.append(_decay_scores(qi, k[..., p:e, :], bi))     # (..., c, c)
        if e < C:
            parts.append(q.new_zeros(*q.shape[:-2], e - p, C - e))
        rows.append(torch.cat(parts, dim=-1))
    return torch.cat(rows, dim=-2)


def _intra_channel_matmul(q, k, b):
    """Per-channel decayed scores inside one chunk as one matmul, when the chunk's decay is mild.

    exp(b_i - b_j) = exp(b_i - b_0) * exp(b_0 - b_j) with b_0 the chunk's first token: the first
    factor is in (0, 1], the second in [1, exp(span)] where span = b_0 - b_(C-1) is the most the
    chunk decays. The caller uses this form only when span <= SPAN (30), so neither factor
    leaves float32's range (e^30 ~ 1e13) and each product carries float32's relative error;
    a stronger decay goes through :func:`_intra_channel` instead. The weights above the diagonal
    (j > i) are finite here and masked to 0 after the matmul.
    """
    b0 = b[..., :1, :]
    return ((q * (b - b0).exp()) @ (k * (b0 - b).exp()).transpose(-1, -2)).tril()


def _chunk(q, k, v, g, S0, per_channel, C):
    """Chunkwise form: decayed masked scores inside each block of C tokens, the state across blocks."""
    B, H, T, Dk = q.shape
    N = -(-T // C)
    pad = N * C - T                                             # padded tokens: k = v = 0, g = 0
    q, k, v, g = (F.pad(x, (0, 0, 0, pad)).view(B, H, N, C, x.shape[-1]) for x in (q, k, v, g))
    b = g.cumsum(dim=3)                                         # within-block cumulative log: (B, H, N, C, 1 or Dk)
    if per_channel and (b[..., 0, :] - b[..., -1, :]).max() <= SPAN:
        A = _intra_channel_matmul(q, k, b)                      # mild decay: one matmul per chunk
    elif per_channel:
        A = _intra_channel(q, k, b)                             # strong decay: exact sub-blocks
    else:
        A = (q @ k.transpose(-1, -2)) * _decay_matrix(b)        # (B, H, N, C, C)
    b_last = b[..., -1:, :]                                     # (B, H, N, 1, 1 or Dk)
    kv = (k * (b_last - b).exp()).transpose(-1, -2) @ v         # each block's decayed write: (B, H, N, Dk, Dv)
    block_decay = b_last.transpose(-1, -2).exp()                # (B, H, N, 1 or Dk, 1): decays rows of S
    S, S_prev = S0, []
    for n in range(N):                                          # the only sequential part: N = T / C steps
        S_prev.append(S)
        S = block_decay[:, :, n] * S + kv[:, :, n]
    S_prev = torch.stack(S_prev, dim=2)                         # state entering each block: (B, H, N, Dk, Dv)
    o = A @ v + (q * b.exp()) @ S_prev                          # (B, H, N, C, Dv)
    return o.reshape(B, H, N * C, -1)[:, :, :T], S
