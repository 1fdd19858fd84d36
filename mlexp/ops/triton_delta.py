"""Triton forward kernel for the (gated) delta rule; backward recomputes through the chunkwise path."""
import torch
import triton
import triton.language as tl

from .delta import _chunk

__all__ = ["delta_rule_triton"]


@triton.jit
def _delta_fwd_kernel(q, k, v, beta, g, s0, o, s_out, T,
                      DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                      BV: tl.constexpr, HAS_G: tl.constexpr, HAS_S0: tl.constexpr,
                      PRECISION: tl.constexpr):
    """One program per (batch*head, block of BV value channels); it walks the chunks in order.

    Per chunk (see mlexp.ops.delta._chunk for the derivation): A = tril(beta K K^T * Gamma, -1),
    T = (I + A)^-1 diag(beta) by forward substitution, W = T diag(e^b) K, U = T V, then
    V' = U - W S, O = diag(e^b) Q S + (Q K^T * Gamma, causal) V', S <- e^{b_C} S + (e^{b_C - b} K)^T V'.
    Inputs are contiguous (B*H, T, D); tokens past T load as zeros (k = v = beta = g = 0), which
    leaves S unchanged, so no padding is needed. Everything is computed in fp32.
    """
    i_bh = tl.program_id(0).to(tl.int64)                       # int64 offsets: B*H*T*D may pass 2^31
    i_v = tl.program_id(1)
    rc = tl.arange(0, C)                                         # token index within a chunk
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    mk, mv = rk < DK, rv < DV
    causal = rc[:, None] >= rc[None, :]                          # (C, C) j <= i
    strict = rc[:, None] > rc[None, :]                           # (C, C) j < i
    eye = tl.where(rc[:, None] == rc[None, :], 1.0, 0.0)

    S = tl.zeros((BK, BV), dtype=tl.float32)                     # state block (Dk, BV)
    if HAS_S0:
        S += tl.load(s0 + i_bh * DK * DV + rk[:, None] * DV + rv[None, :],
                     mask=mk[:, None] & mv[None, :], other=0.0).to(tl.float32)

    for start in range(0, T, C):
        t = start + rc
        mt = t < T
        row_k = i_bh * T * DK + t[:, None] * DK + rk[None, :]
        row_v = i_bh * T * DV + t[:, None] * DV + rv[None, :]
        q_c = tl.load(q + row_k, mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32)  # (C, BK)
        k_c = tl.load(k + row_k, mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32)  # (C, BK)
        v_c = tl.load(v + row_v, mask=mt[:, None] & mv[None, :], other=0.0).to(tl.float32)  # (C, BV)
        beta_c = tl.load(beta + i_bh * T + t, mask=mt, other=0.0).to(tl.float32)            # (C,)
        if HAS_G:
            g_c = tl.load(g + i_bh * T + t, mask=mt, other=0.0).to(tl.float32)
        else:
            g_c = tl.zeros((C,), dtype=tl.float32)
        b = tl.cumsum(g_c, 0)                                    # (C,) log-decay from chunk start
        b_last = tl.sum(g_c, 0)                                  # log-decay over the whole chunk
        # Gamma_ij = exp(b_i - b_j) on and below the diagonal; the difference is zeroed above it
        # before exp, so no positive exponent is formed.
        gamma = tl.where(causal, tl.exp(tl.where(causal, b[:, None] - b[None, :], 0.0)), 0.0)

        kk = tl.dot(k_c, tl.trans(k_c), input_precision=PRECISION)       # (C, C)
        A = tl.where(strict, beta_c[:, None] * kk * gamma, 0.0)
        # X = (I + A)^-1 row by row: X_i = e_i - sum_{j<i} A_ij X_j. Rows j < i are final when
        # row i is formed, and A_ij = 0 for j >= i, so summing over all rows is exact.
        X = eye
        for i in range(1, C):
            a_i = tl.sum(tl.where(rc[:, None] == i, A, 0.0), 0)            # row i of A, (C,)
            x_i = tl.where(rc == i, 1.0, 0.0) - tl.sum(a_i[:, None] * X, 0)
            X = tl.where(rc[:, None] == i, x_i[None, :], X)
        Tm = X * beta_c[None, :]                                  # T = (I + A)^-1 diag(beta)
        W = tl.dot(Tm, k_c * tl.exp(b)[:, None], input_precision=PRECISION)  # (C, BK)
        U = tl.dot(Tm, v_c, input_precision=PRECISION)                      # (C, BV)

        v_new = U - tl.dot(W, S, input_precision=PRECISION)                 # (C, BV) V' = U - W S
        P = tl.dot(q_c, tl.trans(k_c), input_precision=PRECISION) * gamma   # (C, C), causal
        o_c = tl.dot(q_c * tl.exp(b)[:, None], S, input_precision=PRECISION)
        o_c += tl.dot(P, v_new, input_precision=PRECISION)
        tl.store(o + row_v, o_c.to(o.dtype.element_ty), mask=mt[:, None] & mv[None, :])
        k_dec = k_c * tl.exp(b_last - b)[:, None]                            # keys decayed to chunk end
        S = S * tl.exp(b_last) + tl.dot(tl.trans(k_dec), v_new, input_precision=PRECISION)

    tl.store(s_out + i_bh * DK * DV + rk[:, None] * DV + rv[None, :], S, mask=mk[:, None] & mv[None, :])


def _forward(q, k, v, beta, g, S0, C):
    """Launch the kernel. Shapes as delta_rule; returns o in v's dtype and S in float32."""
    B, H, T, Dk = k.shape
    Dv = v.shape[-1]
    if C < 16 or C & (C - 1):
        raise ValueError(f"impl='triton' needs chunk_size a power of two >= 16 (a tl.dot tile); got {C}")
    BK = max(16, triton.next_power_of_2(Dk))
    if BK > 256:
        raise ValueError(f"impl='triton' keeps the whole key dim in one tile, so Dk <= 256; got {Dk}. "
                         f"Use impl='chunk'.")
    BV = min(64, max(16, triton.next_power_of_2(Dv)))
    q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
    g = g.contiguous() if g is not None else None
    S0 = S0.float().contiguous() if S0 is not None else None
    o = torch.empty_like(v)
    S = torch.empty(B, H, Dk, Dv, dtype=torch.float32, device=v.device)
    precision = "ieee" if q.dtype in (torch.float32, torch.float64) else "tf32"
    grid = (B * H, triton.cdiv(Dv, BV))
    _delta_fwd_kernel[grid](q, k, v, beta, g if g is not None else beta, S0 if S0 is not None else S,
                            o, S, T, DK=Dk, DV=Dv, C=C, BK=BK, BV=BV, HAS_G=g is not None,
                            HAS_S0=S0 is not None, PRECISION=precision)
    return o, S


class _DeltaRuleTriton(torch.autograd.Function):
    """Forward in Triton; backward replays the chunkwise PyTorch path and differentiates it."""

    @staticmethod
    def forward(ctx, q, k, v, beta, g, S0, C):
        ctx.save_for_backward(q, k, v, beta, g, S0)
        ctx.C = C
        return _forward(q, k, v, beta, g, S0, C)

    @staticmethod
    def backward(ctx, do, dS):
        saved = ctx.saved_tensors
        inputs = [None if x is None else x.detach().requires_grad_(need)
                  for x, need in zip(saved, ctx.needs_input_grad)]
        with torch.enable_grad():
            args = [None if x is None else x.float() for x in inputs]
            o, S = _chunk(*args, ctx.C)
        wanted = [x for x in inputs if x is not None and x.requires_grad]
        grads = iter(torch.autograd.grad((o, S), wanted, (do.float(), dS.float()), allow_unused=True))
        out = [next(grads) if x is not None and x.requires_grad else None for x in inputs]
        return (*out, None)


def delta_rule_triton(q, k, v, beta, g, S0, C):
    """(Gated) delta rule with the Triton forward kernel; g and S0 may be None.

    Args as mlexp.ops.delta_rule after checks (keys already normalised, q already scaled);
    C must be a power of two >= 16. Returns o (B, H, T, Dv) in v's dtype, S (B, H, Dk, Dv) fp32.
    """
    return _DeltaRuleTriton.apply(q, k, v, beta, g, S0, C)
