"""Triton kernels, forward and backward, for linear attention and gated linear attention."""
import torch
import triton
import triton.language as tl

__all__ = ["triton_linear_attention", "triton_gated_linear_attention"]

# GATE: 0 = no decay (linear attention), 1 = one log-decay per head and token, 2 = one per key channel.
# Per-channel decay forms a (C, C, Dk) tensor inside the kernel, so it always uses chunks of 16.
CHANNEL_CHUNK = 16


@triton.jit
def _chunk_logs(g, i_bh, t, mt, rk, mk, T, DK: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                GATE: tl.constexpr):
    """Cumulative log-decay b inside a chunk and its total b_last: (C, BK) and (BK,) for GATE 2,
    (C, 1) and (1,)-broadcastable for GATE 1, zeros for GATE 0. Tokens past T load g = 0."""
    if GATE == 2:
        g_c = tl.load(g + i_bh * T * DK + t[:, None] * DK + rk[None, :], mask=mt[:, None] & mk[None, :],
                      other=0.0).to(tl.float32)                                # (C, BK)
    elif GATE == 1:
        g_c = tl.load(g + i_bh * T + t, mask=mt, other=0.0).to(tl.float32)[:, None]   # (C, 1)
    else:
        g_c = tl.zeros((C, 1), dtype=tl.float32)
    return tl.cumsum(g_c, 0), tl.sum(g_c, 0)


@triton.jit
def _decayed_scores(a, c, b, causal, GATE: tl.constexpr, PRECISION: tl.constexpr):
    """M_ij = sum_d a_id c_jd exp(b_id - b_jd) for j <= i, else 0; (C, BK) x2 -> (C, C).

    The exponent is a difference of cumulative logs, zeroed above the diagonal before exp.
    """
    if GATE == 2:
        diff = b[:, None, :] - b[None, :, :]                                   # (C, C, BK)
        decay = tl.where(causal[:, :, None], tl.exp(tl.where(causal[:, :, None], diff, 0.0)), 0.0)
        return tl.sum(a[:, None, :] * c[None, :, :] * decay, axis=2)
    else:
        m = tl.dot(a, tl.trans(c), input_precision=PRECISION)                   # (C, C)
        if GATE == 1:
            m = m * tl.exp(tl.where(causal, b - tl.trans(b), 0.0))             # b (C, 1): b_i - b_j
        return tl.where(causal, m, 0.0)


@triton.jit
def _fwd_kernel(q, k, v, g, s0, o, s_out, T, DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr,
                BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr, PRECISION: tl.constexpr):
    """One program per (batch*head, block of BV value channels); it walks the chunks in order.

    Per chunk with entering state S: O = (Q * e^b) S + M V, with M the decayed causal scores;
    S <- e^{b_last} S + (K * e^{b_last - b})^T V. Inputs are contiguous (B*H, T, D); tokens past
    T load as zeros and leave S unchanged. Everything accumulates in fp32.
    """
    i_bh, i_v = tl.program_id(0), tl.program_id(1)
    rc, rk = tl.arange(0, C), tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    mk, mv = rk < DK, rv < DV
    causal = rc[:, None] >= rc[None, :]                                         # (C, C): j <= i
    ms = mk[:, None] & mv[None, :]
    S = tl.load(s0 + i_bh * DK * DV + rk[:, None] * DV + rv[None, :], mask=ms, other=0.0)   # (BK, BV)
    for start in range(0, T, C):
        t = start + rc
        mt = t < T
        q_c = tl.load(q + i_bh * T * DK + t[:, None] * DK + rk[None, :], mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32)
        k_c = tl.load(k + i_bh * T * DK + t[:, None] * DK + rk[None, :], mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32)
        v_c = tl.load(v + i_bh * T * DV + t[:, None] * DV + rv[None, :], mask=mt[:, None] & mv[None, :], other=0.0).to(tl.float32)
        b, b_last = _chunk_logs(g, i_bh, t, mt, rk, mk, T, DK, C, BK, GATE)
        M = _decayed_scores(q_c, k_c, b, causal, GATE, PRECISION)               # (C, C)
        o_c = tl.dot(q_c * tl.exp(b), S, input_precision=PRECISION) + tl.dot(M, v_c, input_precision=PRECISION)
        tl.store(o + i_bh * T * DV + t[:, None] * DV + rv[None, :], o_c, mask=mt[:, None] & mv[None, :])
        k_w = k_c * tl.exp(b_last[None, :] - b)                                 # decay to the chunk end, <= 1
        S = S * tl.trans(tl.exp(b_last[None, :])) + tl.dot(tl.trans(k_w), v_c, input_precision=PRECISION)
    tl.store(s_out + i_bh * DK * DV + rk[:, None] * DV + rv[None, :], S, mask=ms)


@triton.jit
def _bwd_dq_kernel(k, v, g, s0, do, dq, T, DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr, PRECISION: tl.constexpr):
    """dQ, walking the chunks forward and rebuilding S: dQ = e^b * (dO S^T) + M' K with
    M'_ij = sum over channels of (dO_i . V_j) e^{b_i - b_j}, per channel for GATE 2. One program per batch*head."""
    i_bh = tl.program_id(0)
    rc, rk, rv = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = rk < DK, rv < DV
    causal = rc[:, None] >= rc[None, :]
    S = tl.load(s0 + i_bh * DK * DV + rk[:, None] * DV + rv[None, :], mask=mk[:, None] & mv[None, :], other=0.0)
    for start in range(0, T, C):
        t = start + rc
        mt = t < T
        k_c = tl.load(k + i_bh * T * DK + t[:, None] * DK + rk[None, :], mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32)
        v_c = tl.load(v + i_bh * T * DV + t[:, None] * DV + rv[None, :], mask=mt[:, None] & mv[None, :], other=0.0).to(tl.float32)
        do_c = tl.load(do + i_bh * T * DV + t[:, None] * DV + rv[None, :], mask=mt[:, None] & mv[None, :], other=0.0).to(tl.float32)
        b, b_last = _chunk_logs(g, i_bh, t, mt, rk, mk, T, DK, C, BK, GATE)
        P = tl.dot(do_c, tl.trans(v_c), input_precision=PRECISION)              # (C, C): dO_i . V_j
        dq_c = tl.exp(b) * tl.dot(do_c, tl.trans(S), input_precision=PRECISION)  # (C, BK)
        if GATE == 2:
            diff = b[:, None, :] - b[None, :, :]                                # (C, C, BK)
            decay = tl.where(causal[:, :, None], tl.exp(tl.where(causal[:, :, None], diff, 0.0)), 0.0)
            dq_c += tl.sum(P[:, :, None] * k_c[None, :, :] * decay, axis=1)
        else:
            if GATE == 1:
                P = P * tl.exp(tl.where(causal, b - tl.trans(b), 0.0))
            dq_c += tl.dot(tl.where(causal, P, 0.0), k_c, input_precision=PRECISION)
        tl.store(dq + i_bh * T * DK + t[:, None] * DK + rk[None, :], dq_c, mask=mt[:, None] & mk[None, :])
        k_w = k_c * tl.exp(b_last[None, :] - b)
        S = S * tl.trans(tl.exp(b_last[None, :])) + tl.dot(tl.trans(k_w), v_c, input_precision=PRECISION)


@triton.jit
def _bwd_dkv_kernel(q, k, v, g, do, ds, dk, dv, ds0, T, DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr,
                    BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr, PRECISION: tl.constexpr):
    """dK, dV and dS0, walking the chunks backward with dS, the gradient of the state at a chunk's end:
    dV_j = sum_{i>=j} M_ij dO_i + dS^T (K_j * e^{b_last - b_j}),
    dK_j = sum_{i>=j} (dO_i . V_j) e^{b_i - b_j} Q_i + e^{b_last - b_j} * (dS V_j),
    dS <- e^{b_last} dS + (Q * e^b)^T dO. One program per batch*head."""
    i_bh = tl.program_id(0)
    rc, rk, rv = tl.arange(0, C), tl.arange(0, BK), tl.arange(0, BV)
    mk, mv = rk < DK, rv < DV
    causal = rc[:, None] >= rc[None, :]
    ms = mk[:, None] & mv[None, :]
    dS = tl.load(ds + i_bh * DK * DV + rk[:, None] * DV + rv[None, :], mask=ms, other=0.0)
    n_chunks = tl.cdiv(T, C)
    for i in range(0, n_chunks):
        t = (n_chunks - 1 - i) * C + rc
        mt = t < T
        q_c = tl.load(q + i_bh * T * DK + t[:, None] * DK + rk[None, :], mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32)
        k_c = tl.load(k + i_bh * T * DK + t[:, None] * DK + rk[None, :], mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32)
        v_c = tl.load(v + i_bh * T * DV + t[:, None] * DV + rv[None, :], mask=mt[:, None] & mv[None, :], other=0.0).to(tl.float32)
        do_c = tl.load(do + i_bh * T * DV + t[:, None] * DV + rv[None, :], mask=mt[:, None] & mv[None, :], other=0.0).to(tl.float32)
        b, b_last = _chunk_logs(g, i_bh, t, mt, rk, mk, T, DK, C, BK, GATE)
        to_end = tl.exp(b_last[None, :] - b)                                    # decay from token to chunk end
        M = _decayed_scores(q_c, k_c, b, causal, GATE, PRECISION)               # (C, C), query i x key j
        dv_c = tl.dot(tl.trans(M), do_c, input_precision=PRECISION) + tl.dot(k_c * to_end, dS, input_precision=PRECISION)
        P = tl.dot(do_c, tl.trans(v_c), input_precision=PRECISION)              # (C, C): dO_i . V_j
        dk_c = to_end * tl.dot(v_c, tl.trans(dS), input_precision=PRECISION)    # (C, BK)
        if GATE == 2:
            diff = b[:, None, :] - b[None, :, :]
            decay = tl.where(causal[:, :, None], tl.exp(tl.where(causal[:, :, None], diff, 0.0)), 0.0)
            dk_c += tl.sum(P[:, :, None] * q_c[:, None, :] * decay, axis=0)
        else:
            if GATE == 1:
                P = P * tl.exp(tl.where(causal, b - tl.trans(b), 0.0))
            dk_c += tl.dot(tl.trans(tl.where(causal, P, 0.0)), q_c, input_precision=PRECISION)
        tl.store(dk + i_bh * T * DK + t[:, None] * DK + rk[None, :], dk_c, mask=mt[:, None] & mk[None, :])
        tl.store(dv + i_bh * T * DV + t[:, None] * DV + rv[None, :], dv_c, mask=mt[:, None] & mv[None, :])
        dS = dS * tl.trans(tl.exp(b_last[None, :])) + tl.dot(tl.trans(q_c * tl.exp(b)), do_c, input_precision=PRECISION)
    tl.store(ds0 + i_bh * DK * DV + rk[:, None] * DV + rv[None, :], dS, mask=ms)


def _tiles(Dk, Dv):
    """Tile sizes holding the whole key and value dims (>= 16 for tl.dot); ValueError past 256."""
    BK, BV = max(16, triton.next_power_of_2(Dk)), max(16, triton.next_power_of_2(Dv))
    if BK > 256 or BV > 256:
        raise ValueError(f"impl='triton' keeps a head's whole state in one tile, so Dk, Dv <= 256; got {Dk}, {Dv}. "
                         "Use impl='chunk' or split heads.")
    return BK, BV


def _chunk_len(C, gate):
    """The kernel's chunk: 16 for per-channel decay, else C, which must be a power of two >= 16."""
    if gate == 2:
        return CHANNEL_CHUNK
    if C < 16 or C & (C - 1):
        raise ValueError(f"impl='triton' needs chunk_size a power of two >= 16 (a tl.dot tile); got {C}")
    return C


class _LinearAttentionTriton(torch.autograd.Function):
    """Forward and backward in Triton for S_t = diag(e^{g_t}) S_{t-1} + k_t v_t^T, o_t = q_t^T S_t.

    The gradient of g follows from the others: with b the cumulative log-decay,
    dL/db_t = q_t * dq_t - k_t * dk_t (+ rowsum(S_T * dS_T) at the last token), and
    dg_t = sum_{s >= t} dL/db_s (GLA, Yang et al., 2023, section 4).
    """

    @staticmethod
    def forward(ctx, q, k, v, g, S0, C, gate):
        B, H, T, Dk = q.shape
        Dv = v.shape[-1]
        BK, BV = _tiles(Dk, Dv)
        C = _chunk_len(C, gate)
        q, k, v = (x.contiguous() for x in (q, k, v))
        g_arg = g.contiguous() if g is not None else q              # unread when gate == 0
        S0 = S0.float().contiguous()
        o = torch.empty(B, H, T, Dv, dtype=torch.float32, device=q.device)
        S = torch.empty(B, H, Dk, Dv, dtype=torch.float32, device=q.device)
        prec = "ieee" if q.dtype in (torch.float32, torch.float64) else "tf32"
        BVf = min(BV, 64)
        _fwd_kernel[(B * H, triton.cdiv(Dv, BVf))](q, k, v, g_arg, S0, o, S, T, DK=Dk, DV=Dv, C=C, BK=BK,
                                                   BV=BVf, GATE=gate, PRECISION=prec)
        ctx.save_for_backward(q, k, v, g, S0, S)
        ctx.cfg = (C, gate, BK, BV, prec)
        return o, S

    @staticmethod
    def backward(ctx, do, dS):
        q, k, v, g, S0, S_T = ctx.saved_tensors
        C, gate, BK, BV, prec = ctx.cfg
        B, H, T, Dk = q.shape
        Dv = v.shape[-1]
        do = do.float().contiguous() if do is not None else torch.zeros(B, H, T, Dv, device=q.device)
        dS = dS.float().contiguous() if dS is not None else torch.zeros_like(S_T)
        g_arg = g if g is not None else q
        dq = torch.empty(B, H, T, Dk, dtype=torch.float32, device=q.device)
        dk, dv, dS0 = torch.empty_like(dq), torch.empty(B, H, T, Dv, dtype=torch.float32, device=q.device), torch.empty_like(S_T)
        meta = dict(DK=Dk, DV=Dv, C=C, BK=BK, BV=BV, GATE=gate, PRECISION=prec)
        _bwd_dq_kernel[(B * H,)](k, v, g_arg, S0, do, dq, T, **meta)
        _bwd_dkv_kernel[(B * H,)](q, k, v, g_arg, do, dS, dk, dv, dS0, T, **meta)
        dg = None
        if gate and ctx.needs_input_grad[3]:
            db = q.float() * dq - k.float() * dk                         # (B, H, T, Dk)
            db[:, :, -1] += (S_T * dS).sum(-1)                           # the final state decays with b_T
            db = db if gate == 2 else db.sum(-1)
            dg = db.flip(2).cumsum(2).flip(2).to(g.dtype)                # reverse cumulative sum over t
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg, dS0, None, None


def triton_linear_attention(q, k, v, S0, z0, *, normalize, eps, chunk_size):
    """Linear attention with the Triton kernels; arguments as mlexp.ops.linear_attention after checks.

    The normaliser rides along as an extra value column of ones: z = S[:, :, :, Dv] of the widened
    state. Returns o (B, H, T, Dv) in float32, S (B, H, Dk, Dv) and z (B, H, Dk) or None, float32.
    """
    if normalize:
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)          # (B, H, T, Dv + 1)
        S0 = torch.cat([S0, z0[..., None]], dim=-1)                      # (B, H, Dk, Dv + 1)
    o, S = _LinearAttentionTriton.apply(q, k, v, None, S0, chunk_size, 0)
    if not normalize:
        return o, S, None
    o = o[..., :-1] / (o[..., -1:] + eps)                                # q^T S / (q . z + eps)
    return o, S[..., :-1], S[..., -1]


def triton_gated_linear_attention(q, k, v, g, S0, *, chunk_size):
    """Gated linear attention with the Triton kernels; arguments as mlexp.ops.gated_linear_attention
    after checks (g (B, H, T) or (B, H, T, Dk)). Returns o (B, H, T, Dv) and S (B, H, Dk, Dv), float32."""
    gate = 2 if g.dim() == 4 else 1
    return _LinearAttentionTriton.apply(q, k, v, g, S0, chunk_size, gate)
